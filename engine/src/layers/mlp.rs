//! SwiGLU feed-forward (Shazeer 2020): `down(silu(gate·x) ⊙ up·x)`.

use super::Linear;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::Backend;

/// `gate`/`up` `[F, D]`, `down` `[D, F]`.
pub struct Mlp<B: Backend> {
    /// `[F, D]`.
    pub gate: Linear<B>,
    /// `[F, D]`.
    pub up: Linear<B>,
    /// `[D, F]`.
    pub down: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    /// Loads `{prefix}.{gate,up,down}_proj`.
    pub fn load(w: &WeightLoader<B>, prefix: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(w, &format!("{prefix}.gate_proj"), inter, hidden, false)?,
            up: Linear::load(w, &format!("{prefix}.up_proj"), inter, hidden, false)?,
            down: Linear::load(w, &format!("{prefix}.down_proj"), hidden, inter, false)?,
        })
    }

    /// `x` `[N, D]` → `[N, D]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let g = self.gate.forward(b, x)?;
        let u = self.up.forward(b, x)?;
        self.down.forward(b, &b.silu_mul(&g, &u)?)
    }
}
