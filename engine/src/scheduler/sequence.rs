//! One request's tokens and progress.

use crate::cache::prefix::{BlockHash, ExtraKeys};
use crate::sampling::{Sampler, SamplingParams};
use std::time::Instant;

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
    /// What besides token ids names its cached blocks (salt, image hashes).
    pub extra_keys: ExtraKeys,
    /// Hashes of its full blocks of known tokens, in position order (prefix caching).
    pub block_hashes: Vec<BlockHash>,
    /// Leading blocks already named in the prefix cache (in use by this sequence).
    pub num_registered: usize,
    /// Prompt tokens found in the cache when it was first admitted (`cached_tokens` in usage).
    pub cached_tokens: Option<usize>,
    /// Where its prompt leaves the longest cached prefix of per-token caches, in tokens: a
    /// recurrent-state checkpoint is taken there (the shared-prefix junction) when the state
    /// had to be recomputed from an earlier point.
    pub junction: usize,
    /// Waits in the long-request queue (prompt above `long_prefill_threshold`).
    pub long: bool,
    /// When it was queued.
    pub arrival: Instant,
    /// When it was first scheduled.
    pub first_scheduled: Option<Instant>,
    /// When its first token was sampled.
    pub first_token: Option<Instant>,
    /// When its latest token was sampled.
    pub last_token: Option<Instant>,
    /// Set while it waits swapped out to the host tier.
    pub swapped: Option<Swapped>,
    /// Masks its logits before each sample (constrained decoding), when set.
    pub processor: Option<Box<dyn crate::sampling::LogitsProcessor>>,
}

/// A sequence's cache and state held in the host tier while it is preempted.
#[derive(Clone, Debug)]
pub struct Swapped {
    /// Bytes reserved for it in the host tier.
    pub bytes: u64,
    /// Its blocks' bytes (per block tensor) then its state (per state tensor), once the engine
    /// has copied them; `None` until then.
    pub rows: Option<crate::cache::HostRows>,
}

impl Sequence {
    /// A new sequence from prompt ids.
    pub fn new(id: u64, prompt: Vec<u32>, params: SamplingParams) -> Self {
        // The seed alone (not the engine-wide id): the same request samples the same tokens
        // whenever it is sent (a server's `seed`); callers give each of `n` choices its own seed.
        let sampler = Sampler::new(params.seed);
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
            extra_keys: ExtraKeys::default(),
            block_hashes: Vec::new(),
            num_registered: 0,
            cached_tokens: None,
            junction: 0,
            long: false,
            arrival: Instant::now(),
            first_scheduled: None,
            first_token: None,
            last_token: None,
            swapped: None,
            processor: None,
        }
    }

    /// Whether prompt tokens remain to be computed.
    pub fn prefilling(&self) -> bool {
        self.num_computed < self.prompt_len
    }

    /// The generated tokens so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
}
