//! Whole-row copies along dimension 0: `copy_rows`, `read_rows`, `write_rows` (bytes verbatim,
//! any stored dtype). No shader: buffer-to-buffer copies recorded in the backend's encoder, one
//! per contiguous run of rows and device buffer (a tensor split by rows spans several buffers).
//!
//! wgpu refuses a copy whose source and destination are the same buffer, overlapping or not
//! (`TransferError::SameSourceDestinationBuffer`), and the trait wants every source row read
//! before any row is written: runs that stay within one buffer, and every run of a call in
//! which some destination row is also a source row, go through a staging tensor (all gathers,
//! then all scatters). Downloads go through a map-read buffer of at most one chunk per batch.

use crate::{WTensor, WgslBackend};
use anyhow::{ensure, Result};
use dayone_backend::rows::{self, RowLayout, RowRun};
use dayone_backend::{DType, HostTensor};

/// Bytes `offset..offset + len` of one device buffer.
struct Piece<'a> {
    buf: &'a wgpu::Buffer,
    offset: u64,
    len: u64,
}

/// The pieces, in order, that hold bytes `start..start + len` of `t` (one per buffer crossed).
fn locate(t: &WTensor, start: u64, len: u64) -> Vec<Piece<'_>> {
    let es = t.dtype.size() as u64;
    let end = start + len;
    t.st.chunks
        .iter()
        .filter_map(|c| {
            let (c0, c1) = (c.start as u64 * es, (c.start + c.len) as u64 * es);
            let (a, b) = (start.max(c0), end.min(c1));
            (a < b).then_some(Piece {
                buf: &c.buf,
                offset: a - c0,
                len: b - a,
            })
        })
        .collect()
}

/// Copy commands `(source piece, destination piece)` for `len` bytes from byte `from` of `a` to
/// byte `to` of `b`, split wherever either side crosses into another buffer.
fn pair_pieces<'a>(
    a: &'a WTensor,
    from: u64,
    b: &'a WTensor,
    to: u64,
    len: u64,
) -> Vec<(Piece<'a>, Piece<'a>)> {
    let (pa, pb) = (locate(a, from, len), locate(b, to, len));
    let mut out = Vec::with_capacity(pa.len().max(pb.len()));
    let (mut i, mut j, mut da, mut db) = (0, 0, 0, 0);
    while i < pa.len() && j < pb.len() {
        let n = (pa[i].len - da).min(pb[j].len - db);
        out.push((
            Piece {
                buf: pa[i].buf,
                offset: pa[i].offset + da,
                len: n,
            },
            Piece {
                buf: pb[j].buf,
                offset: pb[j].offset + db,
                len: n,
            },
        ));
        (da, db) = (da + n, db + n);
        if da == pa[i].len {
            (i, da) = (i + 1, 0);
        }
        if db == pb[j].len {
            (j, db) = (j + 1, 0);
        }
    }
    out
}

fn record(enc: &mut wgpu::CommandEncoder, pieces: &[(Piece, Piece)]) {
    for (s, d) in pieces {
        enc.copy_buffer_to_buffer(s.buf, s.offset, d.buf, d.offset, Some(s.len));
    }
}

impl WgslBackend {
    /// The row layout of `t`, whose rows must be whole 4-byte words (wgpu's copy alignment;
    /// only a 1-d bf16 tensor has 2-byte rows).
    fn word_rows(op: &str, t: &WTensor) -> Result<RowLayout> {
        let l = RowLayout::of(op, &t.shape, t.dtype)?;
        ensure!(
            l.row_bytes.is_multiple_of(4),
            "{op}: rows of the tensor {:?} {} are {} bytes; the WGSL backend copies whole 4-byte \
             words, so a row must be a multiple of 4 bytes",
            t.shape,
            t.dtype,
            l.row_bytes
        );
        Ok(l)
    }

