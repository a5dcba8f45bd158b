//! DeepSeek-V3.2 DSML tool calls (vLLM `parser/deepseek_v32.py`, SGLang
//! `deepseekv32_detector.py`):
//! `<｜DSML｜function_calls><｜DSML｜invoke name="F"><｜DSML｜parameter name="p" string="true">v</｜DSML｜parameter>…</｜DSML｜invoke></｜DSML｜function_calls>`.
//! Parameters become a JSON object: `string="true"` values are JSON strings
//! (streamed as they arrive, escaped), `string="false"` (or no attribute)
//! values are JSON text, sent when the parameter closes (a value that does
//! not parse falls back to a string). An invoke body may be raw JSON instead.
//! Also: the `tool_calls` block name and self-closing `<｜DSML｜invoke name="x"/>`
//! (V4), and an invoke with no block around it (sglang#40236 fuzz shapes).

use super::markers::{scan, Scan};
use super::{Calls, Delta, Stage};

const TAG: &str = "<｜DSML｜";
const END_TAG: &str = "</｜DSML｜";
const INVOKE: &str = "<｜DSML｜invoke";
const PARAM_END: &str = "</｜DSML｜parameter>";
const INVOKE_END: &str = "</｜DSML｜invoke>";

/// Markers that open tool output (they also end reasoning).
pub(super) const OPENERS: &[&str] = &["<｜DSML｜function_calls>", "<｜DSML｜tool_calls>", INVOKE];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Content,
    /// Inside a block, between invokes.
    Block,
    /// Inside an invoke, before its first parameter or raw JSON.
    InvokeStart,
    /// Between parameters.
    Params,
    /// A `string="true"` value.
    ParamStr,
    /// A JSON value, buffered until `</｜DSML｜parameter>`.
    ParamRaw,
    /// A raw JSON invoke body.
    RawArgs,
}

/// The DSML tool-call state machine.
pub(super) struct Dsml {
    st: St,
    buf: String,
    /// Parameters written so far in the current invoke.
    nparams: usize,
    calls: Calls,
}

/// A parsed tag: `invoke name="F"` → ("invoke", attrs, closing, self-closing).
struct Tag {
    name: String,
    attrs: Vec<(String, String)>,
    closing: bool,
    self_closing: bool,
}

impl Tag {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the text between `<｜DSML｜` (or `</｜DSML｜`) and `>`.
fn parse_tag(inner: &str, closing: bool) -> Tag {
    let mut s = inner.trim();
    let self_closing = s.ends_with('/');
    if self_closing {
        s = s[..s.len() - 1].trim_end();
    }
    let (name, mut rest) = match s.find(char::is_whitespace) {
        Some(p) => (&s[..p], &s[p..]),
        None => (s, ""),
    };
    let mut attrs = Vec::new();
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().to_string();
        let after = rest[eq + 1..].trim_start();
        let (val, next) = if let Some(a) = after.strip_prefix('"') {
            match a.find('"') {
                Some(q) => (&a[..q], &a[q + 1..]),
                None => (a, ""),
            }
        } else {
            match after.find(char::is_whitespace) {
                Some(p) => (&after[..p], &after[p..]),
                None => (after, ""),
            }
        };
        attrs.push((key, val.to_string()));
        rest = next;
    }
    Tag {
        name: name.to_string(),
        attrs,
        closing,
        self_closing,
    }
}

/// A JSON string literal's inside (no quotes) for `s`.
fn escape(s: &str) -> String {
    let q = serde_json::to_string(s).unwrap_or_default();
    q[1..q.len() - 1].to_string()
}

impl Dsml {
    pub(super) fn new(calls: Calls) -> Self {
        Dsml {
            st: St::Content,
            buf: String::new(),
            nparams: 0,
            calls,
        }
    }

