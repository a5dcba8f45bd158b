//! The engine as a service: an [`EngineHandle`] that any thread uses to submit and abort
//! requests while one thread owns the [`Engine`] and steps it (mistral.rs's `Sender<Request>`
//! with a per-request response channel; vLLM's `AsyncLLM` over its engine core).
//!
//! ```no_run
//! # fn demo(ckpt: dayone_engine::loader::Checkpoint) -> anyhow::Result<()> {
//! use dayone_engine::service::{EngineHandle, Request, StreamEvent};
//! use dayone_engine::{sampling::SamplingParams, Engine, EngineConfig};
//! use std::time::Duration;
//!
//! let handle = EngineHandle::start(move || {
//!     Engine::new(dayone_backend::cpu::CpuBackend, &ckpt, &EngineConfig::default(), None)
//! })?;
//! let mut stream = handle.submit(Request::new(vec![1, 2, 3], SamplingParams::default()))?;
//! while let Some(event) = stream.recv_timeout(Duration::from_secs(60))? {
//!     match event {
//!         StreamEvent::Token { token, .. } => print!("{token} "),
//!         StreamEvent::Finished { reason, .. } => println!("[{reason}]"),
//!         StreamEvent::Error(msg) => anyhow::bail!(msg),
//!         StreamEvent::Prefill { .. } => {} // only with `Request::report_prefill`
//!     }
//! }
//! handle.shutdown(Duration::from_secs(5));
//! # Ok(()) }
//! ```
//!
//! The engine thread loops: take every pending command (waiting for one only when no request is
//! unfinished) → [`Engine::step`] → send each token to its request. Requests are validated by
//! [`Engine::add_request`] on that thread and its error comes back from
//! [`EngineHandle::submit`] unchanged. A finished or aborted request has freed its cache blocks
//! and state slot by the time its [`StreamEvent::Finished`] is sent. When a step fails, every
//! in-flight request gets [`StreamEvent::Error`] and later calls fail with
//! `engine stopped: <the step's error>`.
//!
//! Text output: [`TextStream`] turns the token events into text deltas.
//!
//! Besides serving (`dayone serve`, `generate`), the handle carries what `dayone bench` and
//! `dayone check` need of an engine: [`EngineHandle::submit_batch_with`] (a batch scheduled
//! together), [`ModelInfo`]'s byte sizes and activation dtype, [`EngineHandle::copy_bandwidth`]
//! (the roofline), [`EngineHandle::trace_prefill`] (per-layer hidden states, idle engine only)
//! and [`Request::return_logits`] (each token's logits row).

mod detok;
mod request;
mod status;
#[cfg(test)]
mod tests;
mod thread;

pub use detok::TextStream;
pub use request::{Completion, ProcessorCell, Request, RequestStream, RequestTiming, StreamEvent};

use crate::Engine;
use anyhow::{anyhow, Context, Result};
use dayone_backend::{Backend, DType, HostTensor};
use status::{Shared, Status};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::channel;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use thread::{Command, EngineLoop, Stepper};

/// How long the drop of the last [`EngineHandle`] lets in-flight requests finish before it
/// aborts them (call [`EngineHandle::shutdown`] to choose).
pub const SHUTDOWN_GRACE_ON_DROP: Duration = Duration::from_secs(5);

/// What the model accepts, read once at load (no round trip to the engine thread).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelInfo {
    /// The context window in tokens (prompt + generated).
    pub max_context: usize,
    /// Token ids are below this.
    pub vocab_size: usize,
    /// Token ids that end generation (unless `ignore_eos`).
    pub eos_ids: Vec<u32>,
    /// The backend's name (`cuda: NVIDIA H200 (sm_90)`).
    pub backend: String,
    /// Device bytes one cached token takes over all layers ([`Engine::cache_bytes_per_token`]).
    pub cache_bytes_per_token: usize,
    /// Device bytes of one sequence's recurrent state over all layers, 0 for attention-only
    /// models ([`Engine::state_bytes_per_seq`]; `dayone bench`'s bytes per decode step).
    pub state_bytes_per_seq: usize,
    /// The dtype activations and weights are computed in on this backend (the configured
    /// dtype as [`Backend::activation_dtype`] grants it).
    pub activation_dtype: DType,
    /// The dtype float weights are stored in on the device ([`Engine::weight_dtype`]).
    pub weight_dtype: DType,
    /// Device bytes of rank 0's weights as the backend holds them (16-bit weights count 2
    /// bytes, block-quantized ones their blocks; [`Engine::rank_memory`]).
    pub weight_bytes: u64,
    /// Whether the backend runs its batch-invariant kernels
    /// ([`dayone_backend::Backend::batch_invariant`]: bit-exact results whatever the batch).
    pub batch_invariant: bool,
}

