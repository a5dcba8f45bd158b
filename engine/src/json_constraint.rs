//! Constrained decoding to one JSON object (OpenAI's `response_format: {"type": "json_object"}`):
//! before each sample, every token whose text cannot continue a valid JSON text (RFC 8259) is
//! removed, and end-of-sequence is allowed only once the object is closed. The recognizer is a
//! byte-level pushdown automaton over a prefix; each vocabulary token's text is precomputed once
//! per tokenizer ([`TokenTable`]).
//!
//! Cost per step: one pass over the vocabulary, feeding each token's bytes to a copy of the
//! state (a few milliseconds for 150K tokens); the rows are sampled on the host.

use crate::sampling::LogitsProcessor;
use crate::tokenizer::Tokenizer;
use std::sync::Arc;

/// Most whitespace bytes in a row outside strings: without a cap a model may emit blanks
/// forever instead of closing the object.
const MAX_WHITESPACE_RUN: usize = 16;

/// Each token's text as bytes, `None` for tokens that have none usable (special tokens, pieces
/// of a UTF-8 character).
#[derive(Debug)]
pub struct TokenTable {
    texts: Vec<Option<Box<[u8]>>>,
}

impl TokenTable {
    /// Reads every token's text from `tok` for a vocabulary of `vocab` ids. A token is decoded
    /// after an anchor token and the anchor's text removed, so tokenizers that drop a leading
    /// space at the start of a text (SentencePiece's `▁`) still give the space.
    pub fn new(tok: &Tokenizer, vocab: usize) -> Self {
        let anchor = ["{", "0", "a"].iter().find_map(|s| tok.token_to_id(s));
        let base = anchor.and_then(|a| tok.decode(&[a], false).ok());
        let texts = (0..vocab as u32)
            .map(|id| {
                let text = match (anchor, &base) {
                    (Some(a), Some(b)) => tok
                        .decode(&[a, id], false)
                        .ok()
                        .and_then(|t| t.strip_prefix(b.as_str()).map(str::to_string)),
                    _ => tok.decode(&[id], false).ok(),
                }?;
                let special = tok.id_to_token(id).is_some_and(|t| {
                    t == text && t.starts_with('<') && t.ends_with('>') && t.len() > 2
                });
                (!text.is_empty() && !text.contains('\u{FFFD}') && !special)
                    .then(|| text.into_bytes().into_boxed_slice())
            })
            .collect();
        Self { texts }
    }

