//! The serving config file (`--config FILE`, YAML): the deployment layout of the seeds
//! (`serving: {model, parallel, context, cache, runtime}`), read into [`ServingFile`], checked
//! against what this build can serve, layered (CLI flag > file > defaults, as vLLM and SGLang
//! merge theirs) and mapped onto [`EngineConfig`].
//!
//! Every key is optional; an absent key keeps the layer below. Keys are spelled as in the seeds
//! (`tensor_parallel_size`) or as vLLM spells its flags (`tensor-parallel-size`,
//! `max-num-batched-tokens`, `enable-prefix-caching`). An unknown key, a wrong type, or a value
//! this build cannot serve (parallelism above 1, distributed KV, a non-paged KV layout, no
//! continuous batching, float16) is an error naming the file and the key path
//! (`serving.parallel.tensor_parallel_size`). docs/serving.example.yaml is a complete example.
//!
//! YAML is read by `serde-saphyr` (pure Rust, panic-free, maintained; `serde_yaml` is
//! deprecated and its forks sit on the C-translated `unsafe-libyaml`), key paths come from
//! `serde_path_to_error`.

use crate::EngineConfig;
use anyhow::{bail, Context, Result};
use dayone_backend::DType;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::path::{Path, PathBuf};

/// Bytes in one `host_cache_gb` unit: GiB, as vLLM's `swap_space` / `cpu_offload_gb`.
pub const GIB: f64 = (1u64 << 30) as f64;

/// KV block sizes accepted (tokens per block; vLLM's `--block-size` choices).
pub const BLOCK_SIZES: [usize; 5] = [8, 16, 32, 64, 128];

/// A whole config file: one top-level `serving` mapping.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServingFile {
    /// The settings.
    #[serde(default)]
    pub serving: Serving,
}

/// `serving:`; each section optional.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Serving {
    /// `serving.model`.
    pub model: ModelSection,
    /// `serving.parallel`.
    pub parallel: ParallelSection,
    /// `serving.context`.
    pub context: ContextSection,
    /// `serving.cache`.
    pub cache: CacheSection,
    /// `serving.runtime`.
    pub runtime: RuntimeSection,
}

/// Float dtype of weights and activations (`serving.model.dtype`; vLLM's spellings accepted).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DtypeName {
    /// By backend and checkpoint ([`auto_dtype`]): bf16 on CUDA; on WGSL bf16 weights for a
    /// 16-bit checkpoint, else f32; f32 on the CPU backend.
    Auto,
    /// bfloat16.
    #[serde(alias = "bf16")]
    Bfloat16,
    /// IEEE half (refused: the engine computes f32 and bf16 only).
    #[serde(alias = "f16", alias = "half")]
    Float16,
    /// 32-bit float.
    #[serde(alias = "f32", alias = "float")]
    Float32,
}

impl DtypeName {
    /// The dtype, or `None` for `auto` (the caller picks by backend).
    pub fn dtype(self) -> Option<DType> {
        match self {
            DtypeName::Auto => None,
            DtypeName::Bfloat16 => Some(DType::BF16),
            DtypeName::Float16 => Some(DType::F16),
            DtypeName::Float32 => Some(DType::F32),
        }
    }

    /// The name of a dtype the engine runs (F32 → float32, BF16 → bfloat16, F16 → float16).
    pub fn of(d: DType) -> Self {
        match d {
            DType::BF16 => DtypeName::Bfloat16,
            DType::F16 => DtypeName::Float16,
            _ => DtypeName::Float32,
        }
    }
}

/// What `dtype: auto` resolves to on `backend` for a checkpoint whose float weights are stored
/// in `stored` ([`crate::loader::stored_float_dtype`]; `None`: no float weights, or not known
/// yet). The engine stores float weights in the result; activations, the KV cache and
/// accumulation follow [`dayone_backend::Backend::activation_dtype`] of it.
///
/// - CUDA: bf16 whatever the checkpoint (weights, activations and cache; tensor cores).
/// - WGSL: bf16 when the checkpoint is 16-bit, so decode reads half the bytes of f32 (an f16
///   checkpoint is rounded to bf16 at load: there is no f16 weight kernel); f32 otherwise
///   (f32 checkpoints, GGUF files whose float tensors are f32). Activations, the cache and
///   every sum stay f32 on WGSL (the correctness reference).
/// - CPU, and `Auto` (a backend not resolved yet): f32.
pub fn auto_dtype(backend: BackendName, stored: Option<DType>) -> DType {
    match (backend, stored) {
        (BackendName::Cuda, _) => DType::BF16,
        (BackendName::Wgsl, Some(DType::BF16 | DType::F16)) => DType::BF16,
        _ => DType::F32,
    }
}

