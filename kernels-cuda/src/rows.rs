//! Whole-row copies along dimension 0: `copy_rows`, `read_rows`, `write_rows` (bytes verbatim,
//! any dtype), all queued on the backend's one stream, so they are ordered with the kernels
//! around them.
//!
//! `copy_rows` copies runs straight when no destination row is also a source row (the ranges
//! are then disjoint); otherwise it gathers every source run into a scratch buffer first and
//! then scatters, so every row is read before any is written.
//!
//! `read_rows` and `write_rows` of one contiguous run (or nothing) keep one `cuMemcpy*Async`:
//! `write_rows` sends it through the pinned ring when it fits a slot, else from the caller's
//! pageable memory (the driver stages that before the call returns), as `upload` does. Calls
//! with several runs (the host KV tier moves hundreds of scattered 32 KiB rows per call; one
//! copy per run cost ~16 000 small copies a step) go through [`RowStaging`] in batches of at
//! most [`BATCH_BYTES`]: `write_rows` packs the row ids and all rows of a batch into one pinned
//! buffer, makes one host-to-device copy into a device staging buffer and one `rows_scatter`
//! kernel (`kernels/rows.cu`) puts each row in place; `read_rows` uploads the ids, gathers with
//! `rows_gather` into device staging, makes one device-to-host copy into pinned memory and
//! copies that into the result.

use crate::device::drv;
use crate::{launch, CudaBackend, CudaTensor};
use anyhow::Result;
use cudarc::driver::{result as dr, CudaContext, CudaEvent, CudaStream};
use dayone_backend::rows::{self, RowLayout};
use dayone_backend::{DType, HostTensor};
use std::sync::Arc;

/// Largest pinned staging buffer of one batched `read_rows`/`write_rows` transfer (ids and
/// rows); a call moving more rows is split into batches (a single larger row is one batch).
pub(crate) const BATCH_BYTES: usize = 64 << 20;
/// Threads per block of the row kernels.
pub(crate) const ROW_THREADS: u32 = 256;

/// One pinned host buffer, grown on demand, with the event of the last copy that reads or
/// writes it.
struct PinnedSlot {
    ptr: *mut u8,
    cap: usize,
    event: Option<CudaEvent>,
}

/// Pinned staging of the batched row transfers: two [`PinnedSlot`]s used in turn, so packing
/// one batch on the host overlaps the copy of the previous one.
///
/// Reuse guarantee: a slot is handed out by [`RowStaging::acquire`] only after the event
/// recorded behind the last asynchronous copy from it has completed (host wait on that
/// event), and it is used only while the backend's `rows_staging` mutex is held; `read_rows`
/// additionally synchronises the stream before it reads the slot.
pub(crate) struct RowStaging {
    slots: [PinnedSlot; 2],
    next: usize,
}

// SAFETY: the pinned pointers are only used under the backend's `rows_staging` mutex.
unsafe impl Send for RowStaging {}

impl RowStaging {
    /// No pinned memory yet; the first batched transfer allocates it.
    pub(crate) fn new() -> Self {
        let empty = || PinnedSlot {
            ptr: std::ptr::null_mut(),
            cap: 0,
            event: None,
        };
        RowStaging {
            slots: [empty(), empty()],
            next: 0,
        }
    }

    /// The next slot, holding at least `bytes` bytes, once no queued copy uses it any more.
    fn acquire(&mut self, ctx: &Arc<CudaContext>, bytes: usize) -> Result<&mut PinnedSlot> {
        let slot = &mut self.slots[self.next];
        self.next = (self.next + 1) % 2;
        if let Some(ev) = &slot.event {
            ev.synchronize().map_err(drv("row staging event wait"))?;
        }
        if slot.cap < bytes {
            ctx.bind_to_thread().map_err(drv("bind context"))?;
            if !slot.ptr.is_null() {
                // SAFETY: allocated by `malloc_host` below; the event above has completed, so
                // no copy reads or writes it.
                unsafe { dr::free_host(slot.ptr as *mut std::ffi::c_void) }
                    .map_err(drv("cuMemFreeHost"))?;
                slot.ptr = std::ptr::null_mut();
                slot.cap = 0;
            }
            // Doubling (up to a batch) so a slowly growing size reallocates rarely.
            let cap = bytes
                .max((2 * slot.cap).min(BATCH_BYTES))
                .next_multiple_of(1 << 20);
            // SAFETY: plain pinned allocation, freed above on growth or in Drop.
            let p = unsafe { dr::malloc_host(cap, 0) }.map_err(drv("cuMemHostAlloc"))?;
            slot.ptr = p as *mut u8;
            slot.cap = cap;
        }
        Ok(slot)
    }
}

