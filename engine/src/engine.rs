//! The engine loop: admit requests, schedule a step, run the model, sample, stream tokens.

use crate::cache::KvCache;
use crate::config::ModelConfig;
use crate::layers::MlaPrefill;
use crate::loader::Checkpoint;
use crate::metrics::{EngineMetrics, FinishedRequest, MetricsSnapshot, Preemption};
use crate::models::{load_model, CausalLm};
use crate::sampling::SamplingParams;
use crate::scheduler::{
    FinishReason, PrefixSettings, ScheduledChunk, Scheduler, SchedulerConfig, SchedulerCounters,
    Sequence,
};
use anyhow::{bail, Result};
use dayone_backend::{Backend, DType, HostTensor, StepMeta, TensorInfo};
use std::time::Instant;

mod follow;
pub mod graphs;
mod media;
mod paging;
mod vision_tower;

pub use media::EncoderCacheStats;

use follow::{Command, Mirror};

/// Engine settings (serialisable: rank 0 hands its settings to the other ranks).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    /// Requested float dtype for weights and activations (the backend may compute bf16 in f32).
    #[serde(with = "dtype_name")]
    pub dtype: DType,
    /// Tokens the KV cache holds over all sequences; `None`: the model's context window,
    /// clamped to 4096..=65536 tokens (million-token configs do not reserve their whole window),
    /// lowered to what fits when that is more than the device can hold. Either way the cache
    /// (plus the recurrent state slots) must fit in the device's free memory after the weights
    /// are loaded, less a headroom of max(10 %, 256 MiB); a requested size that does not fit is
    /// an error. Backends that cannot report free memory are not checked.
    pub kv_cache_tokens: Option<usize>,
    /// The capacity used when `kv_cache_tokens` is `None`, before the memory cap; `None`: the
    /// context window clamped to 4096..=65536 tokens. A server sets it for its concurrency
    /// (`dayone serve`: `max_num_seqs` × min(window, 8192)), as vLLM fills the free memory;
    /// it applies only on backends that report their free memory (which then caps it).
    pub default_kv_cache_tokens: Option<usize>,
    /// Scheduling limits.
    pub scheduler: SchedulerConfig,
    /// Prefix caching across requests (`--no-prefix-caching` turns it off).
    pub prefix_caching: bool,
    /// Host-memory tier for evicted blocks and swapped-out sequences, in bytes (0: none).
    pub host_cache_bytes: u64,
    /// Recurrent-state checkpoints (KDA layers) every this many prompt tokens, a multiple of the
    /// block size; 0: only at the ends of prefill steps, the last block boundary of a prompt and
    /// where a prompt leaves a cached prefix.
    pub state_checkpoint_interval: usize,
    /// State checkpoint slots kept for prefix caching of recurrent layers; `None`: as many as
    /// `max_num_seqs`.
    pub state_checkpoints: Option<usize>,
    /// Caps the model's context window (`--max-model-len`); `None`: the config's window.
    pub max_model_len: Option<usize>,
    /// Ranks each layer is split over (`--tensor-parallel-size`; [`crate::parallel`]).
    pub tensor_parallel_size: usize,
    /// Groups of ranks the routed experts are divided among (`--expert-parallel-size`); it
    /// divides `tensor_parallel_size`.
    pub expert_parallel_size: usize,
    /// Ranks a long step's tokens are split over, each holding the whole model
    /// (`--context-parallel-size`; [`crate::parallel::context`]); not with
    /// `tensor_parallel_size` > 1.
    #[serde(default = "one")]
    pub context_parallel_size: usize,
    /// Under context parallelism, steps of fewer tokens than this (or than the ranks) run
    /// whole on every rank instead of being split (decode, short prompts).
    #[serde(default = "context_parallel_min_tokens")]
    pub context_parallel_min_tokens: usize,
    /// Which form MLA layers compute prefill steps in ([`MlaPrefill`]); default from
    /// `DAYONE_MLA_PREFILL` (`auto`, `absorbed` or `expanded`) and
    /// `DAYONE_MLA_EXPANDED_MIN_TOKENS` (default 256), else `auto`.
    pub mla_prefill: MlaPrefill,
    /// Decode block-quantized weights to `dtype` at load instead of keeping their low-bit
    /// codes on the device (`--dequantize-at-load`).
    #[serde(default)]
    pub dequantize_at_load: bool,
    /// Run the low-bit routed experts' prefill-sized steps through the backend's FP8 expert
    /// GEMM (`--moe-fp8`; CUDA sm_89+, activations rounded to e4m3 per 32 values); off by
    /// default. Elsewhere a warning, and the experts decode to `dtype` as without it.
    #[serde(default)]
    pub moe_fp8: bool,
    /// Batch-invariant kernels (`--batch-invariant`; [`Backend::set_batch_invariant`]): a
    /// request's logits are bit-exact whatever it shares a step with and however its prompt was
    /// cut (prefix-cache hits, chunk sizes, preemption). CPU and WGSL always are; CUDA gives up
    /// cuBLAS, the decode GEMV and split-K decode attention for it.
    pub batch_invariant: bool,
    /// Never run decode steps as graphs (`--enforce-eager`; see `engine/graphs.rs`).
    #[serde(default)]
    pub enforce_eager: bool,
}

/// `DAYONE_MLA_PREFILL` = `absorbed`, `expanded` or `auto` (the default; anything else is
/// `auto` with a warning), from `DAYONE_MLA_EXPANDED_MIN_TOKENS` new tokens (default 256).
fn mla_prefill_from_env() -> MlaPrefill {
    let min_tokens = match std::env::var("DAYONE_MLA_EXPANDED_MIN_TOKENS") {
        Ok(v) => v.parse().unwrap_or_else(|_| {
            tracing::warn!("DAYONE_MLA_EXPANDED_MIN_TOKENS={v:?} is not a token count; using 256");
            MlaPrefill::DEFAULT_MIN_TOKENS
        }),
        Err(_) => MlaPrefill::DEFAULT_MIN_TOKENS,
    };
    match std::env::var("DAYONE_MLA_PREFILL").as_deref() {
        Ok("absorbed") => MlaPrefill::Absorbed,
        Ok("expanded") => MlaPrefill::Expanded { min_tokens },
        Ok("auto") | Err(_) => MlaPrefill::Auto { min_tokens },
        Ok(other) => {
            tracing::warn!(
                "DAYONE_MLA_PREFILL={other:?} is not auto, absorbed or expanded; using auto"
            );
            MlaPrefill::Auto { min_tokens }
        }
    }
}