    pub(crate) fn copy_rows_impl(&self, t: &WTensor, pairs: &[(u32, u32)]) -> Result<()> {
        const OP: &str = "copy_rows";
        let layout = Self::word_rows(OP, t)?;
        let plan = rows::plan_copy(OP, pairs, &t.shape)?;
        let rb = layout.row_bytes as u64;
        if rb == 0 || plan.runs.is_empty() {
            return Ok(());
        }
        let span = |r: &RowRun| (r.src as u64 * rb, r.dst as u64 * rb, r.len as u64 * rb);
        // Straight copies only when no row is both read and written and no piece would copy
        // within one buffer.
        let (straight, staged): (Vec<RowRun>, Vec<RowRun>) = plan.runs.iter().partition(|r| {
            let (from, to, len) = span(r);
            !plan.overlapping
                && pair_pieces(t, from, t, to, len)
                    .iter()
                    .all(|(s, d)| s.buf != d.buf)
        });
        let staged_rows: usize = staged.iter().map(|r| r.len).sum();
        let staging = if staged_rows > 0 {
            // Words, so that it splits into chunks anywhere (a view's row may exceed a chunk).
            let words = staged_rows * layout.row_bytes / 4;
            Some(self.alloc(&[words], DType::U32)?)
        } else {
            None
        };
        let mut rec = self.lock();
        let enc = self.encoder(&mut rec);
        for r in &straight {
            let (from, to, len) = span(r);
            record(enc, &pair_pieces(t, from, t, to, len));
        }
        if let Some(s) = &staging {
            let mut k = 0;
            for r in &staged {
                let (from, _, len) = span(r);
                record(enc, &pair_pieces(t, from, s, k, len));
                k += len;
            }
            k = 0;
            for r in &staged {
                let (_, to, len) = span(r);
                record(enc, &pair_pieces(s, k, t, to, len));
                k += len;
            }
        }
        Ok(())
    }

    pub(crate) fn read_rows_impl(&self, t: &WTensor, indices: &[u32]) -> Result<HostTensor> {
        const OP: &str = "read_rows";
        let layout = Self::word_rows(OP, t)?;
        rows::plan_read(OP, indices, &t.shape)?;
        let rb = layout.row_bytes;
        let mut out = vec![0u8; indices.len() * rb];
        // Batches whose map-read buffer fits one chunk (at least one row); none for empty rows.
        if let Some(per) = (self.max_chunk as usize).checked_div(rb) {
            let per = per.max(1);
            for (batch, dst) in indices.chunks(per).zip(out.chunks_mut(per * rb)) {
                self.read_rows_batch(t, batch, rb, dst)?;
            }
        }
        self.check_error()?;
        HostTensor::new(rows::rows_shape(&t.shape, indices.len()), t.dtype, out)
    }

    /// Gathers `indices` (checked) of `t` into `out` (`indices.len() · rb` bytes) through one
    /// map-read buffer.
    fn read_rows_batch(
        &self,
        t: &WTensor,
        indices: &[u32],
        rb: usize,
        out: &mut [u8],
    ) -> Result<()> {
        const OP: &str = "read_rows";
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dayone-wgsl read_rows"),
            size: out.len() as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        {
            let mut rec = self.lock();
            let enc = self.encoder(&mut rec);
            for r in rows::plan_read(OP, indices, &t.shape)? {
                let mut at = (r.dst * rb) as u64;
                for p in locate(t, (r.src * rb) as u64, (r.len * rb) as u64) {
                    enc.copy_buffer_to_buffer(p.buf, p.offset, &staging, at, Some(p.len));
                    at += p.len;
                }
            }
            self.flush_locked(&mut rec);
        }
        self.read_staging(OP, &staging, out)
    }

    pub(crate) fn write_rows_impl(
        &self,
        t: &WTensor,
        indices: &[u32],
        src: &HostTensor,
    ) -> Result<()> {
        const OP: &str = "write_rows";
        let rb = Self::word_rows(OP, t)?.row_bytes;
        let runs = rows::plan_write(OP, indices, &t.shape, t.dtype, src)?;
        if rb == 0 || runs.is_empty() {
            return Ok(());
        }
        {
            // Queue writes land before the next submission: submit the work recorded so far
            // (which may still read these rows) first, as `upload` does.
            let mut rec = self.lock();
            self.flush_locked(&mut rec);
        }
        for r in runs {
            let mut at = r.src * rb;
            for p in locate(t, (r.dst * rb) as u64, (r.len * rb) as u64) {
                let n = p.len as usize;
                self.queue
                    .write_buffer(p.buf, p.offset, &src.data[at..at + n]);
                at += n;
            }
        }
        self.check_error()
    }
}
