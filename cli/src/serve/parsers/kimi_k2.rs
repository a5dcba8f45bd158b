//! Kimi-K2 / K2.5 / Kimi-Linear tool calls (vLLM `parser/kimi_k2.py`,
//! SGLang `kimik2_detector.py`):
//! `<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|>…<|tool_calls_section_end|>`.
//! Arguments stream as they arrive (vLLM `stream_arg_deltas=True`).

use super::markers::{scan, Scan};
use super::{Calls, Delta, Stage};

const SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
/// The singular spelling some outputs use (llama.cpp PR #17376).
const SECTION_BEGIN_1: &str = "<|tool_call_section_begin|>";
const SECTION_END: &str = "<|tool_calls_section_end|>";
const SECTION_END_1: &str = "<|tool_call_section_end|>";
const CALL_BEGIN: &str = "<|tool_call_begin|>";
const ARG_BEGIN: &str = "<|tool_call_argument_begin|>";
const CALL_END: &str = "<|tool_call_end|>";

/// Markers that open tool output (they also end reasoning).
pub(super) const OPENERS: &[&str] = &[SECTION_BEGIN, SECTION_BEGIN_1, CALL_BEGIN];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Content,
    /// Inside a section, between calls (text there is dropped).
    Section,
    /// After `<|tool_call_begin|>`, reading `functions.NAME:IDX`.
    Header,
    Args,
    /// After the section end: vLLM's Kimi config suppresses this text.
    After,
}

/// The Kimi-K2 tool-call state machine.
pub(super) struct Kimi {
    st: St,
    buf: String,
    calls: Calls,
}

impl Kimi {
    pub(super) fn new(calls: Calls) -> Self {
        Kimi {
            st: St::Content,
            buf: String::new(),
            calls,
        }
    }

    fn start_call(&mut self, header: &str, out: &mut Vec<Delta>) {
        let (id, name) = ident(header);
        self.calls.start(out, Some(id), &name);
    }

    fn run(&mut self, out: &mut Vec<Delta>) {
        loop {
            let markers: &[&str] = match self.st {
                St::Content => OPENERS,
                St::Section => &[CALL_BEGIN, SECTION_END, SECTION_END_1],
                St::Header => &[ARG_BEGIN, CALL_END, CALL_BEGIN, SECTION_END, SECTION_END_1],
                St::Args => &[CALL_END, CALL_BEGIN, SECTION_END, SECTION_END_1],
                St::After => &[SECTION_BEGIN, SECTION_BEGIN_1],
            };
            match scan(&self.buf, markers) {
                Scan::Found { at, which } => {
                    let before = self.buf[..at].to_string();
                    let m = markers[which];
                    self.buf.drain(..at + m.len());
                    match self.st {
                        St::Content => {
                            out.push(Delta::Content(before));
                            self.st = if m == CALL_BEGIN {
                                St::Header
                            } else {
                                St::Section
                            };
                        }
                        St::Section | St::After => {
                            self.st = match m {
                                CALL_BEGIN => St::Header,
                                SECTION_BEGIN | SECTION_BEGIN_1 => St::Section,
                                _ => St::After,
                            };
                        }
                        St::Header => {
                            self.start_call(&before, out);
                            if m == ARG_BEGIN {
                                self.st = St::Args;
                            } else {
                                // A call without arguments: `{}`.
                                self.calls.end(out, false);
                                self.st = after_call(m);
                            }
                        }
                        St::Args => {
                            self.calls.args(out, &before);
                            // A missing `<|tool_call_end|>` before the next
                            // call or the section end still closes the call
                            // (vllm#24478: no separator between calls).
                            self.calls.end(out, false);
                            self.st = after_call(m);
                        }
                    }
                }
                Scan::Clear { safe } => {
                    match self.st {
                        St::Content => out.push(Delta::Content(self.buf[..safe].to_string())),
                        St::Args => {
                            let s = self.buf[..safe].to_string();
                            self.calls.args(out, &s);
                        }
                        // The header waits whole for its end marker.
                        St::Header => return,
                        St::Section | St::After => {}
                    }
                    self.buf.drain(..safe);
                    return;
                }
            }
        }
    }
}

/// Where a call's end marker leaves the machine.
fn after_call(m: &str) -> St {
    match m {
        CALL_BEGIN => St::Header,
        SECTION_END | SECTION_END_1 => St::After,
        _ => St::Section,
    }
}

