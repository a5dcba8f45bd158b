//! Library detection, the device context, the caching allocator and the device tensor.

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{result as dr, sys, CudaContext, CudaStream};
use dayone_backend::{DType, TensorInfo};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Which CUDA libraries can be loaded on this machine (cudarc panics when it touches a missing one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LibraryPresence {
    /// `libcuda.so` (the NVIDIA driver).
    pub driver: bool,
    /// `libnvrtc.so` (runtime compiler).
    pub nvrtc: bool,
    /// `libcublas.so`.
    pub cublas: bool,
}

impl LibraryPresence {
    /// Probes the dynamic loader for each library (no CUDA call is made).
    pub fn probe() -> Self {
        // SAFETY: these only try to dlopen candidate library names.
        unsafe {
            LibraryPresence {
                driver: sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
                cublas: cudarc::cublas::sys::is_culib_present(),
            }
        }
    }

    /// `Ok` when all three are present, else one line naming the first missing library.
    pub fn check(&self) -> Result<()> {
        if !self.driver {
            bail!("CUDA backend unavailable: libcuda.so not found (no NVIDIA driver)");
        }
        if !self.nvrtc {
            bail!(
                "CUDA backend unavailable: libnvrtc.so not found (install the CUDA toolkit or pip's \
                 nvidia-cuda-nvrtc and add its lib directory to LD_LIBRARY_PATH or DAYONE_NVRTC_DIR)"
            );
        }
        if !self.cublas {
            bail!(
                "CUDA backend unavailable: libcublas.so not found (install cuBLAS and add its lib \
                 directory to LD_LIBRARY_PATH)"
            );
        }
        Ok(())
    }
}

/// Turns a driver error into a message naming what was being done.
pub(crate) fn drv(what: &str) -> impl FnOnce(dr::DriverError) -> anyhow::Error + '_ {
    move |e| anyhow!("CUDA {what} failed: {e:?}")
}

/// Rounds an allocation size up to its pool size class, so that buffers of recurring sizes are
/// reused exactly: 512 B steps up to 1 MiB, 64 KiB steps up to 64 MiB, 2 MiB steps above.
pub fn size_class(bytes: usize) -> usize {
    const KIB: usize = 1024;
    const MIB: usize = 1024 * KIB;
    let step = if bytes <= MIB {
        512
    } else if bytes <= 64 * MIB {
        64 * KIB
    } else {
        2 * MIB
    };
    bytes.div_ceil(step) * step
}

/// The key of the graphs' shared free lists in [`PoolState::graphs`] (buffers tag it).
const GRAPH_POOL: u64 = 1;

#[derive(Default)]
struct PoolState {
    free: HashMap<usize, Vec<u64>>,
    cached_bytes: usize,
    live_bytes: usize,
    /// A capture is running: its allocations and frees use the graphs' free lists.
    capturing: Option<u64>,
    /// The free buffers reserved for graphs (one pool shared by all of a backend's graphs,
    /// under [`GRAPH_POOL`]): a graph replays its kernels on the addresses they were captured
    /// with, so no memory a graph touched may serve other tensors while a graph lives. Graphs
    /// replay one at a time on the one stream, so they can share it (PyTorch's graph pools).
    graphs: HashMap<u64, HashMap<usize, Vec<u64>>>,
    /// Graphs alive; at 0 the shared lists return to the ordinary ones.
    graphs_alive: usize,
}

/// A caching device allocator: freed buffers go back to a per-size-class free list and are
/// handed out again without `cuMemAlloc`. All work runs on one stream, so a buffer released
/// while kernels that use it are still queued can be reused by later work on the same stream.
pub(crate) struct Pool {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    state: Mutex<PoolState>,
}