/// Backend name (`serving.runtime.backend`), as `--backend` spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendName {
    /// CUDA when a driver and a device exist, else WGSL.
    Auto,
    /// wgpu + WGSL.
    Wgsl,
    /// cudarc + NVRTC + cuBLAS.
    Cuda,
    /// The CPU reference backend.
    Cpu,
}

/// KV cache layout (`serving.cache.kv_layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvLayout {
    /// Fixed-size blocks addressed through per-sequence block tables (the only one built).
    Paged,
    /// One contiguous region per sequence (refused).
    Contiguous,
}

/// `serving.model`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Model directory or `.gguf` file (relative paths: to the working directory).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// `bfloat16 | float16 | float32 | auto`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dtype: Option<DtypeName>,
}

/// `serving.parallel`: tensor and expert parallel sizes ([`crate::parallel`]); pipeline
/// parallelism is not built (1 only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ParallelSection {
    /// Devices a layer's tensors are split over.
    #[serde(
        alias = "tensor-parallel-size",
        skip_serializing_if = "Option::is_none"
    )]
    pub tensor_parallel_size: Option<u64>,
    /// Devices the routed experts are spread over.
    #[serde(
        alias = "expert-parallel-size",
        skip_serializing_if = "Option::is_none"
    )]
    pub expert_parallel_size: Option<u64>,
    /// Devices a long prompt's tokens are split over (context parallelism).
    #[serde(
        alias = "context-parallel-size",
        skip_serializing_if = "Option::is_none"
    )]
    pub context_parallel_size: Option<u64>,
    /// Under context parallelism, the smallest step (tokens) that is split.
    #[serde(
        alias = "context-parallel-min-tokens",
        skip_serializing_if = "Option::is_none"
    )]
    pub context_parallel_min_tokens: Option<usize>,
    /// Pipeline stages.
    #[serde(
        alias = "pipeline-parallel-size",
        skip_serializing_if = "Option::is_none"
    )]
    pub pipeline_parallel_size: Option<u64>,
}

/// `serving.context`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ContextSection {
    /// Caps the model's context window (tokens).
    #[serde(alias = "max-model-len", skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<usize>,
    /// Token budget of one step, and the most prompt tokens of one sequence in a step
    /// (vLLM's `max_num_batched_tokens`, SGLang's `chunked_prefill_size`).
    #[serde(
        alias = "chunked-prefill-size",
        alias = "max_num_batched_tokens",
        alias = "max-num-batched-tokens",
        skip_serializing_if = "Option::is_none"
    )]
    pub chunked_prefill_size: Option<usize>,
}

/// `serving.cache`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSection {
    /// `paged` (the only layout built).
    #[serde(alias = "kv-layout", skip_serializing_if = "Option::is_none")]
    pub kv_layout: Option<KvLayout>,
    /// Reuse cached prompt prefixes across requests.
    #[serde(
        alias = "prefix-caching",
        alias = "enable_prefix_caching",
        alias = "enable-prefix-caching",
        skip_serializing_if = "Option::is_none"
    )]
    pub prefix_caching: Option<bool>,
    /// Host-memory tier, GiB (may be fractional; 0: none).
    #[serde(alias = "host-cache-gb", skip_serializing_if = "Option::is_none")]
    pub host_cache_gb: Option<f64>,
    /// KV transfer between hosts (refused: not built).
    #[serde(alias = "distributed-kv", skip_serializing_if = "Option::is_none")]
    pub distributed_kv: Option<bool>,
    /// Tokens the device KV cache holds over all sequences (absent: sized from the model's
    /// window and free memory; see [`EngineConfig::kv_cache_tokens`]).
    #[serde(alias = "kv-cache-tokens", skip_serializing_if = "Option::is_none")]
    pub kv_cache_tokens: Option<usize>,
    /// Tokens per KV block, one of [`BLOCK_SIZES`].
    #[serde(alias = "block-size", skip_serializing_if = "Option::is_none")]
    pub block_size: Option<usize>,
    /// Recurrent-state checkpoint stride in prompt tokens, a multiple of the block size (0:
    /// only at the points the engine always keeps).
    #[serde(
        alias = "state-checkpoint-interval",
        skip_serializing_if = "Option::is_none"
    )]
    pub state_checkpoint_interval: Option<usize>,
    /// Checkpoint slots for prefix caching of recurrent layers (absent: `max_num_seqs`).
    #[serde(alias = "state-checkpoints", skip_serializing_if = "Option::is_none")]
    pub state_checkpoints: Option<usize>,
}