/// A snapshot of the engine's state ([`EngineHandle::stats`]).
///
/// The engine metrics of engine/src/metrics.rs (another task) belong here as one more field,
/// filled between steps where `Stepper::stats` (service/thread.rs) builds this snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineStats {
    /// Requests submitted and not yet finished (waiting or running).
    pub requests: usize,
    /// Free KV cache blocks (all of them when no request is in flight).
    pub free_blocks: usize,
    /// All KV cache blocks.
    pub total_blocks: usize,
    /// Cached prefix blocks no request holds (part of `free_blocks`).
    pub cached_blocks: usize,
    /// The engine's metrics ([`crate::metrics`]); `None` from engines that keep none.
    pub metrics: Option<crate::metrics::MetricsSnapshot>,
    /// Device memory the backend holds, bytes ([`dayone_backend::Backend::memory_reserved`]);
    /// `None` where it is not tracked.
    pub memory_reserved: Option<u64>,
}

/// A handle to an engine running on its own thread. Cheap to clone, usable from any thread;
/// not generic over the backend. The engine shuts down when [`EngineHandle::shutdown`] is
/// called or the last clone is dropped (waiting up to [`SHUTDOWN_GRACE_ON_DROP`]).
#[derive(Clone)]
pub struct EngineHandle {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    model: ModelInfo,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl EngineHandle {
    /// Spawns the engine thread, which runs `build` (so neither the backend nor the engine need
    /// be `Send`); returns once the engine is loaded. Errors: `build`'s error, unchanged (or a
    /// panic in it, with its message), or a thread that cannot be spawned.
    pub fn start<B, F>(build: F) -> Result<Self>
    where
        B: Backend,
        F: FnOnce() -> Result<Engine<B>> + Send + 'static,
    {
        Self::start_stepper(move || {
            let engine = build()?;
            let model = ModelInfo {
                max_context: engine.max_context(),
                vocab_size: engine.config.vocab_size(),
                eos_ids: engine.eos_ids().to_vec(),
                backend: engine.backend.name(),
                cache_bytes_per_token: engine.cache_bytes_per_token(),
                state_bytes_per_seq: engine.state_bytes_per_seq(),
                activation_dtype: engine.activation_dtype(),
                weight_dtype: engine.weight_dtype(),
                weight_bytes: engine.rank_memory().first().map_or(0, |m| m.0),
                batch_invariant: engine.backend().batch_invariant(),
            };
            Ok((engine, model))
        })
    }

