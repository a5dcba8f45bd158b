//! One rank's slice of a checkpoint tensor (tensor and expert parallelism read only their part).

use anyhow::{bail, Result};
use dayone_backend::HostTensor;

/// A slice along one dimension: the dimension's extent seen as `groups` equal groups (fused
/// tensors such as `[gate; up]` or KDA's stacked `conv1d` are 2 or 3 groups), each cut into
/// `parts` equal pieces; piece `index` of every group, concatenated in group order.
///
/// `Split::whole()` is the identity. Example: `W_q` `[H·hd, D]` over 4 ranks is
/// `Split { dim: 0, groups: 1, parts: 4, index: r }`; `o_proj` `[D, H·hd]` is the same on dim 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// The dimension cut.
    pub dim: usize,
    /// Equal groups the dimension is made of.
    pub groups: usize,
    /// Pieces each group is cut into.
    pub parts: usize,
    /// The piece kept, `0..parts`.
    pub index: usize,
}

impl Split {
    /// The whole tensor.
    pub const fn whole() -> Self {
        Split {
            dim: 0,
            groups: 1,
            parts: 1,
            index: 0,
        }
    }

    /// Piece `index` of `parts` along `dim`.
    pub const fn along(dim: usize, parts: usize, index: usize) -> Self {
        Split {
            dim,
            groups: 1,
            parts,
            index,
        }
    }

    /// The same cut applied to each of `groups` equal groups of the dimension.
    pub const fn grouped(self, groups: usize) -> Self {
        Split { groups, ..self }
    }

    /// Whether this keeps everything.
    pub fn is_whole(&self) -> bool {
        self.parts == 1
    }

    /// The shape of the slice of a tensor of `shape`. Errors: `dim` out of range, or an extent
    /// that does not split evenly (naming both numbers).
    pub fn shape(&self, shape: &[usize]) -> Result<Vec<usize>> {
        let Some(&extent) = shape.get(self.dim) else {
            bail!(
                "cannot split dim {} of a tensor of shape {shape:?}",
                self.dim
            );
        };
        let cut = self.groups * self.parts;
        if self.index >= self.parts || cut == 0 || extent % cut != 0 {
            bail!(
                "dim {} of shape {shape:?} ({extent}) does not split into {} groups of {} equal parts",
                self.dim,
                self.groups,
                self.parts
            );
        }
        let mut out = shape.to_vec();
        out[self.dim] = extent / self.parts;
        Ok(out)
    }

    /// Byte ranges `(start, len)` of the slice inside a row-major tensor of `shape` with
    /// `elem` bytes per element, in output order.
    pub fn byte_ranges(&self, shape: &[usize], elem: usize) -> Result<Vec<(usize, usize)>> {
        self.shape(shape)?;
        let outer: usize = shape[..self.dim].iter().product();
        let extent = shape[self.dim];
        let inner: usize = shape[self.dim + 1..].iter().product::<usize>() * elem;
        let group = extent / self.groups;
        let piece = group / self.parts;
        let mut out = Vec::with_capacity(outer * self.groups);
        for o in 0..outer {
            for g in 0..self.groups {
                let row = o * extent + g * group + self.index * piece;
                out.push((row * inner, piece * inner));
            }
        }
        Ok(out)
    }

    /// [`Split::apply`] taking the tensor: a whole split hands it back without a copy (an
    /// expert stack is gigabytes).
    pub fn apply_owned(&self, t: HostTensor) -> Result<HostTensor> {
        if self.is_whole() {
            return Ok(t);
        }
        self.apply(&t)
    }

    /// The slice of a host tensor.
    pub fn apply(&self, t: &HostTensor) -> Result<HostTensor> {
        if self.is_whole() {
            return Ok(t.clone());
        }
        let shape = self.shape(&t.shape)?;
        let ranges = self.byte_ranges(&t.shape, t.dtype.size())?;
        let mut data = Vec::with_capacity(ranges.iter().map(|r| r.1).sum());
        for (s, n) in ranges {
            data.extend_from_slice(&t.data[s..s + n]);
        }
        HostTensor::new(shape, t.dtype, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_rows_columns_and_groups() {
        let t = HostTensor::from_f32(vec![4, 3], &(0..12).map(|x| x as f32).collect::<Vec<_>>())
            .unwrap();
        let rows = Split::along(0, 2, 1).apply(&t).unwrap();
        assert_eq!(rows.shape, vec![2, 3]);
        assert_eq!(rows.to_f32(), vec![6., 7., 8., 9., 10., 11.]);
        let cols = Split::along(1, 3, 2).apply(&t).unwrap();
        assert_eq!(cols.to_f32(), vec![2., 5., 8., 11.]);
        // [gate; up] of 2 rows each, second half of each.
        let gu = Split::along(0, 2, 1).grouped(2).apply(&t).unwrap();
        assert_eq!(gu.to_f32(), vec![3., 4., 5., 9., 10., 11.]);
        assert!(Split::along(0, 3, 0).apply(&t).is_err());
    }
}
