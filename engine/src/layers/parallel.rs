//! Column- and row-parallel projections (Megatron-LM, Shoeybi et al. 2019 §3; nano-vllm
//! `layers/linear.py`): a column-parallel `W` `[out, in]` keeps rows `out/world` of it and
//! produces its slice of the output; a row-parallel one keeps columns `in/world`, takes the
//! matching slice of the input and sums the ranks' partial outputs with one all-reduce. On one
//! rank both are the plain [`Linear`].

use super::{Addend, Linear, Weight};
use crate::loader::Split;
use crate::parallel::Parallel;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::Backend;

impl<B: Backend> Linear<B> {
    /// Loads the slice `split` of `{prefix}.weight` (whole shape `[out, in]`) and, for a split
    /// of the output rows, the same slice of `{prefix}.bias` `[out]`.
    pub fn load_split(
        w: &WeightLoader<B>,
        prefix: &str,
        (out_dim, in_dim): (usize, usize),
        bias: bool,
        split: Split,
    ) -> Result<Self> {
        let weight = if split.is_whole() {
            w.get_weight(prefix, out_dim, in_dim)?
        } else if let Some(q) = w.quant_host(prefix, out_dim, in_dim)? {
            // A rank's slice of a block-quantized weight is cut from its decoded floats.
            Weight::Dense(w.upload(split.apply(&q.to_host(w.dtype())?)?)?)
        } else {
            Weight::Dense(w.get_split(&format!("{prefix}.weight"), &[out_dim, in_dim], split)?)
        };
        let bias = if bias {
            let s = if split.dim == 0 {
                split
            } else {
                Split::whole()
            };
            Some(w.get_split(&format!("{prefix}.bias"), &[out_dim], s)?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    /// Column-parallel: this rank's `out / world` rows of `{prefix}.weight` `[out, in]` (and of
    /// the bias).
    pub fn column(
        w: &WeightLoader<B>,
        prefix: &str,
        out_dim: usize,
        in_dim: usize,
        bias: bool,
    ) -> Result<Self> {
        Self::load_split(w, prefix, (out_dim, in_dim), bias, w.parallel().split(0))
    }
}

/// A row-parallel projection: this rank's columns `[out, in / world]` of the weight, the
/// partial products summed over the ranks. Rank 0 adds the (unsplit) bias to its partial, so
/// the sum has it once.
pub struct RowLinear<B: Backend> {
    /// The local columns; rank 0's carries the bias.
    pub local: Linear<B>,
    /// The ranks that hold the other columns.
    pub parallel: Parallel<B>,
}

impl<B: Backend> RowLinear<B> {
    /// Loads this rank's columns of `{prefix}.weight` `[out, in]` (and, on rank 0,
    /// `{prefix}.bias`).
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        out_dim: usize,
        in_dim: usize,
        bias: bool,
    ) -> Result<Self> {
        let par = w.parallel();
        let mut local = Linear::load_split(w, prefix, (out_dim, in_dim), false, par.split(1))?;
        if bias && par.rank() == 0 {
            local.bias = Some(w.get(&format!("{prefix}.bias"), &[out_dim])?);
        }
        Ok(Self {
            local,
            parallel: par.clone(),
        })
    }

    /// A whole projection on one rank (weights built by hand, e.g. in benchmarks).
    pub fn single(local: Linear<B>) -> Self {
        Self {
            local,
            parallel: Parallel::single(),
        }
    }

    /// `x` `[M, in / world]` → this rank's partial `[M, out]` (not yet summed): for layers
    /// that add several partial sums before one all-reduce.
    pub fn forward_partial(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        self.local.forward(b, x)
    }

    /// `x` `[M, in / world]` → `[M, out]`, summed over the ranks.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        self.parallel.all_reduce(b, &self.forward_partial(b, x)?)
    }

    /// [`RowLinear::forward`] as the residual's addend: not yet computed when the weight is
    /// dense and whole on this rank ([`Addend::Projection`], so the next norm can share its
    /// launch), else computed and summed over the ranks.
    pub fn forward_addend(&self, b: &B, x: B::Tensor) -> Result<Addend<'_, B>> {
        match &self.local.weight {
            Weight::Dense(w) if self.parallel.world() == 1 => Ok(Addend::Projection {
                x,
                w,
                bias: self.local.bias.as_ref(),
            }),
            _ => self.forward(b, &x).map(Addend::Ready),
        }
    }
}