impl PinnedSlot {
    /// The first `len` bytes (`len <= cap`).
    fn bytes(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.cap);
        // SAFETY: inside the pinned allocation; the caller holds the slot exclusively (see
        // `RowStaging`), and no queued copy touches it (`acquire` waited on its event).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    /// Records the slot's event behind the copies queued on `stream` so far.
    fn record(&mut self, ctx: &Arc<CudaContext>, stream: &Arc<CudaStream>) -> Result<()> {
        if self.event.is_none() {
            self.event = Some(ctx.new_event(None).map_err(drv("event creation"))?);
        }
        if let Some(ev) = &self.event {
            ev.record(stream).map_err(drv("event record"))?;
        }
        Ok(())
    }
}

impl Drop for RowStaging {
    fn drop(&mut self) {
        for s in &self.slots {
            if let Some(ev) = &s.event {
                let _ = ev.synchronize();
            }
            if !s.ptr.is_null() {
                // SAFETY: allocated by `malloc_host`; no copy uses it any more (event above).
                unsafe {
                    let _ = dr::free_host(s.ptr as *mut std::ffi::c_void);
                }
            }
        }
    }
}

/// Byte layout of one batched transfer: `n` u32 row ids, zero padding to 16 bytes, then `n`
/// rows of `row_bytes` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchLayout {
    /// Offset of the first row (a multiple of 16).
    pub rows_at: usize,
    /// Bytes in all: `rows_at + n · row_bytes`.
    pub total: usize,
}

impl BatchLayout {
    pub(crate) fn new(n: usize, row_bytes: usize) -> Self {
        let rows_at = (4 * n).next_multiple_of(16);
        BatchLayout {
            rows_at,
            total: rows_at + n * row_bytes,
        }
    }
}

/// Rows per batch for rows of `row_bytes` bytes: as many as fit [`BATCH_BYTES`] with their
/// ids, at least one.
pub(crate) fn batch_rows(row_bytes: usize) -> usize {
    (BATCH_BYTES / (row_bytes + 4)).max(1)
}

/// The copy unit of the row kernels: 16 or 4 bytes when it divides the row size and every
/// base address, else 1 (kernel suffix and unit size are the same number).
pub(crate) fn row_unit(row_bytes: usize, addrs: &[u64]) -> usize {
    [16usize, 4]
        .into_iter()
        .find(|&w| row_bytes.is_multiple_of(w) && addrs.iter().all(|a| a.is_multiple_of(w as u64)))
        .unwrap_or(1)
}

/// Grid of a row kernel over `n` rows of `units` units: `(chunks of a row, rows)`, the rows
/// capped at the grid's y limit and the chunks at 1024 (both loops are grid-stride).
pub(crate) fn row_kernel_grid(n: usize, units: usize) -> (u32, u32, u32) {
    let chunks = units.div_ceil(ROW_THREADS as usize).clamp(1, 1024) as u32;
    (chunks, launch::row_grid(n, 65535), 1)
}

