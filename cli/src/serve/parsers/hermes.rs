//! Hermes / Qwen2.5 / Qwen3 tool calls (vLLM `hermes`/`qwen3_json`, SGLang
//! `qwen25_detector.py`): `<tool_call>\n{"name":"f","arguments":{…}}\n</tool_call>`,
//! repeatable. A small incremental JSON scanner finds the `"arguments"` value
//! inside the call object so it streams as it arrives, final `}` included
//! (vllm#22885, #32152: nested/number/bool/`{}` arguments lost their last `}`).

use super::markers::{rescan_start, scan, scan_from, Scan};
use super::{Calls, Delta, Stage};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Markers that open tool output (they also end reasoning).
pub(super) const OPENERS: &[&str] = &[OPEN];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Phase {
    /// Before the object's `{`.
    #[default]
    Pre,
    /// Expecting a key (or `}`).
    Key,
    InKey,
    Colon,
    /// Expecting a value.
    Value,
    /// Inside an object/array value.
    InContainer,
    InString,
    /// Inside a number/bool/null value.
    InScalar,
    AfterValue,
    Done,
    /// Not the expected shape; the whole body is parsed at the end instead.
    Bad,
}

/// Scanner state over the call body (top-level object only).
#[derive(Default)]
struct Scanner {
    pos: usize,
    phase: Phase,
    key_start: usize,
    key: String,
    vstart: usize,
    depth: u32,
    in_str: bool,
    esc: bool,
    name: Option<String>,
    /// A complete arguments value not streamed (came before the name, or is a
    /// JSON-encoded string): (start, end, is_string).
    args: Option<(usize, usize, bool)>,
    /// Streaming the arguments value from this byte on.
    stream_from: Option<usize>,
    /// Some arguments text was sent.
    sent: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Content,
    Call,
}

/// The Hermes tool-call state machine.
pub(super) struct Hermes {
    st: St,
    buf: String,
    body: String,
    searched: usize,
    js: Scanner,
    calls: Calls,
}

fn is_args_key(k: &str) -> bool {
    k == "arguments" || k == "parameters"
}

impl Hermes {
    pub(super) fn new(calls: Calls) -> Self {
        Hermes {
            st: St::Content,
            buf: String::new(),
            body: String::new(),
            searched: 0,
            js: Scanner::default(),
            calls,
        }
    }

    /// Scans the body up to `limit` (a char boundary before any `</tool_call>`
    /// or held marker prefix), starting the call when its name completes and
    /// streaming the arguments value.
    fn advance(&mut self, limit: usize, out: &mut Vec<Delta>) {
        let body = std::mem::take(&mut self.body);
        let mut i = self.js.pos;
        while i < limit {
            let c = body[i..].chars().next().unwrap_or(' ');
            let n = c.len_utf8();
            let j = &mut self.js;
            let ws = c.is_whitespace();
            match j.phase {
                Phase::Pre => {
                    if c == '{' {
                        j.phase = Phase::Key;
                    } else if !ws {
                        j.phase = Phase::Bad;
                    }
                }
                Phase::Key => {
                    if c == '"' {
                        j.key_start = i;
                        j.esc = false;
                        j.phase = Phase::InKey;
                    } else if c == '}' {
                        j.phase = Phase::Done;
                    } else if !(ws || c == ',') {
                        j.phase = Phase::Bad;
                    }
                }
                Phase::InKey => {
                    if j.esc {
                        j.esc = false;
                    } else if c == '\\' {
                        j.esc = true;
                    } else if c == '"' {
                        j.key = serde_json::from_str(&body[j.key_start..i + 1]).unwrap_or_default();
                        j.phase = Phase::Colon;
                    }
                }
                Phase::Colon => {
                    if c == ':' {
                        j.phase = Phase::Value;
                    } else if !ws {
                        j.phase = Phase::Bad;
                    }
                }
                Phase::Value => {
                    if !ws {
                        j.vstart = i;
                        j.esc = false;
                        j.in_str = false;
                        j.phase = match c {
                            '{' | '[' => {
                                j.depth = 1;
                                if is_args_key(&j.key) && j.name.is_some() && !j.sent {
                                    j.stream_from = Some(i);
                                }
                                Phase::InContainer
                            }
                            '"' => Phase::InString,
                            _ => Phase::InScalar,
                        };
                    }
                }
                Phase::InContainer => {
                    if j.in_str {
                        if j.esc {
                            j.esc = false;
                        } else if c == '\\' {
                            j.esc = true;
                        } else if c == '"' {
                            j.in_str = false;
                        }
                    } else {
                        match c {
                            '"' => j.in_str = true,
                            '{' | '[' => j.depth += 1,
                            '}' | ']' => {
                                j.depth -= 1;
                                if j.depth == 0 {
                                    self.value_end(&body, i + n, false, out);
                                }
                            }
                            _ => {}
                        }
                    }
                }
                Phase::InString => {
                    if j.esc {
                        j.esc = false;
                    } else if c == '\\' {
                        j.esc = true;
                    } else if c == '"' {
                        self.value_end(&body, i + n, true, out);
                    }
                }
                Phase::InScalar => {
                    if ws || c == ',' || c == '}' {
                        self.value_end(&body, i, false, out);
                        continue; // The delimiter is read again after the value.
                    }
                }
                Phase::AfterValue => {
                    if c == ',' {
                        j.phase = Phase::Key;
                    } else if c == '}' {
                        j.phase = Phase::Done;
                    } else if !ws {
                        j.phase = Phase::Bad;
                    }
                }
                Phase::Done | Phase::Bad => break,
            }
            i += n;
        }
        self.js.pos = self.js.pos.max(i.min(limit));
        if let Some(from) = self.js.stream_from {
            let to = self.js.pos;
            if to > from {
                self.calls.args(out, &body[from..to]);
                self.js.stream_from = Some(to);
                self.js.sent = true;
            }
        }
        self.body = body;
    }

