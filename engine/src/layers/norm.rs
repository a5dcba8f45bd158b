//! RMSNorm (Zhang & Sennrich 2019): `y = w ⊙ x / sqrt(mean(x²) + eps)`, in f32.

use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::Backend;

/// An RMSNorm over the last dimension with weight `[D]`.
pub struct RmsNorm<B: Backend> {
    /// `[D]`.
    pub weight: B::Tensor,
    /// Added to the mean square.
    pub eps: f32,
}

impl<B: Backend> RmsNorm<B> {
    /// Loads `{prefix}.weight` of shape `[dim]`.
    pub fn load(w: &WeightLoader<B>, prefix: &str, dim: usize, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: w.get(&format!("{prefix}.weight"), &[dim])?,
            eps: eps as f32,
        })
    }

    /// `x` `[R, D]` → `[R, D]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        b.rms_norm(x, &self.weight, self.eps)
    }

    /// The residual `h + a` and its norm, `(h + a, norm(h + a))`, in one backend call
    /// ([`Backend::add_rms_norm`]; each as `add` then [`RmsNorm::forward`] compute them).
    pub fn add_forward(
        &self,
        b: &B,
        h: &B::Tensor,
        a: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor)> {
        b.add_rms_norm(h, a, &self.weight, self.eps)
    }
}
