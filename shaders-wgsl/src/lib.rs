//! dayone's portable backend: [`dayone_backend::Backend`] on wgpu with WGSL compute shaders.
//!
//! Runs on any Vulkan/Metal/DX12 adapter, including Mesa lavapipe (CPU Vulkan), where it is the
//! correctness reference in CI. Activations, KV caches and all results are f32
//! ([`Backend::activation_dtype`] is always `F32`); integer tensors are u32/i32.
//!
//! Design:
//! - Storage dtypes: f32 uploads stay f32; bf16 uploads whose rows hold a multiple of 8 values
//!   stay packed bf16 (dtype `BF16`, half the bytes: `linear` weights and `embedding` tables are
//!   read packed, other ops widen such inputs on the device first); other bf16 and all f16 uploads
//!   are widened to f32 on the host. `download` returns the stored dtype.
//! - Ops are recorded into one command encoder and one compute pass and submitted lazily: on
//!   `download`, `synchronize`, before an upload (pool buffers may still be referenced by pending
//!   work, and queue writes are ordered before it), or every [`MAX_PENDING_OPS`] ops. Kernel
//!   parameters go to a uniform arena bound with dynamic offsets; bind groups are cached.
//! - Tensor memory comes from a size-bucketed pool and returns to it when the last handle drops.
//! - Tensors larger than the adapter's largest storage binding (128 MiB on lavapipe) are split by
//!   rows into several buffers; `linear` (weights), `embedding` (table), `upload` and `download`
//!   handle split tensors transparently, other ops return an error naming the tensor.
//! - Kernels come in a CPU flavour (llvmpipe: invocations are SIMD lanes, barriers are costly)
//!   and a GPU flavour, chosen by adapter type ([`KernelChoice`]).
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
//!   (`sparse_mla_attention.wgsl`: `mla_attention.wgsl`'s workgroup kernel iterating over
//!   `selected[n]`, skipping `u32::MAX`).

mod buffers;
mod pipelines;

