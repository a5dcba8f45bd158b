//! [`NcclComm`]: the collectives of [`dayone_backend::comm::Comm`] on CUDA through NCCL.
//!
//! Every operation is queued on the backend's own stream (so it is ordered with the kernels
//! before and after it, without host synchronisation) on the backend's own tensors: the raw
//! NCCL calls of `cudarc::nccl::sys` take their device pointers. Reductions use NCCL's sum in
//! the tensor's dtype; data movement (gather, broadcast, all-to-all) moves bytes, so it takes
//! every dtype. NCCL is loaded dynamically; a missing `libnccl.so` is an error, not a panic.

use crate::device::drv;
use crate::{CudaBackend, CudaTensor};
use anyhow::{anyhow, bail, Result};
use cudarc::driver::{result as dr, CudaContext, CudaStream};
use cudarc::nccl::sys;
use dayone_backend::comm::Comm;
use dayone_backend::{Backend, DType, HostTensor, TensorInfo};
use std::ffi::{c_void, CStr};
use std::sync::{Arc, Mutex, MutexGuard};

/// The raw communicator handle.
struct Raw(sys::ncclComm_t);

// SAFETY: an `ncclComm_t` has no affinity to the thread that created it; NCCL only requires
// that one communicator is not used by two threads at the same time. Every use goes through
// `NcclComm::raw`'s mutex and stays under its guard for the whole operation (a group's
// `ncclGroupStart`..`ncclGroupEnd` included, whose state is thread-local), so calls never run
// concurrently, and `Mutex<Raw>` is then `Sync` as well.
unsafe impl Send for Raw {}

/// One rank's NCCL communicator, implementing [`Comm<CudaBackend>`].
///
/// Made with [`NcclComm::new`] on every rank from the id of [`NcclComm::unique_id`]. Every
/// collective must be called with the backend given to `new` (or one on the same device) and
/// queues its work on that backend's stream: it returns before the data has moved, like a
/// kernel launch. The exception is [`Comm::all_to_all`], which waits for the exchange of the
/// row counts (the output's size depends on them). Reductions ([`Comm::all_reduce_sum`],
/// [`Comm::reduce_scatter_sum`]) take f32, bf16, f16, u32 and i32 tensors (integers wrap); the
/// other collectives take every dtype.
///
/// NCCL ops block on the device, not the host: a rank that never joins a collective leaves the
/// others' streams waiting (the host sees it at its next synchronisation).
pub struct NcclComm {
    rank: usize,
    world: usize,
    ordinal: usize,
    raw: Mutex<Raw>,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// One u32 on the device that [`Comm::barrier`] all-reduces.
    flag: CudaTensor,
}

/// An error naming `what` when `r` is not success, with NCCL's last error message.
fn check(what: &str, r: sys::ncclResult_t) -> Result<()> {
    if r == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: NCCL returns NUL-terminated strings that it owns and keeps alive.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    // SAFETY: both only read NCCL's static tables / last-error buffer (the comm argument of
    // `ncclGetLastError` is unused by NCCL, so null is fine).
    let (kind, last) = unsafe {
        (
            text(sys::ncclGetErrorString(r)),
            text(sys::ncclGetLastError(std::ptr::null_mut())),
        )
    };
    let last = if last.is_empty() {
        String::new()
    } else {
        format!(": {last}")
    };
    Err(anyhow!("NCCL {what} failed: {r:?} ({kind}){last}"))
}

/// Fails with one line unless libnccl loads (cudarc panics on a missing library or symbol).
fn ensure_nccl() -> Result<()> {
    // SAFETY: only tries to dlopen cudarc's candidate library names.
    if !unsafe { sys::is_culib_present() } {
        bail!(
            "NCCL (libnccl.so) is not installed: cudarc looks for the unversioned libnccl.so (from \
             libnccl-dev; libnccl.so.2 alone is not found), install it or put a libnccl.so \
             symlink in a directory on LD_LIBRARY_PATH"
        );
    }
    let mut v = 0;
    // SAFETY: writes one int.
    check("ncclGetVersion", unsafe { sys::ncclGetVersion(&mut v) })?;
    if v < 21300 {
        bail!("NCCL {v} is too old: dayone needs NCCL 2.13 or newer");
    }
    Ok(())
}