    /// Takes the next whole tag at the start of `buf` (after skipping text
    /// before it). `None`: more text needed.
    fn next_tag(&mut self) -> Option<Tag> {
        let at = match scan(&self.buf, &[TAG, END_TAG]) {
            Scan::Found { at, .. } => at,
            Scan::Clear { safe } => {
                // Text between tags (whitespace) is dropped.
                self.buf.drain(..safe);
                return None;
            }
        };
        self.buf.drain(..at);
        let closing = self.buf.starts_with(END_TAG);
        let open_len = if closing { END_TAG.len() } else { TAG.len() };
        let gt = self.buf[open_len..].find('>')? + open_len;
        let tag = parse_tag(&self.buf[open_len..gt], closing);
        self.buf.drain(..gt + 1);
        Some(tag)
    }

    fn start_invoke(&mut self, tag: &Tag, out: &mut Vec<Delta>) {
        let name = tag.attr("name").unwrap_or("").to_string();
        self.calls.start(out, None, &name);
        self.nparams = 0;
        if tag.self_closing {
            self.calls.end(out, false);
            self.st = St::Block;
        } else {
            self.st = St::InvokeStart;
        }
    }

    fn end_invoke(&mut self, out: &mut Vec<Delta>) {
        if self.nparams > 0 {
            self.calls.args(out, "}");
        }
        self.calls.end(out, false);
        self.st = St::Block;
    }

    fn run(&mut self, out: &mut Vec<Delta>) {
        loop {
            match self.st {
                St::Content => match scan(&self.buf, OPENERS) {
                    Scan::Found { at, which } => {
                        out.push(Delta::Content(self.buf[..at].to_string()));
                        // A bare invoke stays in the buffer for `Block`.
                        let keep = if OPENERS[which] == INVOKE {
                            0
                        } else {
                            OPENERS[which].len()
                        };
                        self.buf.drain(..at + keep);
                        self.st = St::Block;
                    }
                    Scan::Clear { safe } => {
                        out.push(Delta::Content(self.buf[..safe].to_string()));
                        self.buf.drain(..safe);
                        return;
                    }
                },
                St::Block | St::Params => {
                    let Some(tag) = self.next_tag() else { return };
                    match (tag.closing, tag.name.as_str(), self.st) {
                        (false, "invoke", St::Block) => self.start_invoke(&tag, out),
                        (false, "parameter", St::Params) => self.start_param(&tag, out),
                        (true, "invoke", St::Params) => self.end_invoke(out),
                        (true, "function_calls" | "tool_calls", St::Block) => self.st = St::Content,
                        // A block that closes over an open invoke closes it.
                        (true, "function_calls" | "tool_calls", St::Params) => {
                            self.end_invoke(out);
                            self.st = St::Content;
                        }
                        // Anything else (a nested block opener, unknown tags)
                        // is skipped.
                        _ => {}
                    }
                }
                St::InvokeStart => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    self.st = if t.starts_with('<') {
                        St::Params
                    } else {
                        St::RawArgs
                    };
                }
                St::ParamStr => match scan(&self.buf, &[PARAM_END]) {
                    Scan::Found { at, .. } => {
                        let s = escape(&self.buf[..at]);
                        self.calls.args(out, &s);
                        self.calls.args(out, "\"");
                        self.buf.drain(..at + PARAM_END.len());
                        self.st = St::Params;
                    }
                    Scan::Clear { safe } => {
                        let s = escape(&self.buf[..safe]);
                        self.calls.args(out, &s);
                        self.buf.drain(..safe);
                        return;
                    }
                },
                St::ParamRaw => match scan(&self.buf, &[PARAM_END]) {
                    Scan::Found { at, .. } => {
                        let v = self.buf[..at].trim().to_string();
                        let json = if serde_json::from_str::<serde_json::Value>(&v).is_ok() {
                            v
                        } else {
                            serde_json::to_string(&v).unwrap_or_default()
                        };
                        self.calls.args(out, &json);
                        self.buf.drain(..at + PARAM_END.len());
                        self.st = St::Params;
                    }
                    Scan::Clear { .. } => return,
                },
                St::RawArgs => match scan(&self.buf, &[INVOKE_END]) {
                    Scan::Found { at, .. } => {
                        let s = self.buf[..at].to_string();
                        self.calls.args(out, &s);
                        self.buf.drain(..at + INVOKE_END.len());
                        self.calls.end(out, false);
                        self.st = St::Block;
                    }
                    Scan::Clear { safe } => {
                        let s = self.buf[..safe].to_string();
                        self.calls.args(out, &s);
                        self.buf.drain(..safe);
                        return;
                    }
                },
            }
        }
    }

    fn start_param(&mut self, tag: &Tag, out: &mut Vec<Delta>) {
        let key = serde_json::to_string(tag.attr("name").unwrap_or("")).unwrap_or_default();
        let sep = if self.nparams == 0 { "{" } else { ", " };
        self.nparams += 1;
        self.calls.args(out, &format!("{sep}{key}: "));
        if tag.attr("string") == Some("true") {
            self.calls.args(out, "\"");
            self.st = St::ParamStr;
        } else {
            self.st = St::ParamRaw;
        }
    }
}