use anyhow::{anyhow, bail, ensure, Context, Result};
use buffers::{Chunk, Pool, Storage};
use dayone_backend::{
    Backend, DType, DeviceStepMeta, HostTensor, MoeRouting, RopeStyle, TensorInfo,
};
use pipelines::{Kernel, Pipelines, Spec, PARAM_BYTES};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Ops recorded before the encoder is submitted without being asked.
pub const MAX_PENDING_OPS: usize = 256;
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
    kda_chunk_min: usize,
    pool: Arc<Pool>,
    pipelines: Pipelines,
    rec: Mutex<Recorder>,
    arena: wgpu::Buffer,
    dummy: wgpu::Buffer,
    error: Arc<Mutex<Option<String>>>,
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
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("dayone-wgsl"),
            required_features: wgpu::Features::empty(),
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
        Ok(Self {
            pool: Arc::new(Pool::new(device.clone(), max_chunk)),
            device,
            queue,
            name,
            max_chunk,
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
            }),
            arena,
            dummy,
            error,
        })
    }

    /// Largest bytes per device buffer; larger tensors are split by rows.
    pub fn max_chunk_bytes(&self) -> u64 {
        self.max_chunk
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
        if let Some(enc) = rec.encoder.take() {
            if !rec.params.is_empty() {
                self.queue.write_buffer(&self.arena, 0, &rec.params);
            }
            self.queue.submit([enc.finish()]);
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
        if rec.ops >= MAX_PENDING_OPS {
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

    /// Checks a step's paged-cache metadata against a cache of `blocks` blocks of `bs` slots:
    /// sequence indices, block-table size and every block id a token's keys need.
    fn check_paged_meta(
        op: &str,
        hm: &dayone_backend::StepMeta,
        blocks: usize,
        bs: usize,
    ) -> Result<()> {
        let n = hm.num_tokens();
        ensure!(
            bs == hm.block_size,
            "{op}: cache block size {bs} != meta.block_size {}",
            hm.block_size
        );
        ensure!(
            hm.token_seq.len() == n,
            "{op}: token_seq must have {n} entries"
        );
        ensure!(
            hm.block_tables.len() >= hm.num_seqs() * hm.max_blocks,
            "{op}: block_tables must have [S = {}, max_blocks = {}] entries",
            hm.num_seqs(),
            hm.max_blocks
        );
        for t in 0..n {
            let (s, p) = (hm.token_seq[t] as usize, hm.positions[t] as usize);
            ensure!(
                s < hm.num_seqs(),
                "{op}: token_seq[{t}] = {s} >= number of sequences {}",
                hm.num_seqs()
            );
            ensure!(
                p / bs < hm.max_blocks,
                "{op}: position {p} of token {t} needs block {} >= max_blocks {}",
                p / bs,
                hm.max_blocks
            );
            for b in 0..=p / bs {
                let id = hm.block_tables[s * hm.max_blocks + b] as usize;
                ensure!(
                    id < blocks,
                    "{op}: block id {id} of sequence {s} >= cache blocks {blocks}"
                );
            }
        }
        Ok(())
    }

    /// Per-sequence state-slot rows for the recurrent ops (`short_conv`, `kda`):
    /// `(slot, first row, rows, fresh)` per sequence, after checking the metadata (a
    /// `query_start` covering all `N` rows, one distinct slot `< slots` per sequence).
    /// `fresh`: the sequence starts at position 0 in this step (or has no rows), as in
    /// `reference::short_conv`/`kda`.
    fn state_seqs(op: &str, hm: &dayone_backend::StepMeta, slots: usize) -> Result<Vec<[u32; 4]>> {
        let (n, s) = (hm.num_tokens(), hm.num_seqs());
        ensure!(
            hm.state_slots.len() == s,
            "{op}: state_slots must have one entry per sequence ({s}), got {}",
            hm.state_slots.len()
        );
        ensure!(
            hm.query_start.len() == s + 1
                && hm.query_start.first() == Some(&0)
                && hm.query_start[s] as usize == n
                && hm.query_start.windows(2).all(|w| w[0] <= w[1]),
            "{op}: query_start must be [S + 1 = {}] non-decreasing prefix sums from 0 to N = {n}",
            s + 1
        );
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::with_capacity(s);
        for i in 0..s {
            let slot = hm.state_slots[i];
            ensure!(
                (slot as usize) < slots,
                "{op}: state slot {slot} of sequence {i} out of range ({slots} slots)"
            );
            ensure!(
                seen.insert(slot),
                "{op}: state slot {slot} is used by more than one sequence of the step"
            );
            let (a, b) = (hm.query_start[i], hm.query_start[i + 1]);
            let fresh = a == b || hm.positions[a as usize] == 0;
            out.push([slot, a, b - a, fresh as u32]);
        }
        Ok(out)
    }

    /// `kda`'s chunked path for the sequences `seqs` (`(slot, first row, rows, fresh)`):
    /// chunks of [`KDA_CHUNK`] rows; `kda_chunk_prep.wgsl` computes every chunk's intra-chunk
    /// matrices (one workgroup per (chunk, head), independent across chunks) into a scratch
    /// buffer, then `kda_chunk_state.wgsl` walks each sequence's chunks in order carrying the state
    /// (one invocation per (sequence, head, value column)). Chunks are processed in rounds small
    /// enough for the scratch to fit one storage binding; the state carries over between rounds.
    /// `dims` = `[H, K, V]`, `ins` = prepared `qn`, `kn`, `g` and `v`, `b`.
    fn kda_chunked(
        &self,
        seqs: &[[u32; 4]],
        dims: [usize; 3],
        ins: [&WTensor; 5],
        state: &wgpu::Buffer,
        out: &wgpu::Buffer,
    ) -> Result<()> {
        const OP: &str = "kda";
        let [h, kd, vd] = dims;
        let c = KDA_CHUNK;
        // Per (chunk, head): Γ, Qg, Kd, W [C, K] | U [C, V] | L, Aqk [C, C] | exp(Γ_last) [K].
        let per = 4 * c * kd + c * vd + 2 * c * c + kd;
        let per_chunk_bytes = (h * per * 4) as u64;
        ensure!(
            per_chunk_bytes <= self.max_chunk,
            "{OP}: one chunk's scratch ({per_chunk_bytes} bytes) exceeds the largest device buffer"
        );
        let max_round = ((self.max_chunk / per_chunk_bytes) as usize).clamp(1, 4096);
        // All chunks in order: (sequence index, chunk index within it, first row, rows).
        let mut all = Vec::new();
        for (si, s) in seqs.iter().enumerate() {
            let (first, rows) = (s[1] as usize, s[2] as usize);
            for (ci, r0) in (0..rows).step_by(c).enumerate() {
                all.push((si, ci, first + r0, c.min(rows - r0)));
            }
        }
        let round = max_round.min(all.len());
        let scratch = self.alloc(&[round * h, per], DType::F32)?;
        let scr = scratch.single(OP, "scratch")?;
        let [qn, kn, g, v, b] = ins;
        for part in all.chunks(round) {
            let mut tab: Vec<u32> = part
                .iter()
                .flat_map(|&(_, _, r0, rows)| [r0 as u32, rows as u32])
                .collect();
            let seq_off = tab.len();
            let mut nseq = 0;
            for (i, &(si, ci, _, _)) in part.iter().enumerate() {
                if i == 0 || part[i - 1].0 != si {
                    let count = part[i..].iter().take_while(|x| x.0 == si).count();
                    let fresh = seqs[si][3] != 0 && ci == 0;
                    tab.extend([seqs[si][0], i as u32, count as u32, fresh as u32]);
                    nseq += 1;
                }
            }
            let tabt = self.upload_u32(&tab)?;
            let tb = tabt.single(OP, "table")?;
            let groups = part.len() * h;
            self.dispatch(
                &pipelines::KDA_CHUNK_PREP_K,
                &[
                    groups as u32,
                    h as u32,
                    kd as u32,
                    vd as u32,
                    per as u32,
                    0,
                    0,
                    0,
                ],
                &[
                    qn.single(OP, "q (normalised)")?,
                    kn.single(OP, "k (normalised)")?,
                    g.single(OP, "g")?,
                    v.single(OP, "v")?,
                    b.single(OP, "b")?,
                    tb,
                    scr,
                ],
                Self::grid(OP, groups as u64)?,
            )?;
            let total = nseq * h * vd;
            self.dispatch(
                &pipelines::KDA_CHUNK_STATE_K,
                &[
                    total as u32,
                    h as u32,
                    kd as u32,
                    vd as u32,
                    per as u32,
                    seq_off as u32,
                    0,
                    0,
                ],
                &[scr, tb, state, out],
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )?;
        }
        Ok(())
    }

    fn upload_u32(&self, v: &[u32]) -> Result<WTensor> {
        let v: Vec<u32> = if v.is_empty() { vec![0] } else { v.to_vec() };
        self.upload(&HostTensor::from_u32(vec![v.len()], &v)?)
    }

    fn elementwise(&self, op: &str, spec: &Spec, a: &WTensor, b: &WTensor) -> Result<WTensor> {
        let a = &self.f32_of(op, "a", a)?;
        let b = &self.f32_of(op, "b", b)?;
        ensure!(
            a.shape == b.shape,
            "{op}: operands must have equal shapes, got {:?} and {:?}",
            a.shape,
            b.shape
        );
        let out = self.alloc(&a.shape, DType::F32)?;
        let n = a.numel();
        let g = Self::grid(op, (n as u64).div_ceil(1024))?;
        self.dispatch(
            spec,
            &[n as u32, 0, 0, 0],
            &[
                a.single(op, "a")?,
                b.single(op, "b")?,
                out.single(op, "out")?,
            ],
            g,
        )?;
        Ok(out)
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
        // bf16 whose rows hold a multiple of 8 values stays packed (half the bytes for weights);
        // other bf16 and all f16 tensors are widened to f32 here.
        let packable = host.shape.last().is_some_and(|&d| d.is_multiple_of(8)) && numel > 0;
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
            let (tx, rx) = std::sync::mpsc::channel();
            staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
            self.device
                .poll(wgpu::PollType::wait_indefinitely())
                .map_err(|e| anyhow!("download: device poll failed: {e}"))?;
            self.check_error()?;
            rx.recv()
                .map_err(|_| anyhow!("download: map callback dropped"))?
                .map_err(|e| anyhow!("download: buffer map failed: {e}"))?;
            {
                let view = staging
                    .get_mapped_range(..)
                    .map_err(|e| anyhow!("download: {e}"))?;
                out.copy_from_slice(&view);
            }
            staging.unmap();
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

    fn embedding(&self, table: &WTensor, ids: &WTensor) -> Result<WTensor> {
        const OP: &str = "embedding";
        ensure!(
            table.shape.len() == 2,
            "{OP}: table must have shape [V, D], got {:?}",
            table.shape
        );
        ensure!(
            ids.shape.len() == 1,
            "{OP}: ids must have shape [N], got {:?}",
            ids.shape
        );
        ensure!(
            matches!(table.dtype, DType::F32 | DType::BF16),
            "{OP}: table must be a float tensor, got {}",
            table.dtype
        );
        Self::u32_in(OP, "ids", ids)?;
        let (v, d, n) = (table.shape[0], table.shape[1], ids.shape[0]);
        let out = self.alloc(&[n, d], DType::F32)?;
        let ob = out.single(OP, "output")?;
        let ib = ids.single(OP, "ids")?;
        let g = Self::grid(OP, ((n * d) as u64).div_ceil(256))?;
        if n * d == 0 {
            return Ok(out);
        }
        let nc = table.st.chunks.len();
        for (i, c) in table.st.chunks.iter().enumerate() {
            ensure!(c.start % d == 0, "{OP}: table chunk not aligned to rows");
            let (r0, r1) = (c.start / d, (c.start + c.len) / d);
            let p = [
                n as u32,
                d as u32,
                r0 as u32,
                r1 as u32,
                v as u32,
                (i + 1 == nc) as u32,
                0,
                0,
            ];
            let spec = if table.dtype == DType::BF16 {
                &pipelines::EMBED_B16
            } else {
                &pipelines::EMBED
            };
            self.dispatch(spec, &p, &[&c.buf, ib, ob], g)?;
        }
        Ok(out)
    }

    fn linear(&self, x: &WTensor, w: &WTensor, bias: Option<&WTensor>) -> Result<WTensor> {
        const OP: &str = "linear";
        ensure!(
            w.shape.len() == 2 && !x.shape.is_empty(),
            "{OP}: expected x [M, K] and w [N, K], got {:?} and {:?}",
            x.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        ensure!(
            matches!(w.dtype, DType::F32 | DType::BF16),
            "{OP}: w must be a float tensor, got {}",
            w.dtype
        );
        let (n, k) = (w.shape[0], w.shape[1]);
        ensure!(
            w.dtype != DType::BF16 || k.is_multiple_of(8),
            "{OP}: packed bf16 weights need K % 8 == 0, got {k}"
        );
        ensure!(
            *x.shape.last().unwrap_or(&0) == k,
            "{OP}: x must have shape [M, {k}] to match w [{n}, {k}], got {:?}",
            x.shape
        );
        let m: usize = x.shape[..x.shape.len() - 1].iter().product();
        let mut oshape = x.shape[..x.shape.len() - 1].to_vec();
        oshape.push(n);
        let bias = match bias {
            Some(b) => Some(self.f32_of(OP, "bias", b)?),
            None => None,
        };
        let bb = match &bias {
            Some(b) => {
                ensure!(
                    b.shape == [n],
                    "{OP}: bias must have shape [{n}], got {:?}",
                    b.shape
                );
                b.single(OP, "bias")?
            }
            None => &self.dummy,
        };
        let out = self.alloc(&oshape, DType::F32)?;
        let ob = out.single(OP, "output [M, N]")?;
        let xb = x.single(OP, "x")?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        ensure!(k > 0, "{OP}: K must be > 0");
        for c in &w.st.chunks {
            ensure!(
                c.start % k == 0 && c.len % k == 0,
                "{OP}: weight chunk not aligned to rows"
            );
            let (n_off, n_chunk) = (c.start / k, c.len / k);
            let p = [
                m as u32,
                k as u32,
                n as u32,
                n_off as u32,
                n_chunk as u32,
                bias.is_some() as u32,
                0,
                0,
            ];
            let bufs = [xb, &c.buf, bb, ob];
            let bf16 = w.dtype == DType::BF16;
            let tiles = (n_chunk as u64).div_ceil(4);
            // (kernel, grid): decode (M < 4) and prefill kernels, f32 or packed-bf16 weights.
            let (spec, g) = if !bf16 && !k.is_multiple_of(4) {
                (
                    &pipelines::MATMUL_S,
                    Self::grid(OP, ((m * n_chunk) as u64).div_ceil(64))?,
                )
            } else if m < 4 && !self.cpu_kernels {
                let spec = if bf16 {
                    &pipelines::MATVEC_WG_B16
                } else {
                    &pipelines::MATVEC_WG
                };
                (spec, Self::grid(OP, tiles * m as u64)?)
            } else if m < 4 {
                let spec = if bf16 {
                    &pipelines::MATVEC_B16
                } else {
                    &pipelines::MATVEC_V4
                };
                (spec, [tiles.div_ceil(64) as u32, m as u32, 1])
            } else {
                let spec = if bf16 {
                    &pipelines::MATMUL_B16
                } else {
                    &pipelines::MATMUL_V4
                };
                let gy = (m as u64).div_ceil(4);
                ensure!(gy <= MAX_GROUPS, "{OP}: M {m} too large for one dispatch");
                (spec, [tiles.div_ceil(64) as u32, gy as u32, 1])
            };
            ensure!(
                tiles.div_ceil(64) <= MAX_GROUPS,
                "{OP}: N {n} too large for one dispatch"
            );
            self.dispatch(spec, &p, &bufs, g)?;
        }
        Ok(out)
    }

    fn rms_norm(&self, x: &WTensor, w: &WTensor, eps: f32) -> Result<WTensor> {
        const OP: &str = "rms_norm";
        ensure!(
            !x.shape.is_empty(),
            "{OP}: x must have shape [R, D], got {:?}",
            x.shape
        );
        let d = *x.shape.last().unwrap_or(&0);
        ensure!(
            w.shape == [d],
            "{OP}: w must have shape [{d}] to match x {:?}, got {:?}",
            x.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let w = &self.f32_of(OP, "w", w)?;
        let rows = x.numel().checked_div(d).unwrap_or(0);
        let out = self.alloc(&x.shape, DType::F32)?;
        let g = Self::grid(OP, rows as u64)?;
        self.dispatch(
            &pipelines::RMS_NORM,
            &[rows as u32, d as u32, f32_param(eps), 0],
            &[
                x.single(OP, "x")?,
                w.single(OP, "w")?,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
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
        const OP: &str = "rope";
        ensure!(
            x.shape.len() == 3,
            "{OP}: x must have shape [N, H, hd], got {:?}",
            x.shape
        );
        let (n, h, hd) = (x.shape[0], x.shape[1], x.shape[2]);
        ensure!(
            rot_dim > 0 && rot_dim.is_multiple_of(2) && rot_dim <= hd,
            "{OP}: rot_dim {rot_dim} must be even, positive and <= hd {hd}"
        );
        ensure!(
            positions.shape == [n],
            "{OP}: positions must have shape [{n}], got {:?}",
            positions.shape
        );
        ensure!(
            inv_freq.shape == [rot_dim / 2],
            "{OP}: inv_freq must have shape [{}], got {:?}",
            rot_dim / 2,
            inv_freq.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        Self::u32_in(OP, "positions", positions)?;
        let inv_freq = &self.f32_of(OP, "inv_freq", inv_freq)?;
        let out = self.alloc(&x.shape, DType::F32)?;
        let total = n * h * hd;
        let g = Self::grid(OP, (total as u64).div_ceil(256))?;
        let p = [
            total as u32,
            h as u32,
            hd as u32,
            rot_dim as u32,
            (style == RopeStyle::Interleaved) as u32,
            f32_param(mscale),
            0,
            0,
        ];
        self.dispatch(
            &pipelines::ROPE_K,
            &p,
            &[
                x.single(OP, "x")?,
                positions.single(OP, "positions")?,
                inv_freq.single(OP, "inv_freq")?,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
    }

    fn silu_mul(&self, gate: &WTensor, up: &WTensor) -> Result<WTensor> {
        self.elementwise("silu_mul", &pipelines::SILU_MUL, gate, up)
    }

    fn add(&self, a: &WTensor, b: &WTensor) -> Result<WTensor> {
        self.elementwise("add", &pipelines::ADD, a, b)
    }

    fn write_kv(
        &self,
        k: &WTensor,
        v: &WTensor,
        k_cache: &WTensor,
        v_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<()> {
        const OP: &str = "write_kv";
        let n = meta.host.num_tokens();
        let slots = meta.slot_mapping.single(OP, "slot_mapping")?;
        for (name, src, cache) in [("k", k, k_cache), ("v", v, v_cache)] {
            ensure!(
                src.shape.len() == 3 && src.shape[0] == n,
                "{OP}: {name} must have shape [{n}, Hkv, hd], got {:?}",
                src.shape
            );
            ensure!(
                cache.shape.len() == 4 && cache.shape[2..] == src.shape[1..],
                "{OP}: {name}_cache must have shape [blocks, bs, {}, {}], got {:?}",
                src.shape[1],
                src.shape[2],
                cache.shape
            );
            let src = &self.f32_of(OP, name, src)?;
            Self::float_in(OP, "cache", cache)?;
            let capacity = cache.shape[0] * cache.shape[1];
            if let Some(&bad) = meta
                .host
                .slot_mapping
                .iter()
                .find(|&&s| s as usize >= capacity)
            {
                bail!(
                    "{OP}: slot {bad} outside the cache of {capacity} slots ({:?})",
                    cache.shape
                );
            }
            let row = src.shape[1] * src.shape[2];
            let total = n * row;
            let g = Self::grid(OP, (total as u64).div_ceil(256))?;
            self.dispatch(
                &pipelines::WRITE_KV,
                &[total as u32, row as u32, 0, 0],
                &[src.single(OP, name)?, slots, cache.single(OP, "cache")?],
                g,
            )?;
        }
        Ok(())
    }

    fn paged_attention(
        &self,
        q: &WTensor,
        k_cache: &WTensor,
        v_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
    ) -> Result<WTensor> {
        const OP: &str = "paged_attention";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q.shape.len() == 3 && q.shape[0] == n,
            "{OP}: q must have shape [{n}, H, hd_k], got {:?}",
            q.shape
        );
        ensure!(
            k_cache.shape.len() == 4 && v_cache.shape.len() == 4,
            "{OP}: caches must have shape [blocks, bs, Hkv, hd], got {:?} and {:?}",
            k_cache.shape,
            v_cache.shape
        );
        let (h, hdk) = (q.shape[1], q.shape[2]);
        let (blocks, bs, hkv) = (k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]);
        let hdv = v_cache.shape[3];
        ensure!(
            k_cache.shape[3] == hdk && v_cache.shape[..3] == k_cache.shape[..3],
            "{OP}: k_cache must be [blocks, bs, Hkv, {hdk}] and v_cache [blocks, bs, Hkv, hd_v] with equal \
             leading dims, got {:?} and {:?}",
            k_cache.shape,
            v_cache.shape
        );
        ensure!(
            hkv > 0 && h % hkv == 0,
            "{OP}: H {h} must be a multiple of Hkv {hkv}"
        );
        ensure!(
            bs == hm.block_size,
            "{OP}: cache block size {bs} != meta.block_size {}",
            hm.block_size
        );
        ensure!(
            hdk.is_multiple_of(4) && hdk <= 512 && hdv <= 512,
            "{OP}: head dims must satisfy hd_k % 4 == 0, hd_k <= 512, hd_v <= 512; got {hdk}, {hdv}"
        );
        ensure!(
            hm.token_seq.len() == n,
            "{OP}: token_seq must have {n} entries"
        );
        ensure!(
            hm.block_tables.len() >= hm.num_seqs() * hm.max_blocks,
            "{OP}: block_tables must have [S = {}, max_blocks = {}] entries",
            hm.num_seqs(),
            hm.max_blocks
        );
        for t in 0..n {
            let (s, p) = (hm.token_seq[t] as usize, hm.positions[t] as usize);
            ensure!(
                s < hm.num_seqs(),
                "{OP}: token_seq[{t}] = {s} >= number of sequences {}",
                hm.num_seqs()
            );
            ensure!(
                p / bs < hm.max_blocks,
                "{OP}: position {p} of token {t} needs block {} >= max_blocks {}",
                p / bs,
                hm.max_blocks
            );
            for b in 0..=p / bs {
                let id = hm.block_tables[s * hm.max_blocks + b] as usize;
                ensure!(
                    id < blocks,
                    "{OP}: block id {id} of sequence {s} >= cache blocks {blocks}"
                );
            }
        }
        let q = &self.f32_of(OP, "q", q)?;
        Self::float_in(OP, "k_cache", k_cache)?;
        Self::float_in(OP, "v_cache", v_cache)?;
        let out = self.alloc(&[n, h, hdv], DType::F32)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        ensure!(
            h as u64 <= MAX_GROUPS && n as u64 <= MAX_GROUPS,
            "{OP}: more than 65535 heads or tokens"
        );
        let p = [
            h as u32,
            hkv as u32,
            hdk as u32,
            hdv as u32,
            bs as u32,
            hm.max_blocks as u32,
            (h / hkv) as u32,
            f32_param(scale),
            (n * h) as u32,
            0,
            0,
            0,
        ];
        // CPU adapters: one invocation per (token, head), no barriers; GPUs: a workgroup per
        // (token, head) sharing each key tile.
        let lanes = self.cpu_kernels && hdv.is_multiple_of(4) && hdk <= 256 && hdv <= 256;
        let (spec, g) = if lanes {
            (
                &pipelines::ATTN_LANES,
                Self::grid(OP, ((n * h) as u64).div_ceil(8))?,
            )
        } else {
            (&pipelines::ATTN, [h as u32, n as u32, 1])
        };
        self.dispatch(
            spec,
            &p,
            &[
                q.single(OP, "q")?,
                k_cache.single(OP, "k_cache")?,
                v_cache.single(OP, "v_cache")?,
                meta.positions.single(OP, "positions")?,
                meta.token_seq.single(OP, "token_seq")?,
                meta.block_tables.single(OP, "block_tables")?,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
    }

    fn argmax(&self, x: &WTensor) -> Result<WTensor> {
        const OP: &str = "argmax";
        ensure!(
            x.shape.len() == 2 && x.shape[1] > 0,
            "{OP}: x must have shape [R, V] with V > 0, got {:?}",
            x.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let (r, v) = (x.shape[0], x.shape[1]);
        let out = self.alloc(&[r], DType::U32)?;
        let g = Self::grid(OP, r as u64)?;
        self.dispatch(
            &pipelines::ARGMAX_K,
            &[r as u32, v as u32, 0, 0],
            &[x.single(OP, "x")?, out.single(OP, "output")?],
            g,
        )?;
        Ok(out)
    }
    fn head_linear(&self, x: &WTensor, w: &WTensor) -> Result<WTensor> {
        const OP: &str = "head_linear";
        ensure!(
            x.shape.len() == 3 && w.shape.len() == 3,
            "{OP}: expected x [N, H, K] and w [H, O, K], got {:?} and {:?}",
            x.shape,
            w.shape
        );
        let (n, h, k) = (x.shape[0], x.shape[1], x.shape[2]);
        let o = w.shape[1];
        ensure!(
            w.shape[0] == h && w.shape[2] == k,
            "{OP}: w must have shape [{h}, O, {k}] to match x {:?}, got {:?}",
            x.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let (wb, bf16) = self.weight_in(OP, "w", w)?;
        let out = self.alloc(&[n, h, o], DType::F32)?;
        let total = n * h * o;
        if total == 0 {
            return Ok(out);
        }
        ensure!(total < u32::MAX as usize, "{OP}: output too large");
        // GPUs with long rows: a workgroup per output; else an invocation per output.
        let (spec, g) = if !self.cpu_kernels && k >= 64 {
            (&pipelines::HEAD_LINEAR_WG, Self::grid(OP, total as u64)?)
        } else {
            (
                &pipelines::HEAD_LINEAR_LANES,
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )
        };
        self.dispatch(
            spec,
            &[h as u32, k as u32, o as u32, total as u32, bf16, 0, 0, 0],
            &[x.single(OP, "x")?, wb, out.single(OP, "output")?],
            g,
        )?;
        Ok(out)
    }

    fn write_cache(
        &self,
        x: &WTensor,
        cache: &WTensor,
        col: usize,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<()> {
        const OP: &str = "write_cache";
        let n = meta.host.num_tokens();
        ensure!(
            x.shape.len() == 2 && x.shape[0] == n,
            "{OP}: x must have shape [{n}, w], got {:?}",
            x.shape
        );
        ensure!(
            cache.shape.len() == 3,
            "{OP}: cache must have shape [blocks, bs, W], got {:?}",
            cache.shape
        );
        let (w, width) = (x.shape[1], cache.shape[2]);
        ensure!(
            col + w <= width,
            "{OP}: columns {col}..{} exceed the cache width {width}",
            col + w
        );
        ensure!(
            meta.host.slot_mapping.len() == n,
            "{OP}: slot_mapping must have {n} entries"
        );
        let x = &self.f32_of(OP, "x", x)?;
        Self::float_in(OP, "cache", cache)?;
        let capacity = cache.shape[0] * cache.shape[1];
        if let Some(&bad) = meta
            .host
            .slot_mapping
            .iter()
            .find(|&&s| s as usize >= capacity)
        {
            bail!(
                "{OP}: slot {bad} outside the cache of {capacity} slots ({:?})",
                cache.shape
            );
        }
        let total = n * w;
        if total == 0 {
            return Ok(());
        }
        let g = Self::grid(OP, (total as u64).div_ceil(256))?;
        self.dispatch(
            &pipelines::WRITE_CACHE_K,
            &[total as u32, w as u32, width as u32, col as u32],
            &[
                x.single(OP, "x")?,
                meta.slot_mapping.single(OP, "slot_mapping")?,
                cache.single(OP, "cache")?,
            ],
            g,
        )
    }

    fn paged_latent_attention(
        &self,
        q_lat: &WTensor,
        q_rope: &WTensor,
        cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
    ) -> Result<WTensor> {
        const OP: &str = "paged_latent_attention";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q_lat.shape.len() == 3 && q_lat.shape[0] == n,
            "{OP}: q_lat must have shape [{n}, H, L], got {:?}",
            q_lat.shape
        );
        let (h, l) = (q_lat.shape[1], q_lat.shape[2]);
        ensure!(
            q_rope.shape.len() == 3 && q_rope.shape[..2] == [n, h],
            "{OP}: q_rope must have shape [{n}, {h}, R], got {:?}",
            q_rope.shape
        );
        let r = q_rope.shape[2];
        ensure!(
            cache.shape.len() == 3 && cache.shape[2] == l + r,
            "{OP}: cache must have shape [blocks, bs, {l} + {r}], got {:?}",
            cache.shape
        );
        let (blocks, bs) = (cache.shape[0], cache.shape[1]);
        ensure!(
            l > 0 && l <= 512 && l + r <= 1024,
            "{OP}: needs 0 < L <= 512 and L + R <= 1024, got L {l}, R {r}"
        );
        Self::check_paged_meta(OP, hm, blocks, bs)?;
        let q_lat = &self.f32_of(OP, "q_lat", q_lat)?;
        let q_rope = &self.f32_of(OP, "q_rope", q_rope)?;
        Self::float_in(OP, "cache", cache)?;
        let out = self.alloc(&[n, h, l], DType::F32)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        ensure!(
            h as u64 <= MAX_GROUPS && n as u64 <= MAX_GROUPS,
            "{OP}: more than 65535 heads or tokens"
        );
        let p = [
            h as u32,
            l as u32,
            r as u32,
            bs as u32,
            hm.max_blocks as u32,
            f32_param(scale),
            (n * h) as u32,
            0,
        ];
        // CPU adapters: one invocation per (token, head), vec4 loads, no barriers; GPUs (and
        // widths the lanes kernel cannot hold): a workgroup per (token, head) sharing key tiles.
        let lanes =
            self.cpu_kernels && l.is_multiple_of(4) && r.is_multiple_of(4) && l <= 256 && r <= 64;
        let (spec, g) = if lanes {
            (
                &pipelines::MLA_ATTN_LANES,
                Self::grid(OP, ((n * h) as u64).div_ceil(8))?,
            )
        } else {
            (&pipelines::MLA_ATTN, [h as u32, n as u32, 1])
        };
        // The lanes kernel binds q_rope as vec4s: with R == 0 bind q_lat in its place (unread).
        let qr = if r == 0 {
            q_lat.single(OP, "q_lat")?
        } else {
            q_rope.single(OP, "q_rope")?
        };
        self.dispatch(
            spec,
            &p,
            &[
                q_lat.single(OP, "q_lat")?,
                qr,
                cache.single(OP, "cache")?,
                meta.positions.single(OP, "positions")?,
                meta.token_seq.single(OP, "token_seq")?,
                meta.block_tables.single(OP, "block_tables")?,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
    }

    fn moe_route(
        &self,
        x: &WTensor,
        gate_w: &WTensor,
        bias: Option<&WTensor>,
        routing: &MoeRouting,
    ) -> Result<(WTensor, WTensor)> {
        const OP: &str = "moe_route";
        ensure!(
            x.shape.len() == 2 && gate_w.shape.len() == 2 && gate_w.shape[1] == x.shape[1],
            "{OP}: expected x [N, D] and gate_w [E, D], got {:?} and {:?}",
            x.shape,
            gate_w.shape
        );
        let (n, e) = (x.shape[0], gate_w.shape[0]);
        let k = routing.top_k;
        let g = routing.n_group.max(1);
        ensure!(k >= 1 && k <= e, "{OP}: top_k {k} must be in 1..={e}");
        ensure!(
            e.is_multiple_of(g) && routing.topk_group >= 1 && routing.topk_group <= g && g <= 32,
            "{OP}: {e} experts in {g} groups (at most 32), topk_group {} must be in 1..={g}",
            routing.topk_group
        );
        let bias = match bias {
            Some(b) => {
                ensure!(
                    b.shape == [e],
                    "{OP}: bias must have shape [{e}], got {:?}",
                    b.shape
                );
                Some(self.f32_of(OP, "bias", b)?)
            }
            None => None,
        };
        // Router logits x · gate_wᵀ [N, E] in f32, then one invocation per token.
        let logits = self
            .linear(x, gate_w, None)
            .context("moe_route: router logits")?;
        let ids = self.alloc(&[n, k], DType::U32)?;
        let weights = self.alloc(&[n, k], DType::F32)?;
        if n == 0 {
            return Ok((ids, weights));
        }
        let bb = match &bias {
            Some(b) => b.single(OP, "bias")?,
            None => &self.dummy,
        };
        let p = [
            n as u32,
            e as u32,
            k as u32,
            g as u32,
            (e / g) as u32,
            routing.topk_group as u32,
            routing.norm_topk_prob as u32,
            bias.is_some() as u32,
            f32_param(routing.routed_scaling_factor),
            0,
            0,
            0,
        ];
        self.dispatch(
            &pipelines::MOE_ROUTE_K,
            &p,
            &[
                logits.single(OP, "logits")?,
                bb,
                ids.single(OP, "ids")?,
                weights.single(OP, "weights")?,
            ],
            Self::grid(OP, (n as u64).div_ceil(64))?,
        )?;
        Ok((ids, weights))
    }

    fn moe_experts(
        &self,
        x: &WTensor,
        ids: &WTensor,
        weights: &WTensor,
        gate_up: &WTensor,
        down: &WTensor,
    ) -> Result<WTensor> {
        const OP: &str = "moe_experts";
        ensure!(
            x.shape.len() == 2 && gate_up.shape.len() == 3 && down.shape.len() == 3,
            "{OP}: expected x [N, D], gate_up [E, 2F, D], down [E, D, F], got {:?}, {:?}, {:?}",
            x.shape,
            gate_up.shape,
            down.shape
        );
        let (n, d) = (x.shape[0], x.shape[1]);
        let (e, f2) = (gate_up.shape[0], gate_up.shape[1]);
        let f = f2 / 2;
        ensure!(
            gate_up.shape[2] == d && f2 % 2 == 0 && f > 0,
            "{OP}: gate_up must have shape [E, 2F, {d}], got {:?}",
            gate_up.shape
        );
        ensure!(
            down.shape == [e, d, f],
            "{OP}: down must have shape [{e}, {d}, {f}], got {:?}",
            down.shape
        );
        ensure!(
            ids.shape.len() == 2 && ids.shape[0] == n && weights.shape == ids.shape,
            "{OP}: ids and weights must have shape [{n}, k], got {:?} and {:?}",
            ids.shape,
            weights.shape
        );
        let k = ids.shape[1];
        Self::u32_in(OP, "ids", ids)?;
        let x = &self.f32_of(OP, "x", x)?;
        let weights = &self.f32_of(OP, "weights", weights)?;
        let (gub, gbf) = self.weight_in(OP, "gate_up", gate_up)?;
        let (dnb, dbf) = self.weight_in(OP, "down", down)?;
        let out = self.alloc(&[n, d], DType::F32)?;
        if n * d == 0 {
            return Ok(out);
        }
        ensure!(
            (n * k * f) < u32::MAX as usize && (e * f2 * d) < u32::MAX as usize,
            "{OP}: sizes exceed 32-bit indexing"
        );
        let hmid = self.alloc(&[n, k.max(1), f], DType::F32)?;
        let hb = hmid.single(OP, "scratch")?;
        let ib = ids.single(OP, "ids")?;
        let wg = !self.cpu_kernels;
        // silu(g) ⊙ u for every (token, slot) into the scratch [N, k, F].
        let total = n * k * f;
        let (spec, g) = if wg {
            (&pipelines::MOE_ACT_WG, Self::grid(OP, total as u64)?)
        } else {
            (
                &pipelines::MOE_ACT_LANES,
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )
        };
        let p = [
            d as u32,
            f as u32,
            k as u32,
            e as u32,
            total as u32,
            gbf,
            0,
            0,
        ];
        self.dispatch(spec, &p, &[x.single(OP, "x")?, ib, gub, hb], g)?;
        // The weighted down-projection sum per (token, output).
        let total = n * d;
        let (spec, g) = if wg {
            (&pipelines::MOE_DOWN_WG, Self::grid(OP, total as u64)?)
        } else {
            (
                &pipelines::MOE_DOWN_LANES,
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )
        };
        let p = [
            d as u32,
            f as u32,
            k as u32,
            e as u32,
            total as u32,
            dbf,
            0,
            0,
        ];
        self.dispatch(
            spec,
            &p,
            &[
                hb,
                ib,
                weights.single(OP, "weights")?,
                dnb,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
    }

    fn short_conv(
        &self,
        x: &WTensor,
        w: &WTensor,
        state: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<WTensor> {
        const OP: &str = "short_conv";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            x.shape.len() == 2 && x.shape[0] == n,
            "{OP}: x must have shape [{n}, C], got {:?}",
            x.shape
        );
        let c = x.shape[1];
        ensure!(
            w.shape.len() == 2 && w.shape[0] == c && w.shape[1] >= 2,
            "{OP}: w must have shape [{c}, W] with W >= 2, got {:?}",
            w.shape
        );
        let width = w.shape[1];
        ensure!(
            state.shape.len() == 3 && state.shape[1..] == [c, width - 1],
            "{OP}: state must have shape [slots, {c}, {}], got {:?}",
            width - 1,
            state.shape
        );
        Self::float_in(OP, "state", state)?;
        ensure!(
            hm.token_seq.len() == n,
            "{OP}: token_seq must have {n} entries"
        );
        let seqs = Self::state_seqs(OP, hm, state.shape[0])?;
        let x = &self.f32_of(OP, "x", x)?;
        let w = &self.f32_of(OP, "w", w)?;
        let out = self.alloc(&[n, c], DType::F32)?;
        if seqs.is_empty() || c == 0 {
            return Ok(out);
        }
        ensure!(
            (n.max(seqs.len()) * c) < u32::MAX as usize && state.numel() < u32::MAX as usize,
            "{OP}: sizes exceed 32-bit indexing"
        );
        let tab = self.upload_u32(seqs.as_flattened())?;
        let p = [n as u32, c as u32, width as u32, seqs.len() as u32];
        let bufs = [
            x.single(OP, "x")?,
            w.single(OP, "w")?,
            state.single(OP, "state")?,
            tab.single(OP, "table")?,
            meta.token_seq.single(OP, "token_seq")?,
            out.single(OP, "output")?,
        ];
        // Outputs first (they read the old history), then the history update.
        self.dispatch(
            &pipelines::SHORT_CONV_K,
            &p,
            &bufs,
            Self::grid(OP, ((n * c) as u64).div_ceil(64))?,
        )?;
        self.dispatch(
            &pipelines::SHORT_CONV_STATE,
            &p,
            &bufs,
            Self::grid(OP, ((seqs.len() * c) as u64).div_ceil(64))?,
        )?;
        Ok(out)
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
        const OP: &str = "kda";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q.shape.len() == 3 && q.shape[0] == n,
            "{OP}: q must have shape [{n}, H, K], got {:?}",
            q.shape
        );
        let (h, kd) = (q.shape[1], q.shape[2]);
        ensure!(
            k.shape == q.shape && a.shape == q.shape,
            "{OP}: k and a must have shape [{n}, {h}, {kd}] like q, got {:?} and {:?}",
            k.shape,
            a.shape
        );
        ensure!(
            v.shape.len() == 3 && v.shape[..2] == [n, h] && b.shape == [n, h],
            "{OP}: v must have shape [{n}, {h}, V] and b [{n}, {h}], got {:?} and {:?}",
            v.shape,
            b.shape
        );
        let vd = v.shape[2];
        ensure!(
            a_log.numel() == h && dt_bias.numel() == h * kd,
            "{OP}: a_log must have {h} values and dt_bias [{h}, {kd}], got {:?} and {:?}",
            a_log.shape,
            dt_bias.shape
        );
        ensure!(
            state.shape.len() == 4 && state.shape[1..] == [h, kd, vd],
            "{OP}: state must have shape [slots, {h}, {kd}, {vd}], got {:?}",
            state.shape
        );
        ensure!(
            (1..=128).contains(&kd) && vd >= 1,
            "{OP}: the WGSL kernels need 1 <= K <= 128 and V >= 1, got K {kd}, V {vd}"
        );
        Self::float_in(OP, "state", state)?;
        let seqs = Self::state_seqs(OP, hm, state.shape[0])?;
        ensure!(
            (n * h * kd.max(vd)) < u32::MAX as usize && state.numel() < u32::MAX as usize,
            "{OP}: sizes exceed 32-bit indexing"
        );
        let f = |name: &str, t: &WTensor| self.f32_of(OP, name, t);
        let (q, k, v, a, b) = (f("q", q)?, f("k", k)?, f("v", v)?, f("a", a)?, f("b", b)?);
        let (a_log, dt_bias) = (f("a_log", a_log)?, f("dt_bias", dt_bias)?);
        let out = self.alloc(&[n, h, vd], DType::F32)?;
        if seqs.is_empty() || h == 0 {
            return Ok(out);
        }
        // Normalised q (· K^-½), k and the log decay g, per (token, head).
        let qn = self.alloc(&[n, h, kd], DType::F32)?;
        let kn = self.alloc(&[n, h, kd], DType::F32)?;
        let g = self.alloc(&[n, h, kd], DType::F32)?;
        if n > 0 {
            let p = [
                (n * h) as u32,
                h as u32,
                kd as u32,
                lower_bound.is_some() as u32,
                f32_param(lower_bound.unwrap_or(0.0)),
                f32_param(1.0 / (kd as f32).sqrt()),
                0,
                0,
            ];
            self.dispatch(
                &pipelines::KDA_PREP_K,
                &p,
                &[
                    q.single(OP, "q")?,
                    k.single(OP, "k")?,
                    a.single(OP, "a")?,
                    a_log.single(OP, "a_log")?,
                    dt_bias.single(OP, "dt_bias")?,
                    qn.single(OP, "q (normalised)")?,
                    kn.single(OP, "k (normalised)")?,
                    g.single(OP, "g")?,
                ],
                Self::grid(OP, ((n * h) as u64).div_ceil(64))?,
            )?;
        }
        let (chunked, recurrent): (Vec<[u32; 4]>, Vec<[u32; 4]>) = seqs
            .into_iter()
            .partition(|s| s[2] as usize >= self.kda_chunk_min);
        let sb = state.single(OP, "state")?;
        let ob = out.single(OP, "output")?;
        if !recurrent.is_empty() {
            let tab = self.upload_u32(recurrent.as_flattened())?;
            let total = recurrent.len() * h * vd;
            self.dispatch(
                &pipelines::KDA_RECURRENT_K,
                &[total as u32, h as u32, kd as u32, vd as u32],
                &[
                    qn.single(OP, "q (normalised)")?,
                    kn.single(OP, "k (normalised)")?,
                    g.single(OP, "g")?,
                    v.single(OP, "v")?,
                    b.single(OP, "b")?,
                    sb,
                    tab.single(OP, "table")?,
                    ob,
                ],
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )?;
        }
        if !chunked.is_empty() {
            self.kda_chunked(&chunked, [h, kd, vd], [&qn, &kn, &g, &v, &b], sb, ob)?;
        }
        Ok(out)
    }

    fn gated_rms_norm(
        &self,
        x: &WTensor,
        gate: &WTensor,
        w: &WTensor,
        eps: f32,
    ) -> Result<WTensor> {
        const OP: &str = "gated_rms_norm";
        ensure!(
            x.shape.len() == 2,
            "{OP}: x must have shape [R, D], got {:?}",
            x.shape
        );
        let (r, d) = (x.shape[0], x.shape[1]);
        ensure!(
            gate.shape == x.shape && w.shape == [d],
            "{OP}: gate must have shape [{r}, {d}] and w [{d}], got {:?} and {:?}",
            gate.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let gate = &self.f32_of(OP, "gate", gate)?;
        let w = &self.f32_of(OP, "w", w)?;
        let out = self.alloc(&[r, d], DType::F32)?;
        if r * d == 0 {
            return Ok(out);
        }
        self.dispatch(
            &pipelines::GATED_RMS_NORM,
            &[r as u32, d as u32, f32_param(eps), 0],
            &[
                x.single(OP, "x")?,
                gate.single(OP, "gate")?,
                w.single(OP, "w")?,
                out.single(OP, "output")?,
            ],
            Self::grid(OP, r as u64)?,
        )?;
        Ok(out)
    }

    fn layer_norm(&self, x: &WTensor, w: &WTensor, b: &WTensor, eps: f32) -> Result<WTensor> {
        const OP: &str = "layer_norm";
        ensure!(
            x.shape.len() == 2,
            "{OP}: x must have shape [R, D], got {:?}",
            x.shape
        );
        let (r, d) = (x.shape[0], x.shape[1]);
        ensure!(
            w.shape == [d] && b.shape == [d],
            "{OP}: w and b must have shape [{d}], got {:?} and {:?}",
            w.shape,
            b.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let w = &self.f32_of(OP, "w", w)?;
        let b = &self.f32_of(OP, "b", b)?;
        let out = self.alloc(&[r, d], DType::F32)?;
        if r * d == 0 {
            return Ok(out);
        }
        self.dispatch(
            &pipelines::LAYER_NORM_K,
            &[r as u32, d as u32, f32_param(eps), 0],
            &[
                x.single(OP, "x")?,
                w.single(OP, "w")?,
                b.single(OP, "b")?,
                out.single(OP, "output")?,
            ],
            Self::grid(OP, r as u64)?,
        )?;
        Ok(out)
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
        const OP: &str = "dsa_topk";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q.shape.len() == 3 && q.shape[0] == n,
            "{OP}: q must have shape [{n}, H, d], got {:?}",
            q.shape
        );
        let (h, d) = (q.shape[1], q.shape[2]);
        ensure!(
            w.shape == [n, h],
            "{OP}: w must have shape [{n}, {h}], got {:?}",
            w.shape
        );
        ensure!(
            k_cache.shape.len() == 3 && k_cache.shape[2] == d,
            "{OP}: k_cache must have shape [blocks, bs, {d}], got {:?}",
            k_cache.shape
        );
        ensure!(
            (1..=DSA_MAX_TOPK).contains(&topk),
            "{OP}: topk must be in 1..={DSA_MAX_TOPK}, got {topk}"
        );
        let (blocks, bs) = (k_cache.shape[0], k_cache.shape[1]);
        Self::check_paged_meta(OP, hm, blocks, bs)?;
        let q = &self.f32_of(OP, "q", q)?;
        let w = &self.f32_of(OP, "w", w)?;
        let k_cache = &self.f32_of(OP, "k_cache", k_cache)?;
        let out = self.alloc(&[n, topk], DType::U32)?;
        if n == 0 {
            return Ok(out);
        }
        // Scores of a group of tokens `[group, stride]` f32 at a time (bounded scratch).
        let stride = hm
            .positions
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap_or(1);
        let budget = self.max_chunk.min(DSA_SCORE_BYTES) as usize;
        let group = (budget / (stride * 4)).clamp(1, n).min(MAX_GROUPS as usize);
        let tiles = stride.div_ceil(64);
        ensure!(
            tiles as u64 <= MAX_GROUPS,
            "{OP}: {stride} keys exceed the score grid"
        );
        let scores = self.alloc(&[group, stride], DType::F32)?;
        let hscale = 1.0 / (h as f32).sqrt();
        let mut tok0 = 0;
        while tok0 < n {
            let g = group.min(n - tok0);
            let p = [
                h as u32,
                d as u32,
                bs as u32,
                hm.max_blocks as u32,
                f32_param(scale),
                f32_param(hscale),
                topk as u32,
                stride as u32,
                tok0 as u32,
                0,
                0,
                0,
            ];
            self.dispatch(
                &pipelines::DSA_SCORE,
                &p,
                &[
                    q.single(OP, "q")?,
                    w.single(OP, "w")?,
                    k_cache.single(OP, "k_cache")?,
                    meta.positions.single(OP, "positions")?,
                    meta.token_seq.single(OP, "token_seq")?,
                    meta.block_tables.single(OP, "block_tables")?,
                    scores.single(OP, "scores")?,
                ],
                [tiles as u32, g as u32, 1],
            )?;
            self.dispatch(
                &pipelines::DSA_SELECT_K,
                &p,
                &[
                    scores.single(OP, "scores")?,
                    meta.positions.single(OP, "positions")?,
                    out.single(OP, "output")?,
                ],
                [g as u32, 1, 1],
            )?;
            tok0 += g;
        }
        Ok(out)
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
        const OP: &str = "sparse_latent_attention";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q_lat.shape.len() == 3 && q_lat.shape[0] == n,
            "{OP}: q_lat must have shape [{n}, H, L], got {:?}",
            q_lat.shape
        );
        let (h, l) = (q_lat.shape[1], q_lat.shape[2]);
        ensure!(
            q_rope.shape.len() == 3 && q_rope.shape[..2] == [n, h],
            "{OP}: q_rope must have shape [{n}, {h}, R], got {:?}",
            q_rope.shape
        );
        let r = q_rope.shape[2];
        ensure!(
            cache.shape.len() == 3 && cache.shape[2] == l + r,
            "{OP}: cache must have shape [blocks, bs, {l} + {r}], got {:?}",
            cache.shape
        );
        ensure!(
            selected.shape.len() == 2 && selected.shape[0] == n,
            "{OP}: selected must have shape [{n}, topk], got {:?}",
            selected.shape
        );
        Self::u32_in(OP, "selected", selected)?;
        let topk = selected.shape[1];
        let (blocks, bs) = (cache.shape[0], cache.shape[1]);
        ensure!(
            l > 0 && l <= 512 && l + r <= 1024,
            "{OP}: needs 0 < L <= 512 and L + R <= 1024, got L {l}, R {r}"
        );
        Self::check_paged_meta(OP, hm, blocks, bs)?;
        let q_lat = &self.f32_of(OP, "q_lat", q_lat)?;
        let q_rope = &self.f32_of(OP, "q_rope", q_rope)?;
        Self::float_in(OP, "cache", cache)?;
        let out = self.alloc(&[n, h, l], DType::F32)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        ensure!(
            h as u64 <= MAX_GROUPS && n as u64 <= MAX_GROUPS,
            "{OP}: more than 65535 heads or tokens"
        );
        let p = [
            h as u32,
            l as u32,
            r as u32,
            bs as u32,
            hm.max_blocks as u32,
            f32_param(scale),
            (n * h) as u32,
            topk as u32,
        ];
        // With R == 0 bind q_lat in q_rope's place (unread).
        let qr = if r == 0 {
            q_lat.single(OP, "q_lat")?
        } else {
            q_rope.single(OP, "q_rope")?
        };
        self.dispatch(
            &pipelines::SPARSE_MLA_ATTN,
            &p,
            &[
                q_lat.single(OP, "q_lat")?,
                qr,
                cache.single(OP, "cache")?,
                meta.positions.single(OP, "positions")?,
                meta.token_seq.single(OP, "token_seq")?,
                meta.block_tables.single(OP, "block_tables")?,
                selected.single(OP, "selected")?,
                out.single(OP, "output")?,
            ],
            [h as u32, n as u32, 1],
        )?;
        Ok(out)
    }
}
