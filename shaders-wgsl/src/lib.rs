//! dayone's portable backend: [`dayone_backend::Backend`] on wgpu with WGSL compute shaders.
//!
//! Runs on any Vulkan/Metal/DX12 adapter, including Mesa lavapipe (CPU Vulkan), where it is the
//! correctness reference in CI. Activations, KV caches and all results are f32
//! ([`Backend::activation_dtype`] is always `F32`); integer tensors are u32/i32.
//!
//! Layout: this file holds the backend struct, its shared plumbing (allocation, recording,
//! dispatch, argument checks) and the [`Backend`] impl, which forwards each tensor op to its
//! family's module under `ops/` (`basic`, `linear`, `attention`, `mla`, `moe`, `kda`, `dsa`).
//!
//! Design:
//! - Storage dtypes: f32 uploads stay f32; bf16 matrices (2 or more dims) whose rows hold a
//!   multiple of 8 values stay packed bf16 (dtype `BF16`, half the bytes: `linear` weights,
//!   `embedding` tables and expert stacks are read packed, other ops widen such inputs on the
//!   device first); other bf16 (vectors such as norm weights and biases: tiny, and widened once
//!   here instead of at every op that reads them) and all f16 uploads are widened to f32 on the
//!   host. `download` returns the stored dtype.
//! - Ops are recorded into one command encoder and one compute pass and submitted lazily: on
//!   `download`, `synchronize`, before an upload (pool buffers may still be referenced by pending
//!   work, and queue writes are ordered before it), or every [`MAX_PENDING_OPS`] ops. Kernel
//!   parameters go to a uniform arena bound with dynamic offsets; bind groups are cached.
//! - Tensor memory comes from a size-bucketed pool and returns to it when the last handle drops.
//! - Tensors larger than the adapter's largest storage binding (128 MiB on lavapipe) are split by
//!   rows into several buffers; `linear` (weights), `embedding` (table), `upload` and `download`
//!   handle split tensors transparently, other ops return an error naming the tensor.
//! - Kernels come in a CPU flavour (llvmpipe: invocations are SIMD lanes, barriers are costly)
//!   and a GPU flavour, chosen by adapter type ([`KernelChoice`]). The GPU flavour's bf16 decode
//!   matvec is one of generated variants ([`matvec_variants`], chosen by [`MATVEC_ENV`],
//!   [`Options::matvec`] or [`WgslBackend::set_matvec`]), to be swept per device.
//!   `linear_many` (≤ 4 parts per dispatch) and `linear_silu_mul` run as fused forms of that
//!   variant on the decode path (bf16 weights in one buffer each, M ≤ 16), bit-equal to the
//!   unfused calls they replace; [`WgslBackend::dispatch_count`] counts dispatches.
//! - [`PROFILE_ENV`]`=1` times every dispatch on the GPU (timestamp queries) and prints a table
//!   by kernel entry point when the backend is dropped ([`WgslBackend::take_profile`] reads it
//!   earlier); unset, the recording path only tests an `Option`.
//! - DeepSeek-V3 ops (MLA + MoE): `head_linear` (`head_linear.wgsl`), `write_cache`
//!   (`write_cache.wgsl`), `paged_latent_attention` (`mla_attention_lanes.wgsl` /
//!   `mla_attention.wgsl`), `moe_route` (router logits through `linear`, then `moe_route.wgsl`,
//!   one invocation per token) and `moe_experts` (`moe_act.wgsl`: `silu(g)·u` per (token, slot)
//!   into a scratch `[N, k, F]`, then `moe_down.wgsl`: the weighted down-projection sum per
//!   token). Their weights may be f32 or packed bf16 and must fit one storage binding.
//! - Kimi-Linear KDA ops, per-sequence state in state slots (`meta.state_slots`, one distinct slot
//!   per sequence; a sequence starting at position 0 ignores what its slot holds):
//!   `short_conv` (`short_conv.wgsl`: outputs per (token, channel) from the old history, then the
//!   history roll per (sequence, channel)), `gated_rms_norm` (`gated_norm.wgsl`, a workgroup per
//!   row) and `kda`: `kda_prep.wgsl` (per (token, head): L2-normalised q·K^-½ and k, log decay g)
//!   then, per sequence, the token recurrence (`kda_recurrent.wgsl`, one invocation per (sequence,
//!   head, value column) holding `S[:, e]`, K ≤ 128) when it has fewer than
//!   [`Options::kda_chunk_min`] (default [`KDA_CHUNK_MIN`] = 64, env [`KDA_CHUNK_MIN_ENV`]) tokens
//!   in the step, else the chunked form with chunks of 64 (`kda_chunk_prep.wgsl`: Γ, masked
//!   pairwise `exp(Γ_i − Γ_j)`, forward substitution for W and U, a workgroup per (chunk, head);
//!   `kda_chunk_state.wgsl`: `V_new = U − W S`, `O`, state carry, per value column). Both read
//!   and write the state `[slots, H, K, V]` f32 in place in global memory (no workgroup-memory
//!   limit on K×V); architectures.md §1.2.
//! - DeepSeek-V3.2 sparse attention (DSA) ops, one kernel family on all adapters: `layer_norm`
//!   (`layer_norm.wgsl`, a workgroup per row, two-pass mean/variance), `dsa_topk` (tokens in
//!   groups whose `[group, keys]` f32 score scratch fits 64 MiB: `dsa_topk.wgsl` scores one
//!   (token, key) per invocation over key tiles of 64, then `dsa_select.wgsl`, a workgroup per
//!   token: 8-pass radix select of the k-th largest (score, ~position) composite, compaction and
//!   a bitonic sort in workgroup memory; `topk ≤` [`DSA_MAX_TOPK`]) and `sparse_latent_attention`
//!   (`mla_attention.wgsl`, the dense workgroup kernel, with `topk > 0`: its key loop runs over
//!   `selected[n]`, skipping `u32::MAX`).

