//! SwiGLU feed-forward (Shazeer 2020): `down(silu(gate·x) ⊙ up·x)`; with a limit `l`
//! (GLM-5.3-Flash's `swiglu_limit`), `down(silu(min(g, l)) ⊙ clamp(u, −l, l))`.

use super::Linear;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, HostTensor, TensorInfo};

/// `gate`/`up` `[F, D]`, `down` `[D, F]`.
pub struct Mlp<B: Backend> {
    /// `[F, D]`.
    pub gate: Linear<B>,
    /// `[F, D]`.
    pub up: Linear<B>,
    /// `[D, F]`.
    pub down: Linear<B>,
    /// SwiGLU clamp (`swiglu_limit`), `None`: none.
    pub limit: Option<f32>,
}

/// `silu(min(g, l)) ⊙ clamp(u, −l, l)` element-wise, in f32.
pub fn clamped_swiglu(g: &[f32], u: &[f32], l: f32) -> Vec<f32> {
    g.iter()
        .zip(u)
        .map(|(&g, &u)| {
            let g = g.min(l);
            g / (1.0 + (-g).exp()) * u.clamp(-l, l)
        })
        .collect()
}

/// [`clamped_swiglu`] of two device tensors `[M, F]`, composed on the host (the backends have
/// no clamp op): downloads both, uploads the product in `g`'s dtype.
pub fn clamped_swiglu_device<B: Backend>(
    b: &B,
    g: &B::Tensor,
    u: &B::Tensor,
    l: f32,
) -> Result<B::Tensor> {
    let act = clamped_swiglu(&b.download(g)?.to_f32(), &b.download(u)?.to_f32(), l);
    b.upload(&HostTensor::from_f32_as(
        g.shape().to_vec(),
        &act,
        g.dtype(),
    )?)
}

impl<B: Backend> Mlp<B> {
    /// Loads `{prefix}.{gate,up,down}_proj`.
    pub fn load(w: &WeightLoader<B>, prefix: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(w, &format!("{prefix}.gate_proj"), inter, hidden, false)?,
            up: Linear::load(w, &format!("{prefix}.up_proj"), inter, hidden, false)?,
            down: Linear::load(w, &format!("{prefix}.down_proj"), hidden, inter, false)?,
            limit: None,
        })
    }

    /// The same MLP with its SwiGLU clamped at `limit`.
    pub fn with_limit(mut self, limit: Option<f32>) -> Self {
        self.limit = limit;
        self
    }

    /// `x` `[N, D]` → `[N, D]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let g = self.gate.forward(b, x)?;
        let u = self.up.forward(b, x)?;
        let act = match self.limit {
            Some(l) => clamped_swiglu_device(b, &g, &u, l)?,
            None => b.silu_mul(&g, &u)?,
        };
        self.down.forward(b, &act)
    }
}