    fn value_end(&mut self, body: &str, end: usize, is_string: bool, out: &mut Vec<Delta>) {
        let j = &mut self.js;
        j.phase = Phase::AfterValue;
        let v = &body[j.vstart..end];
        if j.key == "name" && j.name.is_none() {
            if let Ok(name) = serde_json::from_str::<String>(v) {
                self.calls.start(out, None, &name);
                j.name = Some(name);
                // Arguments that came before the name go out now.
                if let Some((s, e, st)) = j.args.take() {
                    emit_args(&mut self.calls, out, &body[s..e], st);
                    j.sent = true;
                }
            }
        } else if is_args_key(&j.key) {
            if let Some(from) = j.stream_from.take() {
                self.calls.args(out, &body[from..end]);
                j.sent = true;
            } else if j.name.is_some() && !j.sent {
                emit_args(&mut self.calls, out, v, is_string);
                j.sent = true;
            } else if !j.sent {
                j.args = Some((j.vstart, end, is_string));
            }
        }
    }

    /// Closes the current call (at `</tool_call>` or the end of output).
    fn finalize(&mut self, truncated: bool, out: &mut Vec<Delta>) {
        let body = std::mem::take(&mut self.body);
        let js = std::mem::take(&mut self.js);
        if js.name.is_some() {
            self.calls.end(out, truncated);
        } else if !truncated {
            // The scanner did not see the usual shape: parse the whole body.
            match parse_whole(&body) {
                Some((name, args)) => {
                    self.calls.start(out, None, &name);
                    self.calls.args(out, &args);
                    self.calls.end(out, false);
                }
                // Neither a call nor nothing: reported as text, not dropped
                // silently (llama.cpp#24658).
                None => out.push(Delta::Content(body)),
            }
        }
        self.searched = 0;
    }

