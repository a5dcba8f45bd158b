//! Whole-row copies along dimension 0, shared by every backend's `copy_rows`, `read_rows` and
//! `write_rows` ([`crate::Backend`]): argument checks with the messages the trait documents,
//! the coalescing of row lists into contiguous runs (one memcpy per run), and the host
//! implementation on raw bytes (the CPU backend; the ground truth of the conformance checks).
//!
//! A *row* is `t[i, ...]`: `shape[1..].product()` elements, `row_bytes` bytes in the tensor's
//! stored dtype. Rows are copied as bytes, never converted.

use crate::{DType, HostTensor};
use anyhow::{bail, ensure, Result};

/// The rows of a tensor along dimension 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    /// `shape[0]`.
    pub rows: usize,
    /// Bytes of one row: `shape[1..].product() · dtype.size()`.
    pub row_bytes: usize,
}

impl RowLayout {
    /// The layout of a tensor of `shape` and `dtype`; an error naming `op` for a 0-d tensor.
    pub fn of(op: &str, shape: &[usize], dtype: DType) -> Result<Self> {
        let Some((&rows, rest)) = shape.split_first() else {
            bail!("{op}: the tensor needs at least one dimension (rows of dim 0), got shape []");
        };
        Ok(Self {
            rows,
            row_bytes: rest.iter().product::<usize>() * dtype.size(),
        })
    }
}

/// Rows `src..src + len` go to rows `dst..dst + len` (indices in rows of each side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowRun {
    /// First source row.
    pub src: usize,
    /// First destination row.
    pub dst: usize,
    /// Rows in the run (≥ 1).
    pub len: usize,
}

/// Merges `(src, dst)` row pairs, in the order given, into maximal runs in which both sides
/// advance by one row: `[(4, 0), (5, 1), (9, 2)]` → runs `4..6 → 0..2` and `9 → 2`.
pub fn coalesce(pairs: impl IntoIterator<Item = (usize, usize)>) -> Vec<RowRun> {
    let mut runs: Vec<RowRun> = Vec::new();
    for (src, dst) in pairs {
        match runs.last_mut() {
            Some(r) if r.src + r.len == src && r.dst + r.len == dst => r.len += 1,
            _ => runs.push(RowRun { src, dst, len: 1 }),
        }
    }
    runs
}

/// An error unless `index < rows`: `"{op}: {what} row {index} is out of range for a tensor of
/// {rows} rows (shape {shape:?})"`.
pub fn check_index(op: &str, what: &str, index: u32, shape: &[usize]) -> Result<usize> {
    let rows = shape.first().copied().unwrap_or(0);
    let i = index as usize;
    ensure!(
        i < rows,
        "{op}: {what} row {index} is out of range for a tensor of {rows} rows (shape {shape:?})"
    );
    Ok(i)
}

/// The shape of `n` rows of a tensor of `shape`: `[n, shape[1..]...]`.
pub fn rows_shape(shape: &[usize], n: usize) -> Vec<usize> {
    let mut s = shape.to_vec();
    if let Some(first) = s.first_mut() {
        *first = n;
    }
    s
}

/// What `copy_rows` does after its checks: the runs to copy (no-op pairs `src == dst` dropped,
/// sorted by destination) and whether any destination row is also a source row (then every
/// source row must be read before any row is written, e.g. through a staging copy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    /// The runs, sorted by `dst`; within a run, rows of both sides are consecutive.
    pub runs: Vec<RowRun>,
    /// Some destination row is also a source row of this call.
    pub overlapping: bool,
}

impl CopyPlan {
    /// Rows copied in all.
    pub fn rows(&self) -> usize {
        self.runs.iter().map(|r| r.len).sum()
    }
}

/// Checks `copy_rows` pairs against a tensor of `shape` (every index in range, no destination
/// twice, even in a no-op pair) and plans the copy.
pub fn plan_copy(op: &str, pairs: &[(u32, u32)], shape: &[usize]) -> Result<CopyPlan> {
    let rows = shape.first().copied().unwrap_or(0);
    let mut is_dst = vec![false; rows];
    let mut is_src = vec![false; rows];
    let mut moves = Vec::with_capacity(pairs.len());
    for &(s, d) in pairs {
        let s = check_index(op, "src", s, shape)?;
        let d = check_index(op, "dst", d, shape)?;
        ensure!(
            !is_dst[d],
            "{op}: dst row {d} appears more than once (a row can be written only once per call)"
        );
        is_dst[d] = true;
        if s != d {
            is_src[s] = true;
            moves.push((s, d));
        }
    }
    let overlapping = moves.iter().any(|&(_, d)| is_src[d]);
    moves.sort_unstable_by_key(|&(_, d)| d);
    Ok(CopyPlan {
        runs: coalesce(moves),
        overlapping,
    })
}

/// Checks `read_rows` indices against a tensor of `shape` (duplicates are allowed) and returns
/// the runs from tensor rows (`src`) to rows of the output (`dst` = position in `rows`).
pub fn plan_read(op: &str, rows: &[u32], shape: &[usize]) -> Result<Vec<RowRun>> {
    let mut pairs = Vec::with_capacity(rows.len());
    for (i, &r) in rows.iter().enumerate() {
        pairs.push((check_index(op, "source", r, shape)?, i));
    }
    Ok(coalesce(pairs))
}

