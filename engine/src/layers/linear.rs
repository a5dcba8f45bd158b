//! A dense projection `y = x·Wᵀ + b`, its weight either floats or kept block-quantized.

use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, QuantTensor};

/// A projection weight `[out, in]`: floats in the storage dtype, or low-bit codes and scales
/// ([`dayone_backend::quant`]) decoded by the backend as it multiplies.
pub enum Weight<B: Backend> {
    /// `[out, in]` in the storage dtype.
    Dense(B::Tensor),
    /// `[1, out, in]` codes and scales (boxed: most projections are dense, and the enum sits
    /// in every layer).
    Quant(Box<QuantTensor<B::Tensor>>),
}

impl<B: Backend> Clone for Weight<B> {
    fn clone(&self) -> Self {
        match self {
            Weight::Dense(t) => Weight::Dense(t.clone()),
            Weight::Quant(q) => Weight::Quant(q.clone()),
        }
    }
}

impl<B: Backend> Weight<B> {
    /// `x` `[M, in]` → `[M, out]` (+ bias).
    pub fn forward(&self, b: &B, x: &B::Tensor, bias: Option<&B::Tensor>) -> Result<B::Tensor> {
        match self {
            Weight::Dense(w) => b.linear(x, w, bias),
            Weight::Quant(q) => b.linear_quant(x, q, bias),
        }
    }
}

/// Weight `[out, in]` (safetensors layout) and optional bias `[out]`.
pub struct Linear<B: Backend> {
    /// `[out, in]`.
    pub weight: Weight<B>,
    /// `[out]`.
    pub bias: Option<B::Tensor>,
}

impl<B: Backend> Linear<B> {
    /// Loads `{prefix}.weight` (kept quantized when the checkpoint stores it in a kept block
    /// format, see [`WeightLoader::get_weight`]) and `{prefix}.bias` when `bias`.
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        out_dim: usize,
        in_dim: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight = w.get_weight(prefix, out_dim, in_dim)?;
        let bias = if bias {
            Some(w.get(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    /// A dense projection from a float weight `[out, in]`.
    pub fn dense(weight: B::Tensor, bias: Option<B::Tensor>) -> Self {
        Self {
            weight: Weight::Dense(weight),
            bias,
        }
    }

    /// `x` `[M, in]` → `[M, out]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        self.weight.forward(b, x, self.bias.as_ref())
    }

    /// Several projections of one `x` `[M, in]` → `[M, outᵢ]` each, as [`Linear::forward`]
    /// computes them; through one [`Backend::linear_many`] call when every weight is dense
    /// (q/k/v, gate/up: one decode GEMV launch on CUDA instead of one per projection).
    pub fn forward_many(b: &B, x: &B::Tensor, layers: &[&Linear<B>]) -> Result<Vec<B::Tensor>> {
        match Self::dense_parts(layers) {
            Some(parts) => b.linear_many(x, &parts),
            None => layers.iter().map(|l| l.forward(b, x)).collect(),
        }
    }

    /// Every layer's (weight, bias) when all the weights are dense (what
    /// [`Backend::linear_many`] takes), else `None`.
    #[allow(clippy::type_complexity)]
    pub fn dense_parts<'a>(
        layers: &[&'a Linear<B>],
    ) -> Option<Vec<(&'a B::Tensor, Option<&'a B::Tensor>)>> {
        layers
            .iter()
            .map(|l| match &l.weight {
                Weight::Dense(w) => Some((w, l.bias.as_ref())),
                Weight::Quant(_) => None,
            })
            .collect()
    }

    /// [`Linear::forward_many`] for a fixed number of projections, as an array.
    pub fn forward_n<const N: usize>(
        b: &B,
        x: &B::Tensor,
        layers: [&Linear<B>; N],
    ) -> Result<[B::Tensor; N]> {
        super::outputs("linear_many", Self::forward_many(b, x, &layers)?)
    }
}