/// `serving.runtime`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSection {
    /// `wgsl | cuda | cpu | auto`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendName>,
    /// Must be true (the scheduler always batches continuously).
    #[serde(alias = "continuous-batching", skip_serializing_if = "Option::is_none")]
    pub continuous_batching: Option<bool>,
    /// Most sequences running at once.
    #[serde(alias = "max-num-seqs", skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<usize>,
    /// Prompts longer than this wait in the long-request queue (0: one queue).
    #[serde(
        alias = "long-prefill-threshold",
        skip_serializing_if = "Option::is_none"
    )]
    pub long_prefill_threshold: Option<usize>,
    /// Most long prompts prefilling at once.
    #[serde(
        alias = "max-long-partial-prefills",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_long_partial_prefills: Option<usize>,
    /// Most prompt tokens of long prompts per step (0: no cap beyond the chunk size).
    #[serde(
        alias = "long-prefill-token-cap",
        skip_serializing_if = "Option::is_none"
    )]
    pub long_prefill_token_cap: Option<usize>,
    /// Most requests waiting; a full queue refuses new ones at once.
    #[serde(
        alias = "max-queued-requests",
        alias = "max_num_queued_reqs",
        alias = "max-num-queued-reqs",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_queued_requests: Option<usize>,
    /// Batch-invariant kernels (bit-exact prefix-cache hits, chunking, preemption and
    /// batching on every backend; slower on CUDA). vLLM: `VLLM_BATCH_INVARIANT=1`.
    #[serde(alias = "batch-invariant", skip_serializing_if = "Option::is_none")]
    pub batch_invariant: Option<bool>,
    /// Decode steps run eagerly, never as CUDA graphs (default false: graphs where the
    /// backend and the model allow them). vLLM: `enforce_eager`.
    #[serde(alias = "enforce-eager", skip_serializing_if = "Option::is_none")]
    pub enforce_eager: Option<bool>,
}

/// Where a layer of settings came from, for error messages.
#[derive(Clone, Debug)]
pub enum Origin {
    /// A config file: errors say `FILE: serving.section.key: …`.
    File(PathBuf),
    /// Command-line flags: errors name the flag.
    Flags,
}

/// One key: its path in the file and the flag that sets it.
struct Key {
    path: &'static str,
    flag: &'static str,
}

impl Origin {
    fn err(&self, key: &Key, msg: impl std::fmt::Display) -> anyhow::Error {
        match self {
            Origin::File(f) => anyhow::anyhow!("{}: {}: {msg}", f.display(), key.path),
            Origin::Flags => anyhow::anyhow!("{}: {msg}", key.flag),
        }
    }
}

macro_rules! key {
    ($name:ident, $path:literal, $flag:literal) => {
        const $name: Key = Key {
            path: $path,
            flag: $flag,
        };
    };
}
key!(DTYPE, "serving.model.dtype", "--dtype");
key!(
    TP,
    "serving.parallel.tensor_parallel_size",
    "--tensor-parallel-size"
);
key!(
    EP,
    "serving.parallel.expert_parallel_size",
    "--expert-parallel-size"
);
key!(
    CP,
    "serving.parallel.context_parallel_size",
    "--context-parallel-size"
);
key!(
    CP_MIN,
    "serving.parallel.context_parallel_min_tokens",
    "--context-parallel-min-tokens"
);
key!(
    PP,
    "serving.parallel.pipeline_parallel_size",
    "--pipeline-parallel-size"
);
key!(
    MAX_MODEL_LEN,
    "serving.context.max_model_len",
    "--max-model-len"
);
key!(
    CHUNK,
    "serving.context.chunked_prefill_size",
    "--chunked-prefill-size"
);
key!(KV_LAYOUT, "serving.cache.kv_layout", "--kv-layout");
key!(HOST_GB, "serving.cache.host_cache_gb", "--host-cache-gb");
key!(DIST_KV, "serving.cache.distributed_kv", "--distributed-kv");
key!(
    KV_TOKENS,
    "serving.cache.kv_cache_tokens",
    "--kv-cache-tokens"
);
key!(BLOCK, "serving.cache.block_size", "--block-size");
key!(
    CKPT_INT,
    "serving.cache.state_checkpoint_interval",
    "--state-checkpoint-interval"
);
key!(
    CKPTS,
    "serving.cache.state_checkpoints",
    "--state-checkpoints"
);
key!(
    CB,
    "serving.runtime.continuous_batching",
    "--continuous-batching"
);
key!(SEQS, "serving.runtime.max_num_seqs", "--max-num-seqs");
key!(
    LONG_TH,
    "serving.runtime.long_prefill_threshold",
    "--long-prefill-threshold"
);
key!(
    LONG_N,
    "serving.runtime.max_long_partial_prefills",
    "--max-long-partial-prefills"
);
key!(
    LONG_CAP,
    "serving.runtime.long_prefill_token_cap",
    "--long-prefill-token-cap"
);
key!(
    QUEUE,
    "serving.runtime.max_queued_requests",
    "--max-queued-requests"
);