fn one() -> usize {
    1
}

/// The default [`EngineConfig::context_parallel_min_tokens`]: below a few hundred tokens per
/// rank the per-layer collectives cost more than the split saves.
fn context_parallel_min_tokens() -> usize {
    1024
}

/// `DType` as its name in serialised settings.
mod dtype_name {
    use dayone_backend::DType;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &DType, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&d.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DType, D::Error> {
        let name = String::deserialize(d)?;
        DType::parse(&name).map_err(serde::de::Error::custom)
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            dtype: DType::F32,
            kv_cache_tokens: None,
            default_kv_cache_tokens: None,
            scheduler: SchedulerConfig::default(),
            prefix_caching: true,
            host_cache_bytes: 0,
            state_checkpoint_interval: 0,
            state_checkpoints: None,
            max_model_len: None,
            tensor_parallel_size: 1,
            expert_parallel_size: 1,
            context_parallel_size: 1,
            context_parallel_min_tokens: context_parallel_min_tokens(),
            mla_prefill: mla_prefill_from_env(),
            dequantize_at_load: false,
            moe_fp8: false,
            batch_invariant: false,
            enforce_eager: false,
        }
    }
}

impl EngineConfig {
    /// Processes (one per device) the model runs on: `tensor_parallel_size ×
    /// context_parallel_size` (one of them is 1).
    pub fn ranks(&self) -> usize {
        self.tensor_parallel_size.max(1) * self.context_parallel_size.max(1)
    }
}

/// A token produced by a step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    /// The sequence it belongs to.
    pub seq_id: u64,
    /// The new token id.
    pub token: u32,
    /// Prompt tokens of the sequence.
    pub prompt_tokens: usize,
    /// Prompt tokens served from the prefix cache when it was admitted (usage `cached_tokens`).
    pub cached_tokens: usize,
    /// Set when the sequence stopped with this token: `stop` (EOS), `length` (`max_tokens`) or
    /// `context` (the context window is full); see [`FinishReason::as_str`].
    pub finish: Option<FinishReason>,
    /// The token's log-probability and top alternatives, when the request asked for them
    /// ([`SamplingParams::logprobs`]).
    pub logprobs: Option<crate::sampling::TokenLogprobs>,
    /// With the first generated token of a request added with prompt log-probabilities
    /// ([`Engine::add_request_scored`]): entry `i` scores prompt token `i + 1` given prompt
    /// tokens `0..=i` (`prompt_tokens − 1` entries).
    pub prompt_logprobs: Option<Vec<crate::sampling::TokenLogprobs>>,
}

/// Prompt log-probabilities being computed for one sequence.
struct PromptScores {
    /// Alternatives kept per position.
    top: usize,
    /// Per prompt position `0..prompt_len − 1`, once its logits row has been computed.
    entries: Vec<Option<crate::sampling::TokenLogprobs>>,
}

/// Which logits rows a step computes: one per chunk that samples, plus the scored prompt
/// positions of sequences with prompt log-probabilities.
#[derive(Default)]
struct LogitRows {
    /// Row of each sampling chunk, in chunk order.
    sample: Vec<usize>,
    /// `(sequence id, first prompt position, first row, rows)`.
    scored: Vec<(u64, usize, usize, usize)>,
}

/// A model on a backend with its cache and scheduler.
pub struct Engine<B: Backend> {
    /// The device.
    pub backend: B,
    /// The parsed `config.json`.
    pub config: ModelConfig,
    model: Box<dyn CausalLm<B>>,
    cache: KvCache<B>,
    scheduler: Scheduler,
    eos_ids: Vec<u32>,
    next_id: u64,
    max_context: usize,
    metrics: EngineMetrics,
    cache_spec_recurrent: bool,
    cache_bytes_per_token: usize,
    state_bytes_per_seq: usize,
    /// The requested dtype as the backend grants it (`Backend::activation_dtype`).
    activation_dtype: DType,
    /// The dtype float weights were converted to at load (`EngineConfig::dtype`).
    weight_dtype: DType,
    /// When set, each step's logits rows are kept in [`Engine::last_logits`] (tests, `check`).
    pub capture_logits: bool,
    /// `(sequence id, logits [V] f32)` of the last step, when `capture_logits` is set.
    pub last_logits: Vec<(u64, Vec<f32>)>,
    /// Sequences whose prompt positions are scored ([`Engine::add_request_scored`]).
    prompt_scores: std::collections::HashMap<u64, PromptScores>,
    /// The rank group when the model is split over several ranks.
    mirror: Option<Mirror>,
    /// `(weight bytes, cache bytes)` of each rank (one entry on one device).
    rank_memory: Vec<(u64, u64)>,
    /// The vision tower, encoder cache and requests' image spans ([`media`]).
    media: media::Media<B>,
    /// Decode steps as graphs ([`graphs`]); `None` with `--enforce-eager`.
    graphs: Option<graphs::DecodeGraphs<B>>,
    /// The recurrent-state row that padding sequences of a graph step read and write.
    scratch_state_slot: u32,
}

impl<B: Backend> Engine<B> {
    /// Loads the model of `ckpt` onto `backend` and sizes the cache.
    ///
    /// Errors: unsupported `model_type`, bad tensors (naming file and tensor), or a cache that
    /// does not fit the device.
    pub fn new(
        backend: B,
        ckpt: &Checkpoint,
        cfg: &EngineConfig,
        progress: Option<&dyn Fn(usize, usize)>,
    ) -> Result<Self> {
        Self::new_distributed(backend, ckpt, cfg, progress, None)
    }

