//! Qwen3-Coder XML tool calls (vLLM `qwen3_coder`/`qwen3_xml`, SGLang
//! `qwen3_coder_detector.py`):
//! `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n…</function>\n</tool_call>`.
//! Parameters become a JSON object. Without the tool schema a value is JSON
//! if it parses as JSON, else a string. A value whose first char cannot
//! start JSON is a string for sure and streams as it arrives (long file
//! contents must not wait, vllm#50604); other values are sent when their
//! parameter closes.

use super::markers::{scan, Scan};
use super::{Calls, Delta, Stage};

const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";
const FUNC_OPEN: &str = "<function=";
const FUNC_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";

/// Markers that open tool output (they also end reasoning).
pub(super) const OPENERS: &[&str] = &[TOOL_OPEN, FUNC_OPEN];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Content,
    /// Inside `<tool_call>`, outside a function.
    Call,
    FuncName,
    /// Inside a function, between parameters.
    Func,
    ParamName,
    /// A value, buffered.
    Param,
    /// A string value being streamed.
    ParamStr,
}

/// The Qwen3-Coder tool-call state machine.
pub(super) struct Qwen3Coder {
    st: St,
    buf: String,
    key: String,
    nparams: usize,
    /// Inside `<tool_call>` (so `</tool_call>` is expected).
    in_call: bool,
    calls: Calls,
}

/// A JSON string literal's inside (no quotes) for `s`.
fn escape(s: &str) -> String {
    let q = serde_json::to_string(s).unwrap_or_default();
    q[1..q.len() - 1].to_string()
}

