//! gpt-oss harmony channels (vLLM `parser/harmony.py` classification,
//! SGLang `gpt_oss_detector.py`): messages
//! `<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT][ <|constrain|>json]<|message|>BODY<|end|>|<|call|>|<|return|>`.
//! `analysis` → reasoning; recipient `functions.NAME` → tool call (BODY is
//! its JSON arguments; the recipient may sit in the role header, llama.cpp PR
//! #15181); `final`, or `commentary` without recipient → content; other
//! recipients (built-in `browser.*`, `python`) → reasoning. Only the body
//! ever reaches a delta, never header text (vllm PR #25514, #33520).

use super::markers::{scan, Scan};
use super::{Calls, Delta, Stage};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Content,
    Tool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    /// Reading a message header (up to `<|message|>`).
    Header,
    Body(Kind),
    /// After `<|return|>`: the answer is over.
    Done,
}

/// The harmony state machine (reasoning and tool calls in one).
pub(super) struct Harmony {
    st: St,
    buf: String,
    tools: bool,
    calls: Calls,
}

impl Harmony {
    /// `tools`: function calls become tool calls (otherwise their bodies are
    /// content).
    pub(super) fn new(tools: bool, calls: Calls) -> Self {
        Harmony {
            st: St::Header,
            buf: String::new(),
            tools,
            calls,
        }
    }

