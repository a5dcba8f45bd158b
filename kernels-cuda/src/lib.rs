//! dayone's datacenter backend: [`dayone_backend::Backend`] on CUDA through cudarc.
//!
//! - Kernels: one `.cu` file per family under `kernels/`, compiled with NVRTC at first use for
//!   the device's architecture and cached on disk ([`nvrtc_cache`]).
//! - `linear` (`linear`): a streaming GEMV kernel for decode-sized M (≤ 8), else cuBLAS `GemmEx`
//!   (bf16/f16 in and out with f32 compute, or f32), bias fused or added by a small kernel.
//! - `paged_attention` (`attention`, with `write_kv`): split-K flash-decoding kernel when every
//!   sequence has one query token; tensor-core (mma.sync) tiled causal kernel for prefill/mixed
//!   steps in bf16/f16; an f32 FMA tiled kernel otherwise.
//! - Element-wise, norm, rotary, embedding and argmax ops live in `basic`; this file keeps the
//!   backend struct, shared plumbing (modules, launches, allocation) and the `Backend` impl.
//! - Memory: a caching allocator (freed buffers are reused by size class); all work is queued
//!   on one stream without host synchronisation, except `download` and `synchronize`; small
//!   uploads (token ids, step metadata) go through pinned memory so they stay asynchronous.
//! - On sm_90+ kernels are launched with programmatic dependent launch.
//! - DeepSeek-V3 ops (`mla_moe`): `head_linear` (cuBLAS strided-batched), `write_cache`,
//!   `paged_latent_attention` (tensor-core split-K kernel sharing each latent row across 64
//!   head rows), `moe_route`, `moe_experts` (device-side sort by expert, one grouped GEMM/GEMV
//!   launch per projection, deterministic combine).
//! - Kimi-Linear KDA ops (`kda`): `short_conv`, `gated_rms_norm`, and `kda` with a
//!   token-recurrent kernel (decode) and a chunked (64) two-kernel form for prefill.
//! - DeepSeek-V3.2 DSA ops (`dsa`): `layer_norm`, `dsa_topk` (blocked indexer scoring on tensor
//!   cores + radix-select top-k), and `sparse_latent_attention` (the MLA kernel over a
//!   selection list).
//! - Collectives between devices ([`NcclComm`], `comm`): `dayone_backend::comm::Comm` through
//!   NCCL on the backend's stream.
//!
//! See `NOTES.md` in this crate for the dispatch rules and measured figures.
//! - Libraries are loaded dynamically: [`CudaBackend::new`] returns a one-line error (never a
//!   panic) when the driver, NVRTC or cuBLAS is missing, or when there is no device.

mod device;
mod launch;
pub mod nvrtc_cache;

pub use device::{size_class, CudaTensor, LibraryPresence};
pub use launch::{
    decode_gb, decode_tpk, gemv_mt, gemv_rpw, gemv_tc_plan, mla_dv, mla_smem_bytes, mma_dv,
    mma_rows, mma_smem_bytes, moe_auto_tile, moe_plan, plan_decode, tiled_rows, tiled_smem_bytes,
    DecodeFusion, DecodePlan, MoeKernel, MoePlan, MoeTile, MoeTileShape, ALL_DECODE_FUSIONS,
    DEFAULT_DECODE_FUSIONS,
};

use anyhow::{anyhow, bail, Result};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{result as dr, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use dayone_backend::{
    AttentionOptions, Backend, DType, DeviceStepMeta, DeviceVarlenMeta, ExpertOptions, HostRow,
    HostTensor, MoeRouting, QuantFormat, QuantTensor, RopeArgs, RopeStyle, StepMeta, TensorInfo,
    VarlenResult,
};
use device::{drv, Pool, Staging};
use nvrtc_cache::Target;
use std::collections::HashMap;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Kernel parameters for `cuLaunchKernel`: pointers to each argument value. Every argument
/// must already have the exact Rust type of the kernel parameter (`u64` for device pointers,
/// `u32`, `f32`); temporaries live until the end of the enclosing statement.
macro_rules! kparams {
    ($($x:expr),* $(,)?) => {
        &mut [$( (&$x) as *const _ as *mut ::std::ffi::c_void ),*]
    };
}

mod attention;
mod basic;
mod bulk_upload;
pub mod comm;
mod dsa;
mod ext;
mod flash;
mod graph;
mod profile;
pub use flash::FlashVariant;
mod host_rows;
mod invariant;
mod kda;
mod kda_step;
mod linear;
mod mla_moe;
mod moe_decode;
pub mod moe_fp8;
mod moe_quant;
pub use moe_quant::{
    direct_tokens_for as moe_quant_direct_tokens_for, MOE_QUANT_DIRECT_PAIRS_PER_EXPERT,
};
mod quant;
mod rows;

pub use comm::NcclComm;
pub use dsa::DSA_SCORE_BYTES;
pub use kda::{kda_plan, KdaPath, KdaPlan, KDA_CHUNK_MIN_TOKENS};

/// What the backend knows about its device.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability as a number, e.g. 90.
    pub arch: u32,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// Largest dynamic shared memory one block may opt into, bytes.
    pub max_smem_optin: u32,
    /// Device memory, bytes.
    pub total_mem: usize,
    /// What NVRTC compiles to for this device.
    pub target: Target,
    /// NVRTC version `(major, minor)`.
    pub nvrtc_version: (i32, i32),
}

struct Kernels {
    target: Target,
    dir: Option<PathBuf>,
    max_smem_optin: u32,
    modules: Mutex<HashMap<(&'static str, &'static str), Arc<CudaModule>>>,
    funcs: Mutex<HashMap<String, CudaFunction>>,
}

