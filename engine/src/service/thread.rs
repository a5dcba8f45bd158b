//! The engine thread: owns the engine and loops — drain commands (waiting for one when idle),
//! run one step, route each token to its request's sink.

use super::request::{Request, RequestTiming, StreamEvent};
use super::EngineStats;
use crate::cache::prefix::ExtraKeys;
use crate::sampling::SamplingParams;
use crate::sampling::{LogitsProcessor, TokenLogprobs};
use crate::scheduler::FinishReason;
use crate::{Engine, TokenEvent};
use anyhow::Result;
use dayone_backend::{Backend, HostTensor};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a request's events go; runs on the engine thread, must not block. Returns `false`
/// once nobody listens (the request is then aborted).
pub(crate) type Sink = Box<dyn FnMut(StreamEvent) -> bool + Send>;

/// A message to the engine thread.
pub(crate) enum Command {
    /// Queue requests, all before the next step; their ids (or the first `add_request` error,
    /// with none of them queued) go back on `reply`.
    Submit {
        requests: Vec<(Request, Sink)>,
        arrival: Instant,
        reply: Sender<Result<Vec<u64>>>,
    },
    /// Abort a request (no-op when it has finished).
    Abort(u64),
    /// Send a snapshot of the engine's state.
    Stats(Sender<EngineStats>),
    /// Prefill `prompt` alone with tracing ([`Engine::trace_prefill`]); refused while any
    /// request is in flight.
    Trace {
        prompt: Vec<u32>,
        reply: Sender<Result<Trace>>,
    },
    /// Measure the device's copy bandwidth ([`super::copy_bandwidth`]), between steps.
    CopyBandwidth(Sender<Result<f64>>),
    /// Stop accepting; finish in-flight requests within `grace`, then abort the rest and end.
    Shutdown { grace: Duration },
}

/// Per-layer hidden states `[N, D]` and the last-token logits of [`Engine::trace_prefill`].
pub(crate) type Trace = (Vec<HostTensor>, Vec<f32>);

/// A step's token for one request: what the loop reads of a [`TokenEvent`].
pub(crate) struct Produced {
    pub(crate) seq_id: u64,
    pub(crate) token: u32,
    pub(crate) finish: Option<FinishReason>,
    /// Prompt tokens served from the prefix cache.
    pub(crate) cached_tokens: usize,
    pub(crate) logprobs: Option<TokenLogprobs>,
    /// The logits row it was sampled from (only from a step asked for logits).
    pub(crate) logits: Option<Vec<f32>>,
    /// The prompt's log-probabilities (first token of a request that asked for them).
    pub(crate) prompt_logprobs: Option<Vec<TokenLogprobs>>,
}

/// What the loop needs of an engine: [`Engine`]'s public API (a test double stands in for it
/// in the unit tests, so the loop's failure paths are tested without a model).
pub(crate) trait Stepper {
    /// [`Engine::add_request_scored`].
    fn add_request(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        extra: ExtraKeys,
        prompt_logprobs: Option<usize>,
    ) -> Result<u64>;
    /// [`Stepper::add_request`] for a prompt with images ([`Engine::add_request_with_images`]);
    /// the default takes none.
    fn add_request_images(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        extra: ExtraKeys,
        prompt_logprobs: Option<usize>,
        images: &[crate::vision::RgbImage],
    ) -> Result<u64> {
        if !images.is_empty() {
            anyhow::bail!("this model takes no image inputs");
        }
        self.add_request(prompt, params, extra, prompt_logprobs)
    }
    /// The prompt length of unfinished request `id` as the engine holds it (image placeholders
    /// expanded); `None` when unknown.
    fn prompt_len(&self, _id: u64) -> Option<usize> {
        None
    }
    /// One step; with `logits`, each [`Produced`] carries its logits row.
    fn step(&mut self, logits: bool) -> Result<Vec<Produced>>;
    /// [`Engine::trace_prefill`] (the engine is idle).
    fn trace_prefill(&mut self, prompt: &[u32]) -> Result<Trace>;
    /// The device's copy bandwidth in bytes/s ([`super::copy_bandwidth`]).
    fn copy_bandwidth(&mut self) -> Result<f64>;
    fn set_logits_processor(&mut self, id: u64, p: Box<dyn LogitsProcessor>) -> Result<()>;
    /// Prompt tokens of request `id` already computed (`None`: unknown or finished).
    fn prefill_progress(&self, id: u64) -> Option<usize>;
    fn abort(&mut self, id: u64) -> Result<bool>;
    fn has_unfinished(&self) -> bool;
    fn stats(&self, requests: usize) -> EngineStats;
}