mod buffers;
mod matvec;
mod ops;
mod pipelines;
mod profile;

pub use matvec::{matvec_variants, MATVEC_DEFAULT, MATVEC_ENV};
pub use profile::PROFILE_ENV;

use anyhow::{anyhow, bail, ensure, Context, Result};
use buffers::{Chunk, Pool, Storage};
use dayone_backend::{
    AttentionOptions, Backend, DType, DeviceStepMeta, ExpertAct, ExpertOptions, HostTensor,
    MoeRouting, QuantTensor, RopeStyle, TensorInfo,
};
use pipelines::{Kernel, Pipelines, Spec, PARAM_BYTES};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Ops recorded before the encoder is submitted without being asked (at most; see
/// [`SUBMIT_OPS_ENV`]).
pub const MAX_PENDING_OPS: usize = 256;
/// Environment variable lowering the ops per unasked submission (1 ..= [`MAX_PENDING_OPS`],
/// default the maximum): wgpu validates and encodes a compute pass only when it ends, so the
/// GPU waits for the host to record a whole submission; smaller submissions start it earlier
/// (more of a decode step's host recording overlaps GPU work) at a cost per submission.
pub const SUBMIT_OPS_ENV: &str = "DAYONE_WGSL_SUBMIT_OPS";
/// Byte stride of one op's parameters in the uniform arena (≥ any adapter's uniform alignment).
const PARAM_STRIDE: u64 = 256;
/// Largest workgroup count per grid dimension.
const MAX_GROUPS: u64 = 65535;
/// Environment variable that lowers the largest buffer chunk (bytes), e.g. to test splitting.
pub const CHUNK_ENV: &str = "DAYONE_WGSL_MAX_CHUNK_BYTES";
/// Environment variable choosing an adapter whose name contains the given text.
pub const ADAPTER_ENV: &str = "DAYONE_WGSL_ADAPTER";

/// Environment variable forcing the `linear` kernel family: `cpu` or `gpu` (see [`KernelChoice`]).
pub const KERNELS_ENV: &str = "DAYONE_WGSL_KERNELS";

/// Environment variable overriding [`Options::kda_chunk_min`] (tokens of one sequence in a step
/// from which `kda` uses the chunked form), e.g. `1` to force it, `1000000000` to force recurrence.
pub const KDA_CHUNK_MIN_ENV: &str = "DAYONE_WGSL_KDA_CHUNK_MIN";

/// Default of [`Options::kda_chunk_min`]: one full chunk of 64 tokens (Kimi's HF code uses the
/// recurrent kernel for `q_len <= 64`; below a chunk the chunked form only adds passes).
pub const KDA_CHUNK_MIN: usize = 64;

/// Largest `topk` of `dsa_topk` (the selection kernel sorts in workgroup memory).
pub const DSA_MAX_TOPK: usize = 2048;

/// Largest indexer score scratch (`[tokens, keys]` f32) of one `dsa_topk` group of tokens.
const DSA_SCORE_BYTES: u64 = 64 << 20;

/// Chunk length of `kda`'s chunked form (fixed in `kda_chunk_*.wgsl`).
const KDA_CHUNK: usize = 64;

/// Options for [`WgslBackend::with_options`].
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Largest bytes per device buffer; tensors above it are split by rows. `None`: the adapter's
    /// max storage binding (or the value of [`CHUNK_ENV`] if set).
    pub max_chunk_bytes: Option<u64>,
    /// Pick the first adapter whose name contains this text (default: [`ADAPTER_ENV`], else a
    /// discrete GPU, an integrated GPU, ... a CPU adapter).
    pub adapter: Option<String>,
    /// Which `linear`/`paged_attention` kernels to use; default: by adapter type.
    pub kernels: KernelChoice,
    /// `kda`: a sequence with at least this many tokens in the step takes the chunked path
    /// (chunks of 64), shorter ones the token recurrence. `None`: [`KDA_CHUNK_MIN_ENV`] if set,
    /// else [`KDA_CHUNK_MIN`]. `Some(1)` forces the chunked path, `Some(usize::MAX)` the recurrence.
    pub kda_chunk_min: Option<usize>,
    /// Decode matvec variant for packed-bf16 weights on GPU kernels (see
    /// [`matvec_variants`]). `None`: [`MATVEC_ENV`] if set, else [`MATVEC_DEFAULT`]. A
    /// subgroup variant (`…sg`) on an adapter without subgroups runs its tree twin.
    pub matvec: Option<String>,
}

/// Kernel variants for `linear` (decode) and `paged_attention`, tuned for different kinds of
/// device. Prefill `linear` uses 4×4 register tiles on both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelChoice {
    /// [`KernelChoice::Cpu`] on CPU adapters (lavapipe), [`KernelChoice::Gpu`] otherwise.
    #[default]
    Auto,
    /// Invocations (= SIMD lanes on llvmpipe) over outputs, no workgroup barriers: matvec with
    /// 4 rows per invocation, attention with one (token, head) per invocation.
    Cpu,
    /// Workgroup reductions along K with coalesced loads (decode matvec), a workgroup per
    /// (token, head) sharing key tiles (attention).
    Gpu,
}

/// A device tensor: shared storage, a row-major shape and a dtype (`F32`, `U32` or `I32`).
#[derive(Clone)]
pub struct WTensor {
    st: Arc<Storage>,
    shape: Vec<usize>,
    dtype: DType,
}

impl TensorInfo for WTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