    /// [`EngineHandle::start`] over anything the loop can step (the unit tests' double).
    fn start_stepper<S, F>(build: F) -> Result<Self>
    where
        S: Stepper,
        F: FnOnce() -> Result<(S, ModelInfo)> + Send + 'static,
    {
        let (commands, rx) = channel::<Command>();
        let (loaded_tx, loaded) = channel::<Result<ModelInfo>>();
        let status = Arc::new(Status::new());
        let thread_status = status.clone();
        let thread = std::thread::Builder::new()
            .name("dayone-engine".into())
            .spawn(move || {
                let ran = catch_unwind(AssertUnwindSafe(|| match build() {
                    Ok((engine, model)) => {
                        let _ = loaded_tx.send(Ok(model));
                        EngineLoop::new(engine).run(&rx)
                    }
                    Err(e) => {
                        let why = format!("it failed to load: {e:#}");
                        let _ = loaded_tx.send(Err(e));
                        why
                    }
                }));
                let why = ran.unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "(no message)".into());
                    format!("the engine thread panicked: {msg}")
                });
                thread_status.stop(why);
            })
            .context("spawning the engine thread")?;
        let loaded = loaded.recv();
        let model = match loaded {
            Ok(Ok(model)) => model,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(anyhow!(status.stopped_message()));
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                shared: Arc::new(Shared { commands, status }),
                model,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    /// What the model accepts (context window, vocabulary size, stop ids).
    pub fn model_info(&self) -> &ModelInfo {
        &self.inner.model
    }

    /// Queues `request` and returns its stream. Errors, synchronously: the engine's validation
    /// error for the request (empty prompt, a token id outside the vocabulary, a prompt longer
    /// than the context window, more tokens than the cache holds, bad sampling parameters;
    /// [`Engine::add_request`]'s text, unchanged), `engine is shutting down`, or
    /// `engine stopped: <reason>`.
    pub fn submit(&self, request: Request) -> Result<RequestStream> {
        let (tx, rx) = channel();
        let id = self.submit_with(request, move |event| tx.send(event).is_ok())?;
        Ok(RequestStream::new(id, rx, self.inner.shared.clone()))
    }

    /// Like [`EngineHandle::submit`], but each event is passed to `on_event`, called on the
    /// engine thread (so it must not block: forward to a channel, e.g. an async one). When it
    /// returns `false` (its receiver is gone) the request is aborted. Returns the request id.
    pub fn submit_with(
        &self,
        request: Request,
        on_event: impl FnMut(StreamEvent) -> bool + Send + 'static,
    ) -> Result<u64> {
        let ids = self.submit_batch_with([(request, on_event)])?;
        Ok(ids[0])
    }

    /// Like [`EngineHandle::submit_with`] for several requests at once: all are queued before
    /// the engine's next step (so they are scheduled together, as a benchmark's batch must be;
    /// one `submit_with` after another may see the first one's prefill start alone), with one
    /// arrival time. Returns their ids, in order. Errors: as `submit_with`, for the first
    /// request the engine refuses (its error unchanged); then none of them is queued and no
    /// callback is called.
    pub fn submit_batch_with<F>(
        &self,
        requests: impl IntoIterator<Item = (Request, F)>,
    ) -> Result<Vec<u64>>
    where
        F: FnMut(StreamEvent) -> bool + Send + 'static,
    {
        let arrival = Instant::now();
        let shared = &self.inner.shared;
        shared.status.check_accepting()?;
        let requests = requests
            .into_iter()
            .map(|(r, f)| (r, Box::new(f) as thread::Sink))
            .collect();
        let (reply, replied) = channel();
        shared.send(Command::Submit {
            requests,
            arrival,
            reply,
        })?;
        replied
            .recv()
            .unwrap_or_else(|_| Err(anyhow!(shared.status.stopped_message())))
    }

    /// Aborts request `id` from any thread: its stream ends with
    /// [`StreamEvent::Finished`] with [`crate::scheduler::FinishReason::Abort`], and its blocks
    /// and state slot are freed before the engine's next step. A request that has already
    /// finished is left alone. Errors: `engine stopped: <reason>`.
    pub fn abort(&self, id: u64) -> Result<()> {
        self.inner.shared.abort(id)
    }

    /// A snapshot of the engine's state, taken between steps (after every command sent before
    /// it from the same thread). Errors: `engine stopped: <reason>`.
    pub fn stats(&self) -> Result<EngineStats> {
        let shared = &self.inner.shared;
        let (reply, replied) = channel();
        shared.send(Command::Stats(reply))?;
        replied
            .recv()
            .map_err(|_| anyhow!(shared.status.stopped_message()))
    }

    /// Prefills `prompt` alone with tracing on, on the engine thread ([`Engine::trace_prefill`]):
    /// the hidden state `[N, D]` (f32) after the embedding and after each layer, and the
    /// last-token logits `[V]`. Nothing is cached or streamed. Errors: any request in flight
    /// (`trace_prefill needs an idle engine: …`; wait for them to finish: it is a diagnostic,
    /// `dayone check`'s, not a serving path), the engine's error for the prompt or the
    /// forward pass (the service keeps running), or `engine stopped: <reason>`.
    pub fn trace_prefill(&self, prompt: Vec<u32>) -> Result<(Vec<HostTensor>, Vec<f32>)> {
        let shared = &self.inner.shared;
        let (reply, replied) = channel();
        shared.send(Command::Trace { prompt, reply })?;
        replied
            .recv()
            .unwrap_or_else(|_| Err(anyhow!(shared.status.stopped_message())))
    }

    /// The device's copy bandwidth in bytes/s, read + write, measured on the engine thread
    /// between steps ([`copy_bandwidth`]; `dayone bench`'s decode roofline). Takes a fraction
    /// of a second and 96 MiB of device memory, briefly; measure while idle for a clean figure.
    /// Errors: the backend's, or `engine stopped: <reason>`.
    pub fn copy_bandwidth(&self) -> Result<f64> {
        let shared = &self.inner.shared;
        let (reply, replied) = channel();
        shared.send(Command::CopyBandwidth(reply))?;
        replied
            .recv()
            .unwrap_or_else(|_| Err(anyhow!(shared.status.stopped_message())))
    }

    /// Stops accepting requests, lets in-flight ones finish for up to `grace`, aborts the rest
    /// (their streams end with `Abort`) and joins the engine thread. Later calls fail with
    /// `engine stopped: it was shut down`. Calling it again, or from another clone, waits for
    /// the same end.
    pub fn shutdown(&self, grace: Duration) {
        self.inner.shutdown(grace);
    }
}