impl<B: Backend> Stepper for Engine<B> {
    fn add_request(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        extra: ExtraKeys,
        prompt_logprobs: Option<usize>,
    ) -> Result<u64> {
        Engine::add_request_scored(self, prompt, params, extra, prompt_logprobs)
    }
    fn add_request_images(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        extra: ExtraKeys,
        prompt_logprobs: Option<usize>,
        images: &[crate::vision::RgbImage],
    ) -> Result<u64> {
        if images.is_empty() {
            return Engine::add_request_scored(self, prompt, params, extra, prompt_logprobs);
        }
        if prompt_logprobs.is_some() {
            anyhow::bail!("prompt_logprobs with images is not supported");
        }
        Engine::add_request_with_images(self, prompt, params, extra, images)
    }
    fn prompt_len(&self, id: u64) -> Option<usize> {
        Engine::prompt_len(self, id)
    }
    fn step(&mut self, logits: bool) -> Result<Vec<Produced>> {
        // Logits rows come from `capture_logits`; a setting of the engine's own is kept.
        let kept = self.capture_logits;
        self.capture_logits = kept || logits;
        let events = Engine::step(self);
        self.capture_logits = kept;
        let events = events?;
        let mut rows: HashMap<u64, Vec<f32>> = if !logits {
            HashMap::new()
        } else if kept {
            self.last_logits.iter().cloned().collect()
        } else {
            std::mem::take(&mut self.last_logits).into_iter().collect()
        };
        Ok(events
            .into_iter()
            .map(|e: TokenEvent| Produced {
                seq_id: e.seq_id,
                token: e.token,
                finish: e.finish,
                cached_tokens: e.cached_tokens,
                logprobs: e.logprobs,
                logits: rows.remove(&e.seq_id),
                prompt_logprobs: e.prompt_logprobs,
            })
            .collect())
    }
    fn trace_prefill(&mut self, prompt: &[u32]) -> Result<Trace> {
        Engine::trace_prefill(self, prompt)
    }
    fn copy_bandwidth(&mut self) -> Result<f64> {
        super::copy_bandwidth(&self.backend)
    }
    fn abort(&mut self, id: u64) -> Result<bool> {
        Engine::abort(self, id)
    }
    fn set_logits_processor(&mut self, id: u64, p: Box<dyn LogitsProcessor>) -> Result<()> {
        Engine::set_logits_processor(self, id, p)
    }
    fn prefill_progress(&self, id: u64) -> Option<usize> {
        Engine::prefill_progress(self, id)
    }
    fn has_unfinished(&self) -> bool {
        Engine::has_unfinished(self)
    }
    fn stats(&self, requests: usize) -> EngineStats {
        EngineStats {
            requests,
            free_blocks: self.free_blocks(),
            total_blocks: self.total_blocks(),
            cached_blocks: self.cached_blocks(),
            metrics: Some(self.metrics()),
            memory_reserved: self.backend.memory_reserved(),
        }
    }
}

/// A request the engine is working on.
struct Active {
    sink: Sink,
    /// Send [`StreamEvent::Prefill`] after each step until the first token.
    report_prefill: bool,
    /// Attach the logits row to each token ([`Request::return_logits`]).
    return_logits: bool,
    arrival: Instant,
    first_token: Option<Instant>,
    prompt_tokens: usize,
    cached_tokens: usize,
    generated: usize,
    /// The prompt's log-probabilities, once computed ([`Request::prompt_logprobs`]).
    prompt_logprobs: Option<Arc<Vec<TokenLogprobs>>>,
}

