//! Incremental detokenization of a request's stream.

use super::request::StreamEvent;
use crate::tokenizer::{StreamDecoder, Tokenizer};
use anyhow::Result;

/// Turns a request's [`StreamEvent`]s into text deltas. A multi-byte character split across
/// tokens is held back until its last byte arrives (never a U+FFFD in the middle of a
/// character); the deltas of a whole stream concatenate to `tokenizer.decode(tokens)`.
/// Wraps [`Tokenizer::stream_decoder`], which decodes a short window of recent ids per token.
#[derive(Debug)]
pub struct TextStream<'t> {
    decoder: StreamDecoder<'t>,
}

impl<'t> TextStream<'t> {
    /// A detokenizer for one request; with `skip_special`, special tokens (EOS, `<|im_end|>`)
    /// produce no text.
    pub fn new(tokenizer: &'t Tokenizer, skip_special: bool) -> Self {
        Self {
            decoder: tokenizer.stream_decoder(skip_special),
        }
    }

    /// The text `event` completes: for a token, the characters it completes (often empty while
    /// a character is split); for the last event (`Finished` or `Error`), whatever was held
    /// back (an incomplete character at the very end as U+FFFD, as a full decode prints it).
    /// Errors: a token id outside the tokenizer's vocabulary.
    pub fn push(&mut self, event: &StreamEvent) -> Result<String> {
        match event {
            StreamEvent::Token { token, .. } => self.decoder.push(*token),
            StreamEvent::Finished { .. } | StreamEvent::Error(_) => self.decoder.finish(),
            StreamEvent::Prefill { .. } => Ok(String::new()),
        }
    }

    /// Every token id pushed so far.
    pub fn tokens(&self) -> &[u32] {
        self.decoder.ids()
    }
}
