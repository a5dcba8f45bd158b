//! SwiGLU feed-forward (Shazeer 2020): `down(silu(gate·x) ⊙ up·x)`; with a limit `l`
//! (GLM-5.3-Flash's `swiglu_limit`), `down(silu(min(g, l)) ⊙ clamp(u, −l, l))`.

use super::{Linear, RowLinear, Weight};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::Backend;

/// `gate`/`up` `[F, D]`, `down` `[D, F]`; over several ranks each keeps `F / world` of the
/// width (gate and up column-parallel, down row-parallel).
pub struct Mlp<B: Backend> {
    /// `[F / world, D]`.
    pub gate: Linear<B>,
    /// `[F / world, D]`.
    pub up: Linear<B>,
    /// `[D, F / world]`, row-parallel.
    pub down: RowLinear<B>,
    /// SwiGLU clamp (`swiglu_limit`), `None`: none.
    pub limit: Option<f32>,
}

impl<B: Backend> Mlp<B> {
    /// Loads `{prefix}.{gate,up,down}_proj` (this rank's slice of the width `inter`).
    /// Errors: missing or misshapen tensors; a width that does not split over the ranks.
    pub fn load(w: &WeightLoader<B>, prefix: &str, hidden: usize, inter: usize) -> Result<Self> {
        let world = w.parallel().world();
        if !inter.is_multiple_of(world) {
            anyhow::bail!(
                "{prefix}: the MLP width {inter} does not split over tensor_parallel_size {world}"
            );
        }
        Ok(Self {
            gate: Linear::column(w, &format!("{prefix}.gate_proj"), inter, hidden, false)?,
            up: Linear::column(w, &format!("{prefix}.up_proj"), inter, hidden, false)?,
            down: RowLinear::load(w, &format!("{prefix}.down_proj"), hidden, inter, false)?,
            limit: None,
        })
    }

    /// The same MLP with its SwiGLU clamped at `limit`.
    pub fn with_limit(mut self, limit: Option<f32>) -> Self {
        self.limit = limit;
        self
    }

    /// `x` `[N, D]` → `[N, D]`, summed over the ranks.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let y = self.forward_partial(b, x)?;
        self.down.parallel.all_reduce(b, &y)
    }

    /// `x` `[N, D]` → this rank's partial `[N, D]` (its slice of the width), not yet summed.
    pub fn forward_partial(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let act = match (&self.gate, &self.up, self.limit) {
            // Dense, bias-free SwiGLU: one call (one decode GEMV launch on CUDA).
            (
                Linear {
                    weight: Weight::Dense(wg),
                    bias: None,
                },
                Linear {
                    weight: Weight::Dense(wu),
                    bias: None,
                },
                None,
            ) => b.linear_silu_mul(x, wg, wu)?,
            _ => {
                let [g, u] = Linear::forward_n(b, x, [&self.gate, &self.up])?;
                match self.limit {
                    Some(l) => b.silu_mul_limit(&g, &u, l)?,
                    None => b.silu_mul(&g, &u)?,
                }
            }
        };
        self.down.forward_partial(b, &act)
    }
}