impl Active {
    fn finish(mut self, reason: FinishReason, now: Instant) {
        let event = StreamEvent::Finished {
            reason,
            prompt_tokens: self.prompt_tokens,
            cached_tokens: self.cached_tokens,
            generated_tokens: self.generated,
            timing: RequestTiming {
                arrival: self.arrival,
                first_token: self.first_token,
                finished: now,
            },
            prompt_logprobs: self.prompt_logprobs.take(),
        };
        (self.sink)(event);
    }
}

/// The loop's state.
pub(crate) struct EngineLoop<S: Stepper> {
    engine: S,
    active: HashMap<u64, Active>,
    /// Set by `Shutdown`: requests still running then are aborted.
    deadline: Option<Instant>,
}

impl<S: Stepper> EngineLoop<S> {
    pub(crate) fn new(engine: S) -> Self {
        Self {
            engine,
            active: HashMap::new(),
            deadline: None,
        }
    }

    /// Runs until shut down or failed; returns why it stopped (what later submits report).
    pub(crate) fn run(mut self, commands: &Receiver<Command>) -> String {
        match self.serve(commands) {
            Ok(()) => "it was shut down".to_string(),
            Err(e) => {
                let msg = format!("{e:#}");
                for (_, mut a) in self.active.drain() {
                    (a.sink)(StreamEvent::Error(msg.clone()));
                }
                msg
            }
        }
    }