/// NCCL's element type for sums over `dt` (every dtype has one; a new dtype without an NCCL
/// type, such as fp8, has to be refused here).
fn reduce_type(dt: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match dt {
        DType::F32 => T::ncclFloat32,
        DType::BF16 => T::ncclBfloat16,
        DType::F16 => T::ncclFloat16,
        DType::U32 => T::ncclUint32,
        DType::I32 => T::ncclInt32,
    }
}

fn ptr(t: &CudaTensor) -> *mut c_void {
    t.device_ptr() as *mut c_void
}

impl NcclComm {
    /// True when libnccl can be loaded (tests and `--backend auto` checks).
    pub fn is_available() -> bool {
        ensure_nccl().is_ok()
    }

    /// A new communicator id (`ncclGetUniqueId`). Call it on one rank only (rank 0) and give
    /// the same 128 bytes to [`NcclComm::new`] on every rank; it also starts NCCL's bootstrap
    /// listener in this process, which the other ranks connect to. Errors: NCCL missing, or
    /// no usable network interface for the bootstrap.
    pub fn unique_id() -> Result<[u8; 128]> {
        ensure_nccl()?;
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes the 128-byte id.
        check("ncclGetUniqueId", unsafe { sys::ncclGetUniqueId(&mut id) })?;
        Ok(id.internal.map(|c| c as u8))
    }