    /// [`Engine::new`] for one rank of a model split over several ([`crate::parallel`]): this
    /// rank's slices are loaded, the cache is sized to what every rank can hold, and a rank
    /// other than 0 then runs [`Engine::follow`] while rank 0 takes requests.
    ///
    /// Errors: as [`Engine::new`], head or expert counts that do not split over the ranks, and
    /// a rank that leaves the group.
    pub fn new_distributed(
        backend: B,
        ckpt: &Checkpoint,
        cfg: &EngineConfig,
        progress: Option<&dyn Fn(usize, usize)>,
        dist: Option<crate::parallel::Distributed<B>>,
    ) -> Result<Self> {
        let parallel = dist
            .as_ref()
            .map(|d| d.parallel.clone())
            .unwrap_or_default();
        let origin = ckpt.path.join("config.json");
        let config = ModelConfig::from_json(&ckpt.config, &origin.display().to_string())?;
        if cfg.context_parallel_size > 1 && cfg.tensor_parallel_size > 1 {
            bail!(
                "--context-parallel-size {} with --tensor-parallel-size {}: context parallelism runs with the whole model on every rank; use one of them",
                cfg.context_parallel_size,
                cfg.tensor_parallel_size
            );
        }
        if !matches!(cfg.dtype, DType::F32 | DType::BF16) {
            bail!("--dtype must be f32 or bf16, got {}", cfg.dtype);
        }
        if cfg.batch_invariant {
            // Before anything is computed, and before the recurrent split alignment is read.
            backend.set_batch_invariant(true)?;
        }
        let t_load = Instant::now();
        let (model, weight_bytes) = load_model(
            &backend,
            &config,
            ckpt,
            cfg.dtype,
            progress,
            crate::models::LoadOptions {
                parallel,
                mla_prefill: cfg.mla_prefill,
                keep_quantized: !cfg.dequantize_at_load,
                moe_fp8: cfg.moe_fp8,
                context_parallel_min_tokens: cfg.context_parallel_min_tokens,
            },
        )?;
        let secs = t_load.elapsed().as_secs_f64();
        // Worth a line only when the load is long enough to wonder about (like the kernel compile).
        let log = |m: String| {
            if secs >= 10.0 {
                tracing::info!("{m}");
            } else {
                tracing::debug!("{m}");
            }
        };
        log(format!(
            "weights loaded: {:.2} GB in {secs:.1} s ({:.2} GB/s)",
            weight_bytes as f64 / 1e9,
            weight_bytes as f64 / 1e9 / secs.max(1e-9)
        ));
        let media = media::Media::load(&backend, &config, ckpt, cfg.dtype)?;
        let act = backend.activation_dtype(cfg.dtype);
        // Every kernel the steps may launch, now: a compile at first use would stall a step.
        let t_compile = Instant::now();
        backend.prepare_kernels(act)?;
        if t_compile.elapsed().as_secs_f64() > 1.0 {
            tracing::info!(
                "kernels compiled in {:.1} s (cached for later runs)",
                t_compile.elapsed().as_secs_f64()
            );
        }
        let bs = cfg.scheduler.block_size;
        let spec = model.cache_spec();
        match cfg.max_model_len {
            Some(0) => bail!("--max-model-len must be at least 1"),
            // As vLLM: a cap above the model's window is a mistake, not a silent no-op.
            Some(m) if m > config.max_context() => bail!(
                "--max-model-len (max_model_len) is {m} but the model's context window is {} \
                 (max_position_embeddings in {})",
                config.max_context(),
                origin.display()
            ),
            _ => {}
        }
        let max_context = config
            .max_context()
            .min(cfg.max_model_len.unwrap_or(usize::MAX));
        let prefix = PrefixSettings {
            enabled: cfg.prefix_caching,
            recurrent: spec.has_recurrent(),
            checkpoint_interval: cfg.state_checkpoint_interval,
            checkpoints: cfg.state_checkpoints.unwrap_or(cfg.scheduler.max_num_seqs),
            alignment: lcm(bs, backend.recurrent_split_alignment().max(1)),
        };
        // Refuse absurd slot counts before sizing anything by them.
        let max = crate::scheduler::MAX_NUM_SEQS;
        if cfg.scheduler.max_num_seqs > max {
            bail!(
                "--max-num-seqs is {} but at most {max} sequences can run at once",
                cfg.scheduler.max_num_seqs
            );
        }
        if prefix.checkpoints > max {
            bail!(
                "state_checkpoints is {} but at most {max} are kept",
                prefix.checkpoints
            );
        }
        // Checkpoint slots are extra rows of the state tensors, after the running slots; the
        // last row is scratch for the padding sequences of decode graphs ([`graphs`]).
        let scratch_state_slot = cfg.scheduler.max_num_seqs
            + if prefix.enabled && prefix.recurrent {
                prefix.checkpoints
            } else {
                0
            };
        let state_slots = scratch_state_slot + usize::from(spec.has_recurrent());
        // Sized after the weights are loaded, against what the device still has free.
        let num_blocks = crate::cache::cache_blocks(&crate::cache::CacheRequest {
            requested_tokens: cfg.kv_cache_tokens,
            // A large default only where the free memory caps it (CPU and some WGSL adapters
            // cannot tell theirs).
            default_tokens: match (cfg.default_kv_cache_tokens, backend.free_memory()) {
                (Some(t), Some(_)) => t,
                _ => max_context.clamp(4096, 65536),
            },
            block_size: bs,
            bytes_per_token: spec.elements_per_token().saturating_mul(act.size()),
            largest_tensor_bytes_per_token: spec
                .largest_tensor_elements_per_token()
                .saturating_mul(act.size()),
            state_bytes_per_seq: spec.state_elements_per_seq().saturating_mul(4),
            largest_state_tensor_bytes_per_seq: spec
                .largest_state_tensor_elements_per_seq()
                .saturating_mul(4),
            state_slots,
            // Ranks on one memory pool each take their share of it.
            free_bytes: backend
                .free_memory()
                .map(|f| f / dist.as_ref().map_or(1, |d| d.memory_shared_by.max(1)) as u64),
            max_tensor_bytes: backend.max_buffer_bytes(),
        })?;
        // Every rank schedules the same blocks: the cache is what the tightest rank holds.
        let num_blocks = match &dist {
            Some(d) => d
                .group
                .all_gather_bytes(&(num_blocks as u64).to_le_bytes())?
                .iter()
                .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap_or_default()) as usize)
                .min()
                .unwrap_or(num_blocks),
            None => num_blocks,
        };
        let cache = KvCache::new(
            &backend,
            &model.cache_spec(),
            num_blocks,
            bs,
            act,
            state_slots,
        )?;
        let cache_bytes: u64 = cache
            .block_tensors()
            .into_iter()
            .chain(cache.state_tensors())
            .map(|t| (t.numel() * t.dtype().size()) as u64)
            .sum();
        let rank_memory = match &dist {
            Some(d) => {
                let mine = [weight_bytes.to_le_bytes(), cache_bytes.to_le_bytes()].concat();
                let all = d.group.all_gather_bytes(&mine)?;
                let per: Vec<(u64, u64)> = all
                    .iter()
                    .map(|b| {
                        let word = |i: usize| {
                            u64::from_le_bytes(
                                b.get(i..i + 8)
                                    .and_then(|s| s.try_into().ok())
                                    .unwrap_or([0; 8]),
                            )
                        };
                        (word(0), word(8))
                    })
                    .collect();
                if d.group.rank() == 0 {
                    for (r, (w, c)) in per.iter().enumerate() {
                        tracing::info!(
                            "rank {r} of {}: weights {}, cache {} ({num_blocks} blocks of {bs} tokens)",
                            per.len(),
                            crate::cache::human_bytes(*w),
                            crate::cache::human_bytes(*c)
                        );
                    }
                }
                per
            }
            None => vec![(weight_bytes, cache_bytes)],
        };
        let mut scheduler = Scheduler::new(cfg.scheduler.clone(), num_blocks, prefix)?;
        if cfg.host_cache_bytes > 0 {
            if let Some(avail) = dayone_backend::host_available_memory() {
                if cfg.host_cache_bytes > avail {
                    bail!(
                        "host_cache_gb asks for {} of host memory but only {} is available",
                        crate::cache::human_bytes(cfg.host_cache_bytes),
                        crate::cache::human_bytes(avail)
                    );
                }
            }
            let row_bytes =
                |t: &B::Tensor| (t.numel() / t.shape()[0].max(1) * t.dtype().size()) as u64;
            scheduler.set_host_tier(crate::cache::HostTier::new(
                cfg.host_cache_bytes,
                cache.block_tensors().into_iter().map(row_bytes).sum(),
                cache.state_tensors().into_iter().map(row_bytes).sum(),
            ));
        }
        Ok(Self {
            media,
            graphs: (!cfg.enforce_eager).then(graphs::DecodeGraphs::default),
            scratch_state_slot: scratch_state_slot as u32,
            cache_bytes_per_token: model.cache_spec().elements_per_token() * act.size(),
            state_bytes_per_seq: model.cache_spec().state_elements_per_seq() * 4,
            activation_dtype: act,
            weight_dtype: cfg.dtype,
            backend,
            config,
            model,
            cache,
            scheduler,
            eos_ids: ckpt.assets.eos_ids.clone(),
            next_id: 0,
            metrics: EngineMetrics::new(max_context),
            cache_spec_recurrent: prefix.recurrent,
            max_context,
            capture_logits: false,
            last_logits: Vec::new(),
            prompt_scores: Default::default(),
            rank_memory,
            mirror: dist.map(|d| Mirror {
                group: d.group,
                outbox: Vec::new(),
                done: d.done,
            }),
        })
    }

    /// `(weight bytes, cache and state bytes)` this model holds on each rank, rank 0 first (one
    /// entry on one device). Weights count what was uploaded through the loader.
    pub fn rank_memory(&self) -> &[(u64, u64)] {
        &self.rank_memory
    }

    /// Bytes the cache keeps per token over all layers.
    pub fn cache_bytes_per_token(&self) -> usize {
        self.cache_bytes_per_token
    }

    /// Bytes of recurrent state (f32) each running sequence keeps over all layers.
    pub fn state_bytes_per_seq(&self) -> usize {
        self.state_bytes_per_seq
    }

    /// The dtype activations, weights and the KV cache are computed in: the configured dtype
    /// as the backend grants it (`Backend::activation_dtype`: f32 on the CPU and WGSL backends).
    pub fn activation_dtype(&self) -> DType {
        self.activation_dtype
    }

    /// The dtype float weights were stored in at load (`EngineConfig::dtype`; block-quantized
    /// weights stay in their format). It differs from [`Engine::activation_dtype`] where the
    /// backend computes in f32 from 16-bit weights (WGSL with bf16: half the bytes read, f32
    /// accumulation; the CPU backend widens them to f32 at upload).
    pub fn weight_dtype(&self) -> DType {
        self.weight_dtype
    }

    /// Token ids that stop generation.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Replaces the stop ids.
    pub fn set_eos_ids(&mut self, ids: Vec<u32>) {
        self.record(Command::SetEos(ids.clone()));
        self.eos_ids = ids;
    }

    /// Cache blocks an allocation may take: free ones plus cached prefixes no sequence holds
    /// (all of them once every sequence has finished).
    pub fn free_blocks(&self) -> usize {
        self.scheduler.pool().num_free()
    }

    /// All cache blocks.
    pub fn total_blocks(&self) -> usize {
        self.scheduler.pool().num_blocks()
    }

    /// Cached prefix blocks no sequence holds (kept until the pool needs room).
    pub fn cached_blocks(&self) -> usize {
        self.scheduler.pool().num_evictable()
    }

    /// The context window in tokens: the model's, capped by `max_model_len`.
    pub fn max_context(&self) -> usize {
        self.max_context
    }

    /// Sequences waiting: (short queue, long queue).
    pub fn num_waiting(&self) -> (usize, usize) {
        let long = self.scheduler.num_waiting_long();
        (self.scheduler.num_waiting() - long, long)
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.scheduler.running.len()
    }

    /// The backend the engine computes on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The scheduler's counters (prefix-cache queries and hits, checkpoints, preemptions).
    pub fn counters(&self) -> SchedulerCounters {
        self.scheduler.counters
    }

    /// State checkpoints held (recurrent layers; 0 for other models).
    pub fn state_checkpoints(&self) -> usize {
        self.scheduler.checkpoints().len()
    }

    /// Forgets every cached prefix that no running sequence holds.
    pub fn reset_prefix_cache(&mut self) {
        self.record(Command::ResetPrefixCache);
        self.scheduler.reset_prefix_cache();
    }

    /// The engine's metrics now (vLLM's names and buckets; see [`crate::metrics`]).
    pub fn metrics(&self) -> MetricsSnapshot {
        self.metrics.snapshot()
    }

    /// Records a finished (or aborted) sequence in the metrics.
    fn record_finished(&mut self, seq: &Sequence) {
        let now = Instant::now();
        let since = |t: Instant| t.duration_since(seq.arrival).as_secs_f64();
        self.metrics.on_request_finished(&FinishedRequest {
            reason: seq.finished.unwrap_or(FinishReason::Abort),
            queue_s: since(seq.first_scheduled.unwrap_or(now)),
            ttft_s: seq.first_token.map(since),
            e2e_s: since(now),
            prompt_len: seq.prompt_len,
            gen_len: seq.generated().len(),
        });
    }

    /// Gauges after a step or an abort.
    fn record_gauges(&mut self) {
        let (short, long) = self.num_waiting();
        self.metrics.set_requests(self.num_running(), short, long);
        let pool = self.scheduler.pool();
        let free = pool.num_free();
        self.metrics
            .set_kv_blocks(pool.num_blocks() - free, free, pool.num_evictable());
    }

    /// Checks that every cache block and state slot is accounted for (tests: no leaks).
    pub fn check_consistency(&self) -> Result<()> {
        self.scheduler.check_consistency()
    }

    /// Queues a request; returns its id.
    ///
    /// Errors: an empty prompt, a token id outside the vocabulary, a prompt that leaves no room in
    /// the context window, or one whose prompt plus `max_tokens` (clipped to the context window)
    /// the KV cache cannot hold at once.
    pub fn add_request(&mut self, prompt: Vec<u32>, params: SamplingParams) -> Result<u64> {
        self.add_request_with(prompt, params, Default::default())
    }

    /// Prompt tokens of unfinished request `id` whose cache is computed (prefill progress);
    /// `None` for no such request.
    pub fn prefill_progress(&self, id: u64) -> Option<usize> {
        self.scheduler
            .sequence(id)
            .map(|s| s.num_computed.min(s.prompt_len))
    }

    /// Attaches a [`crate::sampling::LogitsProcessor`] to request `id` (constrained decoding);
    /// it runs before every sample of that request. Errors: no such unfinished request.
    pub fn set_logits_processor(
        &mut self,
        id: u64,
        processor: Box<dyn crate::sampling::LogitsProcessor>,
    ) -> Result<()> {
        let seq = self
            .scheduler
            .sequence_mut(id)
            .ok_or_else(|| anyhow::anyhow!("no unfinished request {id}"))?;
        seq.processor = Some(processor);
        Ok(())
    }

    /// [`Engine::add_request`] with prefix-cache extra keys (a cache salt, image hashes):
    /// prefixes are shared only between requests whose keys agree.
    pub fn add_request_with(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        extra_keys: crate::cache::prefix::ExtraKeys,
    ) -> Result<u64> {
        self.add_request_scored(prompt, params, extra_keys, None)
    }

    /// [`Engine::add_request_with`], and with `prompt_logprobs: Some(k)` also scores the prompt
    /// (vLLM's `prompt_logprobs`): the logits row of every prompt position but the last is
    /// computed and turned into the log-probability of the next prompt token plus the `k` most
    /// likely tokens (`k ≥ vocab_size`: all of them), delivered with the request's first
    /// generated token ([`TokenEvent::prompt_logprobs`]). Such a request skips the prefix cache
    /// (a cached prefix has no logits: it gets a salt of its own, as vLLM skips the lookup), and
    /// its prompt may fill the whole context window (its one token comes from the last
    /// position).
    pub fn add_request_scored(
        &mut self,
        prompt: Vec<u32>,
        params: SamplingParams,
        mut extra_keys: crate::cache::prefix::ExtraKeys,
        prompt_logprobs: Option<usize>,
    ) -> Result<u64> {
        params.validate()?;
        let forwarded = self.mirror.is_some().then(|| Command::Add {
            id: self.next_id,
            prompt: prompt.clone(),
            params: params.clone(),
            extra_keys: extra_keys.clone(),
            prompt_logprobs,
        });
        if prompt.is_empty() {
            bail!("the prompt is empty: give at least one token");
        }
        let vocab = self.config.vocab_size();
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            bail!("prompt token id {bad} is outside the vocabulary (vocab_size {vocab})");
        }
        let ctx = self.max_context;
        if prompt.len() > ctx || (prompt.len() == ctx && prompt_logprobs.is_none()) {
            bail!(
                "the prompt has {} tokens but the context window is {ctx} (max_position_embeddings{}): shorten it",
                prompt.len(),
                if ctx < self.config.max_context() { ", capped by max_model_len" } else { "" }
            );
        }
        // Generation stops at the context window, so `max_tokens` is first clipped to it; the
        // request then needs every token but the last in the cache at once (vLLM likewise
        // refuses a request longer than its cache rather than failing mid-generation).
        let capacity = self.cache.num_blocks * self.cache.block_size;
        let room = ctx - prompt.len();
        let generated = params.max_tokens.min(room);
        // A scored prompt that fills the window generates nothing past it, but is all cached.
        let need = prompt.len() + generated.max(1) - 1;
        if need > capacity {
            let gen = if generated < params.max_tokens {
                format!("{generated} generated tokens (--max-tokens clipped to the context window of {ctx})")
            } else {
                format!("--max-tokens ({generated})")
            };
            bail!(
                "prompt ({} tokens) + {gen} need {need} tokens of KV cache (all but the last token are cached) but the device cache holds {capacity}{}: raise --kv-cache-tokens or lower --max-tokens",
                prompt.len(),
                match self.scheduler.host_tier() {
                    // A sequence computes with all its tokens on the device; the host tier
                    // holds prefixes and swapped sequences, not a running working set.
                    Some(t) => format!(
                        " and the host tier {} tokens ({}), which only keeps prefixes and swapped-out requests",
                        t.capacity() / t.block_bytes.max(1) * self.cache.block_size as u64,
                        crate::cache::human_bytes(t.capacity())
                    ),
                    None => String::new(),
                }
            );
        }
        let id = self.next_id;
        if let Some(top) = prompt_logprobs {
            // A salt no other request has: no prefix hit, so every position is computed.
            extra_keys.cache_salt = Some(format!("\0dayone-prompt-logprobs-{id}"));
            self.prompt_scores.insert(
                id,
                PromptScores {
                    top,
                    entries: vec![None; prompt.len() - 1],
                },
            );
        }
        let mut seq = Sequence::new(id, prompt, params);
        seq.extra_keys = extra_keys;
        if let Err(e) = self.scheduler.add(seq) {
            self.prompt_scores.remove(&id);
            return Err(e);
        }
        self.next_id += 1;
        if let Some(c) = forwarded {
            self.record(c);
        }
        Ok(id)
    }

    /// Aborts request `id` (waiting or running): its blocks and state slot are freed at once.
    /// Returns whether it was still unfinished. Call between steps (the engine is single-threaded;
    /// [`crate::service`] serialises aborts from other threads).
    pub fn abort(&mut self, id: u64) -> Result<bool> {
        self.record(Command::Abort(id));
        self.prompt_scores.remove(&id);
        let Some(seq) = self.scheduler.abort(id)? else {
            return Ok(false);
        };
        self.record_finished(&seq);
        self.record_gauges();
        Ok(true)
    }

    /// Whether requests remain.
    pub fn has_unfinished(&self) -> bool {
        self.scheduler.has_unfinished()
    }

    /// Runs one step: schedules, runs the model over the step's tokens, samples a token for each
    /// sequence whose prompt is fully computed, and retires finished sequences.
    pub fn step(&mut self) -> Result<Vec<TokenEvent>> {
        self.send(Command::Step)?;
        let before = self.scheduler.counters;
        let plan = self.scheduler.schedule()?;
        self.record_schedule(before);
        self.page(&plan)?;
        let chunks = plan.chunks;
        if chunks.is_empty() {
            if self.scheduler.has_unfinished() {
                // Unreachable when every request passed `add_request`'s size check (preemption
                // frees the whole cache for the oldest sequence); reported rather than looping.
                bail!(
                    "the scheduler could not place any of {} unfinished requests ({} of {} KV cache blocks free): raise --kv-cache-tokens",
                    self.scheduler.num_waiting() + self.scheduler.running.len(),
                    self.free_blocks(),
                    self.total_blocks()
                );
            }
            return Ok(Vec::new());
        }
        // Prefix hits on a recurrent model resume from a state checkpoint.
        self.copy_state_slots(&plan.restores)?;
        let (host_ids, meta, rows) = self.build_step(&chunks);
        let b = &self.backend;
        let want: Vec<usize> = chunks
            .iter()
            .filter(|c| c.wants_logits)
            .map(|c| c.index)
            .collect();
        let seq_ids: Vec<u64> = chunks
            .iter()
            .map(|c| self.scheduler.running[c.index].id)
            .collect();
        let splice = self.media.splice(&chunks, &seq_ids, &meta.query_start)?;
        // Pure decode on one device: a graph when the backend has them ([`graphs`]); its logits
        // have `bucket` rows, the real ones first.
        let decode_only = chunks.iter().all(|c| c.len == 1 && c.wants_logits)
            && rows.scored.is_empty()
            && splice.is_none()
            && self.mirror.is_none();
        let max_blocks = self.max_context.div_ceil(self.cache.block_size);
        let graphed = match self.graphs.as_mut().filter(|_| decode_only) {
            Some(g) => g.run(
                b,
                self.model.as_ref(),
                &self.cache,
                (&host_ids, &meta),
                max_blocks,
                self.scratch_state_slot,
            )?,
            None => None,
        };
        let (logits, logit_rows_total) = match graphed {
            Some(l) => {
                let rows_total = l.shape()[0];
                (l, rows_total)
            }
            None => {
                let ids = b.upload(&HostTensor::from_u32(vec![host_ids.len()], &host_ids)?)?;
                let total = meta.logit_rows.len();
                let meta = b.upload_meta(meta)?;
                let l = self.model.forward_spliced(
                    b,
                    &ids,
                    splice.as_ref(),
                    &meta,
                    &self.cache,
                    None,
                )?;
                (l, total)
            }
        };
        let greedy = want.iter().all(|&i| {
            let seq = &self.scheduler.running[i];
            seq.params.is_greedy() && seq.params.logprobs.is_none() && seq.processor.is_none()
        });
        let mut logprobs: Vec<Option<crate::sampling::TokenLogprobs>> = vec![None; want.len()];
        let tokens: Vec<u32> = if self.is_follower() {
            // Rank 0 samples (it alone holds logits processors and the requests' streams).
            let t = self.share_tokens(None)?;
            if t.len() != want.len() {
                bail!(
                    "rank 0 sent {} tokens for {} sequences: the ranks diverged",
                    t.len(),
                    want.len()
                );
            }
            t
        } else if greedy && !self.capture_logits && self.scores_on_device(&rows) {
            // Only token ids (and one log-probability per scored row) leave the device.
            self.score_prompt_rows_on_device(&logits, &rows.scored)?;
            let b = &self.backend;
            let all = b.download(&b.argmax(&logits)?)?.to_u32()?;
            if rows.scored.is_empty() {
                all
            } else {
                rows.sample.iter().map(|&r| all[r]).collect()
            }
        } else {
            let host = b.download(&logits)?.to_f32();
            let n_rows = rows.sample.len() + rows.scored.iter().map(|s| s.3).sum::<usize>();
            // A graph's logits carry padding rows after the real ones.
            let v = host.len() / logit_rows_total.max(1);
            // No row wants logits (a prefill chunk mid-prompt traced by `check`): nothing to do.
            if n_rows > 0 && (v * logit_rows_total != host.len() || n_rows > logit_rows_total) {
                bail!("internal: {} logits for {n_rows} rows", host.len());
            }
            self.score_prompt_rows(&host, v, &rows.scored);
            self.last_logits.clear();
            want.iter()
                .enumerate()
                .map(|(r, &i)| {
                    let r0 = rows.sample[r];
                    let row = &host[r0 * v..(r0 + 1) * v];
                    let seq = &mut self.scheduler.running[i];
                    if self.capture_logits {
                        self.last_logits.push((seq.id, row.to_vec()));
                    }
                    let masked;
                    let sample_row = match seq.processor.as_mut() {
                        Some(p) => {
                            let mut r = row.to_vec();
                            p.apply(&seq.tokens[seq.prompt_len..], &mut r);
                            masked = r;
                            &masked[..]
                        }
                        None => row,
                    };
                    let token = seq.sampler.sample_with_history(
                        sample_row,
                        &seq.params,
                        &seq.tokens,
                        seq.prompt_len,
                    );
                    if let Some(n) = seq.params.logprobs {
                        logprobs[r] = Some(crate::sampling::token_logprobs(row, token, n));
                    }
                    token
                })
                .collect()
        };
        // A step without logits rows still runs the head on one padded row (metadata tensors
        // are never empty): only the sampled rows' tokens count.
        let mut tokens = tokens;
        tokens.truncate(want.len());
        if self.mirror.is_some() && !self.is_follower() {
            self.share_tokens(Some(&tokens))?;
        }
        self.advance(&chunks)?;
        if self.accepts_images() {
            let sched = &self.scheduler;
            self.media.retain(|id| sched.sequence(id).is_some());
        }
        let ctx = self.max_context;
        let now = Instant::now();
        let mut events = Vec::with_capacity(want.len());
        let follower = self.is_follower();
        for ((&i, &token), logprobs) in want.iter().zip(&tokens).zip(logprobs) {
            let seq = &mut self.scheduler.running[i];
            seq.tokens.push(token);
            match seq.last_token {
                None => {
                    seq.first_token = Some(now);
                    let ttft = now.duration_since(seq.arrival).as_secs_f64();
                    self.metrics.on_first_token(seq.prompt_len, ttft);
                }
                Some(t) => self
                    .metrics
                    .on_next_token(now.duration_since(t).as_secs_f64()),
            }
            seq.last_token = Some(now);
            let finish = if (!seq.params.ignore_eos && self.eos_ids.contains(&token))
                || seq.params.stop_token_ids.contains(&token)
            {
                Some(FinishReason::Eos)
            } else if seq.generated().len() >= seq.params.max_tokens {
                Some(FinishReason::Length)
            } else if seq.tokens.len() >= ctx {
                Some(FinishReason::ContextFull)
            } else {
                None
            };
            seq.finished = finish;
            let prompt_logprobs = if follower {
                // Rank 0 scores the prompt; the others only keep its rows in the step.
                self.prompt_scores.remove(&seq.id);
                None
            } else if seq.generated().len() == 1 {
                match self.prompt_scores.remove(&seq.id) {
                    Some(s) => match s.entries.into_iter().collect::<Option<Vec<_>>>() {
                        Some(all) => Some(all),
                        None => bail!(
                            "internal: request {} finished its prompt with unscored positions",
                            seq.id
                        ),
                    },
                    None => None,
                }
            } else {
                None
            };
            events.push(TokenEvent {
                seq_id: seq.id,
                token,
                prompt_tokens: seq.prompt_len,
                cached_tokens: seq.cached_tokens.unwrap_or(0),
                finish,
                logprobs,
                prompt_logprobs,
            });
        }
        for seq in self.scheduler.reap_finished()? {
            self.record_finished(&seq);
        }
        self.record_gauges();
        Ok(events)
    }

    /// Prefix-cache and preemption counters of one `schedule()` into the metrics.
    fn record_schedule(&mut self, before: SchedulerCounters) {
        let c = self.scheduler.counters;
        let (query, hit) = (
            (c.prefix_query_tokens - before.prefix_query_tokens) as usize,
            (c.prefix_hit_tokens - before.prefix_hit_tokens) as usize,
        );
        if query > 0 {
            self.metrics.on_prefix_query(query, hit);
            if self.cache_spec_recurrent {
                // Tokens whose per-token cache was found: the checkpoint lookups' query.
                let found = hit + (c.state_miss_tokens - before.state_miss_tokens) as usize;
                self.metrics.on_state_checkpoint_query(found, hit);
            }
        }
        for _ in before.preemptions_recompute..c.preemptions_recompute {
            self.metrics.on_preemption(Preemption::Recompute);
        }
        let host_query = (c.host_query_tokens - before.host_query_tokens) as usize;
        if host_query > 0 {
            let hit = (c.host_hit_tokens - before.host_hit_tokens) as usize;
            self.metrics.on_host_query(host_query, hit);
        }
    }

    /// Whether this step's scored rows (if any) need only the next prompt token's
    /// log-probability (no alternatives), which the device computes.
    fn scores_on_device(&self, rows: &LogitRows) -> bool {
        rows.scored
            .iter()
            .all(|s| self.prompt_scores.get(&s.0).is_none_or(|p| p.top == 0))
    }

    /// The scored rows' log-probabilities of their next prompt tokens, computed on the device
    /// ([`Backend::token_logprob_rows`] over `logits` `[rows, V]`): one f32 per row is read back.
    fn score_prompt_rows_on_device(
        &mut self,
        logits: &B::Tensor,
        scored: &[(u64, usize, usize, usize)],
    ) -> Result<()> {
        if scored.is_empty() {
            return Ok(());
        }
        // Rows that are not scored (sampling rows, padding) get token 0 and are ignored.
        let mut targets = vec![0u32; logits.shape()[0]];
        for &(id, pos0, row0, n) in scored {
            let Some(seq) = self.scheduler.running.iter().find(|s| s.id == id) else {
                continue;
            };
            for j in 0..n {
                targets[row0 + j] = seq.tokens[pos0 + j + 1];
            }
        }
        let b = &self.backend;
        let t = b.upload(&HostTensor::from_u32(vec![targets.len()], &targets)?)?;
        let lp = b.download(&b.token_logprob_rows(logits, &t)?)?.to_f32();
        for &(id, pos0, row0, n) in scored {
            let Some(scores) = self.prompt_scores.get_mut(&id) else {
                continue;
            };
            for j in 0..n {
                scores.entries[pos0 + j] = Some(crate::sampling::TokenLogprobs {
                    token: targets[row0 + j],
                    logprob: lp[row0 + j],
                    top: Vec::new(),
                });
            }
        }
        Ok(())
    }

    /// Turns the scored rows of a step's logits (`host`, `[rows, v]`) into prompt
    /// log-probabilities.
    fn score_prompt_rows(&mut self, host: &[f32], v: usize, scored: &[(u64, usize, usize, usize)]) {
        for &(id, pos0, row0, n) in scored {
            let Some(seq) = self.scheduler.running.iter().find(|s| s.id == id) else {
                continue;
            };
            let Some(scores) = self.prompt_scores.get_mut(&id) else {
                continue;
            };
            for j in 0..n {
                let (pos, r) = (pos0 + j, row0 + j);
                let row = &host[r * v..(r + 1) * v];
                scores.entries[pos] =
                    Some(prompt_token_logprobs(row, seq.tokens[pos + 1], scores.top));
            }
        }
    }

    /// Token ids and metadata for the scheduled chunks, and which logits rows they ask for.
    fn build_step(&self, chunks: &[ScheduledChunk]) -> (Vec<u32>, StepMeta, LogitRows) {
        let bs = self.cache.block_size;
        let running = &self.scheduler.running;
        let max_blocks = chunks
            .iter()
            .map(|c| running[c.index].blocks.len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut ids = Vec::new();
        let mut m = StepMeta {
            max_blocks,
            block_size: bs,
            query_start: vec![0],
            ..Default::default()
        };
        let mut rows = LogitRows::default();
        for (s, c) in chunks.iter().enumerate() {
            let seq = &running[c.index];
            if self.prompt_scores.contains_key(&seq.id) {
                // Every prompt position of the chunk that has a next prompt token.
                let first = m.positions.len();
                let end = (c.start + c.len).min(seq.prompt_len.saturating_sub(1));
                if end > c.start {
                    let n = end - c.start;
                    rows.scored.push((seq.id, c.start, m.logit_rows.len(), n));
                    m.logit_rows.extend((first..first + n).map(|r| r as u32));
                }
            }
            for pos in c.start..c.start + c.len {
                ids.push(seq.tokens[pos]);
                m.positions.push(pos as u32);
                m.token_seq.push(s as u32);
                m.slot_mapping
                    .push(seq.blocks[pos / bs] * bs as u32 + (pos % bs) as u32);
            }
            let mut row = seq.blocks.clone();
            row.resize(max_blocks, 0);
            m.block_tables.extend(row);
            let len = (c.start + c.len) as u32;
            m.seq_lens.push(len);
            m.state_slots.push(seq.slot.unwrap_or(0));
            m.max_seq_len = m.max_seq_len.max(len as usize);
            m.query_start.push(m.positions.len() as u32);
            if c.wants_logits {
                rows.sample.push(m.logit_rows.len());
                m.logit_rows.push(m.positions.len() as u32 - 1);
            }
        }
        (ids, m, rows)
    }

    /// Decode graphs so far: `(captures, replays, why graphs are off)`; `None` with
    /// `--enforce-eager` ([`graphs`]).
    pub fn graph_stats(&self) -> Option<(u64, u64, Option<String>)> {
        self.graphs
            .as_ref()
            .map(|g| (g.captures, g.replays, g.off_reason().map(str::to_string)))
    }

    /// Runs every queued request to completion; returns the generated ids per request id order.
    pub fn run_to_completion(&mut self) -> Result<Vec<(u64, Vec<u32>)>> {
        let mut out: std::collections::BTreeMap<u64, Vec<u32>> = Default::default();
        while self.has_unfinished() {
            for e in self.step()? {
                out.entry(e.seq_id).or_default().push(e.token);
            }
        }
        Ok(out.into_iter().collect())
    }

    /// Prefill `prompt` alone with tracing on: the hidden state `[N, D]` (f32) after the embedding
    /// and each layer (HF `output_hidden_states` order) plus the last-token logits `[V]`.
    /// Uses and then frees cache blocks; the engine must be idle.
    pub fn trace_prefill(&mut self, prompt: &[u32]) -> Result<(Vec<HostTensor>, Vec<f32>)> {
        if self.has_unfinished() {
            bail!("trace_prefill needs an idle engine");
        }
        self.send(Command::Trace(prompt.to_vec()))?;
        let id = self.add_request(
            prompt.to_vec(),
            SamplingParams {
                max_tokens: 1,
                ..Default::default()
            },
        )?;
        // The other ranks trace on their own (`Command::Trace`): this request is not theirs.
        if let Some(m) = self.mirror.as_mut() {
            m.outbox.pop();
        }
        let seq = self
            .scheduler
            .abort(id)?
            .expect("just added, not yet scheduled");
        let seq = Sequence::new(seq.id, seq.tokens, seq.params);
        let index = self.scheduler.run_alone(seq)?;
        let chunk = ScheduledChunk {
            index,
            start: 0,
            len: prompt.len(),
            wants_logits: true,
        };
        let (ids, meta, _) = self.build_step(&[chunk]);
        let b = &self.backend;
        let ids = b.upload(&HostTensor::from_u32(vec![ids.len()], &ids)?)?;
        let meta = b.upload_meta(meta)?;
        let mut trace = Vec::new();
        let result = self
            .model
            .forward(b, &ids, &meta, &self.cache, Some(&mut trace));
        self.scheduler.running[index].finished = Some(FinishReason::Abort);
        self.scheduler.reap_finished()?;
        let logits = b.download(&result?)?.to_f32();
        let hidden = trace
            .iter()
            .map(|t| b.download(t))
            .collect::<Result<Vec<_>>>()?;
        Ok((hidden, logits))
    }
}

/// Log-softmax of `row` at `token` and the `top` most likely tokens ([`crate::sampling::token_logprobs`];
/// without alternatives only the log-sum-exp is computed, in f64).
fn prompt_token_logprobs(row: &[f32], token: u32, top: usize) -> crate::sampling::TokenLogprobs {
    if top > 0 {
        return crate::sampling::token_logprobs(row, token, top);
    }
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    crate::sampling::TokenLogprobs {
        token,
        logprob: row
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&x| (x as f64 - lse) as f32),
        top: Vec::new(),
    }
}

/// Least common multiple (for the checkpoint alignment).
fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}