/// The CUDA backend: one device, one stream, NVRTC kernels and cuBLAS.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    pool: Arc<Pool>,
    blas: Mutex<CudaBlas>,
    staging: Mutex<Staging>,
    /// Pinned double buffer of large uploads (weights), allocated at the first one.
    bulk: Mutex<bulk_upload::BulkUpload>,
    /// Pinned staging of `read_rows`/`write_rows` calls with several runs of rows.
    rows_staging: Mutex<rows::RowStaging>,
    kernels: Kernels,
    info: DeviceInfo,
    /// Launch kernels with programmatic dependent launch (sm_90+, unless `DAYONE_CUDA_PDL=0`).
    pdl: bool,
    /// Per-kernel timing (`DAYONE_CUDA_PROFILE=1`), printed when the backend is dropped.
    profiler: Option<Mutex<profile::Profiler>>,
    /// Tensor-core prefill attention (sm_80+, unless `DAYONE_CUDA_MMA_ATTN=0`).
    mma_attention: bool,
    /// KDA path choice ([`KdaPath`] as u8; `DAYONE_KDA_PATH` or [`CudaBackend::set_kda_path`]).
    kda_path: std::sync::atomic::AtomicU8,
    /// Tile rows of the tensor-core MoE kernel ([`MoeTile`] as u8; `DAYONE_MOE_TILE` or
    /// [`CudaBackend::set_moe_tile`]).
    moe_tile: std::sync::atomic::AtomicU8,
    /// Tensor-core skinny product for 5–16 rows of x (`gemv_tc_*`; `DAYONE_CUDA_GEMV_TC=1` or
    /// [`CudaBackend::set_gemv_tc`]; off by default until measured on the H200).
    gemv_tc: std::sync::atomic::AtomicBool,
    /// Score scratch budget of `dsa_topk` in bytes ([`CudaBackend::set_dsa_score_bytes`]).
    dsa_score_bytes: std::sync::atomic::AtomicUsize,
    /// Batch-invariant kernels only (`DAYONE_BATCH_INVARIANT=1` or
    /// [`dayone_backend::Backend::set_batch_invariant`]; see `invariant.rs`).
    batch_invariant: std::sync::atomic::AtomicBool,
    /// Page-locked, device-mapped host memory of the host-memory tier (`host_rows.rs`).
    pinned: Arc<host_rows::PinnedPool>,
    /// Captured CUDA graphs by id (`graph.rs`).
    graphs: Mutex<graph::Graphs>,
    /// See [`CudaBackend::decode_counters`].
    decode_counters: std::sync::OnceLock<CudaTensor>,
    /// The decode fusions on ([`launch::decode_fusions_mask`]; `DAYONE_DECODE_FUSION` or
    /// [`CudaBackend::set_decode_fusions`]).
    decode_fusions: std::sync::atomic::AtomicU16,
}

/// True when the CUDA libraries load and at least one device is visible (for `--backend auto`).
pub fn is_available() -> bool {
    if LibraryPresence::probe().check().is_err() {
        return false;
    }
    dr::init().is_ok() && dr::device::get_count().map(|c| c > 0).unwrap_or(false)
}

/// Visible CUDA devices (0 when the driver is missing).
pub fn device_count() -> usize {
    if LibraryPresence::probe().check().is_err() || dr::init().is_err() {
        return 0;
    }
    dr::device::get_count()
        .map(|c| c.max(0) as usize)
        .unwrap_or(0)
}

fn dtype_suffix(op: &str, dt: DType) -> Result<&'static str> {
    Ok(match dt {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        other => bail!("{op}: expected a float tensor (f32, bf16 or f16), got {other}"),
    })
}

fn check_dtype(op: &str, what: &str, t: &CudaTensor, dt: DType) -> Result<()> {
    if t.dtype != dt {
        bail!(
            "{op}: {what} must be {dt} (like the other inputs), got {} with shape {:?}",
            t.dtype,
            t.shape
        );
    }
    Ok(())
}

fn to_u32(op: &str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| anyhow!("{op}: {what} = {v} exceeds the u32 range of the kernel"))
}

fn to_i32(op: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{op}: {what} = {v} exceeds cuBLAS's i32 range"))
}

