//! SwiGLU feed-forward (Shazeer 2020): `down(silu(gate·x) ⊙ up·x)`; with a limit `l`
//! (GLM-5.3-Flash's `swiglu_limit`), `down(silu(min(g, l)) ⊙ clamp(u, −l, l))`.

use super::{Addend, Linear, PreNorm, RowLinear, Weight};
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

    /// [`Mlp::forward`] of a pre-norm input: gate and up take the norm in their own call where
    /// the backend fuses it ([`PreNorm::linear_silu_mul`]); the same values, `down` still to
    /// project on one rank ([`RowLinear::forward_addend`]).
    pub fn forward_pre(&self, b: &B, input: &PreNorm<B>) -> Result<Addend<'_, B>> {
        let act = match self.fused_gate_up() {
            Some((wg, wu)) => input.linear_silu_mul(b, wg, wu)?,
            None => {
                let gu = input.linear_many(b, &[&self.gate, &self.up])?;
                self.activation(b, &gu[0], &gu[1])?
            }
        };
        // down as the residual's addend: with the next norm in one call where it can be.
        self.down.forward_addend(b, act)
    }

    /// `x` `[N, D]` → this rank's partial `[N, D]` (its slice of the width), not yet summed.
    pub fn forward_partial(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let act = match self.fused_gate_up() {
            Some((wg, wu)) => b.linear_silu_mul(x, wg, wu)?,
            None => {
                let [g, u] = Linear::forward_n(b, x, [&self.gate, &self.up])?;
                self.activation(b, &g, &u)?
            }
        };
        self.down.forward_partial(b, &act)
    }

    /// Gate and up weights when the first half is one [`Backend::linear_silu_mul`] call: dense,
    /// bias-free, unclamped SwiGLU (one decode GEMV launch on CUDA).
    fn fused_gate_up(&self) -> Option<(&B::Tensor, &B::Tensor)> {
        match (&self.gate, &self.up, self.limit) {
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
            ) => Some((wg, wu)),
            _ => None,
        }
    }

    /// `[gate, up, down]` when the whole MLP is dense, bias-free and unclamped (what
    /// [`Backend::moe_experts_shared`] takes for a shared expert), else `None`.
    pub fn dense_swiglu(&self) -> Option<[&B::Tensor; 3]> {
        let (wg, wu) = self.fused_gate_up()?;
        match &self.down.local {
            Linear {
                weight: Weight::Dense(wd),
                bias: None,
            } => Some([wg, wu, wd]),
            _ => None,
        }
    }

    /// SwiGLU of the projections `g`, `u` `[N, F]`, clamped when the MLP has a limit.
    fn activation(&self, b: &B, g: &B::Tensor, u: &B::Tensor) -> Result<B::Tensor> {
        match self.limit {
            Some(l) => b.silu_mul_limit(g, u, l),
            None => b.silu_mul(g, u),
        }
    }
}