/// Checks `write_rows` arguments against a tensor of `shape` and `dtype`: `src` must have
/// shape `[rows.len(), shape[1..]...]` and the tensor's dtype, every row must be in range and
/// appear once. Returns the runs from rows of `src` (`src` = position in `rows`) to tensor rows
/// (`dst`), sorted by `dst`.
pub fn plan_write(
    op: &str,
    rows: &[u32],
    shape: &[usize],
    dtype: DType,
    src: &HostTensor,
) -> Result<Vec<RowRun>> {
    RowLayout::of(op, shape, dtype)?;
    let want = rows_shape(shape, rows.len());
    ensure!(
        src.shape == want && src.dtype == dtype,
        "{op}: src has shape {:?} {}, expected {want:?} {dtype} ({} rows of the tensor of shape \
         {shape:?} {dtype})",
        src.shape,
        src.dtype,
        rows.len()
    );
    ensure!(
        src.data.len() == src.numel() * dtype.size(),
        "{op}: src holds {} bytes, its shape {:?} {dtype} needs {}",
        src.data.len(),
        src.shape,
        src.numel() * dtype.size()
    );
    let mut seen = vec![false; shape[0]];
    let mut pairs = Vec::with_capacity(rows.len());
    for (i, &r) in rows.iter().enumerate() {
        let d = check_index(op, "destination", r, shape)?;
        ensure!(
            !seen[d],
            "{op}: destination row {d} appears more than once (a row can be written only once per call)"
        );
        seen[d] = true;
        pairs.push((i, d));
    }
    pairs.sort_unstable_by_key(|&(_, d)| d);
    Ok(coalesce(pairs))
}

/// Host `copy_rows` on the raw bytes of a tensor whose rows are `row_bytes` long: every pair
/// of `plan` reads the bytes as they were before the call.
pub fn copy_rows_bytes(data: &mut [u8], row_bytes: usize, plan: &CopyPlan) {
    let span = |first: usize, len: usize| first * row_bytes..(first + len) * row_bytes;
    if plan.overlapping {
        // Read every source run first, then write: a row that is both read and written is
        // read with its old value.
        let staged: Vec<Vec<u8>> = plan
            .runs
            .iter()
            .map(|r| data[span(r.src, r.len)].to_vec())
            .collect();
        for (r, bytes) in plan.runs.iter().zip(staged) {
            data[span(r.dst, r.len)].copy_from_slice(&bytes);
        }
    } else {
        for r in &plan.runs {
            data.copy_within(span(r.src, r.len), r.dst * row_bytes);
        }
    }
}

/// Copies each run's rows of `from` (`src` side) to rows of `to` (`dst` side), both with rows
/// of `row_bytes` bytes (host `read_rows` and `write_rows`).
pub fn move_rows_bytes(from: &[u8], to: &mut [u8], row_bytes: usize, runs: &[RowRun]) {
    for r in runs {
        let n = r.len * row_bytes;
        to[r.dst * row_bytes..r.dst * row_bytes + n]
            .copy_from_slice(&from[r.src * row_bytes..r.src * row_bytes + n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_only_when_both_sides_advance() {
        let runs = coalesce([(4, 0), (5, 1), (9, 2), (10, 4), (11, 5)]);
        assert_eq!(
            runs,
            [
                RowRun {
                    src: 4,
                    dst: 0,
                    len: 2
                },
                RowRun {
                    src: 9,
                    dst: 2,
                    len: 1
                },
                RowRun {
                    src: 10,
                    dst: 4,
                    len: 2
                },
            ]
        );
        assert!(coalesce([]).is_empty());
    }

    #[test]
    fn copy_plan_checks_and_sorts() {
        let shape = [5, 2];
        let p = plan_copy("copy_rows", &[(3, 4), (2, 2), (0, 1), (1, 0)], &shape).unwrap();
        assert!(p.overlapping);
        assert_eq!(p.rows(), 3);
        assert_eq!(p.runs[0].dst, 0);
        let p = plan_copy("copy_rows", &[(0, 3), (1, 4)], &shape).unwrap();
        assert!(!p.overlapping);
        assert_eq!(
            p.runs,
            [RowRun {
                src: 0,
                dst: 3,
                len: 2
            }]
        );
        let e = plan_copy("copy_rows", &[(7, 1)], &shape)
            .unwrap_err()
            .to_string();
        assert!(e.contains("row 7") && e.contains("5 rows"), "{e}");
        let e = plan_copy("copy_rows", &[(0, 2), (2, 2)], &shape)
            .unwrap_err()
            .to_string();
        assert!(e.contains("dst row 2 appears more than once"), "{e}");
    }

    #[test]
    fn host_copy_reads_before_writing() {
        // Rows 0..5 hold their index; (0→1), (1→2), (2→0) rotates, (4→3) copies.
        let mut data: Vec<u8> = (0..5u8).flat_map(|i| [i, i]).collect();
        let plan = plan_copy("copy_rows", &[(0, 1), (1, 2), (2, 0), (4, 3)], &[5, 2]).unwrap();
        copy_rows_bytes(&mut data, 2, &plan);
        assert_eq!(data, [2, 2, 0, 0, 1, 1, 4, 4, 4, 4]);
    }

    #[test]
    fn write_plan_names_both_shapes() {
        let src = HostTensor::from_f32(vec![2, 3], &[0.0; 6]).unwrap();
        let e = plan_write("write_rows", &[0], &[4, 3], DType::F32, &src)
            .unwrap_err()
            .to_string();
        assert!(e.contains("[2, 3]") && e.contains("[1, 3]"), "{e}");
        let e = plan_write("write_rows", &[1, 1], &[4, 3], DType::F32, &src)
            .unwrap_err()
            .to_string();
        assert!(e.contains("appears more than once"), "{e}");
        let runs = plan_write("write_rows", &[3, 2], &[4, 3], DType::F32, &src).unwrap();
        assert_eq!(
            runs,
            [
                RowRun {
                    src: 1,
                    dst: 2,
                    len: 1
                },
                RowRun {
                    src: 0,
                    dst: 3,
                    len: 1
                }
            ]
        );
    }
}
