//! Large host-to-device uploads (model weights) through two pinned buffers.
//!
//! A copy from pageable memory is staged by the driver one small piece at a time and blocks the
//! host; a 97 GB checkpoint loaded that way took ≈ 2.5 minutes on the H200 machine. Here each
//! piece is first copied into page-locked memory by several host threads, then its DMA is queued
//! while the next piece is copied into the other buffer.

use crate::device::drv;
use anyhow::Result;
use cudarc::driver::{result as dr, CudaContext, CudaEvent, CudaStream};
use std::sync::Arc;

/// Bytes per pinned buffer (two are allocated on the first large upload).
const PIECE_BYTES: usize = 64 << 20;

/// The two pinned buffers and the events of the copies that last read them.
pub(crate) struct BulkUpload {
    bufs: Vec<(*mut u8, Option<CudaEvent>)>,
    next: usize,
}

// SAFETY: the pinned pointers are only used under the backend's mutex around this struct.
unsafe impl Send for BulkUpload {}

impl BulkUpload {
    /// Nothing is allocated until the first upload.
    pub(crate) fn new() -> Self {
        BulkUpload {
            bufs: Vec::new(),
            next: 0,
        }
    }

    /// Queues the copy of `bytes` to device address `dst` on `stream`; `bytes` may be dropped
    /// when this returns (every piece has been copied into pinned memory by then).
    ///
    /// Errors: a failed pinned allocation, copy or event call (the CUDA error named).
    pub(crate) fn upload(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        dst: u64,
        bytes: &[u8],
    ) -> Result<()> {
        if self.bufs.is_empty() {
            for _ in 0..2 {
                // SAFETY: a plain page-locked allocation, freed in `drop`.
                let p = unsafe { dr::malloc_host(PIECE_BYTES, 0) }.map_err(drv("cuMemHostAlloc"))?
                    as *mut u8;
                self.bufs.push((p, None));
            }
        }
        for (k, piece) in bytes.chunks(PIECE_BYTES).enumerate() {
            let i = self.next;
            self.next = (self.next + 1) % self.bufs.len();
            if let Some(ev) = &self.bufs[i].1 {
                ev.synchronize().map_err(drv("upload event wait"))?;
            }
            // SAFETY: the buffer holds PIECE_BYTES ≥ piece.len() bytes and no queued copy reads
            // it (its event has completed).
            let pinned = unsafe { std::slice::from_raw_parts_mut(self.bufs[i].0, piece.len()) };
            dayone_backend::host_copy::parallel_copy(pinned, piece);
            let at = dst + (k * PIECE_BYTES) as u64;
            // SAFETY: `at .. at + piece.len()` lies inside the destination (the caller's
            // allocation of `bytes.len()` bytes); the buffer stays untouched until the event.
            unsafe { dr::memcpy_htod_async(at, &*pinned, stream.cu_stream()) }
                .map_err(drv("host-to-device copy"))?;
            if self.bufs[i].1.is_none() {
                self.bufs[i].1 = Some(ctx.new_event(None).map_err(drv("event creation"))?);
            }
            if let Some(ev) = &self.bufs[i].1 {
                ev.record(stream).map_err(drv("event record"))?;
            }
        }
        Ok(())
    }
}

impl Drop for BulkUpload {
    fn drop(&mut self) {
        for (p, ev) in &self.bufs {
            if let Some(ev) = ev {
                let _ = ev.synchronize();
            }
            // SAFETY: allocated by `malloc_host` in `upload`; no copy reads it any more.
            unsafe {
                let _ = dr::free_host(*p as *mut std::ffi::c_void);
            }
        }
    }
}
