//! A sublayer's output on its way into the residual stream `h ← h + y`.
//!
//! The next pre-norm sublayer reads `norm(h + y)`. When `y` is a single-rank dense projection
//! `x·Wᵀ (+ b)` it is handed over not yet computed, so the projection, the residual add and the
//! norm can run as one backend call ([`Backend::linear_add_rms_norm`]; on CUDA decode the
//! GEMV's last block adds and normalises) — the same values, bit for bit, as computing `y`
//! first.

use anyhow::Result;
use dayone_backend::Backend;

/// `y` `[N, D]`, computed or still to project.
pub enum Addend<'a, B: Backend> {
    /// Computed.
    Ready(B::Tensor),
    /// `x·wᵀ (+ bias)`: `x` `[N, K]`, `w` `[D, K]`, `bias` `[D]`, of one rank (no all-reduce
    /// between the projection and the add).
    Projection {
        /// `[N, K]`.
        x: B::Tensor,
        /// `[D, K]`.
        w: &'a B::Tensor,
        /// `[D]`.
        bias: Option<&'a B::Tensor>,
    },
}

impl<B: Backend> Addend<'_, B> {
    /// `y` itself (one [`Backend::linear`] for a projection).
    pub fn tensor(self, b: &B) -> Result<B::Tensor> {
        match self {
            Addend::Ready(y) => Ok(y),
            Addend::Projection { x, w, bias } => b.linear(&x, w, bias),
        }
    }

    /// `h + y`: one [`Backend::add`] (after the projection's [`Backend::linear`]).
    pub fn add_to(&self, b: &B, h: &B::Tensor) -> Result<B::Tensor> {
        match self {
            Addend::Ready(y) => b.add(h, y),
            Addend::Projection { x, w, bias } => b.add(h, &b.linear(x, w, *bias)?),
        }
    }
}
