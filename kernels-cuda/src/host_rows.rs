//! `rows_to_host` / `rows_from_host` on CUDA: the host-memory tier's rows live in page-locked
//! host memory mapped into the device's address space ([`PinnedPool`]), and one kernel per call
//! moves whole rows between the cache tensor and those chunks (`rows_to_ptrs_*` /
//! `rows_from_ptrs_*` in `kernels/rows.cu`) — no pageable copy and no staging buffer on the way.

use crate::device::drv;
use crate::rows::row_unit;
use crate::{CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use cudarc::driver::{result as dr, sys, CudaContext};
use dayone_backend::{rows::RowLayout, Backend, HostMem, HostRow, HostTensor};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes of one page-locked slab; chunks of one size are carved from slabs and reused.
const SLAB: usize = 64 << 20;
/// Chunk sizes are rounded up to this (and chunks aligned to it): 16-byte loads, cache lines.
const ALIGN: usize = 256;

/// Page-locked, device-mapped host memory in slabs, handed out in chunks of fixed sizes and
/// taken back when a [`PinnedChunk`] drops (a size's free chunks are reused first).
#[derive(Debug)]
pub(crate) struct PinnedPool {
    ctx: Arc<CudaContext>,
    inner: Mutex<PoolInner>,
}

#[derive(Debug, Default)]
struct PoolInner {
    /// (host address, device address, bytes) of each slab.
    slabs: Vec<(u64, u64, usize)>,
    /// Bytes used of the last slab.
    used: usize,
    /// Free chunks by size: (host, device) addresses.
    free: HashMap<usize, Vec<(u64, u64)>>,
}

impl PinnedPool {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Arc<Self> {
        Arc::new(Self {
            ctx,
            inner: Mutex::new(PoolInner::default()),
        })
    }

    fn alloc(self: &Arc<Self>, len: usize) -> Result<PinnedChunk> {
        let size = len.max(1).next_multiple_of(ALIGN);
        let mut p = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((host, dev)) = p.free.get_mut(&size).and_then(Vec::pop) {
            return Ok(PinnedChunk {
                pool: self.clone(),
                host,
                dev,
                size,
                len,
            });
        }
        let fits = p.slabs.last().is_some_and(|s| p.used + size <= s.2);
        if !fits {
            let bytes = size.max(SLAB);
            self.ctx
                .bind_to_thread()
                .map_err(drv("binding the context"))?;
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: a plain page-locked allocation, freed in Drop.
            let host = unsafe { dr::malloc_host(bytes, flags) }
                .map_err(drv("cuMemHostAlloc (host-memory tier)"))? as u64;
            let mut dev: sys::CUdeviceptr = 0;
            // SAFETY: `host` was allocated with DEVICEMAP just above.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut _, 0) }
                .result()
                .map_err(drv("cuMemHostGetDevicePointer"))?;
            p.slabs.push((host, dev, bytes));
            p.used = 0;
        }
        let &(host0, dev0, _) = p.slabs.last().expect("a slab");
        let off = p.used as u64;
        p.used += size;
        Ok(PinnedChunk {
            pool: self.clone(),
            host: host0 + off,
            dev: dev0 + off,
            size,
            len,
        })
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        let p = self.inner.get_mut().unwrap_or_else(PoisonError::into_inner);
        let _ = self.ctx.bind_to_thread();
        for &(host, _, _) in &p.slabs {
            // SAFETY: allocated by `malloc_host`; no chunk outlives the pool (each holds it).
            let _ = unsafe { dr::free_host(host as *mut std::ffi::c_void) };
        }
    }
}

/// `len` bytes of a [`PinnedPool`] slab (a chunk of `size` bytes), back to the pool on drop.
#[derive(Debug)]
pub(crate) struct PinnedChunk {
    pool: Arc<PinnedPool>,
    host: u64,
    dev: u64,
    size: usize,
    len: usize,
}

impl HostMem for PinnedChunk {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes inside a live slab (the pool outlives the chunk); kernels write
        // them only before `rows_to_host` returns (it synchronizes), never after.
        unsafe { std::slice::from_raw_parts(self.host as *const u8, self.len) }
    }

    fn device_addr(&self) -> Option<u64> {
        Some(self.dev)
    }
}

impl Drop for PinnedChunk {
    fn drop(&mut self) {
        let mut p = self
            .pool
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        p.free
            .entry(self.size)
            .or_default()
            .push((self.host, self.dev));
    }
}