impl WTensor {
    /// Number of device buffers behind the tensor (more than one when it was split by rows).
    pub fn num_chunks(&self) -> usize {
        self.st.chunks.len()
    }

    fn single(&self, op: &str, name: &str) -> Result<&wgpu::Buffer> {
        match self.st.chunks.as_slice() {
            [c] => Ok(&c.buf),
            _ => bail!(
                "{op}: {name} {:?} is split across {} device buffers (larger than the largest \
                 storage binding); only linear weights and embedding tables may be split",
                self.shape,
                self.st.chunks.len()
            ),
        }
    }
}

/// Work recorded but not yet submitted: one encoder with (usually) one open compute pass.
struct Recorder {
    /// The open compute pass (ended before any copy/clear and before submission).
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// Kernel parameters, `PARAM_STRIDE` bytes per recorded dispatch, written at submission.
    params: Vec<u8>,
    ops: usize,
    /// Bind groups by (kernel, buffers); pooled buffers come back, so decode steps hit.
    bind_groups: HashMap<(usize, Vec<wgpu::Buffer>), wgpu::BindGroup>,
    /// Per-dispatch GPU timing ([`PROFILE_ENV`]); `None` on the hot path.
    prof: Option<profile::Profiler>,
}

/// Bind groups kept before the cache is cleared.
const MAX_BIND_GROUPS: usize = 4096;

/// The WGSL backend. Cheap to share: all state lives behind internal locks.
pub struct WgslBackend {
    device: wgpu::Device,
    queue: wgpu::Queue,
    name: String,
    max_chunk: u64,
    cpu_kernels: bool,
    /// The adapter is a CPU (lavapipe): its device memory is host memory.
    cpu_adapter: bool,
    kda_chunk_min: usize,
    pool: Arc<Pool>,
    pipelines: Pipelines,
    rec: Mutex<Recorder>,
    arena: wgpu::Buffer,
    dummy: wgpu::Buffer,
    error: Arc<Mutex<Option<String>>>,
    /// Batch-invariant mode ([`Backend::set_batch_invariant`]): the prefill GEMM for every M
    /// (the decode GEMVs reduce K in another order, or fuse differently when compiled).
    batch_invariant: std::sync::atomic::AtomicBool,
    /// The device has [`wgpu::Features::SUBGROUP`] (subgroup matvec variants may run).
    subgroups: bool,
    /// Index of the decode matvec variant (`matvec::variants()`).
    matvec: std::sync::atomic::AtomicUsize,
    /// Ops per unasked submission ([`SUBMIT_OPS_ENV`]).
    submit_ops: usize,
    /// Dispatches recorded since creation ([`WgslBackend::dispatch_count`]).
    dispatches: std::sync::atomic::AtomicU64,
}

fn type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::Cpu => "CPU",
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Other => "other",
    }
}

fn rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Cpu => 3,
        wgpu::DeviceType::Other => 4,
    }
}

fn f32_param(x: f32) -> u32 {
    x.to_bits()
}

impl WgslBackend {
    /// Opens the best adapter (a GPU if there is one, else lavapipe/CPU) with default options.
    pub fn new() -> Result<Self> {
        Self::with_options(Options::default())
    }

