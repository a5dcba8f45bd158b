//! One request's tokens and progress.

use crate::sampling::{Sampler, SamplingParams};

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// It produced an end-of-sequence token.
    Eos,
    /// It reached `max_tokens`.
    Length,
    /// It filled the model's context window before reaching `max_tokens`.
    ContextFull,
    /// The caller aborted it ([`crate::Engine::abort`]).
    Abort,
}

impl FinishReason {
    /// The name reported to users, after vLLM/OpenAI: `stop` (an end-of-sequence token),
    /// `length` (`max_tokens` reached) `context` (the context window is full) or `abort` (the caller aborted it).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "stop",
            FinishReason::Length => "length",
            FinishReason::ContextFull => "context",
            FinishReason::Abort => "abort",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request in flight.
pub struct Sequence {
    /// Caller-visible id.
    pub id: u64,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    /// Length of the prompt within `tokens`.
    pub prompt_len: usize,
    /// Tokens whose keys/values are in the cache.
    pub num_computed: usize,
    /// Physical cache blocks, in position order.
    pub blocks: Vec<u32>,
    /// State slot (per-sequence recurrent state) while running.
    pub slot: Option<u32>,
    /// Sampling settings.
    pub params: SamplingParams,
    /// This sequence's sampler.
    pub sampler: Sampler,
    /// Set when it stops.
    pub finished: Option<FinishReason>,
}

impl Sequence {
    /// A new sequence from prompt ids.
    pub fn new(id: u64, prompt: Vec<u32>, params: SamplingParams) -> Self {
        let sampler = Sampler::new(params.seed.wrapping_add(id));
        Self {
            id,
            prompt_len: prompt.len(),
            tokens: prompt,
            num_computed: 0,
            blocks: Vec::new(),
            slot: None,
            params,
            sampler,
            finished: None,
        }
    }

    /// The generated tokens so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}
