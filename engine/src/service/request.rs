//! What goes into the service (a [`Request`]) and what comes back ([`StreamEvent`]s on a
//! [`RequestStream`], or a [`Completion`] once the stream has ended).

use super::status::Shared;
use crate::sampling::LogitsProcessor;
use crate::sampling::SamplingParams;
use crate::scheduler::FinishReason;
use anyhow::{anyhow, bail, Result};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A generation request: prompt token ids and how to sample them.
#[derive(Clone, Debug, Default)]
pub struct Request {
    /// Prompt token ids: at least one, each below the model's vocabulary size.
    pub prompt: Vec<u32>,
    /// Sampling and stopping rules (validated by the engine).
    pub params: SamplingParams,
    /// Keeps this request's prefix-cache entries apart from requests with another salt (vLLM's
    /// `cache_salt`, one per tenant). Carried for the prefix cache; the engine does not read it
    /// yet.
    pub cache_salt: Option<String>,
    /// Constrained decoding: masks the logits before each sample (taken by the engine once).
    pub processor: ProcessorCell,
    /// Send [`StreamEvent::Prefill`] after each engine step until the first token (a progress
    /// bar over a long prompt).
    pub report_prefill: bool,
    /// Send the step's full logits row (f32, `[vocab_size]`, before any logits processor or
    /// sampling) with each [`StreamEvent::Token`] (`dayone check` compares them across
    /// backends). Costs a device→host copy of the step's logits while such a request runs.
    pub return_logits: bool,
    /// Score the prompt (vLLM's `prompt_logprobs`): `Some(k)` computes the logits row of every
    /// prompt position and sends, with [`StreamEvent::Finished`], each prompt token's
    /// log-probability given the tokens before it plus the `k` most likely tokens there
    /// (`k ≥ vocab_size`: all). Such a request skips the prefix cache (a cached prefix has no
    /// logits) and its prompt may fill the whole context window ([`crate::Engine::add_request_scored`]).
    pub prompt_logprobs: Option<usize>,
    /// Images of the prompt, one per image placeholder of the model (Kimi: `<|media_pad|>`) in
    /// `prompt`, in order ([`crate::Engine::add_request_with_images`]). Decoded RGB, shared.
    pub images: Vec<Arc<crate::vision::RgbImage>>,
}

/// A [`LogitsProcessor`] travelling with a [`Request`] to the engine thread, which takes it
/// once; empty by default. Clones share the one processor.
#[derive(Clone, Default)]
pub struct ProcessorCell(Arc<Mutex<Option<Box<dyn LogitsProcessor>>>>);

impl ProcessorCell {
    /// A cell holding `p`.
    pub fn new(p: Box<dyn LogitsProcessor>) -> Self {
        Self(Arc::new(Mutex::new(Some(p))))
    }

    /// The processor, once (`None` after the first call, or when empty).
    pub fn take(&self) -> Option<Box<dyn LogitsProcessor>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl std::fmt::Debug for ProcessorCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProcessorCell")
    }
}

impl Request {
    /// A request without a cache salt.
    pub fn new(prompt: Vec<u32>, params: SamplingParams) -> Self {
        Self {
            prompt,
            params,
            cache_salt: None,
            processor: ProcessorCell::default(),
            report_prefill: false,
            return_logits: false,
            prompt_logprobs: None,
            images: Vec::new(),
        }
    }
}

/// When a request arrived, produced its first token and ended, on the monotonic clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestTiming {
    /// When [`super::EngineHandle::submit`] was called.
    pub arrival: Instant,
    /// When the first generated token left the engine (`None`: aborted or failed before it).
    pub first_token: Option<Instant>,
    /// When the request finished.
    pub finished: Instant,
}

impl RequestTiming {
    /// Time to first token: first token − arrival.
    pub fn ttft(&self) -> Option<Duration> {
        self.first_token.map(|t| t - self.arrival)
    }

    /// End-to-end latency: finish − arrival.
    pub fn e2e(&self) -> Duration {
        self.finished - self.arrival
    }

    /// Time per output token after the first, as `vllm bench serve` defines it:
    /// (finish − first token) / (`generated_tokens` − 1); `None` below two tokens.
    pub fn tpot(&self, generated_tokens: usize) -> Option<Duration> {
        let first = self.first_token?;
        let n = u32::try_from(generated_tokens.checked_sub(1)?).ok()?;
        (n > 0).then(|| (self.finished - first) / n)
    }
}