    /// Opens an adapter with explicit [`Options`].
    pub fn with_options(opts: Options) -> Result<Self> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let want = opts
            .adapter
            .clone()
            .or_else(|| std::env::var(ADAPTER_ENV).ok());
        if let Some(w) = &want {
            let w = w.to_lowercase();
            adapters.retain(|a| a.get_info().name.to_lowercase().contains(&w));
        }
        adapters.sort_by_key(|a| rank(a.get_info().device_type));
        let Some(adapter) = adapters.into_iter().next() else {
            match want {
                Some(w) => bail!("no Vulkan/Metal/DX12 adapter whose name contains '{w}' ({ADAPTER_ENV})"),
                None => bail!(
                    "no Vulkan/Metal/DX12 adapter found: install mesa-vulkan-drivers (lavapipe) for the CPU fallback"
                ),
            }
        };
        let info = adapter.get_info();
        let limits = adapter.limits();
        let have = adapter.features();
        // Subgroups only serve the `…sg` matvec variants; requested whenever offered so that the
        // variant can be switched at run time.
        let mut features = have & wgpu::Features::SUBGROUP;
        let prof_mode = match std::env::var(PROFILE_ENV).as_deref() {
            Ok("1") => profile::Profiler::features(have),
            // A pass per dispatch even where timestamps inside passes exist (to test that path
            // or to compare the two).
            Ok("pass") => {
                profile::Profiler::features(have & !wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES)
            }
            _ => None,
        }
        .map(|(mode, f)| {
            features |= f;
            mode
        });
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("dayone-wgsl"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .with_context(|| format!("requesting a device on adapter '{}'", info.name))?;
        let error = Arc::new(Mutex::new(None::<String>));
        let e2 = error.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut g = e2.lock().unwrap_or_else(|p| p.into_inner());
            if g.is_none() {
                *g = Some(e.to_string());
            }
        }));
        let hw_max = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        let env_max = std::env::var(CHUNK_ENV)
            .ok()
            .and_then(|s| s.parse::<u64>().ok());
        let max_chunk = (opts
            .max_chunk_bytes
            .or(env_max)
            .unwrap_or(hw_max)
            .min(hw_max)
            / 4
            * 4)
        .max(4);
        let arena = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dayone-wgsl params"),
            size: PARAM_STRIDE * MAX_PENDING_OPS as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dayone-wgsl dummy"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let name = format!(
            "wgsl: {:?} {} ({})",
            info.backend,
            info.name,
            type_name(info.device_type)
        );
        let subgroups = features.contains(wgpu::Features::SUBGROUP);
        let want_mv = opts
            .matvec
            .clone()
            .or_else(|| std::env::var(MATVEC_ENV).ok())
            .unwrap_or_else(|| MATVEC_DEFAULT.to_string());
        let mv = matvec::resolve(&want_mv, subgroups).ok_or_else(|| {
            anyhow!(
                "unknown decode matvec variant '{want_mv}' ({MATVEC_ENV}); one of: {}",
                matvec_variants().join(" ")
            )
        })?;
        if let (None, Ok(w)) = (&opts.matvec, std::env::var(MATVEC_ENV)) {
            // Sweeps through the engine's CLI: the log shows what ran (a subgroup variant falls
            // back to its tree twin without subgroups).
            eprintln!(
                "dayone-wgsl: decode matvec {} ({MATVEC_ENV}={w})",
                matvec::variants()[mv].name
            );
        }
        let prof = prof_mode.map(|m| profile::Profiler::new(&device, &queue, m, MAX_PENDING_OPS));
        Ok(Self {
            pool: Arc::new(Pool::new(device.clone(), max_chunk)),
            device,
            queue,
            name,
            max_chunk,
            cpu_adapter: info.device_type == wgpu::DeviceType::Cpu,
            cpu_kernels: match (opts.kernels, std::env::var(KERNELS_ENV).as_deref()) {
                (KernelChoice::Cpu, _) | (KernelChoice::Auto, Ok("cpu")) => true,
                (KernelChoice::Gpu, _) | (KernelChoice::Auto, Ok("gpu")) => false,
                (KernelChoice::Auto, _) => info.device_type == wgpu::DeviceType::Cpu,
            },
            kda_chunk_min: opts
                .kda_chunk_min
                .or_else(|| {
                    std::env::var(KDA_CHUNK_MIN_ENV)
                        .ok()
                        .and_then(|s| s.parse().ok())
                })
                .unwrap_or(KDA_CHUNK_MIN)
                .max(1),
            pipelines: Pipelines::new(),
            rec: Mutex::new(Recorder {
                pass: None,
                bind_groups: HashMap::new(),
                encoder: None,
                params: Vec::new(),
                ops: 0,
                prof,
            }),
            arena,
            dummy,
            error,
            batch_invariant: std::sync::atomic::AtomicBool::new(
                dayone_backend::batch_invariant_from_env(),
            ),
            subgroups,
            matvec: std::sync::atomic::AtomicUsize::new(mv),
            submit_ops: std::env::var(SUBMIT_OPS_ENV)
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
                .unwrap_or(MAX_PENDING_OPS)
                .clamp(1, MAX_PENDING_OPS),
            dispatches: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// The decode matvec variant in use (see [`matvec_variants`]; a subgroup variant asked for
    /// on an adapter without subgroups reports its tree twin).
    pub fn matvec(&self) -> &'static str {
        &matvec::variants()[self.matvec_index()].name
    }

    /// Switches the decode matvec variant (e.g. to test or time each); returns the one that
    /// will run (the tree twin of a subgroup variant without subgroups).
    pub fn set_matvec(&self, name: &str) -> Result<&'static str> {
        let i = matvec::resolve(name, self.subgroups).ok_or_else(|| {
            anyhow!(
                "unknown decode matvec variant '{name}'; one of: {}",
                matvec_variants().join(" ")
            )
        })?;
        self.matvec.store(i, std::sync::atomic::Ordering::Relaxed);
        Ok(self.matvec())
    }

    pub(crate) fn matvec_index(&self) -> usize {
        self.matvec.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Compute dispatches recorded since the backend was created: tests and benchmarks count
    /// what an op (or a decode step) costs in dispatches, the host overhead that fusions save.
    pub fn dispatch_count(&self) -> u64 {
        self.dispatches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the device runs subgroup operations ([`wgpu::Features::SUBGROUP`]).
    pub fn has_subgroups(&self) -> bool {
        self.subgroups
    }

    /// With [`PROFILE_ENV`]`=1`: the per-kernel GPU timing table since the last call (or since
    /// creation), after waiting for all recorded work; the totals restart. `None` when not
    /// profiling or nothing ran. The rest is printed to stderr when the backend is dropped.
    pub fn take_profile(&self) -> Option<String> {
        let mut rec = self.lock();
        rec.prof.as_ref()?;
        self.flush_locked(&mut rec);
        rec.prof.as_mut().and_then(|p| p.take_report())
    }

    /// Whether the batch-invariant kernels are in use.
    pub(crate) fn invariant(&self) -> bool {
        self.batch_invariant
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Largest bytes per device buffer; larger tensors are split by rows.
    pub fn max_chunk_bytes(&self) -> u64 {
        self.max_chunk
    }

    /// Waits for the queued copies into the map-readable `staging` buffer and copies its bytes
    /// into `out` (`out.len()` = the buffer's size); `op` names the caller in errors.
    pub(crate) fn read_staging(
        &self,
        op: &str,
        staging: &wgpu::Buffer,
        out: &mut [u8],
    ) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| anyhow!("{op}: device poll failed: {e}"))?;
        self.check_error()?;
        rx.recv()
            .map_err(|_| anyhow!("{op}: map callback dropped"))?
            .map_err(|e| anyhow!("{op}: buffer map failed: {e}"))?;
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| anyhow!("{op}: {e}"))?;
            out.copy_from_slice(&view);
        }
        staging.unmap();
        Ok(())
    }

    fn check_error(&self) -> Result<()> {
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        match g.take() {
            Some(e) => Err(anyhow!("wgpu error: {e}")),
            None => Ok(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn flush_locked(&self, rec: &mut Recorder) {
        rec.pass = None;
        if let Some(mut enc) = rec.encoder.take() {
            if !rec.params.is_empty() {
                self.queue.write_buffer(&self.arena, 0, &rec.params);
            }
            let timed = rec.prof.as_ref().is_some_and(|p| p.resolve(&mut enc));
            self.queue.submit([enc.finish()]);
            if timed {
                if let Some(p) = rec.prof.as_mut() {
                    p.collect(&self.device);
                }
            }
        }
        rec.params.clear();
        rec.ops = 0;
    }

    /// The encoder, with the open compute pass (if any) ended.
    fn encoder<'a>(&self, rec: &'a mut Recorder) -> &'a mut wgpu::CommandEncoder {
        rec.pass = None;
        rec.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("dayone-wgsl"),
                })
        })
    }

    /// Allocates an uninitialised tensor, split by rows (of `shape[0]`) if it exceeds the chunk size.
    fn alloc(&self, shape: &[usize], dtype: DType) -> Result<WTensor> {
        let row = if shape.len() > 1 {
            shape[1..].iter().product::<usize>().max(1)
        } else {
            1
        };
        let rows = if shape.is_empty() { 1 } else { shape[0] };
        let es = dtype.size();
        let row_bytes = (row * es) as u64;
        ensure!(
            row_bytes <= self.max_chunk,
            "tensor {shape:?}: one row of {row_bytes} bytes exceeds the largest device buffer ({} bytes)",
            self.max_chunk
        );
        let per = ((self.max_chunk / row_bytes) as usize).max(1);
        let mut chunks = Vec::new();
        let mut r = 0;
        loop {
            let n = per.min(rows - r);
            let len = if shape.is_empty() { 1 } else { n * row };
            chunks.push(Chunk {
                buf: self.pool.get((len * es) as u64),
                start: r * row,
                len,
            });
            r += n;
            if r >= rows {
                break;
            }
        }
        Ok(WTensor {
            st: Arc::new(Storage::new(chunks, self.pool.clone())),
            shape: shape.to_vec(),
            dtype,
        })
    }

    /// Records one compute dispatch. `bufs` are bound to bindings `1..` in order.
    fn dispatch(
        &self,
        spec: &Spec,
        params: &[u32],
        bufs: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Result<()> {
        if groups.contains(&0) {
            return Ok(());
        }
        debug_assert!(params.len() * 4 <= PARAM_BYTES as usize);
        debug_assert_eq!(bufs.len(), spec.access.len());
        let kernel: Arc<Kernel> = self.pipelines.get(&self.device, spec);
        let mut rec = self.lock();
        if rec.ops >= self.submit_ops {
            self.flush_locked(&mut rec);
        }
        let offset = rec.ops as u64 * PARAM_STRIDE;
        rec.params
            .resize(offset as usize + PARAM_STRIDE as usize, 0);
        let p: &[u8] = bytemuck::cast_slice(params);
        rec.params[offset as usize..offset as usize + p.len()].copy_from_slice(p);
        if self.pool.take_evicted() || rec.bind_groups.len() >= MAX_BIND_GROUPS {
            // Buffers were really freed (or the cache is large): drop the cached bind groups
            // so that they do not keep freed memory alive.
            rec.bind_groups.clear();
        }
        let key = (
            Arc::as_ptr(&kernel) as usize,
            bufs.iter().map(|b| (*b).clone()).collect::<Vec<_>>(),
        );
        let bg = match rec.bind_groups.get(&key) {
            Some(bg) => bg.clone(),
            None => {
                let mut entries = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.arena,
                        offset: 0,
                        size: wgpu::BufferSize::new(PARAM_BYTES),
                    }),
                }];
                for (i, b) in bufs.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: b.as_entire_binding(),
                    });
                }
                let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &kernel.layout,
                    entries: &entries,
                });
                rec.bind_groups.insert(key, bg.clone());
                bg
            }
        };
        rec.ops += 1;
        self.dispatches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if rec.prof.is_some() {
            self.dispatch_timed(&mut rec, spec.entry, &kernel, &bg, offset as u32, groups);
            return Ok(());
        }
        if rec.pass.is_none() {
            let enc = self.encoder(&mut rec);
            let pass = enc
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: None,
                })
                .forget_lifetime();
            rec.pass = Some(pass);
        }
        let pass = rec.pass.as_mut().expect("compute pass was just opened");
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &bg, &[offset as u32]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        Ok(())
    }

    /// [`WgslBackend::dispatch`]'s recording under the profiler: timestamps around the dispatch
    /// (queries `2i`, `2i + 1` for the submission's `i`-th dispatch).
    fn dispatch_timed(
        &self,
        rec: &mut Recorder,
        entry: &'static str,
        kernel: &Kernel,
        bg: &wgpu::BindGroup,
        offset: u32,
        groups: [u32; 3],
    ) {
        let Some(p) = rec.prof.as_ref() else { return };
        let (mode, qs) = (p.mode, p.queries.clone());
        let i = p.pending.len() as u32;
        if mode == profile::Mode::PerPass {
            rec.pass = None;
        }
        if rec.pass.is_none() {
            let tw = wgpu::ComputePassTimestampWrites {
                query_set: &qs,
                beginning_of_pass_write_index: Some(2 * i),
                end_of_pass_write_index: Some(2 * i + 1),
            };
            let enc = self.encoder(rec);
            let pass = enc
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: (mode == profile::Mode::PerPass).then_some(tw),
                })
                .forget_lifetime();
            rec.pass = Some(pass);
        }
        let pass = rec.pass.as_mut().expect("compute pass was just opened");
        if mode == profile::Mode::InsidePasses {
            pass.write_timestamp(&qs, 2 * i);
        }
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, bg, &[offset]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if mode == profile::Mode::InsidePasses {
            pass.write_timestamp(&qs, 2 * i + 1);
        } else {
            // The end-of-pass timestamp is written when the pass ends.
            rec.pass = None;
        }
        if let Some(p) = rec.prof.as_mut() {
            p.pending.push(entry);
        }
    }

    /// A 2-D grid of `n` workgroups (x ≤ 65535), for kernels that linearise `wid.x + wid.y·nwg.x`.
    fn grid(op: &str, n: u64) -> Result<[u32; 3]> {
        let x = n.clamp(1, MAX_GROUPS);
        let y = n.div_ceil(x);
        ensure!(
            y <= MAX_GROUPS,
            "{op}: {n} workgroups exceed the 65535² grid"
        );
        Ok([if n == 0 { 0 } else { x as u32 }, y as u32, 1])
    }

    fn float_in(op: &str, name: &str, t: &WTensor) -> Result<()> {
        ensure!(
            t.dtype == DType::F32,
            "{op}: {name} must be a float (f32) tensor, got {}",
            t.dtype
        );
        Ok(())
    }

    /// `t` as an f32 tensor: itself if it is f32, else an f32 copy (packed bf16 is widened on
    /// the device). Errors for integer tensors.
    fn f32_of(&self, op: &str, name: &str, t: &WTensor) -> Result<WTensor> {
        match t.dtype {
            DType::F32 => Ok(t.clone()),
            DType::BF16 => {
                let out = self.alloc(&t.shape, DType::F32)?;
                let n = t.numel();
                let g = Self::grid(op, (n as u64).div_ceil(256))?;
                self.dispatch(
                    &pipelines::BF16_TO_F32,
                    &[n as u32, 0, 0, 0],
                    &[t.single(op, name)?, out.single(op, name)?],
                    g,
                )?;
                Ok(out)
            }
            other => bail!("{op}: {name} must be a float tensor, got {other}"),
        }
    }

    fn u32_in(op: &str, name: &str, t: &WTensor) -> Result<()> {
        ensure!(
            matches!(t.dtype, DType::U32 | DType::I32),
            "{op}: {name} must be a u32 tensor, got {}",
            t.dtype
        );
        Ok(())
    }

    /// A weight read by a kernel as raw words: its buffer and whether it is packed bf16 (else f32).
    /// Such weights must fit one storage binding; larger ones (e.g. a full DeepSeek-V3 layer's
    /// stacked experts on lavapipe's 128 MiB limit) are refused with a clear error.
    fn weight_in<'a>(
        &self,
        op: &str,
        name: &str,
        t: &'a WTensor,
    ) -> Result<(&'a wgpu::Buffer, u32)> {
        let bf16 = match t.dtype {
            DType::F32 => 0,
            DType::BF16 => 1,
            other => bail!("{op}: {name} must be a float tensor, got {other}"),
        };
        ensure!(
            t.st.chunks.len() == 1,
            "{op}: {name} {:?} ({} bytes) is larger than this adapter's largest storage binding \
             ({} bytes); the WGSL backend needs it in one buffer (use a smaller model or a GPU \
             with a larger binding limit)",
            t.shape,
            t.numel() * t.dtype.size(),
            self.max_chunk
        );
        Ok((&t.st.chunks[0].buf, bf16))
    }

    fn upload_u32(&self, v: &[u32]) -> Result<WTensor> {
        let v: Vec<u32> = if v.is_empty() { vec![0] } else { v.to_vec() };
        self.upload(&HostTensor::from_u32(vec![v.len()], &v)?)
    }
}