impl Pool {
    pub(crate) fn new(ctx: Arc<CudaContext>, stream: Arc<CudaStream>) -> Self {
        Pool {
            ctx,
            stream,
            state: Mutex::new(PoolState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `bytes` bytes (contents undefined). `bytes == 0` gives a null buffer.
    pub(crate) fn alloc(self: &Arc<Self>, bytes: usize) -> Result<DeviceBuffer> {
        if bytes == 0 {
            return Ok(DeviceBuffer {
                ptr: 0,
                class: 0,
                graph: 0,
                weight: false,
                pool: self.clone(),
            });
        }
        let class = size_class(bytes);
        let graph = {
            let mut st = self.lock();
            let graph = st.capturing;
            let reused = match graph {
                Some(g) => st
                    .graphs
                    .get_mut(&g)
                    .and_then(|f| f.get_mut(&class))
                    .and_then(|v| v.pop()),
                None => st.free.get_mut(&class).and_then(|v| v.pop()),
            };
            if let Some(ptr) = reused {
                if graph.is_none() {
                    st.cached_bytes -= class;
                }
                st.live_bytes += class;
                return Ok(DeviceBuffer {
                    ptr,
                    class,
                    graph: graph.unwrap_or(0),
                    weight: false,
                    pool: self.clone(),
                });
            }
            graph
        };
        self.ctx.bind_to_thread().map_err(drv("bind context"))?;
        // SAFETY: plain device allocation; freed by `release`/`Drop` through the pool.
        let ptr = match unsafe { dr::malloc_sync(class) } {
            Ok(p) => p,
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                self.trim()?;
                // SAFETY: as above.
                unsafe { dr::malloc_sync(class) }.map_err(|e| {
                    anyhow!(
                        "CUDA out of memory allocating {class} bytes ({} bytes in live tensors): {e:?}",
                        self.lock().live_bytes
                    )
                })?
            }
            Err(e) => return Err(anyhow!("cuMemAlloc({class} bytes) failed: {e:?}")),
        };
        self.lock().live_bytes += class;
        Ok(DeviceBuffer {
            ptr,
            class,
            graph: graph.unwrap_or(0),
            weight: false,
            pool: self.clone(),
        })
    }

    /// A buffer goes back to the graph it belongs to while that graph lives; any buffer freed
    /// during a capture joins the captured graph (its kernels may still address it).
    fn release(&self, class: usize, ptr: u64, graph: u64) {
        let mut st = self.lock();
        st.live_bytes = st.live_bytes.saturating_sub(class);
        let owner = st.capturing.or((graph != 0).then_some(graph));
        if let Some(list) = owner.and_then(|g| st.graphs.get_mut(&g)) {
            list.entry(class).or_default().push(ptr);
            return;
        }
        st.cached_bytes += class;
        st.free.entry(class).or_default().push(ptr);
    }

    /// Starts routing allocations to the graphs' lists (a capture begins).
    pub(crate) fn begin_graph(&self) {
        let mut st = self.lock();
        st.graphs.entry(GRAPH_POOL).or_default();
        st.capturing = Some(GRAPH_POOL);
    }

    /// The capture ended; `kept`: it made a graph (else its buffers are free graph memory, or
    /// ordinary memory again when no graph lives).
    pub(crate) fn end_graph(&self, kept: bool) {
        let mut st = self.lock();
        st.capturing = None;
        st.graphs_alive += usize::from(kept);
        if st.graphs_alive == 0 {
            Self::release_graph_lists(&mut st);
        }
    }

    /// Whether a capture is in progress (uploads and read-backs are refused then).
    pub(crate) fn is_capturing(&self) -> bool {
        self.lock().capturing.is_some()
    }

    /// A graph is gone; with the last one the graphs' free buffers return to the ordinary
    /// lists (buffers still held by tensors follow when those are dropped).
    pub(crate) fn drop_graph(&self) {
        let mut st = self.lock();
        st.graphs_alive = st.graphs_alive.saturating_sub(1);
        if st.graphs_alive == 0 && st.capturing.is_none() {
            Self::release_graph_lists(&mut st);
        }
    }

    fn release_graph_lists(st: &mut PoolState) {
        if let Some(lists) = st.graphs.remove(&GRAPH_POOL) {
            for (class, ptrs) in lists {
                st.cached_bytes += class * ptrs.len();
                st.free.entry(class).or_default().extend(ptrs);
            }
        }
    }

    /// Frees every cached (unused) buffer back to the driver, after the stream has drained.
    pub(crate) fn trim(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(drv("bind context"))?;
        self.stream
            .synchronize()
            .map_err(drv("stream synchronize"))?;
        let mut st = self.lock();
        for (_, v) in st.free.drain() {
            for p in v {
                // SAFETY: `p` came from `malloc_sync` and is not referenced by any tensor.
                unsafe {
                    let _ = dr::free_sync(p);
                }
            }
        }
        st.cached_bytes = 0;
        Ok(())
    }

    /// `(bytes held by live tensors, bytes cached for reuse)`.
    pub(crate) fn usage(&self) -> (usize, usize) {
        let st = self.lock();
        (st.live_bytes, st.cached_bytes)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.trim();
    }
}

/// One device allocation; dropping it returns the memory to the pool.
pub(crate) struct DeviceBuffer {
    ptr: u64,
    class: usize,
    /// The graph whose capture allocated it (0: none).
    graph: u64,
    /// Uploaded by `upload_weight`: no kernel writes it, so kernels may read it before their
    /// `griddepcontrol.wait` (see gemv.cu).
    pub(crate) weight: bool,
    pool: Arc<Pool>,
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            self.pool.release(self.class, self.ptr, self.graph);
        }
    }
}

/// A tensor in device memory: a shared buffer, a row-major shape and a dtype.
/// Clones share the memory; [`dayone_backend::Backend::reshape`] gives another shape of it.
#[derive(Clone)]
pub struct CudaTensor {
    pub(crate) buf: Arc<DeviceBuffer>,
    /// Byte offset of the first element in `buf` (views such as the fields of one step's
    /// metadata share one buffer).
    pub(crate) offset: usize,
    pub(crate) shape: Vec<usize>,
    pub(crate) dtype: DType,
}