/// Copies the ids of `indices` (native-endian u32) and zero padding into `buf[..rows_at]`.
fn pack_ids(buf: &mut [u8], indices: &[u32], rows_at: usize) {
    for (k, &i) in indices.iter().enumerate() {
        buf[4 * k..4 * k + 4].copy_from_slice(&i.to_ne_bytes());
    }
    buf[4 * indices.len()..rows_at].fill(0);
}

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

    /// Device staging for a batch of `bytes` bytes. From the caching pool, so buffers of
    /// recurring sizes are reused; safe to hand out again as soon as it is dropped because
    /// every use is queued on the one stream.
    fn row_scratch(&self, bytes: usize) -> Result<CudaTensor> {
        self.alloc(vec![bytes.div_ceil(4)], DType::U32)
    }

    /// Launches `rows_{scatter,gather}_{unit}` over `n` rows of `rb` bytes.
    #[allow(clippy::too_many_arguments)]
    fn launch_rows(
        &self,
        op: &str,
        kind: &str,
        src: u64,
        dst: u64,
        ids: u64,
        n: usize,
        rb: usize,
    ) -> Result<()> {
        let unit = row_unit(rb, &[src, dst]);
        let name = format!("rows_{kind}_{unit}");
        let f = self.func("rows", "", &name)?;
        let units = rb / unit;
        self.launch(
            op,
            &f,
            row_kernel_grid(n, units),
            (ROW_THREADS, 1, 1),
            0,
            kparams![src, dst, ids, n as u32, units as u64],
        )
    }

    pub(crate) fn read_rows_impl(&self, t: &CudaTensor, indices: &[u32]) -> Result<HostTensor> {
        const OP: &str = "read_rows";
        let rb = RowLayout::of(OP, &t.shape, t.dtype)?.row_bytes;
        let runs = rows::plan_read(OP, indices, &t.shape)?;
        self.bind()?;
        let mut out = vec![0u8; indices.len() * rb];
        if rb > 0 && runs.len() > 1 {
            self.read_rows_batched(t, indices, rb, &mut out)?;
        } else if rb > 0 {
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

    /// `out[i] = t[indices[i]]` through the row staging (indices checked by the caller).
    fn read_rows_batched(
        &self,
        t: &CudaTensor,
        indices: &[u32],
        rb: usize,
        out: &mut [u8],
    ) -> Result<()> {
        let mut st = self.rows_staging.lock().unwrap_or_else(|p| p.into_inner());
        let per = batch_rows(rb);
        for (ids, out) in indices.chunks(per).zip(out.chunks_mut(per * rb)) {
            let lay = BatchLayout::new(ids.len(), rb);
            let dev = self.row_scratch(lay.total)?;
            let d = dev.device_ptr();
            let slot = st.acquire(&self.ctx, lay.total)?;
            let buf = slot.bytes(lay.total);
            pack_ids(buf, ids, lay.rows_at);
            let (head, rows_part) = buf.split_at_mut(lay.rows_at);
            let s = self.stream.cu_stream();
            // SAFETY: `d` holds `lay.total` bytes; `head` and `rows_part` are pinned memory of
            // this slot, untouched by the host until the synchronize below.
            unsafe { dr::memcpy_htod_async(d, &*head, s) }.map_err(drv("host-to-device copy"))?;
            self.launch_rows(
                "read_rows",
                "gather",
                t.device_ptr(),
                d + lay.rows_at as u64,
                d,
                ids.len(),
                rb,
            )?;
            // SAFETY: as above; the source lies inside `dev`.
            unsafe { dr::memcpy_dtoh_async(rows_part, d + lay.rows_at as u64, s) }
                .map_err(drv("device-to-host copy"))?;
            // The slot is read right away, so wait for the whole stream (the copies above
            // included) rather than for an event.
            self.stream
                .synchronize()
                .map_err(drv("stream synchronize"))?;
            out.copy_from_slice(rows_part);
        }
        Ok(())
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
        if runs.len() > 1 {
            return self.write_rows_batched(t, indices, rb, &src.data);
        }
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

    /// `t[indices[i]] = data row i` through the row staging (arguments checked by the caller:
    /// ids in range and distinct, `data` holding `indices.len()` rows of `rb` bytes).
    fn write_rows_batched(
        &self,
        t: &CudaTensor,
        indices: &[u32],
        rb: usize,
        data: &[u8],
    ) -> Result<()> {
        let mut st = self.rows_staging.lock().unwrap_or_else(|p| p.into_inner());
        let per = batch_rows(rb);
        for (ids, rows) in indices.chunks(per).zip(data.chunks(per * rb)) {
            let lay = BatchLayout::new(ids.len(), rb);
            let dev = self.row_scratch(lay.total)?;
            let d = dev.device_ptr();
            let slot = st.acquire(&self.ctx, lay.total)?;
            let buf = slot.bytes(lay.total);
            pack_ids(buf, ids, lay.rows_at);
            buf[lay.rows_at..].copy_from_slice(rows);
            // SAFETY: `d` holds `lay.total` bytes; the slot is not written again before its
            // event (recorded right after this copy) completes — `acquire` waits for it.
            unsafe { dr::memcpy_htod_async(d, &*buf, self.stream.cu_stream()) }
                .map_err(drv("host-to-device copy"))?;
            slot.record(&self.ctx, &self.stream)?;
            self.launch_rows(
                "write_rows",
                "scatter",
                d + lay.rows_at as u64,
                t.device_ptr(),
                d,
                ids.len(),
                rb,
            )?;
            // Dropping `dev` returns it to the pool; later work that reuses it is queued
            // behind the scatter on the same stream.
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_layout_aligns_rows() {
        assert_eq!(
            BatchLayout::new(3, 30),
            BatchLayout {
                rows_at: 16,
                total: 106
            }
        );
        assert_eq!(BatchLayout::new(4, 8).rows_at, 16);
        assert_eq!(BatchLayout::new(5, 8).rows_at, 32);
        assert_eq!(BatchLayout::new(0, 8).total, 0);
    }

    #[test]
    fn unit_divides_size_and_addresses() {
        assert_eq!(row_unit(32768, &[0x1000, 0x2010]), 16);
        assert_eq!(row_unit(32768, &[0x1000, 0x2004]), 4);
        assert_eq!(row_unit(28, &[0x1000, 0x2000]), 4);
        assert_eq!(row_unit(30, &[0x1000, 0x2000]), 1);
        assert_eq!(row_unit(32, &[0x1002, 0x2000]), 1);
    }

    #[test]
    fn batches_and_grids() {
        assert!(batch_rows(32 << 10) * ((32 << 10) + 4) <= BATCH_BYTES);
        assert_eq!(batch_rows(BATCH_BYTES * 2), 1);
        // 255 rows of 32 KiB in 16-byte units: 8 chunks of 256 threads per row.
        assert_eq!(row_kernel_grid(255, 2048), (8, 255, 1));
        assert_eq!(row_kernel_grid(100_000, 1), (1, 65535, 1));
        assert_eq!(row_kernel_grid(1, 1 << 30), (1024, 1, 1));
    }
}