impl Drop for WgslBackend {
    /// With [`PROFILE_ENV`]`=1`, prints the per-kernel GPU timing table to stderr.
    fn drop(&mut self) {
        if let Some(r) = self.take_profile() {
            eprint!("{r}");
        }
    }
}

impl Backend for WgslBackend {
    type Tensor = WTensor;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn activation_dtype(&self, _requested: DType) -> DType {
        DType::F32
    }

    /// A CPU adapter (lavapipe) allocates host memory: the host's `MemAvailable`. wgpu reports
    /// no free memory for GPU adapters: `None`.
    fn free_memory(&self) -> Option<u64> {
        if self.cpu_adapter {
            dayone_backend::host_available_memory()
        } else {
            None
        }
    }

    /// The largest buffer chunk ([`WgslBackend::max_chunk_bytes`]): a cache tensor above it would
    /// be split by rows, which the cache ops cannot bind.
    fn max_buffer_bytes(&self) -> Option<u64> {
        Some(self.max_chunk)
    }

    fn upload(&self, host: &HostTensor) -> Result<WTensor> {
        let numel = host.numel();
        let want = numel * host.dtype.size();
        ensure!(
            host.data.len() == want,
            "upload: tensor {:?} {} needs {want} bytes, got {}",
            host.shape,
            host.dtype,
            host.data.len()
        );
        // A bf16 matrix whose rows hold a multiple of 8 values stays packed (half the bytes for
        // weights); other bf16 (vectors: norm weights, biases, which ops would otherwise widen at
        // every call) and all f16 tensors are widened to f32 here.
        let packable = host.shape.len() >= 2
            && host.shape.last().is_some_and(|&d| d.is_multiple_of(8))
            && numel > 0;
        let (dtype, bytes): (DType, std::borrow::Cow<[u8]>) = match host.dtype {
            DType::F32 | DType::U32 | DType::I32 => (host.dtype, (&host.data[..]).into()),
            DType::BF16 if packable => (DType::BF16, (&host.data[..]).into()),
            DType::BF16 | DType::F16 => {
                let v = host.to_f32();
                (
                    DType::F32,
                    bytemuck::cast_slice::<f32, u8>(&v).to_vec().into(),
                )
            }
        };
        let t = self.alloc(&host.shape, dtype)?;
        {
            // Pool buffers may still be referenced by recorded commands; write_buffer is ordered
            // at the queue level, so submit pending work first.
            let mut rec = self.lock();
            self.flush_locked(&mut rec);
        }
        for c in &t.st.chunks {
            let es = dtype.size();
            let b = &bytes[c.start * es..(c.start + c.len) * es];
            if !b.is_empty() {
                self.queue.write_buffer(&c.buf, 0, b);
            }
        }
        Ok(t)
    }

