//! dayone's datacenter backend: [`dayone_backend::Backend`] on CUDA through cudarc.
//!
//! - Kernels: one `.cu` file per family under `kernels/`, compiled with NVRTC at first use for
//!   the device's architecture and cached on disk ([`nvrtc_cache`]).
//! - `linear`: a streaming GEMV kernel for decode-sized M (≤ 8), else cuBLAS `GemmEx`
//!   (bf16/f16 in and out with f32 compute, or f32), bias fused or added by a small kernel.
//! - `paged_attention`: split-K flash-decoding kernel when every sequence has one query token;
//!   tensor-core (mma.sync) tiled causal kernel for prefill/mixed steps in bf16/f16; an f32 FMA
//!   tiled kernel otherwise.
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
//!
//! See `NOTES.md` in this crate for the dispatch rules and measured figures.
//! - Libraries are loaded dynamically: [`CudaBackend::new`] returns a one-line error (never a
//!   panic) when the driver, NVRTC or cuBLAS is missing, or when there is no device.

mod device;
mod launch;
pub mod nvrtc_cache;

pub use device::{size_class, CudaTensor, LibraryPresence};
pub use launch::{
    decode_gb, decode_tpk, gemv_mt, gemv_rpw, mla_dv, mla_smem_bytes, mma_dv, mma_rows,
    mma_smem_bytes, moe_plan, plan_decode, tiled_rows, tiled_smem_bytes, DecodePlan, MoeKernel,
    MoePlan,
};

use anyhow::{anyhow, bail, Result};
use cudarc::cublas::{self, CudaBlas};
use cudarc::driver::{result as dr, sys, CudaContext, CudaFunction, CudaModule, CudaStream};
use dayone_backend::{
    Backend, DType, DeviceStepMeta, HostTensor, MoeRouting, RopeStyle, StepMeta, TensorInfo,
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

mod kda;
mod mla_moe;

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
    kernels: Kernels,
    info: DeviceInfo,
    /// Launch kernels with programmatic dependent launch (sm_90+, unless `DAYONE_CUDA_PDL=0`).
    pdl: bool,
    /// Tensor-core prefill attention (sm_80+, unless `DAYONE_CUDA_MMA_ATTN=0`).
    mma_attention: bool,
    /// KDA path choice ([`KdaPath`] as u8; `DAYONE_KDA_PATH` or [`CudaBackend::set_kda_path`]).
    kda_path: std::sync::atomic::AtomicU8,
}