/// Id and name from a call header. The id is the header itself
/// (`functions.get-weather:0`); the name is what lies between `functions.`
/// and `:IDX`. Headers without that shape (`call00003`, `get_weather:1`,
/// UUIDs, `functions_Bash_2`; sglang#25358, llama.cpp#24658) still make a call:
/// the name is the header minus a `functions.`/`functions_` prefix and a
/// trailing `:N` (`_N` after `functions_`).
fn ident(header: &str) -> (String, String) {
    let id = header.trim();
    let name = if let Some(r) = id.strip_prefix("functions.") {
        strip_counter(r, ':')
    } else if let Some(r) = id.strip_prefix("functions_") {
        strip_counter(strip_counter(r, ':'), '_')
    } else {
        strip_counter(id, ':')
    };
    let name = if name.is_empty() { id } else { name };
    (id.to_string(), name.to_string())
}

/// `s` without a trailing `SEP<digits>`.
fn strip_counter(s: &str, sep: char) -> &str {
    if let Some(p) = s.rfind(sep) {
        let tail = &s[p + 1..];
        if !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) && p > 0 {
            return &s[..p];
        }
    }
    s
}

impl Stage for Kimi {
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
            // A header that never reached its arguments started no call.
            St::Header | St::Section | St::After => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{Delta, ReasoningFormat, ToolFormat};

    fn kimi(thinking: bool) -> impl Fn() -> Box<dyn super::super::OutputParser> {
        maker(
            Some(ToolFormat::KimiK2),
            Some(ReasoningFormat::KimiK2),
            thinking,
            true,
        )
    }

    const TWO: &str = "I'll check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_call_begin|>functions.get_news:1<|tool_call_argument_begin|>{\"topic\": \"tech\"}<|tool_call_end|><|tool_calls_section_end|>";

    #[test]
    fn two_calls_no_separator() {
        // vllm#24478: calls back to back parse as two, stream and non-stream.
        let p = check(&kimi(false), TWO, false);
        assert_eq!(
            p,
            parsed(
                Some("I'll check."),
                None,
                &[
                    (
                        "functions.get_weather:0",
                        "get_weather",
                        "{\"city\": \"Paris\"}"
                    ),
                    ("functions.get_news:1", "get_news", "{\"topic\": \"tech\"}"),
                ]
            )
        );
    }

    #[test]
    fn reasoning_then_call_no_marker_leak() {
        let text = format!("think hard</think>\n\n{TWO}");
        for pieces in splits(&text) {
            let ds = run(&kimi(true), &pieces, false);
            for d in &ds {
                if let Delta::Reasoning(s) | Delta::Content(s) = d {
                    assert!(!s.contains("<|") && !s.contains("|>"), "{s:?}");
                }
            }
        }
        let p = check(&kimi(true), &text, false);
        assert_eq!(p.reasoning.as_deref(), Some("think hard"));
        assert_eq!(p.content.as_deref(), Some("I'll check."));
        assert_eq!(p.tool_calls.len(), 2);
    }

    #[test]
    fn reasoning_without_close_ends_at_section() {
        // vllm PR #32216 / sglang PR #18178.
        let text = "pondering<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
        let p = check(&kimi(true), text, false);
        assert_eq!(
            p,
            parsed(None, Some("pondering"), &[("functions.f:0", "f", "{}")])
        );
    }

    #[test]
    fn singular_section_spelling() {
        let text = "<|tool_call_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\":1}<|tool_call_end|><|tool_call_section_end|>";
        let p = check(&kimi(false), text, false);
        assert_eq!(
            p,
            parsed(None, None, &[("functions.f:0", "f", "{\"a\":1}")])
        );
    }