/// Some(v) with v ≥ 1, or the error.
fn at_least_one(o: &Origin, k: &Key, v: Option<impl Into<u64> + Copy>) -> Result<()> {
    match v.map(Into::into) {
        Some(0) => Err(o.err(k, "must be at least 1, got 0")),
        _ => Ok(()),
    }
}

fn parallel_one(o: &Origin, k: &Key, v: Option<u64>, what: &str) -> Result<()> {
    match v {
        Some(0) => Err(o.err(k, "must be at least 1, got 0")),
        Some(n) if n > 1 => Err(o.err(
            k,
            format!("{n} is not supported by this build: {what} is not built; set it to 1 (tensor_parallel_size splits a model over devices)"),
        )),
        _ => Ok(()),
    }
}

impl ServingFile {
    /// Reads and checks `file`.
    ///
    /// Errors name the file and the key path: unreadable file, YAML syntax (with line and
    /// column), unknown key, wrong type, or a value this build cannot serve ([`Serving::check`]).
    pub fn load(file: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        Self::parse(&text, file)
    }

    /// Parses YAML `text` that came from `file` (named in errors) and checks it.
    pub fn parse(text: &str, file: &Path) -> Result<Self> {
        // An empty file (or only comments) is an empty config, not an error.
        if text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            return Ok(Self::default());
        }
        let path = RefCell::new(String::new());
        let parsed = serde_saphyr::with_deserializer_from_str(text, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                *path.borrow_mut() = e.path().to_string();
                e.into_inner()
            })
        });
        let cfg: ServingFile = match parsed {
            Ok(c) => c,
            Err(e) => {
                let p = path.into_inner();
                // The message's first line; later lines are a source snippet.
                let msg = e.to_string();
                let msg = msg.lines().next().unwrap_or("").trim();
                let msg = msg.strip_prefix("error:").unwrap_or(msg).trim();
                if p.is_empty() || p == "." {
                    bail!("{}: {msg}", file.display());
                }
                bail!("{}: {p}: {msg}", file.display());
            }
        };
        cfg.serving.check(&Origin::File(file.to_path_buf()))?;
        Ok(cfg)
    }

    /// This config as YAML, readable by [`ServingFile::parse`] again.
    pub fn to_yaml(&self) -> Result<String> {
        serde_saphyr::to_string(self).context("writing the serving config as YAML")
    }
}

impl Serving {
    /// Checks values this build cannot serve and ranges; errors name the key (or flag) and,
    /// for a file, the file.
    pub fn check(&self, o: &Origin) -> Result<()> {
        if self.model.dtype == Some(DtypeName::Float16) {
            return Err(o.err(
                &DTYPE,
                "float16 is not supported by this build (the engine computes bfloat16 and float32): use bfloat16, float32 or auto",
            ));
        }
        let p = &self.parallel;
        at_least_one(o, &TP, p.tensor_parallel_size)?;
        at_least_one(o, &EP, p.expert_parallel_size)?;
        if let (Some(t), Some(e)) = (p.tensor_parallel_size, p.expert_parallel_size) {
            if t % e != 0 {
                return Err(o.err(
                    &EP,
                    format!("{e} must divide tensor_parallel_size ({t}): experts are split over groups of the tensor-parallel ranks"),
                ));
            }
        }
        at_least_one(o, &CP, p.context_parallel_size)?;
        at_least_one(o, &CP_MIN, p.context_parallel_min_tokens.map(|v| v as u64))?;
        if let (Some(t @ 2..), Some(c @ 2..)) = (p.tensor_parallel_size, p.context_parallel_size) {
            return Err(o.err(
                &CP,
                format!("{c} with tensor_parallel_size {t}: context parallelism keeps the whole model on every rank; use one of them"),
            ));
        }
        parallel_one(o, &PP, p.pipeline_parallel_size, "pipeline parallelism")?;
        at_least_one(
            o,
            &MAX_MODEL_LEN,
            self.context.max_model_len.map(|v| v as u64),
        )?;
        at_least_one(
            o,
            &CHUNK,
            self.context.chunked_prefill_size.map(|v| v as u64),
        )?;
        let c = &self.cache;
        if c.kv_layout == Some(KvLayout::Contiguous) {
            return Err(o.err(&KV_LAYOUT, "only `paged` is supported by this build"));
        }
        if let Some(gb) = c.host_cache_gb {
            if !(gb.is_finite() && gb >= 0.0) {
                return Err(o.err(&HOST_GB, format!("must be a finite number ≥ 0, got {gb}")));
            }
        }
        if c.distributed_kv == Some(true) {
            return Err(o.err(
                &DIST_KV,
                "true is not supported by this build (no KV transfer between hosts yet): set it to false",
            ));
        }
        at_least_one(o, &KV_TOKENS, c.kv_cache_tokens.map(|v| v as u64))?;
        if let Some(bs) = c.block_size {
            if !BLOCK_SIZES.contains(&bs) {
                return Err(o.err(&BLOCK, format!("must be one of {BLOCK_SIZES:?}, got {bs}")));
            }
        }
        at_least_one(o, &CKPTS, c.state_checkpoints.map(|v| v as u64))?;
        let r = &self.runtime;
        if r.continuous_batching == Some(false) {
            return Err(o.err(
                &CB,
                "false is not supported: the scheduler always batches continuously; set it to true",
            ));
        }
        at_least_one(o, &SEQS, r.max_num_seqs.map(|v| v as u64))?;
        at_least_one(o, &LONG_N, r.max_long_partial_prefills.map(|v| v as u64))?;
        at_least_one(o, &QUEUE, r.max_queued_requests.map(|v| v as u64))?;
        let _ = (&LONG_TH, &LONG_CAP); // any value ≥ 0 is valid
        Ok(())
    }

