//! A dense projection `y = x·Wᵀ + b`.

use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::Backend;

/// Weight `[out, in]` (safetensors layout) and optional bias `[out]`.
pub struct Linear<B: Backend> {
    /// `[out, in]`.
    pub weight: B::Tensor,
    /// `[out]`.
    pub bias: Option<B::Tensor>,
}

impl<B: Backend> Linear<B> {
    /// Loads `{prefix}.weight` (and `{prefix}.bias` when `bias`).
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        out_dim: usize,
        in_dim: usize,
        bias: bool,
    ) -> Result<Self> {
        let weight = w.get(&format!("{prefix}.weight"), &[out_dim, in_dim])?;
        let bias = if bias {
            Some(w.get(&format!("{prefix}.bias"), &[out_dim])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    /// `x` `[M, in]` → `[M, out]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        b.linear(x, &self.weight, self.bias.as_ref())
    }
}