    fn run(&mut self, out: &mut Vec<Delta>) {
        loop {
            match self.st {
                St::Content => match scan(&self.buf, &[OPEN]) {
                    Scan::Found { at, .. } => {
                        out.push(Delta::Content(self.buf[..at].to_string()));
                        self.body = self.buf[at + OPEN.len()..].to_string();
                        self.buf.clear();
                        self.searched = 0;
                        self.js = Scanner::default();
                        self.st = St::Call;
                    }
                    Scan::Clear { safe } => {
                        out.push(Delta::Content(self.buf[..safe].to_string()));
                        self.buf.drain(..safe);
                        return;
                    }
                },
                St::Call => {
                    let from = rescan_start(&self.body, self.searched, &[CLOSE]);
                    match scan_from(&self.body, from, &[CLOSE]) {
                        Scan::Found { at, .. } => {
                            self.advance(at, out);
                            let rest = self.body[at + CLOSE.len()..].to_string();
                            self.body.truncate(at);
                            self.finalize(false, out);
                            self.buf = rest;
                            self.st = St::Content;
                        }
                        Scan::Clear { safe } => {
                            self.advance(safe, out);
                            self.searched = self.body.len();
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Sends arguments text; a JSON-encoded string value is decoded first
/// (some models write `"arguments": "{\"a\":1}"`).
fn emit_args(calls: &mut Calls, out: &mut Vec<Delta>, v: &str, is_string: bool) {
    if is_string {
        if let Ok(s) = serde_json::from_str::<String>(v) {
            return calls.args(out, &s);
        }
    }
    if v != "null" {
        calls.args(out, v);
    }
}

/// Name and arguments from a whole call body, for shapes the scanner skips.
fn parse_whole(body: &str) -> Option<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.to_string();
    let args = match o.get("arguments").or_else(|| o.get("parameters")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => String::new(),
        Some(a) => a.to_string(),
    };
    Some((name, args))
}

impl Stage for Hermes {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        match self.st {
            St::Content => self.buf.push_str(text),
            St::Call => self.body.push_str(text),
        }
        self.run(out);
    }

    fn finish(&mut self, truncated: bool, out: &mut Vec<Delta>) {
        match self.st {
            St::Content => out.push(Delta::Content(std::mem::take(&mut self.buf))),
            St::Call => {
                self.advance(self.body.len(), out);
                self.finalize(truncated, out);
            }
        }
        self.st = St::Content;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{Delta, OutputParser, ReasoningFormat, ToolFormat};

    fn hermes() -> impl Fn() -> Box<dyn OutputParser> {
        maker(
            Some(ToolFormat::Hermes),
            Some(ReasoningFormat::Think),
            false,
            true,
        )
    }

    #[test]
    fn keeps_final_brace_for_all_shapes() {
        // vllm#22885, #32152.
        for args in [
            "{\"a\": {\"b\": [1, {\"c\": 2}]}}",
            "{\"n\": 5}",
            "{\"ok\": true}",
            "{}",
            "{\"s\": \"}\\\"{\"}",
        ] {
            let text =
                format!("<tool_call>\n{{\"name\": \"f\", \"arguments\": {args}}}\n</tool_call>");
            let p = check(&hermes(), &text, false);
            assert_eq!(p, parsed(None, None, &[("call_t_0", "f", args)]), "{args}");
        }
    }

    #[test]
    fn repeated_calls_with_text_and_reasoning() {
        let text = "<think>\nneed two\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\": \"<tool>\"}}\n</tool_call>";
        let p = check(&hermes(), text, false);
        assert_eq!(
            p,
            parsed(
                Some("Sure."),
                Some("need two"),
                &[
                    ("call_t_0", "a", "{\"x\": 1}"),
                    ("call_t_1", "b", "{\"y\": \"<tool>\"}")
                ]
            )
        );
    }

    #[test]
    fn first_delta_has_name_then_args_only() {
        // vllm#19056: id+name once, then index+arguments.
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"abc\"}}\n</tool_call>";
        let ds = run(&hermes(), &splits(text)[1], false);
        let starts: Vec<_> = ds
            .iter()
            .filter(|d| matches!(d, Delta::ToolCallStart { .. }))
            .collect();
        assert_eq!(starts.len(), 1);
        let args = ds
            .iter()
            .filter(|d| matches!(d, Delta::ToolCallArgs { .. }))
            .count();
        assert!(args > 5, "arguments should stream: {ds:?}");
    }

    #[test]
    fn args_before_name_and_string_args() {
        let text = "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"b\\\": 2}\"}</tool_call><tool_call>{\"name\": \"h\"}</tool_call>";
        let p = check(&hermes(), text, false);
        assert_eq!(
            p,
            parsed(
                None,
                None,
                &[
                    ("call_t_0", "f", "{\"a\": 1}"),
                    ("call_t_1", "g", "{\"b\": 2}"),
                    ("call_t_2", "h", "{}")
                ]
            )
        );
    }

    #[test]
    fn truncated_and_broken_calls() {
        let text = "ok<tool_call>\n{\"name\": \"f\", \"arguments\": {\"input\": \"{\\\"key";
        assert_eq!(check(&hermes(), text, true), parsed(Some("ok"), None, &[]));
        // Missing `</tool_call>` at a natural end is still a call.
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}";
        assert_eq!(
            check(&hermes(), text, false),
            parsed(None, None, &[("call_t_0", "f", "{\"a\": 1}")])
        );
        // Garbage inside the tags is reported as content.
        let text = "<tool_call>not json</tool_call>";
        assert_eq!(
            check(&hermes(), text, false),
            parsed(Some("not json"), None, &[])
        );
    }

    #[test]
    fn tools_off_is_content() {
        let m = maker(Some(ToolFormat::Hermes), None, false, false);
        let text = "<tool_call>{\"name\": \"f\"}</tool_call>";
        assert_eq!(check(&m, text, false), parsed(Some(text), None, &[]));
    }

    #[test]
    fn call_inside_reasoning_ends_it() {
        let m = maker(
            Some(ToolFormat::Hermes),
            Some(ReasoningFormat::Think),
            true,
            true,
        );
        let text =
            "I should call f.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        assert_eq!(
            check(&m, text, false),
            parsed(None, Some("I should call f."), &[("call_t_0", "f", "{}")])
        );
    }
}
