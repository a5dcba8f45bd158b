//! Whole-row copies along dimension 0: `copy_rows`, `read_rows`, `write_rows` (bytes verbatim,
//! any dtype). No kernels: one `cuMemcpy*Async` per contiguous run of rows on the backend's
//! stream, so the copies are ordered with the kernels around them.
//!
//! `copy_rows` copies runs straight when no destination row is also a source row (the ranges
//! are then disjoint); otherwise it gathers every source run into a scratch buffer first and
//! then scatters, so every row is read before any is written. `write_rows` sends runs that fit
//! a pinned staging slot through the ring (truly asynchronous), larger ones from the caller's
//! pageable memory (the driver stages those before the call returns), as `upload` does.

use crate::device::drv;
use crate::{CudaBackend, CudaTensor};
use anyhow::Result;
use cudarc::driver::result as dr;
use dayone_backend::rows::{self, RowLayout};
use dayone_backend::HostTensor;

impl CudaBackend {
    /// One device-to-device copy of `bytes` bytes on the stream.
    fn dtod(&self, dst: u64, src: u64, bytes: usize) -> Result<()> {
        // SAFETY: callers pass ranges inside live buffers (rows checked against the shape);
        // the source and destination ranges do not overlap.
        unsafe { dr::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .map_err(drv("device-to-device copy"))
    }

    pub(crate) fn copy_rows_impl(&self, t: &CudaTensor, pairs: &[(u32, u32)]) -> Result<()> {
        const OP: &str = "copy_rows";
        let rb = RowLayout::of(OP, &t.shape, t.dtype)?.row_bytes;
        let plan = rows::plan_copy(OP, pairs, &t.shape)?;
        if rb == 0 || plan.runs.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let base = t.device_ptr();
        let at = |row: usize| base + (row * rb) as u64;
        if !plan.overlapping {
            for r in &plan.runs {
                self.dtod(at(r.dst), at(r.src), r.len * rb)?;
            }
            return Ok(());
        }
        let scratch = self.alloc(vec![plan.rows() * (rb / t.dtype.size())], t.dtype)?;
        let mut k = scratch.device_ptr();
        for r in &plan.runs {
            self.dtod(k, at(r.src), r.len * rb)?;
            k += (r.len * rb) as u64;
        }
        let mut k = scratch.device_ptr();
        for r in &plan.runs {
            self.dtod(at(r.dst), k, r.len * rb)?;
            k += (r.len * rb) as u64;
        }
        // Dropping `scratch` returns it to the pool; later work on the stream runs after the
        // copies above.
        Ok(())
    }

    pub(crate) fn read_rows_impl(&self, t: &CudaTensor, indices: &[u32]) -> Result<HostTensor> {
        const OP: &str = "read_rows";
        let rb = RowLayout::of(OP, &t.shape, t.dtype)?.row_bytes;
        let runs = rows::plan_read(OP, indices, &t.shape)?;
        self.bind()?;
        let mut out = vec![0u8; indices.len() * rb];
        if rb > 0 {
            for r in &runs {
                let dst = &mut out[r.dst * rb..(r.dst + r.len) * rb];
                // SAFETY: `dst` lies inside `out`, which outlives the synchronize below; the
                // source rows lie inside `t` (checked).
                unsafe {
                    dr::memcpy_dtoh_async(
                        dst,
                        t.device_ptr() + (r.src * rb) as u64,
                        self.stream.cu_stream(),
                    )
                }
                .map_err(drv("device-to-host copy"))?;
            }
        }
        self.stream
            .synchronize()
            .map_err(drv("stream synchronize"))?;
        HostTensor::new(rows::rows_shape(&t.shape, indices.len()), t.dtype, out)
    }

    pub(crate) fn write_rows_impl(
        &self,
        t: &CudaTensor,
        indices: &[u32],
        src: &HostTensor,
    ) -> Result<()> {
        const OP: &str = "write_rows";
        let rb = RowLayout::of(OP, &t.shape, t.dtype)?.row_bytes;
        let runs = rows::plan_write(OP, indices, &t.shape, t.dtype, src)?;
        if rb == 0 || runs.is_empty() {
            return Ok(());
        }
        self.bind()?;
        let mut st = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        for r in &runs {
            let bytes = &src.data[r.src * rb..(r.src + r.len) * rb];
            let dst = t.device_ptr() + (r.dst * rb) as u64;
            if bytes.len() <= st.slot_bytes() {
                st.upload(&self.ctx, &self.stream, dst, &[(0, bytes)], bytes.len())?;
            } else {
                // SAFETY: the destination rows lie inside `t` (checked); pageable source memory
                // is staged by the driver before the call returns.
                unsafe { dr::memcpy_htod_async(dst, bytes, self.stream.cu_stream()) }
                    .map_err(drv("host-to-device copy"))?;
            }
        }
        Ok(())
    }
}