impl Stage for Dsml {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.buf.push_str(text);
        self.run(out);
    }

    fn finish(&mut self, truncated: bool, out: &mut Vec<Delta>) {
        let b = std::mem::take(&mut self.buf);
        match self.st {
            St::Content => out.push(Delta::Content(b)),
            St::Block => {}
            // An unfinished invoke: whatever was built is checked as JSON
            // (it cannot be complete unless the invoke closed), so it is
            // dropped; raw JSON that is complete survives a natural end.
            St::RawArgs => {
                self.calls.args(out, &b);
                self.calls.end(out, truncated);
            }
            St::InvokeStart | St::Params | St::ParamStr | St::ParamRaw => {
                self.calls.end(out, true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{OutputParser, ReasoningFormat, ToolFormat};

    fn v32(thinking: bool) -> impl Fn() -> Box<dyn OutputParser> {
        maker(
            Some(ToolFormat::DeepSeekV32),
            Some(ReasoningFormat::DeepSeekV3),
            thinking,
            true,
        )
    }

    #[test]
    fn golden_params() {
        let text = "Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜parameter name=\"city\" string=\"true\">São \"Paulo\"\n</｜DSML｜parameter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>\n<｜DSML｜parameter name=\"opts\" string=\"false\">{\"units\": \"C\"}</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"get_time\">\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
        let p = check(&v32(false), text, false);
        assert_eq!(
            p,
            parsed(
                Some("Checking."),
                None,
                &[
                    (
                        "call_t_0",
                        "get_weather",
                        "{\"city\": \"São \\\"Paulo\\\"\\n\", \"days\": 3, \"opts\": {\"units\": \"C\"}}"
                    ),
                    ("call_t_1", "get_time", "{}")
                ]
            )
        );
    }

    #[test]
    fn tool_calls_block_raw_json_self_closing_and_bare() {
        let text = "<｜DSML｜tool_calls><｜DSML｜invoke name=\"a\">{\"x\": [1, 2]}</｜DSML｜invoke><｜DSML｜invoke name=\"b\"/></｜DSML｜tool_calls>after<｜DSML｜invoke name=\"c\"><｜DSML｜parameter name=\"q\">not json</｜DSML｜parameter></｜DSML｜invoke>";
        let p = check(&v32(false), text, false);
        assert_eq!(
            p,
            parsed(
                Some("after"),
                None,
                &[
                    ("call_t_0", "a", "{\"x\": [1, 2]}"),
                    ("call_t_1", "b", "{}"),
                    ("call_t_2", "c", "{\"q\": \"not json\"}")
                ]
            )
        );
    }

    #[test]
    fn thinking_then_dsml_and_truncation() {
        let text = "plan</think><｜DSML｜function_calls><｜DSML｜invoke name=\"f\"><｜DSML｜parameter name=\"p\" string=\"true\">long text";
        let p = check(&v32(true), text, true);
        assert_eq!(p, parsed(None, Some("plan"), &[]));
        // The answer after reasoning is content, not reasoning (vllm-ascend#8042).
        let p = check(&v32(true), "plan</think>The answer.", false);
        assert_eq!(p, parsed(Some("The answer."), Some("plan"), &[]));
    }

    #[test]
    fn after_tool_result_without_thinking_is_content() {
        // sglang#17551: a later turn's answer is not all reasoning.
        let p = check(&v32(false), "The weather is sunny.", false);
        assert_eq!(p, parsed(Some("The weather is sunny."), None, &[]));
    }
}