    #[test]
    fn odd_ids_and_names() {
        let text = "<|tool_calls_section_begin|>\
            <|tool_call_begin|>functions.get-weather:0<|tool_call_argument_begin|>{}<|tool_call_end|>\
            <|tool_call_begin|>call00003<|tool_call_argument_begin|>{\"x\":1}<|tool_call_end|>\
            <|tool_call_begin|>call_6b0e1c2d-aaaa<|tool_call_argument_begin|>{}<|tool_call_end|>\
            <|tool_call_begin|>functions_Bash_2<|tool_call_argument_begin|>{\"cmd\":\"ls\"}<|tool_call_end|>\
            <|tool_call_begin|>search:4<|tool_call_argument_begin|>{\"q\":\"x\"}<|tool_call_end|>\
            <|tool_calls_section_end|>";
        let p = check(&kimi(false), text, false);
        let names: Vec<_> = p
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("functions.get-weather:0", "get-weather"),
                ("call00003", "call00003"),
                ("call_6b0e1c2d-aaaa", "call_6b0e1c2d-aaaa"),
                ("functions_Bash_2", "Bash"),
                ("search:4", "search"),
            ]
        );
    }

    #[test]
    fn angle_brackets_and_multiline_json() {
        let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.render:0<|tool_call_argument_begin|>{\"html\":\"<div>content</div>\"}<|tool_call_end|><|tool_call_begin|>functions.w:1<|tool_call_argument_begin|>{\n  \"text\": \"a\\nb <|x\",\n  \"n\": 2\n}\n<|tool_call_end|><|tool_calls_section_end|>";
        let p = check(&kimi(false), text, false);
        assert_eq!(
            p.tool_calls[0].arguments,
            "{\"html\":\"<div>content</div>\"}"
        );
        assert_eq!(
            p.tool_calls[1].arguments,
            "{\n  \"text\": \"a\\nb <|x\",\n  \"n\": 2\n}"
        );
    }

    #[test]
    fn truncated_call_is_dropped() {
        // vllm#41739: a max_tokens cut must not yield a call with bad JSON.
        let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.run:0<|tool_call_argument_begin|>{\"input\": \"{\\\"key\\\"";
        let p = check(&kimi(false), text, true);
        assert_eq!(p, parsed(None, None, &[]));
        let ds = run(&kimi(false), &[text.to_string()], true);
        assert!(ds.contains(&Delta::ToolCallInvalid { index: 0 }));
        // Invalid JSON with a proper end is dropped too; later calls survive.
        let text = "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0<|tool_call_argument_begin|>{oops<|tool_call_end|><|tool_call_begin|>functions.b:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
        let p = check(&kimi(false), text, false);
        assert_eq!(p, parsed(None, None, &[("functions.b:1", "b", "{}")]));
    }

    #[test]
    fn long_args_stream_incrementally() {
        // sglang#23341, vllm#50604: fragments arrive while the call is open.
        let big = "x".repeat(40_000);
        let mut p = kimi(false)();
        p.push("<|tool_calls_section_begin|><|tool_call_begin|>functions.w:0<|tool_call_argument_begin|>{\"t\":\"");
        let mut streamed = 0;
        for chunk in big.as_bytes().chunks(1000) {
            for d in p.push(std::str::from_utf8(chunk).unwrap()) {
                if let Delta::ToolCallArgs { fragment, .. } = d {
                    streamed += fragment.len();
                }
            }
        }
        assert!(streamed >= 39_000, "{streamed}");
        let rest = p.push("\"}<|tool_call_end|><|tool_calls_section_end|>");
        assert!(!rest
            .iter()
            .any(|d| matches!(d, Delta::ToolCallInvalid { .. })));
    }

    #[test]
    fn tools_off_markers_are_content_but_not_reasoning() {
        let m = maker(
            Some(ToolFormat::KimiK2),
            Some(ReasoningFormat::KimiK2),
            true,
            false,
        );
        let text = "r<|tool_calls_section_begin|>x";
        let p = check(&m, text, false);
        assert_eq!(
            p,
            parsed(Some("<|tool_calls_section_begin|>x"), Some("r"), &[])
        );
    }

    #[test]
    fn text_after_section_is_suppressed() {
        let text = format!("{TWO}trailing");
        let p = check(&kimi(false), &text, false);
        assert_eq!(p.content.as_deref(), Some("I'll check."));
    }

    #[test]
    fn fan_out_of_22_calls() {
        // llama.cpp#24658: many calls with `functions_Bash_N` ids all parse.
        let mut text = String::from("<|tool_calls_section_begin|>");
        for i in 0..22 {
            text.push_str(&format!(
                "<|tool_call_begin|>functions_Bash_{i}<|tool_call_argument_begin|>{{\"cmd\": \"echo {i}\"}}<|tool_call_end|>"
            ));
        }
        text.push_str("<|tool_calls_section_end|>");
        let p = check(&kimi(false), &text, false);
        assert_eq!(p.tool_calls.len(), 22);
        assert!(p.tool_calls.iter().all(|c| c.name == "Bash"));
        assert_eq!(p.tool_calls[21].arguments, "{\"cmd\": \"echo 21\"}");
    }
}