    fn download(&self, t: &WTensor) -> Result<HostTensor> {
        let numel = t.numel();
        let es = t.dtype.size();
        let bytes = (numel * es) as u64;
        let mut out = vec![0u8; bytes as usize];
        if bytes > 0 {
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("dayone-wgsl download"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            {
                let mut rec = self.lock();
                let enc = self.encoder(&mut rec);
                for c in &t.st.chunks {
                    if c.len > 0 {
                        enc.copy_buffer_to_buffer(
                            &c.buf,
                            0,
                            &staging,
                            (c.start * es) as u64,
                            Some((c.len * es) as u64),
                        );
                    }
                }
                self.flush_locked(&mut rec);
            }
            self.read_staging("download", &staging, &mut out)?;
        }
        self.check_error()?;
        HostTensor::new(t.shape.clone(), t.dtype, out)
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<WTensor> {
        let dtype = match dtype {
            DType::F32 | DType::BF16 | DType::F16 => DType::F32,
            d => d,
        };
        let t = self.alloc(shape, dtype)?;
        let mut rec = self.lock();
        let enc = self.encoder(&mut rec);
        for c in &t.st.chunks {
            enc.clear_buffer(&c.buf, 0, None);
        }
        Ok(t)
    }

    fn reshape(&self, t: &WTensor, shape: &[usize]) -> Result<WTensor> {
        let n: usize = shape.iter().product();
        ensure!(
            n == t.numel(),
            "reshape: cannot view {:?} ({} elements) as {shape:?} ({n} elements)",
            t.shape,
            t.numel()
        );
        Ok(WTensor {
            st: t.st.clone(),
            shape: shape.to_vec(),
            dtype: t.dtype,
        })
    }

    fn synchronize(&self) -> Result<()> {
        {
            let mut rec = self.lock();
            self.flush_locked(&mut rec);
        }
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| anyhow!("synchronize: device poll failed: {e}"))?;
        self.check_error()
    }

    fn dequantize_into(
        &self,
        q: &QuantTensor<WTensor>,
        items: &WTensor,
        out: &WTensor,
    ) -> Result<()> {
        self.dequantize_into_impl(q, items, out)
    }

    fn linear_quant(
        &self,
        x: &WTensor,
        q: &QuantTensor<WTensor>,
        bias: Option<&WTensor>,
    ) -> Result<WTensor> {
        self.linear_quant_impl(x, q, bias)
    }

    fn embedding(&self, table: &WTensor, ids: &WTensor) -> Result<WTensor> {
        self.embedding_impl(table, ids)
    }

    fn linear(&self, x: &WTensor, w: &WTensor, bias: Option<&WTensor>) -> Result<WTensor> {
        self.linear_impl(x, w, bias)
    }

    fn linear_many(
        &self,
        x: &WTensor,
        parts: &[(&WTensor, Option<&WTensor>)],
    ) -> Result<Vec<WTensor>> {
        self.linear_many_impl(x, parts)
    }

    fn linear_silu_mul(&self, x: &WTensor, w_gate: &WTensor, w_up: &WTensor) -> Result<WTensor> {
        self.linear_silu_mul_impl(x, w_gate, w_up)
    }

    fn rms_norm(&self, x: &WTensor, w: &WTensor, eps: f32) -> Result<WTensor> {
        self.rms_norm_impl(x, w, eps)
    }

    fn add_rms_norm(
        &self,
        a: &WTensor,
        r: &WTensor,
        w: &WTensor,
        eps: f32,
    ) -> Result<(WTensor, WTensor)> {
        self.add_rms_norm_impl(a, r, w, eps)
    }

    fn rope(
        &self,
        x: &WTensor,
        positions: &WTensor,
        inv_freq: &WTensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<WTensor> {
        self.rope_impl(x, positions, inv_freq, rot_dim, style, mscale)
    }

    fn silu_mul(&self, gate: &WTensor, up: &WTensor) -> Result<WTensor> {
        self.silu_mul_impl(gate, up)
    }

    fn silu_mul_limit(&self, gate: &WTensor, up: &WTensor, limit: f32) -> Result<WTensor> {
        self.silu_mul_limit_impl(gate, up, limit)
    }

    fn add(&self, a: &WTensor, b: &WTensor) -> Result<WTensor> {
        self.add_impl(a, b)
    }

    fn stream_mix(&self, x: &WTensor, w: &WTensor) -> Result<WTensor> {
        self.stream_mix_impl(x, w)
    }

    fn gelu(&self, x: &WTensor, approximate: bool) -> Result<WTensor> {
        self.gelu_impl(x, approximate)
    }

    fn write_kv(
        &self,
        k: &WTensor,
        v: &WTensor,
        k_cache: &WTensor,
        v_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<()> {
        self.write_kv_impl(k, v, k_cache, v_cache, meta)
    }

    /// On the device (`attention_varlen.wgsl`) for f32 tensors within one storage binding; the
    /// host path otherwise (bf16 activations never occur here; split tensors are large key
    /// segments that lavapipe's 128 MiB binding cannot hold).
    fn attention_varlen(
        &self,
        q: &WTensor,
        k: &WTensor,
        v: &WTensor,
        meta: &dayone_backend::DeviceVarlenMeta<WTensor>,
        scale: f32,
        prior: Option<(&WTensor, &WTensor)>,
        final_out: bool,
    ) -> Result<dayone_backend::VarlenResult<WTensor>> {
        match self.attention_varlen_impl(q, k, v, meta, scale, prior, final_out)? {
            Some(r) => Ok(r),
            None => dayone_backend::varlen::attention_varlen_on_host(
                self, q, k, v, meta, scale, prior, final_out,
            ),
        }
    }

    fn paged_attention(
        &self,
        q: &WTensor,
        k_cache: &WTensor,
        v_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
    ) -> Result<WTensor> {
        self.paged_attention_impl(q, k_cache, v_cache, meta, scale, None, None)
    }

    fn paged_attention_ext(
        &self,
        q: &WTensor,
        k_cache: &WTensor,
        v_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
        opts: &AttentionOptions<WTensor>,
    ) -> Result<WTensor> {
        self.paged_attention_impl(q, k_cache, v_cache, meta, scale, opts.window, opts.sinks)
    }

    fn moe_experts_ext(
        &self,
        x: &WTensor,
        ids: &WTensor,
        weights: &WTensor,
        gate_up: &WTensor,
        down: &WTensor,
        opts: &ExpertOptions<WTensor>,
    ) -> Result<WTensor> {
        self.moe_experts_impl(x, ids, weights, gate_up, down, opts)
    }

    fn argmax(&self, x: &WTensor) -> Result<WTensor> {
        self.argmax_impl(x)
    }
    fn head_linear(&self, x: &WTensor, w: &WTensor) -> Result<WTensor> {
        self.head_linear_impl(x, w)
    }

    fn write_cache(
        &self,
        x: &WTensor,
        cache: &WTensor,
        col: usize,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<()> {
        self.write_cache_impl(x, cache, col, meta)
    }

    fn paged_latent_attention(
        &self,
        q_lat: &WTensor,
        q_rope: &WTensor,
        cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
    ) -> Result<WTensor> {
        self.latent_attention_impl(q_lat, q_rope, cache, meta, scale, None)
    }

    fn moe_route(
        &self,
        x: &WTensor,
        gate_w: &WTensor,
        bias: Option<&WTensor>,
        routing: &MoeRouting,
    ) -> Result<(WTensor, WTensor)> {
        self.moe_route_impl(x, gate_w, bias, routing)
    }

    fn moe_experts(
        &self,
        x: &WTensor,
        ids: &WTensor,
        weights: &WTensor,
        gate_up: &WTensor,
        down: &WTensor,
    ) -> Result<WTensor> {
        self.moe_experts_impl(
            x,
            ids,
            weights,
            gate_up,
            down,
            &ExpertOptions {
                act: ExpertAct::Swiglu,
                gate_up_bias: None,
                down_bias: None,
                fp8: false,
            },
        )
    }

    fn short_conv(
        &self,
        x: &WTensor,
        w: &WTensor,
        state: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<WTensor> {
        self.short_conv_impl(x, w, state, meta)
    }

    #[allow(clippy::too_many_arguments)]
    fn kda(
        &self,
        q: &WTensor,
        k: &WTensor,
        v: &WTensor,
        a: &WTensor,
        b: &WTensor,
        a_log: &WTensor,
        dt_bias: &WTensor,
        lower_bound: Option<f32>,
        state: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<WTensor> {
        self.kda_impl(q, k, v, a, b, a_log, dt_bias, lower_bound, state, meta)
    }

    fn gated_rms_norm(
        &self,
        x: &WTensor,
        gate: &WTensor,
        w: &WTensor,
        eps: f32,
    ) -> Result<WTensor> {
        self.gated_rms_norm_impl(x, gate, w, eps)
    }

    fn layer_norm(&self, x: &WTensor, w: &WTensor, b: &WTensor, eps: f32) -> Result<WTensor> {
        self.layer_norm_impl(x, w, b, eps)
    }

    fn dsa_topk(
        &self,
        q: &WTensor,
        w: &WTensor,
        k_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
        topk: usize,
    ) -> Result<WTensor> {
        self.dsa_topk_impl(q, w, k_cache, meta, scale, topk)
    }

    fn sparse_latent_attention(
        &self,
        q_lat: &WTensor,
        q_rope: &WTensor,
        cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
        selected: &WTensor,
    ) -> Result<WTensor> {
        self.latent_attention_impl(q_lat, q_rope, cache, meta, scale, Some(selected))
    }

    /// Buffer-to-buffer copies, staged where wgpu forbids a copy within one buffer (`ops/rows.rs`).
    fn copy_rows(&self, t: &WTensor, pairs: &[(u32, u32)]) -> Result<()> {
        self.copy_rows_impl(t, pairs)
    }

    fn read_rows(&self, t: &WTensor, rows: &[u32]) -> Result<HostTensor> {
        self.read_rows_impl(t, rows)
    }

    fn write_rows(&self, t: &WTensor, rows: &[u32], src: &HostTensor) -> Result<()> {
        self.write_rows_impl(t, rows, src)
    }

    fn recurrent_split_alignment(&self) -> usize {
        // `kda` aligns its chunks to absolute multiples of KDA_CHUNK (ops/kda.rs).
        KDA_CHUNK
    }

    /// Decode-sized `linear` and `linear_quant` calls take the prefill GEMM (ops/linear.rs).
    fn set_batch_invariant(&self, on: bool) -> Result<()> {
        self.batch_invariant
            .store(on, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn batch_invariant(&self) -> bool {
        self.invariant()
    }
}