/// Bytes the copy-bandwidth probe moves per repetition: 1 GiB (large enough to stream past any
/// cache), less where the device caps one buffer or has little free memory.
pub fn copy_probe_bytes<B: Backend>(b: &B) -> usize {
    let mut bytes = 1usize << 30;
    if let Some(cap) = b.max_buffer_bytes() {
        bytes = bytes.min((cap / 2) as usize);
    }
    if let Some(free) = b.free_memory() {
        bytes = bytes.min((free / 8) as usize);
    }
    (bytes / 4096 * 4096).max(4096)
}

/// A device's copy bandwidth in bytes/s (read + write), the decode roofline: one row of a
/// `[2, n]` tensor copied onto the other (`copy_rows`: a device-to-device copy of
/// [`copy_probe_bytes`], 1 GiB on a GPU), timed over 10 repetitions after one warm-up.
pub fn copy_bandwidth<B: Backend>(b: &B) -> Result<f64> {
    let bytes = copy_probe_bytes(b);
    let t = b.zeros(&[2, bytes / 4], DType::F32)?;
    b.copy_rows(&t, &[(0, 1)])?;
    b.synchronize()?;
    let reps = 10;
    let start = Instant::now();
    for i in 0..reps {
        // Alternate the direction so that no copy is a no-op a backend could skip.
        let pair = if i % 2 == 0 { (1, 0) } else { (0, 1) };
        b.copy_rows(&t, &[pair])?;
    }
    b.synchronize()?;
    Ok((2 * bytes * reps) as f64 / start.elapsed().as_secs_f64())
}

impl Inner {
    fn shutdown(&self, grace: Duration) {
        let mut thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(t) = thread.take() else {
            return;
        };
        self.shared.status.begin_shutdown();
        // Fails only when the thread has already ended (after an engine error).
        let _ = self.shared.send(Command::Shutdown { grace });
        if t.thread().id() == std::thread::current().id() {
            return; // dropped from an event callback on the engine thread: it ends by itself
        }
        // The thread catches panics, so joining cannot fail.
        let _ = t.join();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown(SHUTDOWN_GRACE_ON_DROP);
    }
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("model", &self.inner.model)
            .finish_non_exhaustive()
    }
}