impl CudaBackend {
    /// Opens device `ordinal`. Fails with one line when a CUDA library is missing
    /// (e.g. `CUDA backend unavailable: libcuda.so not found (no NVIDIA driver)`), when no device
    /// is present or `ordinal` is out of range. If `DAYONE_NVRTC_DIR` names a directory holding
    /// `libnvrtc.so*` (such as pip's `nvidia/cu13/lib`), that NVRTC is used.
    pub fn new(ordinal: usize) -> Result<Self> {
        if std::env::var_os("DAYONE_NVRTC_DIR").is_some() && !nvrtc_cache::nvrtc_present() {
            let _ = nvrtc_cache::preload_nvrtc(None);
        }
        LibraryPresence::probe().check()?;
        dr::init().map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE {
                anyhow!("CUDA backend unavailable: no CUDA device found")
            } else {
                anyhow!("CUDA backend unavailable: cuInit failed ({e:?})")
            }
        })?;
        let count = dr::device::get_count()
            .map_err(|e| anyhow!("CUDA backend unavailable: cannot count devices ({e:?})"))?;
        if count <= 0 {
            bail!("CUDA backend unavailable: no CUDA device found");
        }
        if ordinal >= count as usize {
            bail!("CUDA device {ordinal} does not exist ({count} device(s) present)");
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("context creation"))?;
        // We track ordering ourselves (one stream); cudarc's per-slice events are not used.
        // SAFETY: no CudaSlice is ever created by this backend.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("stream creation"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("compute capability"))?;
        let arch = nvrtc_cache::arch_number(major, minor);
        let attr = |a| ctx.attribute(a).map_err(drv("device attribute"));
        let sms = attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        let max_smem_optin =
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as u32;
        let supported = nvrtc_cache::nvrtc_supported_archs().unwrap_or_default();
        let target = nvrtc_cache::pick_target(arch, &supported)?;
        let info = DeviceInfo {
            ordinal,
            name: ctx.name().map_err(drv("device name"))?,
            arch,
            sms,
            max_smem_optin,
            total_mem: ctx.total_mem().map_err(drv("device memory size"))?,
            target: target.clone(),
            nvrtc_version: nvrtc_cache::nvrtc_version().unwrap_or((0, 0)),
        };
        let blas =
            CudaBlas::new(stream.clone()).map_err(|e| anyhow!("cuBLAS init failed: {e:?}"))?;
        let pool = Arc::new(Pool::new(ctx.clone(), stream.clone()));
        let staging = Mutex::new(Staging::new(&ctx, 64, 256 * 1024)?);
        let pdl = arch >= 90 && std::env::var("DAYONE_CUDA_PDL").map_or(true, |v| v != "0");
        let mma_attention =
            arch >= 80 && std::env::var("DAYONE_CUDA_MMA_ATTN").map_or(true, |v| v != "0");
        let kda_path = std::sync::atomic::AtomicU8::new(KdaPath::from_env() as u8);
        Ok(CudaBackend {
            kda_path,
            dsa_score_bytes: std::sync::atomic::AtomicUsize::new(dsa::DSA_SCORE_BYTES),
            moe_tile: std::sync::atomic::AtomicU8::new(MoeTile::from_env() as u8),
            gemv_tc: std::sync::atomic::AtomicBool::new(launch::gemv_tc_from_env()),
            batch_invariant: std::sync::atomic::AtomicBool::new(
                dayone_backend::batch_invariant_from_env(),
            ),
            pinned: host_rows::PinnedPool::new(ctx.clone()),
            graphs: Mutex::new(graph::Graphs::default()),
            mma_attention,
            pdl,
            profiler: profile::Profiler::from_env(),
            staging,
            bulk: Mutex::new(bulk_upload::BulkUpload::new()),
            rows_staging: Mutex::new(rows::RowStaging::new()),
            kernels: Kernels {
                target,
                dir: nvrtc_cache::cache_dir(),
                max_smem_optin,
                modules: Mutex::new(HashMap::new()),
                funcs: Mutex::new(HashMap::new()),
            },
            ctx,
            stream,
            pool,
            blas: Mutex::new(blas),
            info,
            decode_counters: std::sync::OnceLock::new(),
            decode_fusions: std::sync::atomic::AtomicU16::new(launch::decode_fusions_from_env()),
        })
    }

    /// Turns on exactly `fusions` (tests, benchmarks; the default comes from
    /// `DAYONE_DECODE_FUSION`, see [`launch::decode_fusions_from_env`]). Each gives the same
    /// bits as the ops it joins, but `MoeBlock` (see [`DecodeFusion`]).
    pub fn set_decode_fusions(&self, fusions: &[DecodeFusion]) {
        self.decode_fusions.store(
            launch::decode_fusions_mask(fusions),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether decode fusion `f` is on.
    fn fusion(&self, f: launch::DecodeFusion) -> bool {
        self.decode_fusions
            .load(std::sync::atomic::Ordering::Relaxed)
            & f.bit()
            != 0
    }

    /// The zeroed u32 counters of the in-kernel merges (the decode attention's splits, the
    /// decode MoE block's pairs, the router's top-k; [`launch::DECODE_COUNTERS`] of them; each
    /// launch leaves them zeroed), allocated at the first call outside a graph capture (every
    /// capture makes that call first); `None` inside a capture before that (the caller then
    /// takes its separate launches).
    fn decode_counters(&self) -> Result<Option<&CudaTensor>> {
        if let Some(c) = self.decode_counters.get() {
            return Ok(Some(c));
        }
        if self.pool.is_capturing() {
            return Ok(None);
        }
        let c = self.zeros(&[launch::DECODE_COUNTERS], DType::U32)?;
        Ok(Some(self.decode_counters.get_or_init(|| c)))
    }

    /// The device this backend runs on.
    pub fn device_info(&self) -> &DeviceInfo {
        &self.info
    }

    /// `(bytes in live tensors, bytes cached by the allocator for reuse)`.
    pub fn memory_usage(&self) -> (usize, usize) {
        self.pool.usage()
    }

    /// Returns every cached buffer to the driver (waits for queued work first).
    pub fn trim_memory(&self) -> Result<()> {
        self.pool.trim()
    }

    /// `linear` through cuBLAS even for decode-sized M (for comparisons with the GEMV kernel).
    pub fn linear_cublas(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.linear_impl(x, w, bias, false)
    }

    /// Kernel modules (one per family and dtype) compiled or loaded so far.
    pub fn loaded_modules(&self) -> usize {
        self.kernels
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// Compiles (or loads from the disk cache) every kernel family for activations of `dtype`
    /// now instead of at first use.
    pub fn precompile(&self, dtype: DType) -> Result<()> {
        let sfx = dtype_suffix("precompile", dtype)?;
        for (family, _) in nvrtc_cache::KERNEL_SOURCES {
            let variant = if matches!(*family, "embedding" | "kv_cache" | "rows") {
                ""
            } else {
                sfx
            };
            self.module(family, variant)?;
        }
        Ok(())
    }

    /// Times `f` with device events: runs it `warmup` times, then `iters` times, and returns the
    /// mean milliseconds per call (work queued by `f` on this backend is what is measured).
    pub fn time_ms(
        &self,
        warmup: usize,
        iters: usize,
        mut f: impl FnMut() -> Result<()>,
    ) -> Result<f32> {
        for _ in 0..warmup {
            f()?;
        }
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let a = self.ctx.new_event(flags).map_err(drv("event creation"))?;
        let b = self.ctx.new_event(flags).map_err(drv("event creation"))?;
        a.record(&self.stream).map_err(drv("event record"))?;
        for _ in 0..iters.max(1) {
            f()?;
        }
        b.record(&self.stream).map_err(drv("event record"))?;
        b.synchronize().map_err(drv("event synchronize"))?;
        Ok(a.elapsed_ms(&b).map_err(drv("event elapsed"))? / iters.max(1) as f32)
    }

    /// A new tensor of `shape` holding a copy of `src`'s elements `offset..offset + numel(shape)`
    /// (device-to-device, asynchronous). Same dtype as `src`.
    pub fn copy_slice(
        &self,
        src: &CudaTensor,
        offset: usize,
        shape: &[usize],
    ) -> Result<CudaTensor> {
        let n: usize = shape.iter().product();
        if offset + n > src.numel() {
            bail!(
                "copy_slice: elements {offset}..{} out of range for {:?}",
                offset + n,
                src.shape
            );
        }
        self.bind()?;
        let out = self.alloc(shape.to_vec(), src.dtype)?;
        if n > 0 {
            let es = src.dtype.size();
            // SAFETY: both ranges lie inside live buffers (checked above).
            unsafe {
                dr::memcpy_dtod_async(
                    out.device_ptr(),
                    src.device_ptr() + (offset * es) as u64,
                    n * es,
                    self.stream.cu_stream(),
                )
            }
            .map_err(drv("device-to-device copy"))?;
        }
        Ok(out)
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("bind context"))
    }

    /// The module of `family` compiled for dtype suffix `variant` (`""`: every dtype).
    fn module(&self, family: &'static str, variant: &'static str) -> Result<Arc<CudaModule>> {
        let key = (family, variant);
        if let Some(m) = self
            .kernels
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
        {
            return Ok(m.clone());
        }
        let src = nvrtc_cache::KERNEL_SOURCES
            .iter()
            .find(|(n, _)| *n == family)
            .map(|(_, s)| *s)
            .ok_or_else(|| anyhow!("unknown kernel family '{family}'"))?;
        let define = nvrtc_cache::dtype_define(variant);
        let defines: Vec<&str> = if variant.is_empty() {
            vec![]
        } else {
            vec![define.as_str()]
        };
        let target = self.kernels.target.for_family(family);
        let bytes = nvrtc_cache::load_or_compile(
            family,
            src,
            &target,
            &defines,
            self.kernels.dir.as_deref(),
        )?;
        let image = match target {
            Target::Cubin(_) | Target::CubinArchSpecific(_) => {
                cudarc::nvrtc::Ptx::from_binary(bytes)
            }
            Target::Ptx(_) => {
                let s = String::from_utf8_lossy(&bytes)
                    .trim_end_matches('\0')
                    .to_string();
                cudarc::nvrtc::Ptx::from_src(s)
            }
        };
        let m = self
            .ctx
            .load_module(image)
            .map_err(|e| anyhow!("loading CUDA kernels '{family}' failed: {e:?}"))?;
        self.kernels
            .modules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, m.clone());
        Ok(m)
    }

    /// Kernel `name` of `family`, compiled for dtype suffix `variant` (`""` for dtype-agnostic
    /// families).
    fn func(
        &self,
        family: &'static str,
        variant: &'static str,
        name: &str,
    ) -> Result<CudaFunction> {
        if let Some(f) = self
            .kernels
            .funcs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(f.clone());
        }
        let m = self.module(family, variant)?;
        let f = m
            .load_function(name)
            .map_err(|e| anyhow!("kernel '{name}' not found in '{family}': {e:?}"))?;
        if name.starts_with("attn_tiled")
            || name.starts_with("attn_mma")
            || name.starts_with("mla_attn_mma")
            || name.starts_with("kda_chunk")
            || name.starts_with("dsa_score_mma")
            || name.starts_with("gemm_inv_mma")
            || name.starts_with("flash_attn")
            || name.starts_with("moe_mma16_")
            || name.starts_with("moe_mma32_")
            || name.starts_with("moe_mma128")
            || name.starts_with("moe_mma64w_")
            || name.starts_with("moe_wg")
        {
            // SAFETY: `f` is a live function of a loaded module.
            unsafe {
                dr::function::set_function_attribute(
                    f.cu_function(),
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    self.kernels.max_smem_optin as i32,
                )
            }
            .map_err(drv("raising the shared-memory limit"))?;
        }
        self.kernels
            .funcs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), f.clone());
        Ok(f)
    }

    fn launch(
        &self,
        op: &str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.profiled(
            || self.kernel_name(f).unwrap_or_else(|| op.to_string()),
            || self.launch_now(op, f, grid, block, smem, params),
        )
    }

    /// Runs `work` (a launch, a cuBLAS call), timed as `name()` when profiling
    /// (`DAYONE_CUDA_PROFILE=1`, outside graph captures).
    fn profiled<T>(
        &self,
        name: impl FnOnce() -> String,
        work: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let Some(profiler) = self.profiler.as_ref().filter(|_| !self.pool.is_capturing()) else {
            return work();
        };
        let start = profile::Profiler::start(&self.ctx, &self.stream)?;
        let out = work()?;
        profiler.lock().unwrap_or_else(|p| p.into_inner()).end(
            &self.ctx,
            &self.stream,
            name(),
            start,
        )?;
        Ok(out)
    }

    /// The name `f` was loaded under (a linear search: profiling only).
    fn kernel_name(&self, f: &CudaFunction) -> Option<String> {
        let funcs = self.kernels.funcs.lock().unwrap_or_else(|p| p.into_inner());
        funcs
            .iter()
            .find(|(_, g)| g.cu_function() == f.cu_function())
            .map(|(name, _)| name.clone())
    }

    fn launch_now(
        &self,
        op: &str,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        smem: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        if self.pdl {
            // Programmatic dependent launch: the launch may overlap the previous kernel's tail;
            // every kernel starts with `griddepcontrol.wait` (see common.cuh).
            // SAFETY: a zeroed attribute value is valid; the field set is the one the id names.
            let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id =
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let cfg = sys::CUlaunchConfig {
                gridDimX: grid.0,
                gridDimY: grid.1,
                gridDimZ: grid.2,
                blockDimX: block.0,
                blockDimY: block.1,
                blockDimZ: block.2,
                sharedMemBytes: smem,
                hStream: self.stream.cu_stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for `launch_kernel` below; `cfg` and `attr` outlive the call.
            return unsafe {
                sys::cuLaunchKernelEx(
                    &cfg,
                    f.cu_function(),
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            }
            .result()
            .map_err(|e| anyhow!("{op}: kernel launch failed: {e:?}"));
        }
        // SAFETY: every caller passes pointers to values of the kernel's parameter types, device
        // pointers of live buffers sized for the launch shape.
        unsafe {
            dr::launch_kernel(
                f.cu_function(),
                grid,
                block,
                smem,
                self.stream.cu_stream(),
                params,
            )
        }
        .map_err(|e| anyhow!("{op}: kernel launch failed: {e:?}"))
    }

    fn alloc(&self, shape: Vec<usize>, dtype: DType) -> Result<CudaTensor> {
        let bytes = shape.iter().product::<usize>() * dtype.size();
        Ok(CudaTensor {
            buf: Arc::new(self.pool.alloc(bytes)?),
            offset: 0,
            shape,
            dtype,
        })
    }

    fn scratch_f32(&self, n: usize) -> Result<CudaTensor> {
        self.alloc(vec![n], DType::F32)
    }
}

/// Splits `t` as `[rows, last]` (every leading dimension flattened into rows).
fn rows_last(op: &str, what: &str, t: &CudaTensor) -> Result<(usize, usize)> {
    match t.shape.split_last() {
        Some((&last, lead)) if !lead.is_empty() => Ok((lead.iter().product(), last)),
        _ => bail!(
            "{op}: {what} must have at least 2 dimensions [rows, cols], got {:?}",
            t.shape
        ),
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;

    fn name(&self) -> String {
        format!(
            "cuda: {} (sm_{}, {} SMs, {:.0} GiB)",
            self.info.name,
            self.info.arch,
            self.info.sms,
            self.info.total_mem as f64 / (1u64 << 30) as f64
        )
    }

    /// `cuMemGetInfo`'s free bytes plus the bytes the caching allocator holds for reuse.
    fn free_memory(&self) -> Option<u64> {
        let (free, _total) = self.ctx.mem_get_info().ok()?;
        let (_live, cached) = self.pool.usage();
        Some(free as u64 + cached as u64)
    }

    fn activation_dtype(&self, requested: DType) -> DType {
        match requested {
            DType::F32 => DType::F32,
            DType::F16 => DType::F16,
            _ => DType::BF16,
        }
    }

    fn upload(&self, host: &HostTensor) -> Result<CudaTensor> {
        self.not_capturing("upload")?;
        let want = host.numel() * host.dtype.size();
        if host.data.len() != want {
            bail!(
                "upload: host tensor of shape {:?} {} needs {want} bytes, has {}",
                host.shape,
                host.dtype,
                host.data.len()
            );
        }
        self.bind()?;
        let t = self.alloc(host.shape.clone(), host.dtype)?;
        if want > 0 {
            let mut st = self.staging.lock().unwrap_or_else(|p| p.into_inner());
            if want <= st.slot_bytes() {
                // Small tensors (token ids, metadata): through pinned memory, fully async.
                st.upload(
                    &self.ctx,
                    &self.stream,
                    t.device_ptr(),
                    &[(0, &host.data)],
                    want,
                )?;
            } else {
                drop(st);
                let mut bulk = self.bulk.lock().unwrap_or_else(|p| p.into_inner());
                bulk.upload(&self.ctx, &self.stream, t.device_ptr(), &host.data)?;
            }
        }
        Ok(t)
    }

    fn upload_weight(&self, host: &HostTensor) -> Result<CudaTensor> {
        let mut t = self.upload(host)?;
        if let Some(buf) = Arc::get_mut(&mut t.buf) {
            buf.weight = true;
        }
        Ok(t)
    }

    fn download(&self, t: &CudaTensor) -> Result<HostTensor> {
        self.not_capturing("download")?;
        self.bind()?;
        let mut data = vec![0u8; t.num_bytes()];
        if !data.is_empty() {
            // SAFETY: `data` holds exactly the tensor's bytes and outlives the synchronize below.
            unsafe { dr::memcpy_dtoh_async(&mut data, t.device_ptr(), self.stream.cu_stream()) }
                .map_err(drv("device-to-host copy"))?;
        }
        self.stream
            .synchronize()
            .map_err(drv("stream synchronize"))?;
        HostTensor::new(t.shape.clone(), t.dtype, data)
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<CudaTensor> {
        self.bind()?;
        let t = self.alloc(shape.to_vec(), dtype)?;
        if t.num_bytes() > 0 {
            // SAFETY: the buffer holds `num_bytes` bytes.
            unsafe {
                dr::memset_d8_async(t.device_ptr(), 0, t.num_bytes(), self.stream.cu_stream())
            }
            .map_err(drv("memset"))?;
        }
        Ok(t)
    }

    fn reshape(&self, t: &CudaTensor, shape: &[usize]) -> Result<CudaTensor> {
        let n: usize = shape.iter().product();
        if n != t.numel() {
            bail!(
                "reshape: cannot view {:?} ({} elements) as {shape:?} ({n} elements)",
                t.shape,
                t.numel()
            );
        }
        Ok(CudaTensor {
            buf: t.buf.clone(),
            offset: t.offset,
            shape: shape.to_vec(),
            dtype: t.dtype,
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.not_capturing("synchronize")?;
        self.bind()?;
        self.stream.synchronize().map_err(drv("stream synchronize"))
    }

    fn embedding(&self, table: &CudaTensor, ids: &CudaTensor) -> Result<CudaTensor> {
        self.embedding_impl(table, ids)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.linear_impl(x, w, bias, true)
    }

    fn linear_each(&self, parts: &[(&CudaTensor, &CudaTensor)]) -> Result<Vec<CudaTensor>> {
        self.linear_each_impl(parts)
    }

    fn linear_many(
        &self,
        x: &CudaTensor,
        parts: &[(&CudaTensor, Option<&CudaTensor>)],
    ) -> Result<Vec<CudaTensor>> {
        self.linear_many_impl(x, parts)
    }

    fn to_f32(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.to_f32_impl(x)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        self.rms_norm_impl(x, w, eps)
    }

    fn add_rms_norm(
        &self,
        a: &CudaTensor,
        r: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.add_rms_norm_impl(a, r, w, eps)
    }

    fn rope(
        &self,
        x: &CudaTensor,
        positions: &CudaTensor,
        inv_freq: &CudaTensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<CudaTensor> {
        self.rope_impl(x, positions, inv_freq, rot_dim, style, mscale)
    }

    fn rope_pair(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        positions: &CudaTensor,
        inv_freq: &CudaTensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        let (q, k) = self.rope_pair_impl(
            q,
            Some(k),
            positions,
            inv_freq,
            rot_dim,
            style,
            mscale,
            None,
        )?;
        Ok((q, k.expect("k given")))
    }

    fn rope_write_kv(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        rope: RopeArgs<'_, CudaTensor>,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<CudaTensor> {
        if !self.fusion(launch::DecodeFusion::RopeKv) {
            return dayone_backend::rope_then_write_kv(self, q, k, v, rope, k_cache, v_cache, meta);
        }
        let cache = basic::KvWrite {
            v,
            k_cache,
            v_cache,
            meta,
        };
        let (q, _) = self.rope_pair_impl(
            q,
            Some(k),
            &meta.positions,
            rope.inv_freq,
            rope.rot_dim,
            rope.style,
            rope.mscale,
            Some(cache),
        )?;
        Ok(q)
    }

    fn stream_mix(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        self.stream_mix_impl(x, w)
    }

    fn silu_mul_limit(&self, gate: &CudaTensor, up: &CudaTensor, limit: f32) -> Result<CudaTensor> {
        self.binary_with("silu_mul_limit", gate, up, Some(limit))
    }

    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.binary("silu_mul", gate, up)
    }

    fn linear_silu_mul(
        &self,
        x: &CudaTensor,
        w_gate: &CudaTensor,
        w_up: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.linear_silu_mul_impl(x, w_gate, w_up)
    }

    fn rms_norm_linear_many(
        &self,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        norm_w: &CudaTensor,
        eps: f32,
        parts: &[(&CudaTensor, Option<&CudaTensor>)],
    ) -> Result<dayone_backend::NormedProjections<CudaTensor>> {
        self.rms_norm_linear_many_impl(a, r, norm_w, eps, parts)
    }

    fn rms_norm_linear_silu_mul(
        &self,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        norm_w: &CudaTensor,
        eps: f32,
        w_gate: &CudaTensor,
        w_up: &CudaTensor,
    ) -> Result<(Option<CudaTensor>, CudaTensor)> {
        self.rms_norm_linear_silu_mul_impl(a, r, norm_w, eps, w_gate, w_up)
    }

    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        self.binary("add", a, b)
    }

    fn gelu(&self, x: &CudaTensor, approximate: bool) -> Result<CudaTensor> {
        // `x` passed as both operands of the binary kernel; the second is unread.
        self.binary(if approximate { "gelu_tanh" } else { "gelu" }, x, x)
    }

    fn write_kv(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<()> {
        self.write_kv_impl(k, v, k_cache, v_cache, meta)
    }

    fn paged_attention(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
    ) -> Result<CudaTensor> {
        self.attention(q, k_cache, v_cache, meta, scale)
    }

    fn attention_varlen(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        meta: &DeviceVarlenMeta<CudaTensor>,
        scale: f32,
        prior: Option<(&CudaTensor, &CudaTensor)>,
        final_out: bool,
    ) -> Result<VarlenResult<CudaTensor>> {
        self.attention_varlen_with(q, k, v, meta, scale, prior, final_out, None)
    }

    fn attention_varlen_native(&self, dtype: DType, dk: usize, dv: usize) -> bool {
        self.varlen_native(dtype, dk, dv)
    }

    fn head_linear(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        self.head_linear_impl(x, w)
    }

    fn write_cache(
        &self,
        x: &CudaTensor,
        cache: &CudaTensor,
        col: usize,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<()> {
        self.write_cache_impl(x, cache, col, meta)
    }

    fn paged_latent_attention(
        &self,
        q_lat: &CudaTensor,
        q_rope: &CudaTensor,
        cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
    ) -> Result<CudaTensor> {
        self.latent_attention_impl(q_lat, q_rope, cache, meta, scale, None)
    }

    fn moe_route(
        &self,
        x: &CudaTensor,
        gate_w: &CudaTensor,
        bias: Option<&CudaTensor>,
        routing: &MoeRouting,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.moe_route_impl(x, gate_w, bias, routing)
    }

    fn gated_rms_norm_linear(
        &self,
        x: &CudaTensor,
        gate: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
        head_dim: usize,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.gated_rms_norm_linear_impl(x, gate, norm_w, eps, head_dim, w, bias)
    }

    fn prefers_linear_add_rms_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        h: &CudaTensor,
        norm_w: &CudaTensor,
    ) -> bool {
        self.add_norm_fits(x, w, bias, h, norm_w).is_some()
    }

    fn linear_add_rms_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        h: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.linear_add_rms_norm_impl(x, w, bias, h, norm_w, eps)
    }

    fn rms_norm_moe_route(
        &self,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        norm_w: &CudaTensor,
        eps: f32,
        gate_w: &CudaTensor,
        bias: Option<&CudaTensor>,
        routing: &MoeRouting,
    ) -> Result<dayone_backend::NormedRoute<CudaTensor>> {
        self.rms_norm_moe_route_impl(a, r, norm_w, eps, gate_w, bias, routing)
    }

    fn paged_attention_ext(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
        opts: &AttentionOptions<CudaTensor>,
    ) -> Result<CudaTensor> {
        self.attention_ext(q, k_cache, v_cache, meta, scale, opts)
    }

    fn moe_experts_ext(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &CudaTensor,
        down: &CudaTensor,
        opts: &ExpertOptions<CudaTensor>,
    ) -> Result<CudaTensor> {
        self.moe_experts_ext_impl(x, ids, weights, gate_up, down, opts)
    }

    fn linear_f32(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        self.linear_f32_impl(x, w)
    }

    fn dequantize_into(
        &self,
        q: &QuantTensor<CudaTensor>,
        items: &CudaTensor,
        out: &CudaTensor,
    ) -> Result<()> {
        self.dequantize_into_impl(q, items, out)
    }

    fn linear_quant(
        &self,
        x: &CudaTensor,
        q: &QuantTensor<CudaTensor>,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.linear_quant_impl(x, q, bias)
    }

    fn moe_experts_quant(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &QuantTensor<CudaTensor>,
        down: &QuantTensor<CudaTensor>,
        opts: &ExpertOptions<CudaTensor>,
    ) -> Result<CudaTensor> {
        self.moe_experts_quant_impl(x, ids, weights, gate_up, down, opts)
    }

    fn moe_quant_direct_tokens(&self, format: QuantFormat, experts: usize, top_k: usize) -> usize {
        self.moe_quant_direct_tokens_impl(format, experts, top_k)
    }

    fn moe_fp8_available(&self, format: QuantFormat) -> bool {
        self.moe_fp8_available_impl(format)
    }

    fn moe_experts_fp8(
        &self,
        x: &CudaTensor,
        slot_ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &QuantTensor<CudaTensor>,
        down: &QuantTensor<CudaTensor>,
        chosen: &CudaTensor,
        opts: &ExpertOptions<CudaTensor>,
        workspace: (&CudaTensor, &CudaTensor),
    ) -> Result<Option<CudaTensor>> {
        self.moe_experts_fp8_impl(x, slot_ids, weights, gate_up, down, chosen, opts, workspace)
    }

    fn moe_experts_shared(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &CudaTensor,
        down: &CudaTensor,
        shared: [&CudaTensor; 3],
    ) -> Result<CudaTensor> {
        self.moe_experts_shared_impl(x, ids, weights, gate_up, down, shared)
    }

    fn moe_experts(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &CudaTensor,
        down: &CudaTensor,
    ) -> Result<CudaTensor> {
        let opts = ExpertOptions {
            act: dayone_backend::ExpertAct::Swiglu,
            gate_up_bias: None,
            down_bias: None,
            fp8: false,
        };
        self.moe_experts_impl(x, ids, weights, gate_up, down, &opts)
    }

    fn short_conv(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        state: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<CudaTensor> {
        self.short_conv_impl(x, w, state, meta)
    }

    fn short_conv_many(
        &self,
        xs: &[&CudaTensor],
        ws: &[&CudaTensor],
        states: &[&CudaTensor],
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<Vec<CudaTensor>> {
        self.short_conv_many_impl(xs, ws, states, meta)
    }

    fn kda(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        a: &CudaTensor,
        b: &CudaTensor,
        a_log: &CudaTensor,
        dt_bias: &CudaTensor,
        lower_bound: Option<f32>,
        state: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<CudaTensor> {
        self.kda_impl(q, k, v, a, b, a_log, dt_bias, lower_bound, state, meta)
    }

    fn kda_from_projections(
        &self,
        p: &dayone_backend::KdaProjections<'_, CudaTensor>,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.kda_from_projections_impl(p, meta)
    }

    fn gated_rms_norm(
        &self,
        x: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        self.gated_rms_norm_impl(x, gate, w, eps)
    }

    fn layer_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        b: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        self.layer_norm_impl(x, w, b, eps)
    }

    fn dsa_topk(
        &self,
        q: &CudaTensor,
        w: &CudaTensor,
        k_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
        topk: usize,
    ) -> Result<CudaTensor> {
        self.dsa_topk_impl(q, w, k_cache, meta, scale, topk)
    }

    fn sparse_latent_attention(
        &self,
        q_lat: &CudaTensor,
        q_rope: &CudaTensor,
        cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
        selected: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.latent_attention_impl(q_lat, q_rope, cache, meta, scale, Some(selected))
    }

    /// All eight fields in one pinned host→device copy (when they fit a staging slot); each
    /// field is a view into the shared buffer, 16-byte aligned.
    fn upload_meta(&self, meta: StepMeta) -> Result<DeviceStepMeta<CudaTensor>> {
        self.not_capturing("upload_meta")?;
        let fields: [&[u32]; 8] = [
            &meta.positions,
            &meta.token_seq,
            &meta.slot_mapping,
            &meta.block_tables,
            &meta.seq_lens,
            &meta.query_start,
            &meta.logit_rows,
            &meta.state_slots,
        ];
        // Empty fields keep one (zero) element, like the trait's default.
        let lens: Vec<usize> = fields.iter().map(|f| f.len().max(1)).collect();
        let mut offs = Vec::with_capacity(fields.len());
        let mut total = 0usize;
        for &l in &lens {
            offs.push(total);
            total += (l * 4).div_ceil(16) * 16;
        }
        let fits = total
            <= self
                .staging
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .slot_bytes();
        if !fits {
            let u = |v: &[u32]| {
                let v: Vec<u32> = if v.is_empty() { vec![0] } else { v.to_vec() };
                self.upload(&HostTensor::from_u32(vec![v.len()], &v)?)
            };
            return Ok(DeviceStepMeta {
                positions: u(&meta.positions)?,
                token_seq: u(&meta.token_seq)?,
                slot_mapping: u(&meta.slot_mapping)?,
                block_tables: u(&meta.block_tables)?,
                seq_lens: u(&meta.seq_lens)?,
                query_start: u(&meta.query_start)?,
                logit_rows: u(&meta.logit_rows)?,
                state_slots: u(&meta.state_slots)?,
                host: meta,
            });
        }
        self.bind()?;
        let whole = self.alloc(vec![total / 4], DType::U32)?;
        const ZERO: [u8; 4] = [0; 4];
        let parts: Vec<(usize, &[u8])> = fields
            .iter()
            .zip(&offs)
            .map(|(f, &o)| {
                let b: &[u8] = if f.is_empty() {
                    &ZERO
                } else {
                    bytemuck::cast_slice(f)
                };
                (o, b)
            })
            .collect();
        self.staging
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .upload(&self.ctx, &self.stream, whole.device_ptr(), &parts, total)?;
        let view = |i: usize| CudaTensor {
            buf: whole.buf.clone(),
            offset: offs[i],
            shape: vec![lens[i]],
            dtype: DType::U32,
        };
        Ok(DeviceStepMeta {
            positions: view(0),
            token_seq: view(1),
            slot_mapping: view(2),
            block_tables: view(3),
            seq_lens: view(4),
            query_start: view(5),
            logit_rows: view(6),
            state_slots: view(7),
            host: meta,
        })
    }

    fn argmax(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.argmax_impl(x)
    }

    fn memory_reserved(&self) -> Option<u64> {
        let (live, cached) = self.memory_usage();
        Some((live + cached) as u64)
    }

    fn token_logprob_rows(&self, x: &CudaTensor, targets: &CudaTensor) -> Result<CudaTensor> {
        self.token_logprob_rows_impl(x, targets)
    }

    /// One `cuMemcpyDtoDAsync` per run, through a scratch buffer when rows are both read and
    /// written (`rows.rs`).
    fn copy_rows(&self, t: &CudaTensor, pairs: &[(u32, u32)]) -> Result<()> {
        self.copy_rows_impl(t, pairs)
    }

    fn read_rows(&self, t: &CudaTensor, rows: &[u32]) -> Result<HostTensor> {
        self.not_capturing("read_rows")?;
        self.read_rows_impl(t, rows)
    }

    fn write_rows(&self, t: &CudaTensor, rows: &[u32], src: &HostTensor) -> Result<()> {
        self.not_capturing("write_rows")?;
        self.write_rows_impl(t, rows, src)
    }

    fn capture_graph(
        &self,
        f: &mut dyn FnMut() -> Result<CudaTensor>,
    ) -> Result<Option<(u64, CudaTensor)>> {
        self.capture_graph_impl(f).map(Some)
    }

    fn replay_graph(&self, id: u64) -> Result<()> {
        self.replay_graph_impl(id)
    }

    fn drop_graph(&self, id: u64) {
        self.drop_graph_impl(id)
    }

    /// Into page-locked, device-mapped chunks, written by one kernel (`host_rows.rs`).
    fn rows_to_host(&self, t: &CudaTensor, rows: &[u32]) -> Result<Vec<HostRow>> {
        self.rows_to_host_impl(t, rows)
    }

    /// From such chunks, read by one kernel; rows in ordinary memory go through `write_rows`.
    fn rows_from_host(&self, t: &CudaTensor, rows: &[u32], src: &[&HostRow]) -> Result<()> {
        self.rows_from_host_impl(t, rows, src)
    }

    /// `invariant.rs`: fixed-order GEMMs, prefill attention kernels for decode, no key splits,
    /// tiled MoE experts and token-recurrent KDA.
    fn set_batch_invariant(&self, on: bool) -> Result<()> {
        self.set_invariant(on);
        Ok(())
    }

    fn batch_invariant(&self) -> bool {
        self.invariant()
    }

    /// Every kernel family for `dtype`, and for f32 (routing logits, scores and other f32 paths
    /// of 16-bit models): NVRTC, or the disk cache when it holds them.
    fn prepare_kernels(&self, dtype: DType) -> Result<()> {
        self.precompile(dtype)?;
        if dtype != DType::F32 {
            self.precompile(DType::F32)?;
        }
        Ok(())
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
        if let Some(p) = self.profiler.as_ref() {
            eprint!("{}", p.lock().unwrap_or_else(|p| p.into_inner()).report());
        }
    }
}

/// Re-exported so callers can report where kernels are cached.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    nvrtc_cache::cache_dir()
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn f<T: Send + Sync>() {}
    f::<CudaBackend>();
    f::<CudaTensor>();
}