/// Checks `indices` against `rows` rows (and, for writes, that none repeats).
fn check_ids(op: &str, indices: &[u32], rows: usize, distinct: bool) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for &i in indices {
        if i as usize >= rows {
            bail!("{op}: row {i} is out of range for a tensor of {rows} rows");
        }
        if distinct && !seen.insert(i) {
            bail!("{op}: row {i} is written twice");
        }
    }
    Ok(())
}

impl CudaBackend {
    /// Launches `rows_{to,from}_ptrs_*`: row `ids[r]` of `t` ⇄ the chunk at `ptrs[r]`.
    fn launch_ptr_rows(
        &self,
        op: &str,
        to_host: bool,
        t: &CudaTensor,
        ids: &[u32],
        ptrs: &[u64],
        rb: usize,
    ) -> Result<()> {
        let mut words: Vec<u32> = ids.to_vec();
        // ptrs follow the ids, 8-byte aligned (an even number of words before them).
        if words.len() % 2 == 1 {
            words.push(0);
        }
        let at = words.len() * 4;
        for p in ptrs {
            words.push(*p as u32);
            words.push((*p >> 32) as u32);
        }
        let desc = self.upload(&HostTensor::from_u32(vec![words.len()], &words)?)?;
        let mut addrs = vec![t.device_ptr()];
        addrs.extend_from_slice(ptrs);
        let unit = row_unit(rb, &addrs);
        let kind = if to_host { "to" } else { "from" };
        let f = self.func("rows", "", &format!("rows_{kind}_ptrs_{unit}"))?;
        let units = rb / unit;
        self.launch(
            op,
            &f,
            crate::rows::row_kernel_grid(ids.len(), units),
            (crate::rows::ROW_THREADS, 1, 1),
            0,
            kparams![
                t.device_ptr(),
                desc.device_ptr(),
                desc.device_ptr() + at as u64,
                ids.len() as u32,
                units as u64
            ],
        )
    }

    pub(crate) fn rows_to_host_impl(
        &self,
        t: &CudaTensor,
        indices: &[u32],
    ) -> Result<Vec<HostRow>> {
        const OP: &str = "rows_to_host";
        let rb = RowLayout::of(OP, &t.shape, t.dtype)?.row_bytes;
        check_ids(OP, indices, t.shape.first().copied().unwrap_or(0), false)?;
        let mut shape = t.shape.clone();
        shape[0] = 1;
        if indices.is_empty() {
            return Ok(Vec::new());
        }
        self.bind()?;
        let chunks = indices
            .iter()
            .map(|_| self.pinned.alloc(rb))
            .collect::<Result<Vec<_>>>()?;
        if rb > 0 {
            let ptrs: Vec<u64> = chunks.iter().map(|c| c.dev).collect();
            self.launch_ptr_rows(OP, true, t, indices, &ptrs, rb)?;
            // The bytes are read on the host only after this (`HostMem::bytes`).
            self.synchronize()?;
        }
        Ok(chunks
            .into_iter()
            .map(|c| HostRow::from_backend(t.dtype, shape.clone(), Box::new(c)))
            .collect())
    }

    pub(crate) fn rows_from_host_impl(
        &self,
        t: &CudaTensor,
        indices: &[u32],
        src: &[&HostRow],
    ) -> Result<()> {
        const OP: &str = "rows_from_host";
        let rb = RowLayout::of(OP, &t.shape, t.dtype)?.row_bytes;
        if indices.len() != src.len() {
            bail!(
                "{OP}: {} rows to write from {} host rows",
                indices.len(),
                src.len()
            );
        }
        check_ids(OP, indices, t.shape.first().copied().unwrap_or(0), true)?;
        if let Some(r) = src.iter().find(|r| r.len() != rb) {
            bail!(
                "{OP}: a host row holds {} bytes, a row of {:?} {} holds {rb}",
                r.len(),
                t.shape,
                t.dtype
            );
        }
        let ptrs: Option<Vec<u64>> = src.iter().map(|r| r.device_addr()).collect();
        let Some(ptrs) = ptrs else {
            // Rows in ordinary memory (not made by rows_to_host here): the staged path.
            let stacked = dayone_backend::host_rows::stack(src)?;
            return self.write_rows(t, indices, &stacked);
        };
        if indices.is_empty() || rb == 0 {
            return Ok(());
        }
        self.bind()?;
        self.launch_ptr_rows(OP, false, t, indices, &ptrs, rb)
    }
}
