//! DeepSeek-V3/R1 and V3.1 tool calls (vLLM `deepseek_v3`/`deepseek_v31`,
//! SGLang `deepseekv3_detector.py`/`deepseekv31_detector.py`).
//! V3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{json}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`;
//! V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>`.
//! One machine reads both: a V3-only parser returned nothing on V3.1 output
//! (vLLM PR #23454, sglang PR #9446), so the head before `<｜tool▁sep｜>`
//! decides (`function` + a name line = V3, anything else = the V3.1 name).
//! `▁` is U+2581 and `｜` U+FF5C.

use super::markers::{scan, Scan};
use super::{Calls, Delta, Stage};

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE: &str = "```";

/// Markers that open tool output (they also end reasoning).
pub(super) const OPENERS: &[&str] = &[CALLS_BEGIN, CALL_BEGIN];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Content,
    /// Between calls inside `<｜tool▁calls▁begin｜>…`.
    Section,
    /// After `<｜tool▁call▁begin｜>`, up to `<｜tool▁sep｜>`.
    Head,
    /// V3: the `NAME` line after `function<｜tool▁sep｜>`.
    NameLine,
    /// Before the arguments: an optional ```` ```json ```` fence line.
    ArgsOpen,
    Args,
    /// After the closing fence, up to `<｜tool▁call▁end｜>`.
    ArgsTail,
}

/// The DeepSeek V3/V3.1 tool-call state machine.
pub(super) struct DeepSeek {
    st: St,
    buf: String,
    head: String,
    calls: Calls,
}

impl DeepSeek {
    pub(super) fn new(calls: Calls) -> Self {
        DeepSeek {
            st: St::Content,
            buf: String::new(),
            head: String::new(),
            calls,
        }
    }

    /// The state after a call ends at marker `m`.
    fn close(&mut self, m: &str, out: &mut Vec<Delta>) {
        self.calls.end(out, false);
        self.st = match m {
            CALLS_END => St::Content,
            CALL_BEGIN => St::Head,
            _ => St::Section,
        };
    }

    fn run(&mut self, out: &mut Vec<Delta>) {
        loop {
            match self.st {
                St::Content | St::Section => {
                    let markers: &[&str] = if self.st == St::Content {
                        OPENERS
                    } else {
                        &[CALL_BEGIN, CALLS_END]
                    };
                    match scan(&self.buf, markers) {
                        Scan::Found { at, which } => {
                            if self.st == St::Content {
                                out.push(Delta::Content(self.buf[..at].to_string()));
                            }
                            let m = markers[which];
                            self.buf.drain(..at + m.len());
                            self.st = match m {
                                CALLS_BEGIN => St::Section,
                                CALL_BEGIN => St::Head,
                                _ => St::Content,
                            };
                        }
                        Scan::Clear { safe } => {
                            if self.st == St::Content {
                                out.push(Delta::Content(self.buf[..safe].to_string()));
                            }
                            self.buf.drain(..safe);
                            return;
                        }
                    }
                }
                St::Head => {
                    let markers = [SEP, CALL_END, CALLS_END];
                    match scan(&self.buf, &markers) {
                        Scan::Found { at, which } => {
                            self.head = self.buf[..at].trim().to_string();
                            self.buf.drain(..at + markers[which].len());
                            if which == 0 {
                                if self.head == "function" {
                                    self.st = St::NameLine;
                                } else {
                                    let name = std::mem::take(&mut self.head);
                                    self.calls.start(out, None, &name);
                                    self.st = St::ArgsOpen;
                                }
                            } else {
                                // No separator: not a call; skip it.
                                self.st = if which == 1 { St::Section } else { St::Content };
                            }
                        }
                        Scan::Clear { .. } => return,
                    }
                }
                St::NameLine => {
                    let t = self.buf.trim_start();
                    if t.starts_with('{') {
                        // V3.1 with a function named `function`.
                        self.calls.start(out, None, "function");
                        self.st = St::Args;
                        continue;
                    }
                    let markers = ["\n", FENCE, CALL_END, CALLS_END];
                    match scan(t, &markers) {
                        Scan::Found { at, which } => {
                            let name = t[..at].trim().to_string();
                            let skip = self.buf.len() - t.len() + at;
                            self.calls.start(out, None, &name);
                            match which {
                                0 => {
                                    self.buf.drain(..skip + 1);
                                    self.st = St::ArgsOpen;
                                }
                                1 => {
                                    self.buf.drain(..skip);
                                    self.st = St::ArgsOpen;
                                }
                                _ => {
                                    let m = markers[which];
                                    self.buf.drain(..skip + m.len());
                                    self.close(m, out);
                                }
                            }
                        }
                        Scan::Clear { .. } => return,
                    }
                }
                St::ArgsOpen => {
                    let t = self.buf.trim_start();
                    if t.is_empty() || (FENCE.starts_with(t) && t.len() < FENCE.len()) {
                        return;
                    }
                    if let Some(r) = t.strip_prefix(FENCE) {
                        // Drop the fence line (```` ```json ````).
                        match r.find('\n') {
                            Some(nl) => {
                                let cut = self.buf.len() - r.len() + nl + 1;
                                self.buf.drain(..cut);
                                self.st = St::Args;
                            }
                            None => return,
                        }
                    } else {
                        self.st = St::Args;
                    }
                }
                St::Args | St::ArgsTail => {
                    let markers = [CALL_END, CALLS_END, CALL_BEGIN, FENCE];
                    match scan(&self.buf, &markers) {
                        Scan::Found { at, which } => {
                            if self.st == St::Args {
                                let s = self.buf[..at].to_string();
                                self.calls.args(out, &s);
                            }
                            let m = markers[which];
                            self.buf.drain(..at + m.len());
                            if m == FENCE {
                                self.st = St::ArgsTail;
                            } else {
                                self.close(m, out);
                            }
                        }
                        Scan::Clear { safe } => {
                            if self.st == St::Args {
                                let s = self.buf[..safe].to_string();
                                self.calls.args(out, &s);
                            }
                            self.buf.drain(..safe);
                            return;
                        }
                    }
                }
            }
        }
    }
}

