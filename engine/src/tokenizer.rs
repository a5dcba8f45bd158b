//! Text ↔ token ids through the `tokenizers` crate.

/// A tokenizer (from `tokenizer.json` or a GGUF vocabulary).
#[derive(Clone, Debug)]
pub struct Tokenizer {
    /// The wrapped Hugging Face tokenizer.
    pub inner: tokenizers::Tokenizer,
}