    /// `self` with every key `top` sets replaced by `top`'s value (`top` wins).
    pub fn overlaid_by(&self, top: &Serving) -> Serving {
        macro_rules! pick {
            ($s:ident . $f:ident) => {
                top.$s.$f.clone().or_else(|| self.$s.$f.clone())
            };
        }
        Serving {
            model: ModelSection {
                path: pick!(model.path),
                dtype: pick!(model.dtype),
            },
            parallel: ParallelSection {
                tensor_parallel_size: pick!(parallel.tensor_parallel_size),
                expert_parallel_size: pick!(parallel.expert_parallel_size),
                context_parallel_size: pick!(parallel.context_parallel_size),
                context_parallel_min_tokens: pick!(parallel.context_parallel_min_tokens),
                pipeline_parallel_size: pick!(parallel.pipeline_parallel_size),
            },
            context: ContextSection {
                max_model_len: pick!(context.max_model_len),
                chunked_prefill_size: pick!(context.chunked_prefill_size),
            },
            cache: CacheSection {
                kv_layout: pick!(cache.kv_layout),
                prefix_caching: pick!(cache.prefix_caching),
                host_cache_gb: pick!(cache.host_cache_gb),
                distributed_kv: pick!(cache.distributed_kv),
                kv_cache_tokens: pick!(cache.kv_cache_tokens),
                block_size: pick!(cache.block_size),
                state_checkpoint_interval: pick!(cache.state_checkpoint_interval),
                state_checkpoints: pick!(cache.state_checkpoints),
            },
            runtime: RuntimeSection {
                backend: pick!(runtime.backend),
                continuous_batching: pick!(runtime.continuous_batching),
                max_num_seqs: pick!(runtime.max_num_seqs),
                long_prefill_threshold: pick!(runtime.long_prefill_threshold),
                max_long_partial_prefills: pick!(runtime.max_long_partial_prefills),
                long_prefill_token_cap: pick!(runtime.long_prefill_token_cap),
                max_queued_requests: pick!(runtime.max_queued_requests),
                batch_invariant: pick!(runtime.batch_invariant),
                enforce_eager: pick!(runtime.enforce_eager),
            },
        }
    }