/// One event of a request's stream. A stream is zero or more `Token`s followed by exactly one
/// `Finished` or `Error`.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamEvent {
    /// A generated token (an end-of-sequence token too, when it stops the request).
    Token {
        /// The token id.
        token: u32,
        /// Its position among the generated tokens (0 for the first).
        index: usize,
        /// When the engine produced it (tokens of one engine step share it); the gaps between
        /// consecutive tokens are the inter-token latencies.
        time: Instant,
        /// Its log-probability and top alternatives, when the request's
        /// [`SamplingParams::logprobs`] asked for them.
        logprobs: Option<crate::sampling::TokenLogprobs>,
        /// The logits row this token was sampled from, when the request's
        /// [`Request::return_logits`] asked for it.
        logits: Option<Arc<Vec<f32>>>,
    },
    /// Prefill progress after an engine step (only with [`Request::report_prefill`], and only
    /// before the first token).
    Prefill {
        /// Prompt tokens computed (cache hits included).
        computed: usize,
        /// Prompt tokens.
        total: usize,
    },
    /// The request ended normally or was aborted ([`FinishReason::Abort`]); its cache blocks and
    /// state slot are already free.
    Finished {
        /// Why it stopped.
        reason: FinishReason,
        /// Prompt length in tokens.
        prompt_tokens: usize,
        /// Prompt tokens served from the prefix cache (usage
        /// `prompt_tokens_details.cached_tokens`).
        cached_tokens: usize,
        /// Tokens generated (the `Token` events sent).
        generated_tokens: usize,
        /// Arrival, first token and finish times.
        timing: RequestTiming,
        /// With [`Request::prompt_logprobs`]: entry `i` scores prompt token `i + 1` given prompt
        /// tokens `0..=i` (`prompt_tokens − 1` entries; `None` when aborted before the prompt
        /// was computed, or not asked for).
        prompt_logprobs: Option<Arc<Vec<crate::sampling::TokenLogprobs>>>,
    },
    /// The engine failed (the message says why) and stopped; no more events follow, and the
    /// service refuses new requests.
    Error(String),
}

impl StreamEvent {
    /// Whether no event follows this one.
    pub fn is_last(&self) -> bool {
        !matches!(
            self,
            StreamEvent::Token { .. } | StreamEvent::Prefill { .. }
        )
    }
}

/// The events of one submitted request, as they are produced.
///
/// Dropping a stream before its last event aborts the request (a server does that when its
/// client disconnects): the engine frees its cache blocks and state slot before its next step.
/// Also an [`Iterator`] over the events (blocking, ends after the last one).
pub struct RequestStream {
    id: u64,
    events: Receiver<StreamEvent>,
    service: Arc<Shared>,
    ended: bool,
}

impl RequestStream {
    pub(super) fn new(id: u64, events: Receiver<StreamEvent>, service: Arc<Shared>) -> Self {
        Self {
            id,
            events,
            service,
            ended: false,
        }
    }

    /// The request's id (what [`super::EngineHandle::abort`] takes).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event, waiting for it; `None` once the last event has been returned.
    pub fn recv(&mut self) -> Option<StreamEvent> {
        if self.ended {
            return None;
        }
        let event = self.events.recv().unwrap_or_else(|_| self.lost());
        Some(self.note(event))
    }

    /// The next event, waiting at most `timeout`; `Ok(None)` once the last event has been
    /// returned. Errors: nothing arrived within `timeout` (the request keeps running).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<StreamEvent>> {
        if self.ended {
            return Ok(None);
        }
        let event = match self.events.recv_timeout(timeout) {
            Ok(event) => event,
            Err(RecvTimeoutError::Timeout) => {
                bail!("request {}: no event within {timeout:?}", self.id)
            }
            Err(RecvTimeoutError::Disconnected) => self.lost(),
        };
        Ok(Some(self.note(event)))
    }

    /// Collects the whole stream. `idle_timeout` bounds the wait for each event (not the
    /// whole request). Errors: an [`StreamEvent::Error`] (its message), or a wait past
    /// `idle_timeout`.
    pub fn wait(mut self, idle_timeout: Duration) -> Result<Completion> {
        let mut tokens = Vec::new();
        let mut token_times = Vec::new();
        loop {
            match self.recv_timeout(idle_timeout)? {
                Some(StreamEvent::Token { token, time, .. }) => {
                    tokens.push(token);
                    token_times.push(time);
                }
                Some(StreamEvent::Finished {
                    reason,
                    prompt_tokens,
                    timing,
                    ..
                }) => {
                    return Ok(Completion {
                        id: self.id,
                        tokens,
                        token_times,
                        reason,
                        prompt_tokens,
                        timing,
                    })
                }
                Some(StreamEvent::Error(msg)) => return Err(anyhow!(msg)),
                Some(StreamEvent::Prefill { .. }) => {}
                None => bail!("request {}: the stream had already ended", self.id),
            }
        }
    }

    fn note(&mut self, event: StreamEvent) -> StreamEvent {
        self.ended = event.is_last();
        event
    }

    /// The event for a stream whose sender vanished without a last event (the engine thread
    /// ended abnormally).
    fn lost(&self) -> StreamEvent {
        StreamEvent::Error(format!(
            "{} (request {} got no final event)",
            self.service.status.stopped_message(),
            self.id
        ))
    }
}

impl Iterator for RequestStream {
    type Item = StreamEvent;

    fn next(&mut self) -> Option<StreamEvent> {
        self.recv()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.ended {
            // Fails only when the engine has stopped, and then nothing is left to abort.
            let _ = self.service.abort(self.id);
        }
    }
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("id", &self.id)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// A request's whole output ([`RequestStream::wait`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// The request's id.
    pub id: u64,
    /// Generated token ids, in order.
    pub tokens: Vec<u32>,
    /// When each token was produced (`token_times[i]` belongs to `tokens[i]`).
    pub token_times: Vec<Instant>,
    /// Why it stopped.
    pub reason: FinishReason,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Arrival, first token and finish times.
    pub timing: RequestTiming,
}

impl Completion {
    /// Inter-token latencies: the gaps between consecutive tokens (`tokens.len() − 1` of them;
    /// tokens of one engine step have a gap of zero).
    pub fn itl(&self) -> Vec<Duration> {
        self.token_times.windows(2).map(|w| w[1] - w[0]).collect()
    }
}