/// `v` without the newline the template puts after `>` and before `</`.
fn strip_nl(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

impl Qwen3Coder {
    pub(super) fn new(calls: Calls) -> Self {
        Qwen3Coder {
            st: St::Content,
            buf: String::new(),
            key: String::new(),
            nparams: 0,
            in_call: false,
            calls,
        }
    }

    fn key_prefix(&mut self) -> String {
        let sep = if self.nparams == 0 { "{" } else { ", " };
        self.nparams += 1;
        let k = serde_json::to_string(&self.key).unwrap_or_default();
        format!("{sep}{k}: ")
    }

    fn end_func(&mut self, out: &mut Vec<Delta>, truncated: bool) {
        if self.nparams > 0 && !truncated {
            self.calls.args(out, "}");
        }
        self.calls.end(out, truncated);
    }

    /// After `</function>`/`</tool_call>`/a new parameter ended a value.
    fn after(&mut self, m: &str, out: &mut Vec<Delta>) {
        match m {
            PARAM_CLOSE => self.st = St::Func,
            PARAM_OPEN => self.st = St::ParamName,
            FUNC_CLOSE => {
                self.end_func(out, false);
                self.st = if self.in_call { St::Call } else { St::Content };
            }
            _ => {
                self.end_func(out, false);
                self.in_call = false;
                self.st = St::Content;
            }
        }
    }

    fn run(&mut self, out: &mut Vec<Delta>) {
        const VALUE_END: [&str; 4] = [PARAM_CLOSE, PARAM_OPEN, FUNC_CLOSE, TOOL_CLOSE];
        loop {
            match self.st {
                St::Content | St::Call => {
                    let markers: &[&str] = if self.st == St::Content {
                        OPENERS
                    } else {
                        &[FUNC_OPEN, TOOL_CLOSE]
                    };
                    match scan(&self.buf, markers) {
                        Scan::Found { at, which } => {
                            if self.st == St::Content {
                                out.push(Delta::Content(self.buf[..at].to_string()));
                            }
                            let m = markers[which];
                            self.buf.drain(..at + m.len());
                            self.st = match m {
                                TOOL_OPEN => {
                                    self.in_call = true;
                                    St::Call
                                }
                                FUNC_OPEN => St::FuncName,
                                _ => {
                                    self.in_call = false;
                                    St::Content
                                }
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
                St::FuncName | St::ParamName => {
                    let Some(gt) = self.buf.find('>') else { return };
                    let name = self.buf[..gt].trim().to_string();
                    self.buf.drain(..gt + 1);
                    if self.st == St::FuncName {
                        self.calls.start(out, None, &name);
                        self.nparams = 0;
                        self.st = St::Func;
                    } else {
                        self.key = name;
                        self.st = St::Param;
                    }
                }
                St::Func => {
                    let markers = [PARAM_OPEN, FUNC_CLOSE, TOOL_CLOSE];
                    match scan(&self.buf, &markers) {
                        Scan::Found { at, which } => {
                            self.buf.drain(..at + markers[which].len());
                            self.after(markers[which], out);
                        }
                        Scan::Clear { safe } => {
                            self.buf.drain(..safe);
                            return;
                        }
                    }
                }
                St::Param => match scan(&self.buf, &VALUE_END) {
                    Scan::Found { at, which } => {
                        let v = strip_nl(&self.buf[..at]).to_string();
                        self.buf.drain(..at + VALUE_END[which].len());
                        let p = self.key_prefix();
                        self.calls.args(out, &p);
                        self.calls.args(out, &json_value(&v));
                        self.after(VALUE_END[which], out);
                    }
                    Scan::Clear { .. } => {
                        let v = self.buf.strip_prefix('\n').unwrap_or(&self.buf);
                        match v.chars().next() {
                            Some(c) if !"{[\"-0123456789tfn".contains(c) => {
                                let skip = self.buf.len() - v.len();
                                self.buf.drain(..skip);
                                let p = self.key_prefix();
                                self.calls.args(out, &p);
                                self.calls.args(out, "\"");
                                self.st = St::ParamStr;
                            }
                            _ => return,
                        }
                    }
                },
                St::ParamStr => match scan(&self.buf, &VALUE_END) {
                    Scan::Found { at, which } => {
                        let v = self.buf[..at].strip_suffix('\n').unwrap_or(&self.buf[..at]);
                        let s = escape(v);
                        self.buf.drain(..at + VALUE_END[which].len());
                        self.calls.args(out, &s);
                        self.calls.args(out, "\"");
                        self.after(VALUE_END[which], out);
                    }
                    Scan::Clear { safe } => {
                        // Keep a last `\n`: it may be the template's, before `</parameter>`.
                        let mut n = safe;
                        if self.buf[..n].ends_with('\n') {
                            n -= 1;
                        }
                        let s = escape(&self.buf[..n]);
                        self.calls.args(out, &s);
                        self.buf.drain(..n);
                        return;
                    }
                },
            }
        }
    }
}

/// A parameter value as JSON: itself when it parses, else a JSON string.
fn json_value(v: &str) -> String {
    if serde_json::from_str::<serde_json::Value>(v.trim()).is_ok() {
        v.trim().to_string()
    } else {
        serde_json::to_string(v).unwrap_or_default()
    }
}

impl Stage for Qwen3Coder {
    fn push(&mut self, text: &str, out: &mut Vec<Delta>) {
        self.buf.push_str(text);
        self.run(out);
    }

    fn finish(&mut self, truncated: bool, out: &mut Vec<Delta>) {
        let b = std::mem::take(&mut self.buf);
        match self.st {
            St::Content => out.push(Delta::Content(b)),
            St::Call | St::FuncName => {}
            St::Func | St::ParamName => self.end_func(out, truncated),
            St::Param => {
                if !truncated {
                    let p = self.key_prefix();
                    self.calls.args(out, &p);
                    self.calls.args(out, &json_value(strip_nl(&b)));
                }
                self.end_func(out, truncated);
            }
            St::ParamStr => {
                if !truncated {
                    let v = b.strip_suffix('\n').unwrap_or(&b);
                    let s = escape(v);
                    self.calls.args(out, &s);
                    self.calls.args(out, "\"");
                }
                self.end_func(out, truncated);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::{Delta, OutputParser, ReasoningFormat, ToolFormat};

    fn coder() -> impl Fn() -> Box<dyn OutputParser> {
        maker(
            Some(ToolFormat::Qwen3Coder),
            Some(ReasoningFormat::Think),
            false,
            true,
        )
    }

    #[test]
    fn golden() {
        let text = "Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.txt\n</parameter>\n<parameter=content>\nline1\n\"q\" <b>\n</parameter>\n<parameter=mode>\n420\n</parameter>\n<parameter=flags>\n{\"x\": true}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=ls>\n</function>\n</tool_call>";
        let p = check(&coder(), text, false);
        assert_eq!(
            p,
            parsed(
                Some("Writing it."),
                None,
                &[
                    (
                        "call_t_0",
                        "write_file",
                        "{\"path\": \"/tmp/a.txt\", \"content\": \"line1\\n\\\"q\\\" <b>\", \"mode\": 420, \"flags\": {\"x\": true}}"
                    ),
                    ("call_t_1", "ls", "{}")
                ]
            )
        );
    }

    #[test]
    fn string_values_stream_and_truncation_drops() {
        let mut p = coder()();
        p.push("<tool_call>\n<function=w>\n<parameter=content>\n");
        let d = p.push("Hello long text");
        assert!(
            d.iter().any(|d| matches!(d, Delta::ToolCallArgs { .. })),
            "{d:?}"
        );
        let text = "<tool_call>\n<function=w>\n<parameter=content>\nHello";
        assert_eq!(check(&coder(), text, true), parsed(None, None, &[]));
    }
}