    /// Writes every key that is set onto `cfg` (the defaults layer); `model.path`, `model.dtype`
    /// `auto` and `runtime.backend` are the caller's (they depend on the backend chosen).
    ///
    /// Errors: a `state_checkpoint_interval` that is not a multiple of the resulting block size.
    pub fn apply(&self, cfg: &mut EngineConfig) -> Result<()> {
        if let Some(d) = self.model.dtype.and_then(DtypeName::dtype) {
            cfg.dtype = d;
        }
        if let Some(n) = self.context.max_model_len {
            cfg.max_model_len = Some(n);
        }
        if let Some(n) = self.context.chunked_prefill_size {
            cfg.scheduler.max_batched_tokens = n;
            cfg.scheduler.max_prefill_chunk = n;
        }
        if let Some(n) = self.parallel.tensor_parallel_size {
            cfg.tensor_parallel_size = n as usize;
        }
        if let Some(n) = self.parallel.expert_parallel_size {
            cfg.expert_parallel_size = n as usize;
        }
        if let Some(n) = self.parallel.context_parallel_size {
            cfg.context_parallel_size = n as usize;
        }
        if let Some(n) = self.parallel.context_parallel_min_tokens {
            cfg.context_parallel_min_tokens = n;
        }
        if cfg.context_parallel_size > 1 && cfg.tensor_parallel_size > 1 {
            bail!(
                "serving.parallel.context_parallel_size / --context-parallel-size ({}) with serving.parallel.tensor_parallel_size / --tensor-parallel-size ({}): context parallelism keeps the whole model on every rank; use one of them",
                cfg.context_parallel_size,
                cfg.tensor_parallel_size
            );
        }
        if !cfg
            .tensor_parallel_size
            .is_multiple_of(cfg.expert_parallel_size.max(1))
        {
            bail!(
                "serving.parallel.expert_parallel_size / --expert-parallel-size ({}) must divide serving.parallel.tensor_parallel_size / --tensor-parallel-size ({})",
                cfg.expert_parallel_size,
                cfg.tensor_parallel_size
            );
        }
        let c = &self.cache;
        if let Some(b) = c.prefix_caching {
            cfg.prefix_caching = b;
        }
        if let Some(gb) = c.host_cache_gb {
            cfg.host_cache_bytes = (gb * GIB).round() as u64;
        }
        if let Some(n) = c.kv_cache_tokens {
            cfg.kv_cache_tokens = Some(n);
        }
        if let Some(n) = c.block_size {
            cfg.scheduler.block_size = n;
        }
        if let Some(n) = c.state_checkpoint_interval {
            cfg.state_checkpoint_interval = n;
        }
        if let Some(n) = c.state_checkpoints {
            cfg.state_checkpoints = Some(n);
        }
        let r = &self.runtime;
        let s = &mut cfg.scheduler;
        if let Some(n) = r.max_num_seqs {
            s.max_num_seqs = n;
        }
        if let Some(n) = r.long_prefill_threshold {
            s.long_prefill_threshold = n;
        }
        if let Some(n) = r.max_long_partial_prefills {
            s.max_long_partial_prefills = n;
        }
        if let Some(n) = r.long_prefill_token_cap {
            s.long_prefill_token_cap = n;
        }
        if let Some(n) = r.max_queued_requests {
            s.max_queued_requests = n;
        }
        if let Some(b) = r.batch_invariant {
            cfg.batch_invariant = b;
        }
        if let Some(b) = r.enforce_eager {
            cfg.enforce_eager = b;
        }
        let (interval, bs) = (cfg.state_checkpoint_interval, cfg.scheduler.block_size);
        if !interval.is_multiple_of(bs) {
            bail!(
                "{} / {} {interval} must be a multiple of the block size {bs}",
                CKPT_INT.path,
                CKPT_INT.flag
            );
        }
        Ok(())
    }