    /// Kind of message a header announces; starts the call for a tool.
    fn open(&mut self, header: &str, out: &mut Vec<Delta>) -> Kind {
        let word_after = |tag: &str| {
            header.find(tag).map(|p| {
                header[p + tag.len()..]
                    .trim_start()
                    .split(|c: char| c.is_whitespace() || c == '<')
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
        };
        let channel = word_after(CHANNEL).unwrap_or_default();
        let recipient = word_after("to=");
        match recipient {
            Some(r) if r.starts_with("functions.") => {
                if self.tools {
                    self.calls.start(out, None, &r["functions.".len()..]);
                    Kind::Tool
                } else {
                    Kind::Content
                }
            }
            Some(_) => Kind::Reasoning,
            None if channel == "analysis" => Kind::Reasoning,
            None => Kind::Content,
        }
    }

    fn emit(&mut self, k: Kind, s: &str, out: &mut Vec<Delta>) {
        match k {
            Kind::Reasoning => out.push(Delta::Reasoning(s.to_string())),
            Kind::Content => out.push(Delta::Content(s.to_string())),
            Kind::Tool => self.calls.args(out, s),
        }
    }

    fn run(&mut self, out: &mut Vec<Delta>) {
        loop {
            match self.st {
                St::Header => {
                    let t = self.buf.trim_start();
                    if !t.is_empty() && !header_like(t) {
                        // Plain text without harmony tokens: an answer.
                        self.st = St::Body(Kind::Content);
                        continue;
                    }
                    let markers = [MESSAGE, END, CALL, RETURN];
                    match scan(&self.buf, &markers) {
                        Scan::Found { at, which } => {
                            let header = self.buf[..at].to_string();
                            self.buf.drain(..at + markers[which].len());
                            self.st = match which {
                                0 => St::Body(self.open(&header, out)),
                                3 => St::Done,
                                _ => St::Header,
                            };
                        }
                        Scan::Clear { .. } => return,
                    }
                }
                St::Body(k) => {
                    let markers = [END, CALL, RETURN, START, CHANNEL];
                    match scan(&self.buf, &markers) {
                        Scan::Found { at, which } => {
                            let s = self.buf[..at].to_string();
                            self.emit(k, &s, out);
                            if k == Kind::Tool {
                                self.calls.end(out, false);
                            }
                            // A header marker without a terminator starts the
                            // next message; it stays in the buffer.
                            let keep = if which >= 3 { 0 } else { markers[which].len() };
                            self.buf.drain(..at + keep);
                            self.st = if which == 2 { St::Done } else { St::Header };
                        }
                        Scan::Clear { safe } => {
                            let s = self.buf[..safe].to_string();
                            self.emit(k, &s, out);
                            self.buf.drain(..safe);
                            return;
                        }
                    }
                }
                St::Done => {
                    self.buf.clear();
                    return;
                }
            }
        }
    }
}

/// Whether `t` can be the start of a header: a harmony token, the role, or
/// a recipient right after the prompt's `<|start|>assistant`.
fn header_like(t: &str) -> bool {
    ["<|", "to=", "assistant"]
        .iter()
        .any(|p| t.starts_with(p) || p.starts_with(t))
}

impl Stage for Harmony {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.buf.push_str(text);
        self.run(out);
    }

    fn finish(&mut self, truncated: bool, out: &mut Vec<Delta>) {
        let b = std::mem::take(&mut self.buf);
        match self.st {
            St::Header => {
                if !b.contains("<|") {
                    out.push(Delta::Content(b));
                }
            }
            St::Body(k) => {
                self.emit(k, &b, out);
                if k == Kind::Tool {
                    // A stop on `<|call|>` may have removed the marker: a
                    // complete body is still a call unless cut off.
                    self.calls.end(out, truncated);
                }
            }
            St::Done => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{Delta, OutputParser, ReasoningFormat, ToolFormat};

    fn gpt(tools: bool) -> impl Fn() -> Box<dyn OutputParser> {
        maker(
            Some(ToolFormat::Harmony),
            Some(ReasoningFormat::Harmony),
            false,
            tools,
        )
    }

    const CALL: &str = "<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"SF\"}<|call|>";

    #[test]
    fn analysis_then_tool_call() {
        let p = check(&gpt(true), CALL, false);
        assert_eq!(
            p,
            parsed(
                None,
                Some("User wants weather."),
                &[("call_t_0", "get_weather", "{\"city\":\"SF\"}")]
            )
        );
        // vllm PR #25514: no header text in content/reasoning, in any split.
        for pieces in splits(CALL) {
            for d in run(&gpt(true), &pieces, false) {
                if let Delta::Content(s) | Delta::Reasoning(s) = d {
                    assert!(
                        !s.contains("to=") && !s.contains("<|") && !s.contains("json"),
                        "{s}"
                    );
                }
            }
        }
    }

    #[test]
    fn final_answer_and_return() {
        let text = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|return|>ignored";
        assert_eq!(
            check(&gpt(true), text, false),
            parsed(Some("Hi there"), Some("think"), &[])
        );
    }

    #[test]
    fn recipient_in_role_header_and_end_terminator() {
        // llama.cpp PR #15181; `<|end|>` instead of `<|call|>` (vllm PR #24473).
        let text = " to=functions.lookup<|channel|>commentary json<|message|>{\"q\": 1}<|end|><|start|>assistant to=functions.other<|channel|>commentary<|message|>{}<|call|>";
        assert_eq!(
            check(&gpt(true), text, false),
            parsed(
                None,
                None,
                &[
                    ("call_t_0", "lookup", "{\"q\": 1}"),
                    ("call_t_1", "other", "{}")
                ]
            )
        );
    }

    #[test]
    fn truncated_call_and_stop_without_marker() {
        let text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ";
        assert_eq!(check(&gpt(true), text, true), parsed(None, None, &[]));
        let text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}";
        assert_eq!(
            check(&gpt(true), text, false),
            parsed(None, None, &[("call_t_0", "f", "{\"a\": 1}")])
        );
    }

    #[test]
    fn commentary_preamble_is_content_and_plain_text_passes() {
        let text = "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>final<|message|>Done.<|return|>";
        assert_eq!(
            check(&gpt(true), text, false),
            parsed(Some("Let me check.Done."), None, &[])
        );
        assert_eq!(
            check(&gpt(true), "Hello world", false),
            parsed(Some("Hello world"), None, &[])
        );
        // Tools off: the call body is plain content, headers still hidden.
        assert_eq!(
            check(&gpt(false), CALL, false),
            parsed(Some("{\"city\":\"SF\"}"), Some("User wants weather."), &[])
        );
    }

    #[test]
    fn recipient_on_analysis_channel_is_a_call() {
        // vllm-mlx#562: the recipient decides, not the channel.
        let text =
            "<|channel|>analysis to=functions.f <|constrain|>json<|message|>{\"a\": [1]}<|call|>";
        assert_eq!(
            check(&gpt(true), text, false),
            parsed(None, None, &[("call_t_0", "f", "{\"a\": [1]}")])
        );
    }
}