    /// Joins communicator `id` as `rank` of `world` on `backend`'s device (`ncclCommInitRank`).
    /// Blocks until every rank has joined. Errors: NCCL missing, `rank >= world`, or the init
    /// failing (NCCL's message is included; two ranks on one GPU fail with "Duplicate GPU
    /// detected" unless each process has its own `NCCL_HOSTID`).
    pub fn new(backend: &CudaBackend, rank: usize, world: usize, id: [u8; 128]) -> Result<Self> {
        ensure_nccl()?;
        if rank >= world {
            bail!("NcclComm::new: rank {rank} out of range for a world of {world}");
        }
        let (r, w) = (i32::try_from(rank)?, i32::try_from(world)?);
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let flag = backend.zeros(&[1], DType::U32)?;
        backend.bind()?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` receives the handle; the current context is the backend's device.
        check(
            &format!("init of rank {rank} of {world} (ncclCommInitRank)"),
            unsafe { sys::ncclCommInitRank(&mut comm, w, id, r) },
        )?;
        Ok(NcclComm {
            rank,
            world,
            ordinal: backend.info.ordinal,
            raw: Mutex::new(Raw(comm)),
            ctx: backend.ctx.clone(),
            stream: backend.stream.clone(),
            flag,
        })
    }

    /// The communicator, locked for one operation, after checking that `b` runs on its device
    /// and binding that device to this thread.
    fn lock(&self, op: &str, b: &CudaBackend) -> Result<(MutexGuard<'_, Raw>, sys::cudaStream_t)> {
        if b.info.ordinal != self.ordinal {
            bail!(
                "{op}: the communicator is on CUDA device {}, the backend on device {}",
                self.ordinal,
                b.info.ordinal
            );
        }
        b.bind()?;
        let g = self.raw.lock().unwrap_or_else(|p| p.into_inner());
        Ok((g, b.stream.cu_stream() as sys::cudaStream_t))
    }

    /// Rows of `x` (its first dimension) and bytes per row; a 0-d tensor is one row.
    fn rows(x: &CudaTensor) -> (usize, usize) {
        let rest: usize = x.shape.iter().skip(1).product();
        (x.shape.first().copied().unwrap_or(1), rest * x.dtype.size())
    }

    /// `x`'s shape with `rows` rows.
    fn with_rows(x: &CudaTensor, rows: usize) -> Vec<usize> {
        let mut s = x.shape.clone();
        if s.is_empty() {
            s.push(1);
        }
        s[0] = rows;
        s
    }
}

impl Comm<CudaBackend> for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    /// `ncclAllReduce` (sum) into a new tensor.
    fn all_reduce_sum(&self, b: &CudaBackend, x: &CudaTensor) -> Result<CudaTensor> {
        let ty = reduce_type(x.dtype);
        let (g, s) = self.lock("all_reduce_sum", b)?;
        let out = b.alloc(x.shape.clone(), x.dtype)?;
        if x.numel() > 0 {
            // SAFETY: both buffers hold `numel` elements of `ty` and live until the op is done
            // (the pool reuses freed buffers only for later work on this stream).
            check("all_reduce_sum (ncclAllReduce)", unsafe {
                sys::ncclAllReduce(
                    ptr(x),
                    ptr(&out),
                    x.numel(),
                    ty,
                    sys::ncclRedOp_t::ncclSum,
                    g.0,
                    s,
                )
            })?;
        }
        Ok(out)
    }

    /// `ncclAllGather` of `x`'s bytes.
    fn all_gather(&self, b: &CudaBackend, x: &CudaTensor) -> Result<CudaTensor> {
        let (g, s) = self.lock("all_gather", b)?;
        let (rows, _) = Self::rows(x);
        let out = b.alloc(Self::with_rows(x, rows * self.world), x.dtype)?;
        if x.num_bytes() > 0 {
            // SAFETY: `out` holds `world` times `x`'s bytes.
            check("all_gather (ncclAllGather)", unsafe {
                sys::ncclAllGather(
                    ptr(x),
                    ptr(&out),
                    x.num_bytes(),
                    sys::ncclDataType_t::ncclUint8,
                    g.0,
                    s,
                )
            })?;
        }
        Ok(out)
    }

    /// `ncclReduceScatter` (sum); errors when the rows do not split evenly over the ranks.
    fn reduce_scatter_sum(&self, b: &CudaBackend, x: &CudaTensor) -> Result<CudaTensor> {
        let ty = reduce_type(x.dtype);
        let rows = x.shape.first().copied().unwrap_or(0);
        if x.shape.is_empty() || rows % self.world != 0 {
            bail!(
                "reduce_scatter_sum: {:?} does not split into {} row blocks",
                x.shape,
                self.world
            );
        }
        let (g, s) = self.lock("reduce_scatter_sum", b)?;
        let out = b.alloc(Self::with_rows(x, rows / self.world), x.dtype)?;
        if out.numel() > 0 {
            // SAFETY: `x` holds `world` times `out`'s elements.
            check("reduce_scatter_sum (ncclReduceScatter)", unsafe {
                sys::ncclReduceScatter(
                    ptr(x),
                    ptr(&out),
                    out.numel(),
                    ty,
                    sys::ncclRedOp_t::ncclSum,
                    g.0,
                    s,
                )
            })?;
        }
        Ok(out)
    }

    /// Exchanges every rank's counts (and row size, which must agree) with one all-gather,
    /// waits for it, then moves the row blocks with grouped `ncclSend`/`ncclRecv` (this rank's
    /// own block by a device copy).
    fn all_to_all(
        &self,
        b: &CudaBackend,
        x: &CudaTensor,
        send: &[usize],
    ) -> Result<(CudaTensor, Vec<usize>)> {
        let (w, me) = (self.world, self.rank);
        let (rows, rb) = Self::rows(x);
        if x.shape.is_empty() || send.len() != w || send.iter().sum::<usize>() != rows {
            bail!(
                "all_to_all: send counts {send:?} do not split the {:?} rows over {w} ranks",
                x.shape
            );
        }
        let big = |v: usize| anyhow!("all_to_all: {v} exceeds the u32 range of the exchange");
        let mine = send
            .iter()
            .chain([&rb])
            .map(|&c| u32::try_from(c).map_err(|_| big(c)))
            .collect::<Result<Vec<u32>>>()?;
        let counts = b.upload(&HostTensor::from_u32(vec![w + 1], &mine)?)?;
        let all = b.alloc(vec![w * (w + 1)], DType::U32)?;
        // Locked for the whole exchange, so no other collective slips in between its parts.
        let (g, s) = self.lock("all_to_all", b)?;
        // SAFETY: `all` holds `world` times `counts`' elements.
        check("all_to_all count exchange (ncclAllGather)", unsafe {
            sys::ncclAllGather(
                ptr(&counts),
                ptr(&all),
                w + 1,
                sys::ncclDataType_t::ncclUint32,
                g.0,
                s,
            )
        })?;
        let all = b.download(&all)?.to_u32()?;
        let (mut recv, mut src_off) = (Vec::with_capacity(w), Vec::with_capacity(w));
        for src in 0..w {
            let theirs = &all[src * (w + 1)..(src + 1) * (w + 1)];
            if theirs[w] as usize != rb {
                bail!(
                    "all_to_all: rank {src} sends rows of {} bytes, this rank {rb}",
                    theirs[w]
                );
            }
            recv.push(theirs[me] as usize);
            src_off.push(recv[..src].iter().sum::<usize>());
        }
        let out = b.alloc(Self::with_rows(x, recv.iter().sum()), x.dtype)?;
        let send_off = |j: usize| send[..j].iter().sum::<usize>() * rb;
        if send[me] > 0 {
            // SAFETY: both ranges lie inside their buffers (sizes from the counts above).
            unsafe {
                dr::memcpy_dtod_async(
                    out.device_ptr() + (src_off[me] * rb) as u64,
                    x.device_ptr() + send_off(me) as u64,
                    send[me] * rb,
                    b.stream.cu_stream(),
                )
            }
            .map_err(drv("all_to_all: device-to-device copy"))?;
        }
        // SAFETY: a group only collects the calls until `ncclGroupEnd`, which always runs.
        check("all_to_all (ncclGroupStart)", unsafe {
            sys::ncclGroupStart()
        })?;
        let mut first_err = Ok(());
        for j in (0..w).filter(|&j| j != me) {
            let u8t = sys::ncclDataType_t::ncclUint8;
            if send[j] > 0 && first_err.is_ok() {
                let p = (x.device_ptr() + send_off(j) as u64) as *const c_void;
                // SAFETY: rows `send_off(j)..` of `x`, `send[j]` rows long.
                first_err = check("all_to_all (ncclSend)", unsafe {
                    sys::ncclSend(p, send[j] * rb, u8t, j as i32, g.0, s)
                });
            }
            if recv[j] > 0 && first_err.is_ok() {
                let p = (out.device_ptr() + (src_off[j] * rb) as u64) as *mut c_void;
                // SAFETY: rows `src_off[j]..` of `out`, `recv[j]` rows long.
                first_err = check("all_to_all (ncclRecv)", unsafe {
                    sys::ncclRecv(p, recv[j] * rb, u8t, j as i32, g.0, s)
                });
            }
        }
        // SAFETY: closes the group opened above.
        let end = check("all_to_all (ncclGroupEnd)", unsafe { sys::ncclGroupEnd() });
        first_err.and(end)?;
        drop(g);
        Ok((out, recv))
    }

    /// `ncclBroadcast` of `x`'s bytes from `root`.
    fn broadcast(&self, b: &CudaBackend, x: &CudaTensor, root: usize) -> Result<CudaTensor> {
        if root >= self.world {
            bail!(
                "broadcast: root {root} out of range for a world of {}",
                self.world
            );
        }
        let (g, s) = self.lock("broadcast", b)?;
        let out = b.alloc(x.shape.clone(), x.dtype)?;
        if x.num_bytes() > 0 {
            // SAFETY: both buffers hold `num_bytes` bytes.
            check("broadcast (ncclBroadcast)", unsafe {
                sys::ncclBroadcast(
                    ptr(x),
                    ptr(&out),
                    x.num_bytes(),
                    sys::ncclDataType_t::ncclUint8,
                    root as i32,
                    g.0,
                    s,
                )
            })?;
        }
        Ok(out)
    }

    /// An all-reduce of one u32 on the communicator's stream, then a wait for that stream
    /// (so it also waits for the work queued before it).
    fn barrier(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("bind context"))?;
        let g = self.raw.lock().unwrap_or_else(|p| p.into_inner());
        let f = ptr(&self.flag);
        // SAFETY: in place on one u32 of `flag`, which lives as long as `self`.
        check("barrier (ncclAllReduce)", unsafe {
            sys::ncclAllReduce(
                f,
                f,
                1,
                sys::ncclDataType_t::ncclUint32,
                sys::ncclRedOp_t::ncclSum,
                g.0,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        })?;
        drop(g);
        self.stream
            .synchronize()
            .map_err(drv("barrier: stream synchronize"))
    }
}

impl Drop for NcclComm {
    /// `ncclCommAbort`: frees the communicator without waiting for peers that may be gone
    /// (`ncclCommDestroy` would wait for queued collectives, forever if a peer has exited).
    /// Collectives still in flight are cut short: synchronise first if their results matter.
    fn drop(&mut self) {
        let raw = self.raw.get_mut().unwrap_or_else(|p| p.into_inner());
        if !raw.0.is_null() && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the handle came from `ncclCommInitRank` and is not used after this.
            unsafe {
                let _ = sys::ncclCommAbort(raw.0);
            }
            raw.0 = std::ptr::null_mut();
        }
    }
}
