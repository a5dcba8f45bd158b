//! Text ↔ token ids through the `tokenizers` crate.
//!
//! A [`Tokenizer`] comes from a `tokenizer.json` ([`Tokenizer::from_file`]) or from the
//! vocabulary stored in a GGUF file's metadata (built by the GGUF loader with
//! [`Tokenizer::from_gpt2_vocab`]). [`StreamDecoder`] turns generated ids into text piece by
//! piece without ever splitting a UTF-8 character.

use anyhow::{anyhow, bail, Result};
use std::path::Path;

/// A tokenizer (from `tokenizer.json` or a GGUF vocabulary).
///
/// For a raw prompt, call `encode(text, false)` and prepend the checkpoint's BOS id when
/// [`crate::loader::TokenizerAssets::add_bos`] is set (equivalently `encode(text, true)`, whose
/// post-processor adds BOS for tokenizers that want it). For a rendered chat template call
/// `encode(text, false)`: the template prints its special tokens itself and they are parsed
/// back as single ids.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    /// The wrapped Hugging Face tokenizer.
    pub inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Loads a `tokenizer.json`. Errors name the file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            // Valid JSON of another layout makes the library report a syntax error at the first
            // unexpected key; say what is missing instead.
            let layout = std::fs::read(path)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .filter(|v| v.get("model").is_none());
            match layout {
                Some(_) => anyhow!(
                    "{}: invalid tokenizer file: valid JSON but no `model` field (expected a Hugging Face tokenizers file with `model`, `added_tokens`, `normalizer`, …)",
                    path.display()
                ),
                None => anyhow!("{}: invalid tokenizer file: {e}", path.display()),
            }
        })?;
        Ok(Self { inner })
    }

    /// Wraps an already built `tokenizers` tokenizer.
    pub fn from_inner(inner: tokenizers::Tokenizer) -> Self {
        Self { inner }
    }

    /// Token ids of `text`. With `add_special_tokens`, the tokenizer's post-processor runs
    /// (e.g. adds BOS for tokenizers configured to). Special tokens written in the text
    /// (`<|im_start|>`) always become their single ids.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| anyhow!("tokenizer: cannot encode text: {e}"))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; with `skip_special`, special tokens (BOS, `<|im_end|>`, …) are left out.
    /// Ids outside the vocabulary are an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        let n = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= n) {
            bail!("tokenizer: token id {bad} is outside the vocabulary (size {n})");
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| anyhow!("tokenizer: cannot decode ids: {e}"))
    }

    /// Id of a token string (a vocabulary entry or an added/special token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Token string of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// A streaming detokenizer over this tokenizer.
    pub fn stream_decoder(&self, skip_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special)
    }

    /// Builds a byte-level BPE tokenizer (GPT-2 family) from a GGUF-style vocabulary:
    /// `tokens[i]` is the byte-level string of id `i`, `merges` are `"left right"` pairs in
    /// priority order, `token_types[i]` follows llama.cpp (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte). Control tokens become special added tokens and
    /// user-defined ones plain added tokens, so they encode as single ids.
    /// `pre` is llama.cpp's pre-tokenizer name (`tokenizer.ggml.pre`); when `add_bos` is set the
    /// post-processor prepends `bos_id` for `encode(text, true)`.
    pub fn from_gpt2_vocab(
        tokens: &[String],
        merges: &[String],
        token_types: &[i32],
        pre: &str,
        bos_id: Option<u32>,
        add_bos: bool,
    ) -> Result<Self> {
        crate::loader::gguf_tokenizer::build_gpt2(tokens, merges, token_types, pre, bos_id, add_bos)
            .map(Self::from_inner)
    }
}

/// Streaming detokenizer: push generated ids one at a time and get back the text they
/// complete. A piece is only released once it decodes to whole characters (no U+FFFD from a
/// partial UTF-8 sequence at its end), and the concatenation of every piece plus
/// [`StreamDecoder::finish`] equals `decode(all_ids)`.
///
/// It decodes a short window of recent ids rather than the whole sequence, so each push costs
/// O(window), not O(length).
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the decoding window: ids before it are settled.
    prefix: usize,
    /// Ids before `read` have had their text emitted.
    read: usize,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder with no ids yet.
    pub fn new(tok: &'t Tokenizer, skip_special: bool) -> Self {
        Self {
            tok,
            skip_special,
            ids: Vec::new(),
            prefix: 0,
            read: 0,
        }
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Adds one id; returns the newly completed text (often empty while a multi-byte
    /// character is split across tokens).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let before = self
            .tok
            .decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let now = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.starts_with(&before) {
            let piece = now[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(piece)
        } else {
            Ok(String::new())
        }
    }

    /// Adds several ids; returns the text they complete.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(id)?);
        }
        Ok(out)
    }

    /// Text still held back (an incomplete character at the end is released as U+FFFD, as the
    /// full decode would print it). Call once generation ends.
    pub fn finish(&mut self) -> Result<String> {
        let before = self
            .tok
            .decode(&self.ids[self.prefix..self.read], self.skip_special)?;
        let now = self
            .tok
            .decode(&self.ids[self.prefix..], self.skip_special)?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        match now.strip_prefix(&before) {
            Some(rest) => Ok(rest.to_string()),
            None => Ok(now.get(before.len()..).unwrap_or("").to_string()),
        }
    }
}

/// Reads an optional tokenizer file: `Ok(None)` when absent.
pub(crate) fn load_optional(path: &Path) -> Result<Option<Tokenizer>> {
    if !path.is_file() {
        return Ok(None);
    }
    // `from_file` names the file already.
    Tokenizer::from_file(path).map(Some)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bad_tokenizer_file_is_named_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer.json");
        std::fs::write(&p, "{not json").unwrap();
        let e = format!("{:#}", super::load_optional(&p).unwrap_err());
        let shown = p.display().to_string();
        assert_eq!(e.matches(&shown).count(), 1, "{e}");
        assert!(
            e.starts_with(&format!("{shown}: invalid tokenizer file: ")),
            "{e}"
        );
    }

    #[test]
    fn json_of_another_layout_says_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokenizer.json");
        std::fs::write(&p, r#"{"hello": 1}"#).unwrap();
        let e = format!("{:#}", super::load_optional(&p).unwrap_err());
        assert!(e.contains("no `model` field"), "{e}");
    }
}