    /// A table from given texts (tests).
    pub fn from_texts(texts: Vec<Option<&str>>) -> Self {
        Self {
            texts: texts
                .into_iter()
                .map(|t| t.map(|s| s.as_bytes().to_vec().into_boxed_slice()))
                .collect(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frame {
    Object,
    Array,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the top-level value (only `{` or whitespace).
    Start,
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `:` or `,` in an array: a value.
    Value,
    /// After `[`: a value or `]`.
    ValueOrEnd,
    /// After a value: `,` or the container's end.
    AfterValue,
    /// Inside a string (a key when `key`).
    Str { key: bool },
    /// After `\` in a string.
    Escape { key: bool },
    /// Inside `\uXXXX`, `left` hex digits to go.
    Hex { key: bool, left: u8 },
    /// Inside a number.
    Num(Num),
    /// Inside `true`/`false`/`null`: `word[at..]` must follow.
    Lit { word: &'static [u8], at: u8 },
    /// The top-level object is closed.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Num {
    /// Whether a number may end here.
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }
}

/// A JSON text's prefix: whether bytes so far can still become one JSON object.
#[derive(Clone, Debug)]
pub struct JsonPrefix {
    stack: Vec<Frame>,
    state: State,
    whitespace: usize,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        Self {
            stack: Vec::new(),
            state: State::Start,
            whitespace: 0,
        }
    }
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

impl JsonPrefix {
    /// Whether the object is complete (end-of-sequence is allowed).
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Feeds bytes; `false` (and an unspecified state) when they cannot continue a JSON object.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.byte(b))
    }

    /// The state a value's end leads to.
    fn after_value(&mut self) -> State {
        if self.stack.is_empty() {
            State::Done
        } else {
            State::AfterValue
        }
    }

    fn open_value(&mut self, b: u8) -> bool {
        self.state = match b {
            b'{' => {
                self.stack.push(Frame::Object);
                State::KeyOrEnd
            }
            b'[' => {
                self.stack.push(Frame::Array);
                State::ValueOrEnd
            }
            b'"' => State::Str { key: false },
            b'-' => State::Num(Num::Minus),
            b'0' => State::Num(Num::Zero),
            b'1'..=b'9' => State::Num(Num::Int),
            b't' => State::Lit {
                word: b"true",
                at: 1,
            },
            b'f' => State::Lit {
                word: b"false",
                at: 1,
            },
            b'n' => State::Lit {
                word: b"null",
                at: 1,
            },
            _ => return false,
        };
        true
    }

    fn close(&mut self, b: u8) -> bool {
        let want = match b {
            b'}' => Frame::Object,
            b']' => Frame::Array,
            _ => return false,
        };
        if self.stack.pop() != Some(want) {
            return false;
        }
        self.state = self.after_value();
        true
    }

    fn byte(&mut self, b: u8) -> bool {
        let structural = !matches!(
            self.state,
            State::Str { .. } | State::Escape { .. } | State::Hex { .. }
        );
        if structural && is_ws(b) && !matches!(self.state, State::Num(_) | State::Lit { .. }) {
            self.whitespace += 1;
            return self.whitespace <= MAX_WHITESPACE_RUN && self.state != State::Done;
        }
        self.whitespace = 0;
        match self.state {
            State::Start => {
                if b != b'{' {
                    return false;
                }
                self.stack.push(Frame::Object);
                self.state = State::KeyOrEnd;
                true
            }
            State::KeyOrEnd | State::Key => match b {
                b'"' => {
                    self.state = State::Str { key: true };
                    true
                }
                b'}' if self.state == State::KeyOrEnd => self.close(b),
                _ => false,
            },
            State::Colon => {
                self.state = State::Value;
                b == b':'
            }
            State::Value => self.open_value(b),
            State::ValueOrEnd => {
                if b == b']' {
                    self.close(b)
                } else {
                    self.open_value(b)
                }
            }
            State::AfterValue => match (b, self.stack.last()) {
                (b',', Some(Frame::Object)) => {
                    self.state = State::Key;
                    true
                }
                (b',', Some(Frame::Array)) => {
                    self.state = State::Value;
                    true
                }
                (b'}' | b']', _) => self.close(b),
                _ => false,
            },
            State::Str { key } => {
                match b {
                    b'"' => {
                        self.state = if key {
                            State::Colon
                        } else {
                            self.after_value()
                        }
                    }
                    b'\\' => self.state = State::Escape { key },
                    0..=0x1f => return false,
                    _ => {}
                }
                true
            }
            State::Escape { key } => {
                self.state = match b {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => State::Str { key },
                    b'u' => State::Hex { key, left: 4 },
                    _ => return false,
                };
                true
            }
            State::Hex { key, left } => {
                if !b.is_ascii_hexdigit() {
                    return false;
                }
                self.state = if left == 1 {
                    State::Str { key }
                } else {
                    State::Hex {
                        key,
                        left: left - 1,
                    }
                };
                true
            }
            State::Num(n) => {
                let next = match (n, b) {
                    (Num::Minus, b'0') => Some(Num::Zero),
                    (Num::Minus, b'1'..=b'9') => Some(Num::Int),
                    (Num::Int, b'0'..=b'9') => Some(Num::Int),
                    (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
                    (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
                    (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::E),
                    (Num::E, b'+' | b'-') => Some(Num::ESign),
                    (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Some(Num::Exp),
                    _ => None,
                };
                match next {
                    Some(n) => {
                        self.state = State::Num(n);
                        true
                    }
                    // The number ends here; the byte belongs to what follows it.
                    None if n.complete() => {
                        self.state = self.after_value();
                        self.byte(b)
                    }
                    None => false,
                }
            }
            State::Lit { word, at } => {
                if word.get(at as usize) != Some(&b) {
                    return false;
                }
                self.state = if at as usize + 1 == word.len() {
                    self.after_value()
                } else {
                    State::Lit { word, at: at + 1 }
                };
                true
            }
            State::Done => false,
        }
    }
}

/// The [`LogitsProcessor`] of `response_format: json_object`: the answer is one JSON object.
#[derive(Debug)]
pub struct JsonObjectProcessor {
    table: Arc<TokenTable>,
    eos: Vec<u32>,
    state: JsonPrefix,
    seen: usize,
}

impl JsonObjectProcessor {
    /// A processor over `table`; `eos` are the ids that end the answer (allowed only once the
    /// object is closed).
    pub fn new(table: Arc<TokenTable>, eos: Vec<u32>) -> Self {
        Self {
            table,
            eos,
            state: JsonPrefix::default(),
            seen: 0,
        }
    }
}

impl LogitsProcessor for JsonObjectProcessor {
    fn apply(&mut self, generated: &[u32], logits: &mut [f32]) {
        for &t in &generated[self.seen.min(generated.len())..] {
            if let Some(Some(b)) = self.table.texts.get(t as usize) {
                self.state.feed(b);
            }
        }
        self.seen = generated.len();
        let done = self.state.is_done();
        let mut any = false;
        for (id, l) in logits.iter_mut().enumerate() {
            let ok = if self.eos.contains(&(id as u32)) {
                done
            } else if done {
                false
            } else {
                match self.table.texts.get(id) {
                    Some(Some(b)) => self.state.clone().feed(b),
                    _ => false,
                }
            };
            if ok {
                any |= l.is_finite();
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        if !any {
            // Nothing can continue (an impossible vocabulary): end rather than sample garbage.
            for &e in &self.eos {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = 0.0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_prefix(s: &str) -> bool {
        JsonPrefix::default().feed(s.as_bytes())
    }

    #[test]
    fn accepts_json_object_prefixes_and_completion() {
        for s in [
            "{",
            "{}",
            r#"{"a": 1, "b": [true, false, null, -0.5e+3, "x\"\u00e9"], "c": {"d": []}}"#,
            r#" {"k":"v"}"#,
            r#"{"n": 12"#,
        ] {
            assert!(valid_prefix(s), "{s}");
        }
        let mut p = JsonPrefix::default();
        assert!(p.feed(br#"{"a": [1, {"b": 2}]}"#));
        assert!(p.is_done());
        let mut p = JsonPrefix::default();
        assert!(p.feed(br#"{"a": 10"#));
        assert!(!p.is_done());
    }

    #[test]
    fn rejects_what_cannot_become_an_object() {
        for s in [
            "[1]",
            "\"s\"",
            "1",
            "{a",
            "{\"a\" 1",
            "{\"a\":}",
            "{\"a\":01",
            "{\"a\":1,}",
            "{\"a\":[1,]",
            "{\"a\":tru e",
            "{}}",
            "{} x",
            "{\"a\":\"\u{1}\"",
            "{\"a\":1]",
            "{\"\\x\"",
            "{\"a\":-}",
        ] {
            assert!(!valid_prefix(s), "{s:?}");
        }
        let blanks = format!("{{{}", " ".repeat(MAX_WHITESPACE_RUN + 1));
        assert!(!valid_prefix(&blanks));
    }

    #[test]
    fn processor_masks_tokens_and_allows_eos_only_when_closed() {
        let texts = vec![
            Some("{"),
            Some("}"),
            Some("\"a\""),
            Some(":"),
            Some("1"),
            Some("x"),
            None, // EOS
            Some("[]"),
        ];
        let table = Arc::new(TokenTable::from_texts(texts));
        let mut p = JsonObjectProcessor::new(table, vec![6]);
        let allowed = |p: &mut JsonObjectProcessor, generated: &[u32]| -> Vec<usize> {
            let mut l = vec![0.0f32; 8];
            p.apply(generated, &mut l);
            (0..8).filter(|&i| l[i].is_finite()).collect()
        };
        assert_eq!(allowed(&mut p, &[]), vec![0]);
        assert_eq!(allowed(&mut p, &[0]), vec![1, 2]);
        assert_eq!(allowed(&mut p, &[0, 2]), vec![3]);
        assert_eq!(allowed(&mut p, &[0, 2, 3]), vec![0, 2, 4, 7]);
        assert_eq!(allowed(&mut p, &[0, 2, 3, 4]), vec![1, 4]);
        assert_eq!(allowed(&mut p, &[0, 2, 3, 4, 1]), vec![6]);
    }
}