    /// Every setting of `cfg` spelled out (the effective settings `dayone config` prints):
    /// applying the result to any [`EngineConfig`] gives `cfg` back.
    pub fn effective(cfg: &EngineConfig, model: Option<&Path>, backend: BackendName) -> Serving {
        let s = &cfg.scheduler;
        Serving {
            model: ModelSection {
                path: model.map(Path::to_path_buf),
                dtype: Some(DtypeName::of(cfg.dtype)),
            },
            parallel: ParallelSection {
                tensor_parallel_size: Some(cfg.tensor_parallel_size as u64),
                expert_parallel_size: Some(cfg.expert_parallel_size as u64),
                context_parallel_size: Some(cfg.context_parallel_size as u64),
                context_parallel_min_tokens: Some(cfg.context_parallel_min_tokens),
                pipeline_parallel_size: Some(1),
            },
            context: ContextSection {
                max_model_len: cfg.max_model_len,
                // Both limits come from one key; the budget is the one users set.
                chunked_prefill_size: Some(s.max_batched_tokens),
            },
            cache: CacheSection {
                kv_layout: Some(KvLayout::Paged),
                prefix_caching: Some(cfg.prefix_caching),
                host_cache_gb: Some(cfg.host_cache_bytes as f64 / GIB),
                distributed_kv: Some(false),
                kv_cache_tokens: cfg.kv_cache_tokens,
                block_size: Some(s.block_size),
                state_checkpoint_interval: Some(cfg.state_checkpoint_interval),
                state_checkpoints: cfg.state_checkpoints,
            },
            runtime: RuntimeSection {
                backend: Some(backend),
                continuous_batching: Some(true),
                max_num_seqs: Some(s.max_num_seqs),
                long_prefill_threshold: Some(s.long_prefill_threshold),
                max_long_partial_prefills: Some(s.max_long_partial_prefills),
                long_prefill_token_cap: Some(s.long_prefill_token_cap),
                max_queued_requests: Some(s.max_queued_requests),
                batch_invariant: Some(cfg.batch_invariant),
                enforce_eager: Some(cfg.enforce_eager),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_dtype_keeps_16_bit_checkpoints_16_bit_on_wgsl() {
        use BackendName::*;
        for stored in [None, Some(DType::F32), Some(DType::BF16), Some(DType::F16)] {
            assert_eq!(auto_dtype(Cuda, stored), DType::BF16);
            assert_eq!(auto_dtype(Cpu, stored), DType::F32);
        }
        assert_eq!(auto_dtype(Wgsl, Some(DType::BF16)), DType::BF16);
        assert_eq!(auto_dtype(Wgsl, Some(DType::F16)), DType::BF16);
        assert_eq!(auto_dtype(Wgsl, Some(DType::F32)), DType::F32);
        assert_eq!(auto_dtype(Wgsl, None), DType::F32);
    }

    const SEED_EXAMPLE: &str = "\
serving:
  model: {path: /models/x, dtype: bfloat16}          # bfloat16 | float16 | float32 | auto
  parallel: {tensor_parallel_size: 1, expert_parallel_size: 1, pipeline_parallel_size: 1}
  context: {max_model_len: 1000000, chunked_prefill_size: 8192}
  cache: {kv_layout: paged, prefix_caching: true, host_cache_gb: 64, distributed_kv: false}
  runtime: {continuous_batching: true, max_num_seqs: 256, long_prefill_threshold: 32768,
            max_long_partial_prefills: 1, max_queued_requests: 1024}
";

    fn parse(text: &str) -> Result<ServingFile> {
        ServingFile::parse(text, Path::new("serve.yaml"))
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse(text).expect_err("should be refused"))
    }

    #[test]
    fn seed_layout_maps_onto_the_engine_config() {
        let f = parse(SEED_EXAMPLE).unwrap();
        assert_eq!(
            f.serving.model.path.as_deref(),
            Some(Path::new("/models/x"))
        );
        let mut cfg = EngineConfig::default();
        f.serving.apply(&mut cfg).unwrap();
        assert_eq!(cfg.dtype, DType::BF16);
        assert_eq!(cfg.max_model_len, Some(1_000_000));
        assert_eq!(cfg.scheduler.max_batched_tokens, 8192);
        assert_eq!(cfg.scheduler.max_prefill_chunk, 8192);
        assert!(cfg.prefix_caching);
        assert_eq!(cfg.host_cache_bytes, 64 << 30);
        assert_eq!(cfg.scheduler.max_num_seqs, 256);
        assert_eq!(cfg.scheduler.long_prefill_threshold, 32768);
        assert_eq!(cfg.scheduler.max_long_partial_prefills, 1);
        assert_eq!(cfg.scheduler.max_queued_requests, 1024);
    }

    #[test]
    fn parallel_sizes_are_read_and_bad_ones_name_the_key_and_file() {
        let text = SEED_EXAMPLE.replace("tensor_parallel_size: 1", "tensor_parallel_size: 8");
        let f = parse(&text).unwrap();
        assert_eq!(f.serving.parallel.tensor_parallel_size, Some(8));
        let text = text.replace("expert_parallel_size: 1", "expert_parallel_size: 3");
        let e = err(&text);
        assert!(
            e.contains("serve.yaml")
                && e.contains("serving.parallel.expert_parallel_size")
                && e.contains("must divide"),
            "{e}"
        );
        let e = err("serving: {parallel: {pipeline_parallel_size: 2}}");
        assert!(e.contains("serving.parallel.pipeline_parallel_size"), "{e}");
    }

    #[test]
    fn unservable_values_name_their_key() {
        for (text, key) in [
            (
                "serving: {cache: {distributed_kv: true}}",
                "serving.cache.distributed_kv",
            ),
            (
                "serving: {cache: {kv_layout: contiguous}}",
                "serving.cache.kv_layout",
            ),
            (
                "serving: {runtime: {continuous_batching: false}}",
                "serving.runtime.continuous_batching",
            ),
            ("serving: {model: {dtype: float16}}", "serving.model.dtype"),
            (
                "serving: {runtime: {max_num_seqs: 0}}",
                "serving.runtime.max_num_seqs",
            ),
            (
                "serving: {cache: {block_size: 12}}",
                "serving.cache.block_size",
            ),
            (
                "serving: {cache: {host_cache_gb: -1}}",
                "serving.cache.host_cache_gb",
            ),
        ] {
            let e = err(text);
            assert!(e.contains(key) && e.contains("serve.yaml"), "{text}: {e}");
        }
    }

    #[test]
    fn unknown_keys_and_wrong_types_name_the_path() {
        let e = err("serving:\n  cache:\n    prefix_cachin: true\n");
        assert!(
            e.contains("serving.cache") && e.contains("prefix_cachin"),
            "{e}"
        );
        let e = err("serving:\n  runtime:\n    max_num_seqs: lots\n");
        assert!(e.contains("serving.runtime.max_num_seqs"), "{e}");
        let e = err("server:\n  runtime: {}\n");
        assert!(e.contains("server"), "{e}");
        let e = err("serving:\n  model: {dtype: bf17}\n");
        assert!(e.contains("serving.model.dtype"), "{e}");
    }

    #[test]
    fn vllm_kebab_case_spellings_are_accepted() {
        let f = parse(
            "serving:\n  context: {max-model-len: 4096, max-num-batched-tokens: 512}\n  runtime: {max-num-seqs: 8, max-queued-requests: 3}\n  cache: {enable-prefix-caching: false, kv-cache-tokens: 1024}\n",
        )
        .unwrap();
        let mut cfg = EngineConfig::default();
        f.serving.apply(&mut cfg).unwrap();
        assert_eq!(cfg.max_model_len, Some(4096));
        assert_eq!(cfg.scheduler.max_batched_tokens, 512);
        assert_eq!(cfg.scheduler.max_num_seqs, 8);
        assert_eq!(cfg.scheduler.max_queued_requests, 3);
        assert!(!cfg.prefix_caching);
        assert_eq!(cfg.kv_cache_tokens, Some(1024));
    }

    #[test]
    fn the_top_layer_wins_key_by_key() {
        let file = parse("serving: {runtime: {max_num_seqs: 8, max_queued_requests: 5}}")
            .unwrap()
            .serving;
        let mut flags = Serving::default();
        flags.runtime.max_num_seqs = Some(3);
        let merged = file.overlaid_by(&flags);
        assert_eq!(merged.runtime.max_num_seqs, Some(3));
        assert_eq!(merged.runtime.max_queued_requests, Some(5));
        assert_eq!(merged.runtime.long_prefill_threshold, None);
    }

    #[test]
    fn effective_settings_round_trip_through_yaml() {
        let mut cfg = EngineConfig::default();
        parse("serving: {cache: {host_cache_gb: 1.5, kv_cache_tokens: 4096, state_checkpoint_interval: 64}, context: {chunked_prefill_size: 300}}")
            .unwrap()
            .serving
            .apply(&mut cfg)
            .unwrap();
        let eff = Serving::effective(&cfg, Some(Path::new("/m")), BackendName::Wgsl);
        let yaml = ServingFile {
            serving: eff.clone(),
        }
        .to_yaml()
        .unwrap();
        let back = parse(&yaml).unwrap().serving;
        assert_eq!(back, eff, "{yaml}");
        let mut again = EngineConfig {
            dtype: DType::BF16,
            ..Default::default()
        };
        again.scheduler.max_num_seqs = 1;
        back.apply(&mut again).unwrap();
        assert_eq!(format!("{again:?}"), format!("{cfg:?}"), "{yaml}");
    }

    #[test]
    fn checkpoint_interval_must_be_a_block_multiple() {
        let s = parse("serving: {cache: {state_checkpoint_interval: 24}}")
            .unwrap()
            .serving;
        let e = format!("{:#}", s.apply(&mut EngineConfig::default()).unwrap_err());
        assert!(
            e.contains("state_checkpoint_interval") && e.contains("16"),
            "{e}"
        );
    }

    #[test]
    fn the_documented_example_is_a_valid_config() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/serving.example.yaml");
        let f = ServingFile::load(&file).unwrap();
        let mut cfg = EngineConfig::default();
        f.serving.apply(&mut cfg).unwrap();
        assert_eq!(cfg.host_cache_bytes, 64 << 30);
        assert_eq!(cfg.kv_cache_tokens, Some(131072));
        assert_eq!(f.serving.runtime.backend, Some(BackendName::Auto));
    }

    #[test]
    fn empty_file_is_an_empty_config() {
        assert_eq!(parse("# nothing\n\n").unwrap(), ServingFile::default());
    }
}