/// True when the CUDA libraries load and at least one device is visible (for `--backend auto`).
pub fn is_available() -> bool {
    if LibraryPresence::probe().check().is_err() {
        return false;
    }
    dr::init().is_ok() && dr::device::get_count().map(|c| c > 0).unwrap_or(false)
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
            mma_attention,
            pdl,
            staging,
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
        })
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

    /// Compiles (or loads from the disk cache) every kernel family for activations of `dtype`
    /// now instead of at first use.
    pub fn precompile(&self, dtype: DType) -> Result<()> {
        let sfx = dtype_suffix("precompile", dtype)?;
        for (family, _) in nvrtc_cache::KERNEL_SOURCES {
            let variant = if matches!(*family, "embedding" | "kv_cache") {
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
        let bytes = nvrtc_cache::load_or_compile(
            family,
            src,
            &self.kernels.target,
            &defines,
            self.kernels.dir.as_deref(),
        )?;
        let image = match self.kernels.target {
            Target::Cubin(_) => cudarc::nvrtc::Ptx::from_binary(bytes),
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

    fn activation_dtype(&self, requested: DType) -> DType {
        match requested {
            DType::F32 => DType::F32,
            DType::F16 => DType::F16,
            _ => DType::BF16,
        }
    }

    fn upload(&self, host: &HostTensor) -> Result<CudaTensor> {
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
                // SAFETY: the buffer holds `want` bytes; pageable source memory is staged by
                // the driver before the call returns.
                unsafe {
                    dr::memcpy_htod_async(t.device_ptr(), &host.data, self.stream.cu_stream())
                }
                .map_err(drv("host-to-device copy"))?;
            }
        }
        Ok(t)
    }

    fn download(&self, t: &CudaTensor) -> Result<HostTensor> {
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
        self.bind()?;
        self.stream.synchronize().map_err(drv("stream synchronize"))
    }

    fn embedding(&self, table: &CudaTensor, ids: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "embedding";
        if table.shape.len() != 2 || !table.dtype.is_float() {
            bail!(
                "{OP}: table must be a float [V, D] tensor, got {:?} {}",
                table.shape,
                table.dtype
            );
        }
        if ids.shape.len() != 1 || ids.dtype != DType::U32 {
            bail!(
                "{OP}: ids must be a u32 [N] tensor, got {:?} {}",
                ids.shape,
                ids.dtype
            );
        }
        let (v, d, n) = (table.shape[0], table.shape[1], ids.shape[0]);
        self.bind()?;
        let out = self.alloc(vec![n, d], table.dtype)?;
        if n == 0 || d == 0 {
            return Ok(out);
        }
        let f = self.func("embedding", "", "embedding_rows")?;
        let row_bytes = (d * table.dtype.size()) as u64;
        self.launch(
            OP,
            &f,
            (launch::row_grid(n, 65535), 1, 1),
            (256, 1, 1),
            0,
            kparams![
                table.device_ptr(),
                ids.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "N", n)?,
                to_u32(OP, "V", v)?,
                row_bytes
            ],
        )?;
        Ok(out)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.linear_impl(x, w, bias, true)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        const OP: &str = "rms_norm";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (r, d) = rows_last(OP, "x [R, D]", x)?;
        if w.shape != [d] {
            bail!(
                "{OP}: w must be [D] = [{d}] (x is {:?}), got {:?}",
                x.shape,
                w.shape
            );
        }
        check_dtype(OP, "w", w, x.dtype)?;
        self.bind()?;
        let out = self.alloc(x.shape.clone(), x.dtype)?;
        if r == 0 || d == 0 {
            return Ok(out);
        }
        let f = self.func("norm", sfx, &format!("rms_norm_{sfx}"))?;
        let threads = if d >= 2048 { 512 } else { 256 };
        self.launch(
            OP,
            &f,
            (launch::row_grid(r, 65535), 1, 1),
            (threads, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                w.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "R", r)?,
                to_u32(OP, "D", d)?,
                eps
            ],
        )?;
        Ok(out)
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
        const OP: &str = "rope";
        let sfx = dtype_suffix(OP, x.dtype)?;
        if x.shape.len() != 3 {
            bail!("{OP}: x must be [N, H, hd], got {:?}", x.shape);
        }
        let (n, h, hd) = (x.shape[0], x.shape[1], x.shape[2]);
        if positions.shape != [n] || positions.dtype != DType::U32 {
            bail!(
                "{OP}: positions must be u32 [N] = [{n}], got {:?} {}",
                positions.shape,
                positions.dtype
            );
        }
        if rot_dim > hd || !rot_dim.is_multiple_of(2) {
            bail!("{OP}: rot_dim must be even and at most hd = {hd}, got {rot_dim}");
        }
        if inv_freq.shape != [rot_dim / 2] || inv_freq.dtype != DType::F32 {
            bail!(
                "{OP}: inv_freq must be f32 [rot_dim/2] = [{}], got {:?} {}",
                rot_dim / 2,
                inv_freq.shape,
                inv_freq.dtype
            );
        }
        self.bind()?;
        let out = self.alloc(x.shape.clone(), x.dtype)?;
        if x.numel() == 0 {
            return Ok(out);
        }
        let f = self.func("rope", sfx, &format!("rope_{sfx}"))?;
        let style: u32 = match style {
            RopeStyle::HalfSplit => 0,
            RopeStyle::Interleaved => 1,
        };
        self.launch(
            OP,
            &f,
            (launch::row_grid(n, 65535), 1, 1),
            (256, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                positions.device_ptr(),
                inv_freq.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "N", n)?,
                to_u32(OP, "H", h)?,
                to_u32(OP, "hd", hd)?,
                rot_dim as u32,
                style,
                mscale
            ],
        )?;
        Ok(out)
    }

    fn silu_mul(&self, gate: &CudaTensor, up: &CudaTensor) -> Result<CudaTensor> {
        self.binary("silu_mul", gate, up)
    }

    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        self.binary("add", a, b)
    }

    fn write_kv(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<()> {
        const OP: &str = "write_kv";
        dtype_suffix(OP, k.dtype)?;
        if k.shape.len() != 3 || v.shape.len() != 3 || k.shape[..2] != v.shape[..2] {
            bail!(
                "{OP}: k must be [N, Hkv, hd_k] and v [N, Hkv, hd_v], got {:?} and {:?}",
                k.shape,
                v.shape
            );
        }
        let (n, hkv, hdk, hdv) = (k.shape[0], k.shape[1], k.shape[2], v.shape[2]);
        let bs = meta.host.block_size;
        if k_cache.shape.len() != 4 || k_cache.shape[1..] != [bs, hkv, hdk] {
            bail!(
                "{OP}: k_cache must be [blocks, {bs}, {hkv}, {hdk}] (block size, Hkv, hd_k), got {:?}",
                k_cache.shape
            );
        }
        if v_cache.shape.len() != 4
            || v_cache.shape[1..] != [bs, hkv, hdv]
            || v_cache.shape[0] != k_cache.shape[0]
        {
            bail!(
                "{OP}: v_cache must be [{}, {bs}, {hkv}, {hdv}], got {:?}",
                k_cache.shape[0],
                v_cache.shape
            );
        }
        for (what, t) in [("v", v), ("k_cache", k_cache), ("v_cache", v_cache)] {
            check_dtype(OP, what, t, k.dtype)?;
        }
        if meta.host.slot_mapping.len() != n || meta.slot_mapping.numel() < n {
            bail!(
                "{OP}: slot_mapping must have N = {n} entries, has {}",
                meta.host.slot_mapping.len()
            );
        }
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.func("kv_cache", "", "write_kv")?;
        let num_slots = to_u32(OP, "blocks·block_size", k_cache.shape[0] * bs)?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(n, 65535), 1, 1),
            (128, 1, 1),
            0,
            kparams![
                k.device_ptr(),
                v.device_ptr(),
                k_cache.device_ptr(),
                v_cache.device_ptr(),
                meta.slot_mapping.device_ptr(),
                n as u32,
                num_slots,
                (hkv * hdk * k.dtype.size()) as u64,
                (hkv * hdv * k.dtype.size()) as u64
            ],
        )
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
        self.latent_attention_impl(q_lat, q_rope, cache, meta, scale)
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

    fn moe_experts(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &CudaTensor,
        down: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.moe_experts_impl(x, ids, weights, gate_up, down)
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

    fn gated_rms_norm(
        &self,
        x: &CudaTensor,
        gate: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        self.gated_rms_norm_impl(x, gate, w, eps)
    }

    /// All eight fields in one pinned host→device copy (when they fit a staging slot); each
    /// field is a view into the shared buffer, 16-byte aligned.
    fn upload_meta(&self, meta: StepMeta) -> Result<DeviceStepMeta<CudaTensor>> {
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
        const OP: &str = "argmax";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (r, v) = match x.shape.split_last() {
            Some((&v, lead)) => (lead.iter().product::<usize>(), v),
            None => bail!("{OP}: x must be [R, V], got a scalar"),
        };
        self.bind()?;
        let out = self.alloc(x.shape[..x.shape.len() - 1].to_vec(), DType::U32)?;
        if r == 0 {
            return Ok(out);
        }
        if v == 0 {
            bail!("{OP}: rows of x are empty (shape {:?})", x.shape);
        }
        let f = self.func("argmax", sfx, &format!("argmax_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(r, 65535), 1, 1),
            (1024, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                out.device_ptr(),
                r as u32,
                to_u32(OP, "V", v)?
            ],
        )?;
        Ok(out)
    }
}

impl CudaBackend {
    fn linear_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        allow_gemv: bool,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (m, k) = rows_last(OP, "x [M, K]", x)?;
        if w.shape.len() != 2 || w.shape[1] != k {
            bail!(
                "{OP}: w must be [N, K] with K = {k} (x is {:?}), got {:?}",
                x.shape,
                w.shape
            );
        }
        check_dtype(OP, "w", w, x.dtype)?;
        let n = w.shape[0];
        if let Some(b) = bias {
            if b.shape != [n] {
                bail!("{OP}: bias must be [N] = [{n}], got {:?}", b.shape);
            }
            check_dtype(OP, "bias", b, x.dtype)?;
        }
        self.bind()?;
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("rank >= 2") = n;
        let out = self.alloc(shape, x.dtype)?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        if let Some(mt) = launch::gemv_mt(m, k).filter(|_| allow_gemv) {
            // Decode-sized M: the streaming GEMV kernel (bias fused).
            let rpw = launch::gemv_rpw(n, self.info.sms);
            let f = self.func("gemv", sfx, &format!("gemv_{sfx}_m{mt}_r{rpw}"))?;
            let grid = to_u32(OP, "N / rows per block", n.div_ceil(rpw as usize))?;
            self.launch(
                OP,
                &f,
                (grid, 1, 1),
                (launch::GEMV_THREADS, 1, 1),
                0,
                kparams![
                    x.device_ptr(),
                    w.device_ptr(),
                    bias.map_or(0u64, |b| b.device_ptr()),
                    out.device_ptr(),
                    m as u32,
                    to_u32(OP, "N", n)?,
                    to_u32(OP, "K", k)?
                ],
            )?;
            return Ok(out);
        }
        if k == 0 {
            // Empty reduction: y = bias (or 0).
            // SAFETY: the buffer holds `num_bytes` bytes.
            unsafe {
                dr::memset_d8_async(
                    out.device_ptr(),
                    0,
                    out.num_bytes(),
                    self.stream.cu_stream(),
                )
            }
            .map_err(drv("memset"))?;
        } else {
            use cublas::sys::{
                cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType,
            };
            let dt = match x.dtype {
                DType::F32 => cudaDataType::CUDA_R_32F,
                DType::BF16 => cudaDataType::CUDA_R_16BF,
                _ => cudaDataType::CUDA_R_16F,
            };
            let (mi, ni, ki) = (
                to_i32(OP, "M", m)?,
                to_i32(OP, "N", n)?,
                to_i32(OP, "K", k)?,
            );
            let alpha = 1.0f32;
            let beta = 0.0f32;
            let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
            // Row-major y[M,N] = x[M,K]·w[N,K]ᵀ is column-major yᵀ[N,M] = wᵀ·xᵀ where the
            // row-major buffers of w and x read column-major are [K,N] and [K,M]: op(A) = Aᵀ.
            // SAFETY: device pointers of live buffers with the sizes checked above.
            unsafe {
                cublas::result::gemm_ex(
                    *blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    mi,
                    ki,
                    (&alpha) as *const f32 as *const c_void,
                    w.device_ptr() as *const c_void,
                    dt,
                    ki,
                    x.device_ptr() as *const c_void,
                    dt,
                    ki,
                    (&beta) as *const f32 as *const c_void,
                    out.device_ptr() as *mut c_void,
                    dt,
                    ni,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| anyhow!("{OP}: cuBLAS GemmEx [{m}x{k}]·[{n}x{k}]ᵀ failed: {e:?}"))?;
        }
        if let Some(b) = bias {
            let f = self.func("elementwise", sfx, &format!("bias_add_{sfx}"))?;
            self.launch(
                OP,
                &f,
                (
                    launch::elementwise_grid(m * n, 1, 256, 8 * self.info.sms),
                    1,
                    1,
                ),
                (256, 1, 1),
                0,
                kparams![
                    out.device_ptr(),
                    b.device_ptr(),
                    to_u32(OP, "M", m)?,
                    to_u32(OP, "N", n)?
                ],
            )?;
        }
        Ok(out)
    }

    fn binary(&self, op: &'static str, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        let sfx = dtype_suffix(op, a.dtype)?;
        if a.shape != b.shape {
            bail!(
                "{op}: inputs must have equal shapes, got {:?} and {:?}",
                a.shape,
                b.shape
            );
        }
        check_dtype(op, "second input", b, a.dtype)?;
        self.bind()?;
        let out = self.alloc(a.shape.clone(), a.dtype)?;
        let n = a.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.func("elementwise", sfx, &format!("{op}_{sfx}"))?;
        self.launch(
            op,
            &f,
            (
                launch::elementwise_grid(n, 8, 256, 16 * self.info.sms),
                1,
                1,
            ),
            (256, 1, 1),
            0,
            kparams![a.device_ptr(), b.device_ptr(), out.device_ptr(), n as u64],
        )?;
        Ok(out)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "paged_attention";
        let sfx = dtype_suffix(OP, q.dtype)?;
        if q.shape.len() != 3 {
            bail!("{OP}: q must be [N, H, hd_k], got {:?}", q.shape);
        }
        let (n, h, hdk) = (q.shape[0], q.shape[1], q.shape[2]);
        let hm = &meta.host;
        let bs = hm.block_size;
        if k_cache.shape.len() != 4 || k_cache.shape[1] != bs || k_cache.shape[3] != hdk {
            bail!(
                "{OP}: k_cache must be [blocks, {bs}, Hkv, {hdk}] (block size, hd_k of q), got {:?}",
                k_cache.shape
            );
        }
        let (nblocks, hkv) = (k_cache.shape[0], k_cache.shape[2]);
        if v_cache.shape.len() != 4 || v_cache.shape[..3] != k_cache.shape[..3] {
            bail!(
                "{OP}: v_cache must be [{nblocks}, {bs}, {hkv}, hd_v], got {:?}",
                v_cache.shape
            );
        }
        let hdv = v_cache.shape[3];
        check_dtype(OP, "k_cache", k_cache, q.dtype)?;
        check_dtype(OP, "v_cache", v_cache, q.dtype)?;
        if hkv == 0 || h % hkv != 0 {
            bail!("{OP}: query heads H = {h} must be a multiple of KV heads Hkv = {hkv}");
        }
        let s = hm.num_seqs();
        if hm.positions.len() != n || hm.token_seq.len() != n {
            bail!(
                "{OP}: meta has {} positions and {} token_seq entries, q has N = {n} tokens",
                hm.positions.len(),
                hm.token_seq.len()
            );
        }
        if hm.query_start.len() != s + 1 || hm.block_tables.len() != s * hm.max_blocks {
            bail!(
                "{OP}: meta needs query_start [S+1] = [{}] and block_tables [S, max_blocks] = [{s}, {}], got {} and {}",
                s + 1,
                hm.max_blocks,
                hm.query_start.len(),
                hm.block_tables.len()
            );
        }
        if hm.token_seq.iter().any(|&x| x as usize >= s) {
            bail!("{OP}: token_seq refers to a sequence index >= S = {s}");
        }
        self.bind()?;
        let out = self.alloc(vec![n, h, hdv], q.dtype)?;
        if n == 0 || h == 0 || hdv == 0 {
            return Ok(out);
        }
        let g = h / hkv;
        let max_q = hm
            .query_start
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as usize)
            .max()
            .unwrap_or(0);
        let kv_cap = hm.max_blocks * bs;
        let max_kv = (hm.positions.iter().copied().max().unwrap_or(0) as usize + 1).min(kv_cap);
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        let (hu, hkvu, hdku, hdvu) = (
            to_u32(OP, "H", h)?,
            to_u32(OP, "Hkv", hkv)?,
            to_u32(OP, "hd_k", hdk)?,
            to_u32(OP, "hd_v", hdv)?,
        );
        let (bsu, mbu, nbu) = (
            to_u32(OP, "block_size", bs)?,
            to_u32(OP, "max_blocks", hm.max_blocks)?,
            to_u32(OP, "blocks", nblocks)?,
        );
        if kv_cap == 0 || nblocks == 0 {
            // No cache: every softmax is empty, the output is zero.
            // SAFETY: the buffer holds `num_bytes` bytes.
            unsafe {
                dr::memset_d8_async(
                    out.device_ptr(),
                    0,
                    out.num_bytes(),
                    self.stream.cu_stream(),
                )
            }
            .map_err(drv("memset"))?;
            return Ok(out);
        }
        let tpk = launch::decode_tpk(hdk, hdv);
        if let Some(tpk) = tpk.filter(|_| max_q <= 1 && n <= 65535) {
            let gb = launch::decode_gb(g);
            let gchunks = g.div_ceil(gb as usize);
            let step = (launch::ATTN_THREADS / tpk) * launch::DECODE_UNROLL;
            let plan = launch::plan_decode(
                n * hkv * gchunks,
                max_kv,
                4 * self.info.sms as usize,
                step,
                (2 * step).max(64),
            );
            let f = self.func(
                "attention_paged",
                sfx,
                &format!("attn_decode_{sfx}_t{tpk}_g{gb}"),
            )?;
            let (part_o, part_ml) = if plan.nsplit > 1 {
                let rows = n * h * plan.nsplit as usize;
                (
                    Some(self.scratch_f32(rows * hdv)?),
                    Some(self.scratch_f32(rows * 2)?),
                )
            } else {
                (None, None)
            };
            let po = part_o.as_ref().map_or(0, |t| t.device_ptr());
            let pml = part_ml.as_ref().map_or(0, |t| t.device_ptr());
            self.launch(
                OP,
                &f,
                (plan.nsplit, to_u32(OP, "grid.y", hkv * gchunks)?, n as u32),
                (launch::ATTN_THREADS, 1, 1),
                0,
                kparams![
                    q.device_ptr(),
                    k_cache.device_ptr(),
                    v_cache.device_ptr(),
                    meta.token_seq.device_ptr(),
                    meta.positions.device_ptr(),
                    meta.block_tables.device_ptr(),
                    out.device_ptr(),
                    po,
                    pml,
                    hu,
                    hkvu,
                    hdku,
                    hdvu,
                    bsu,
                    mbu,
                    nbu,
                    plan.chunk,
                    plan.nsplit,
                    scale_log2
                ],
            )?;
            if plan.nsplit > 1 {
                let f = self.func("attention_paged", sfx, &format!("attn_combine_{sfx}"))?;
                self.launch(
                    OP,
                    &f,
                    (to_u32(OP, "N·H", n * h)?, 1, 1),
                    (hdvu.clamp(32, 256).div_ceil(32) * 32, 1, 1),
                    0,
                    kparams![po, pml, out.device_ptr(), hdvu, plan.nsplit],
                )?;
            }
            return Ok(out);
        }
        if s > 65535 {
            bail!("{OP}: at most 65535 sequences per step, got {s}");
        }
        // Tensor-core kernel: prefill, chunked prefill and mixed steps in bf16/f16.
        let mma_smem = launch::mma_smem_bytes(hdk, hdv);
        if let Some(dv) = launch::mma_dv(hdk, hdv).filter(|_| {
            q.dtype != DType::F32
                && self.mma_attention
                && mma_smem <= self.info.max_smem_optin as usize
        }) {
            let (hc, tq) = launch::mma_rows(g);
            let gchunks = g.div_ceil(hc as usize);
            let f = self.func("attention_paged", sfx, &format!("attn_mma_{sfx}_d{dv}"))?;
            self.launch(
                OP,
                &f,
                (
                    to_u32(OP, "grid.x", max_q.div_ceil(tq as usize).max(1))?,
                    to_u32(OP, "grid.y", hkv * gchunks)?,
                    s as u32,
                ),
                (launch::ATTN_THREADS, 1, 1),
                mma_smem as u32,
                kparams![
                    q.device_ptr(),
                    k_cache.device_ptr(),
                    v_cache.device_ptr(),
                    meta.query_start.device_ptr(),
                    meta.positions.device_ptr(),
                    meta.block_tables.device_ptr(),
                    out.device_ptr(),
                    hu,
                    hkvu,
                    hdku,
                    hdvu,
                    bsu,
                    mbu,
                    nbu,
                    hc,
                    tq,
                    scale_log2
                ],
            )?;
            return Ok(out);
        }
        // Tiled FMA kernel: f32, or head dims the other kernels do not cover.
        let vpl = launch::tiled_vpl(hdv)
            .ok_or_else(|| anyhow!("{OP}: hd_v = {hdv} is above the supported 512"))?;
        let smem = launch::tiled_smem_bytes(hdk, hdv);
        if smem > self.info.max_smem_optin as usize {
            bail!(
                "{OP}: head dims hd_k = {hdk}, hd_v = {hdv} need {smem} bytes of shared memory, \
                 the device allows {}",
                self.info.max_smem_optin
            );
        }
        let (hc, tq) = launch::tiled_rows(g);
        let gchunks = g.div_ceil(hc as usize);
        let f = self.func("attention_paged", sfx, &format!("attn_tiled_{sfx}_v{vpl}"))?;
        self.launch(
            OP,
            &f,
            (
                to_u32(OP, "grid.x", max_q.div_ceil(tq as usize).max(1))?,
                to_u32(OP, "grid.y", hkv * gchunks)?,
                s as u32,
            ),
            (launch::ATTN_THREADS, 1, 1),
            smem as u32,
            kparams![
                q.device_ptr(),
                k_cache.device_ptr(),
                v_cache.device_ptr(),
                meta.query_start.device_ptr(),
                meta.positions.device_ptr(),
                meta.block_tables.device_ptr(),
                out.device_ptr(),
                hu,
                hkvu,
                hdku,
                hdvu,
                bsu,
                mbu,
                nbu,
                hc,
                tq,
                scale_log2
            ],
        )?;
        Ok(out)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        let _ = self.stream.synchronize();
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