    fn serve(&mut self, commands: &Receiver<Command>) -> Result<()> {
        loop {
            if !self.engine.has_unfinished() {
                self.fail_untracked();
                if self.deadline.is_some() {
                    return Ok(());
                }
                // Idle: wait for work. Every handle gone without a shutdown cannot happen (the
                // last one shuts down on drop), but would end the loop the same way.
                match commands.recv() {
                    Ok(cmd) => self.handle(cmd)?,
                    Err(_) => return Ok(()),
                }
            }
            loop {
                match commands.try_recv() {
                    Ok(cmd) => self.handle(cmd)?,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.deadline.get_or_insert_with(Instant::now);
                        break;
                    }
                }
            }
            if let Some(deadline) = self.deadline {
                if self.active.is_empty() {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    let ids: Vec<u64> = self.active.keys().copied().collect();
                    for id in ids {
                        self.abort(id)?;
                    }
                    return Ok(());
                }
            }
            if self.engine.has_unfinished() {
                let logits = self.active.values().any(|a| a.return_logits);
                let events = self.engine.step(logits)?;
                self.route(events)?;
                self.report_prefill();
            }
        }
    }

    /// Prompt tokens computed so far, to the requests that asked (progress bars).
    fn report_prefill(&mut self) {
        for (&id, a) in self.active.iter_mut() {
            if a.report_prefill && a.first_token.is_none() {
                if let Some(computed) = self.engine.prefill_progress(id) {
                    (a.sink)(StreamEvent::Prefill {
                        computed,
                        total: a.prompt_tokens,
                    });
                }
            }
        }
    }

    fn handle(&mut self, cmd: Command) -> Result<()> {
        match cmd {
            Command::Submit {
                requests,
                arrival,
                reply,
            } => {
                if self.deadline.is_some() {
                    let _ = reply.send(Err(anyhow::anyhow!(
                        "engine is shutting down: it accepts no new requests"
                    )));
                    return Ok(());
                }
                let mut ids = Vec::with_capacity(requests.len());
                for (request, sink) in requests {
                    match self.add(request, sink, arrival) {
                        Ok(id) => ids.push(id),
                        Err(e) => {
                            // All or nothing: the batch's earlier requests were never announced.
                            for id in ids {
                                self.active.remove(&id);
                                self.engine.abort(id)?;
                            }
                            let _ = reply.send(Err(e));
                            return Ok(());
                        }
                    }
                }
                if let Err(unsent) = reply.send(Ok(ids)) {
                    for id in unsent.0.into_iter().flatten() {
                        self.abort(id)?; // the submitter is gone
                    }
                }
            }
            Command::Abort(id) => self.abort(id)?,
            Command::Stats(reply) => {
                let _ = reply.send(self.engine.stats(self.active.len()));
            }
            Command::Trace { prompt, reply } => {
                let traced = if self.active.is_empty() && !self.engine.has_unfinished() {
                    self.engine.trace_prefill(&prompt)
                } else {
                    Err(anyhow::anyhow!(
                        "trace_prefill needs an idle engine: {} requests are in flight",
                        self.active.len()
                    ))
                };
                let _ = reply.send(traced);
            }
            Command::CopyBandwidth(reply) => {
                let _ = reply.send(self.engine.copy_bandwidth());
            }
            Command::Shutdown { grace } => {
                let at = Instant::now() + grace;
                self.deadline = Some(self.deadline.map_or(at, |d| d.min(at)));
            }
        }
        Ok(())
    }

    /// Adds one request to the engine (validated there) and tracks it.
    fn add(&mut self, mut request: Request, sink: Sink, arrival: Instant) -> Result<u64> {
        let prompt_tokens = request.prompt.len();
        let extra = ExtraKeys {
            cache_salt: request.cache_salt.take(),
            ..Default::default()
        };
        let processor = request.processor.take();
        let images: Vec<crate::vision::RgbImage> =
            request.images.iter().map(|i| i.as_ref().clone()).collect();
        let id = self.engine.add_request_images(
            request.prompt,
            request.params,
            extra,
            request.prompt_logprobs,
            &images,
        )?;
        if let Some(p) = processor {
            if let Err(e) = self.engine.set_logits_processor(id, p) {
                self.engine.abort(id)?;
                return Err(e);
            }
        }
        self.active.insert(
            id,
            Active {
                sink,
                report_prefill: request.report_prefill,
                return_logits: request.return_logits,
                arrival,
                first_token: None,
                // Image placeholders count as the tokens they became.
                prompt_tokens: self.engine.prompt_len(id).unwrap_or(prompt_tokens),
                cached_tokens: 0,
                generated: 0,
                prompt_logprobs: None,
            },
        );
        Ok(id)
    }

    /// Aborts request `id` in the engine (freeing its blocks and slot) and ends its stream.
    fn abort(&mut self, id: u64) -> Result<()> {
        if let Some(a) = self.active.remove(&id) {
            self.engine.abort(id)?;
            a.finish(FinishReason::Abort, Instant::now());
        }
        Ok(())
    }

    fn route(&mut self, events: Vec<Produced>) -> Result<()> {
        let now = Instant::now();
        for e in events {
            let Some(a) = self.active.get_mut(&e.seq_id) else {
                continue; // aborted earlier in this step's drain
            };
            let index = a.generated;
            a.generated += 1;
            a.cached_tokens = e.cached_tokens;
            a.first_token.get_or_insert(now);
            if let Some(p) = e.prompt_logprobs {
                a.prompt_logprobs = Some(Arc::new(p));
            }
            let listening = (a.sink)(StreamEvent::Token {
                token: e.token,
                index,
                time: now,
                logprobs: e.logprobs,
                logits: e.logits.filter(|_| a.return_logits).map(Arc::new),
            });
            if let Some(reason) = e.finish {
                let a = self.active.remove(&e.seq_id).expect("looked up above");
                a.finish(reason, now);
            } else if !listening {
                self.abort(e.seq_id)?;
            }
        }
        Ok(())
    }

    /// Requests the engine no longer has but that never got their last event would wait
    /// forever; end them with an error instead (an engine bug, reported rather than hung).
    fn fail_untracked(&mut self) {
        for (id, mut a) in self.active.drain() {
            (a.sink)(StreamEvent::Error(format!(
                "the engine dropped request {id} without finishing it"
            )));
        }
    }
}