impl CudaTensor {
    /// The device address of the first element (0 for an empty tensor).
    pub fn device_ptr(&self) -> u64 {
        if self.buf.ptr == 0 {
            0
        } else {
            self.buf.ptr + self.offset as u64
        }
    }

    /// Size of the data in bytes.
    pub fn num_bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

impl TensorInfo for CudaTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaTensor({:?}, {})", self.shape, self.dtype)
    }
}

/// Pinned host memory for small uploads: a ring of slots, each reused only after the copy that
/// last read it has finished (an event per slot), so `cuMemcpyHtoDAsync` from it is truly
/// asynchronous (a copy from pageable memory waits for the stream's queued work first).
pub(crate) struct Staging {
    base: *mut u8,
    slot_bytes: usize,
    events: Vec<Option<cudarc::driver::CudaEvent>>,
    next: usize,
}

// SAFETY: the pinned pointer is only used under the backend's staging mutex.
unsafe impl Send for Staging {}

impl Staging {
    /// `slots` slots of `slot_bytes` bytes each.
    pub(crate) fn new(ctx: &Arc<CudaContext>, slots: usize, slot_bytes: usize) -> Result<Self> {
        ctx.bind_to_thread().map_err(drv("bind context"))?;
        // SAFETY: plain pinned allocation, freed in Drop.
        let base =
            unsafe { dr::malloc_host(slots * slot_bytes, 0) }.map_err(drv("cuMemHostAlloc"))?;
        Ok(Staging {
            base: base as *mut u8,
            slot_bytes,
            events: (0..slots).map(|_| None).collect(),
            next: 0,
        })
    }

    /// Largest upload that goes through the ring.
    pub(crate) fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Copies `parts` (concatenated, each at the given byte offset) into the next free slot and
    /// queues its copy to `dst` on `stream`.
    pub(crate) fn upload(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        dst: u64,
        parts: &[(usize, &[u8])],
        total: usize,
    ) -> Result<()> {
        if total > self.slot_bytes {
            bail!(
                "staging upload of {total} bytes exceeds the slot size {}",
                self.slot_bytes
            );
        }
        let i = self.next;
        self.next = (self.next + 1) % self.events.len();
        if let Some(ev) = &self.events[i] {
            ev.synchronize().map_err(drv("staging event wait"))?;
        }
        // SAFETY: the slot lies inside the pinned allocation and no queued copy reads it (the
        // event above has completed).
        let slot =
            unsafe { std::slice::from_raw_parts_mut(self.base.add(i * self.slot_bytes), total) };
        for (off, bytes) in parts {
            slot[*off..*off + bytes.len()].copy_from_slice(bytes);
        }
        // SAFETY: `dst` holds at least `total` bytes; the slot stays untouched until the event.
        unsafe { dr::memcpy_htod_async(dst, &slot[..total], stream.cu_stream()) }
            .map_err(drv("host-to-device copy"))?;
        if self.events[i].is_none() {
            self.events[i] = Some(ctx.new_event(None).map_err(drv("event creation"))?);
        }
        if let Some(ev) = &self.events[i] {
            ev.record(stream).map_err(drv("event record"))?;
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for ev in self.events.iter().flatten() {
            let _ = ev.synchronize();
        }
        // SAFETY: allocated by `malloc_host` in `new`; no copy reads it any more.
        unsafe {
            let _ = dr::free_host(self.base as *mut std::ffi::c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes() {
        assert_eq!(size_class(1), 512);
        assert_eq!(size_class(512), 512);
        assert_eq!(size_class(513), 1024);
        assert_eq!(size_class(1 << 20), 1 << 20);
        assert_eq!(size_class((1 << 20) + 1), (1 << 20) + 65536);
        assert_eq!(size_class(100 << 20), 100 << 20);
        assert_eq!(size_class((100 << 20) + 1), (102 << 20));
        for b in [1usize, 777, 4096, 1_000_000, 3_333_333, 1 << 30] {
            assert!(size_class(b) >= b);
        }
    }

    #[test]
    fn missing_library_messages() {
        let none = LibraryPresence {
            driver: false,
            nvrtc: false,
            cublas: false,
        };
        let e = none.check().unwrap_err().to_string();
        assert!(e.contains("libcuda.so not found"), "{e}");
        let e = LibraryPresence {
            driver: true,
            ..none
        }
        .check()
        .unwrap_err()
        .to_string();
        assert!(e.contains("libnvrtc.so"), "{e}");
        let e = LibraryPresence {
            driver: true,
            nvrtc: true,
            cublas: false,
        }
        .check()
        .unwrap_err()
        .to_string();
        assert!(e.contains("libcublas.so"), "{e}");
        assert!(LibraryPresence {
            driver: true,
            nvrtc: true,
            cublas: true
        }
        .check()
        .is_ok());
    }
}