impl Stage for DeepSeek {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.buf.push_str(text);
        self.run(out);
    }

    fn finish(&mut self, truncated: bool, out: &mut Vec<Delta>) {
        let b = std::mem::take(&mut self.buf);
        match self.st {
            St::Content => out.push(Delta::Content(b)),
            St::Args => {
                self.calls.args(out, &b);
                self.calls.end(out, truncated);
            }
            St::ArgsOpen | St::ArgsTail => self.calls.end(out, truncated),
            St::NameLine | St::Head | St::Section => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{OutputParser, ReasoningFormat, ToolFormat};

    fn v3(thinking: bool) -> impl Fn() -> Box<dyn OutputParser> {
        maker(
            Some(ToolFormat::DeepSeekV3),
            Some(ReasoningFormat::DeepSeekV3),
            thinking,
            true,
        )
    }

    const V3: &str = "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"tz\": \"JST\", \"fmt\": \"`x`\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    const V31: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Tokyo\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"tz\": \"JST\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

    #[test]
    fn v3_golden() {
        let p = check(&v3(false), V3, false);
        assert_eq!(
            p,
            parsed(
                Some("Let me look."),
                None,
                &[
                    ("call_t_0", "get_weather", "{\"city\": \"Tokyo\"}"),
                    (
                        "call_t_1",
                        "get_time",
                        "{\"tz\": \"JST\", \"fmt\": \"`x`\"}"
                    )
                ]
            )
        );
    }

    #[test]
    fn v31_golden_through_both_names() {
        for f in [ToolFormat::DeepSeekV3, ToolFormat::DeepSeekV31] {
            let m = maker(Some(f), Some(ReasoningFormat::DeepSeekV3), false, true);
            let p = check(&m, V31, false);
            assert_eq!(
                p,
                parsed(
                    None,
                    None,
                    &[
                        ("call_t_0", "get_weather", "{\"city\": \"Tokyo\"}"),
                        ("call_t_1", "get_time", "{\"tz\": \"JST\"}")
                    ]
                )
            );
        }
    }

    #[test]
    fn r1_reasoning_then_call() {
        let text = format!("Think.\n</think>\n\n{V3}");
        let p = check(&v3(true), &text, false);
        assert_eq!(p.reasoning.as_deref(), Some("Think."));
        assert_eq!(p.content.as_deref(), Some("Let me look."));
        assert_eq!(p.tool_calls.len(), 2);
        for c in [&p.content, &p.reasoning].into_iter().flatten() {
            assert!(!c.contains('｜'), "{c}");
        }
    }

    #[test]
    fn truncated_and_invalid_are_dropped() {
        // vllm#41739: DeepSeek parsers skipped validation.
        let text =
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"To";
        assert_eq!(check(&v3(false), text, true), parsed(None, None, &[]));
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{bad}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        assert_eq!(check(&v3(false), text, false), parsed(None, None, &[]));
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{\"a\":";
        assert_eq!(check(&v3(false), text, true), parsed(None, None, &[]));
    }

    #[test]
    fn function_named_function_in_v31() {
        let text = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜>";
        assert_eq!(
            check(&v3(false), text, false),
            parsed(None, None, &[("call_t_0", "function", "{\"a\": 1}")])
        );
    }
}
