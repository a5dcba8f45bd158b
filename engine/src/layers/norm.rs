//! RMSNorm (Zhang & Sennrich 2019): `y = w ⊙ x / sqrt(mean(x²) + eps)`, in f32.

use super::linear::Linear;
use super::Addend;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, MoeRouting};
use std::cell::OnceCell;

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

/// A pre-norm sublayer's input `x = norm(h + m)` (or `norm(h)`), not computed until the
/// sublayer asks for it: its first projections can take the un-normalised rows
/// ([`PreNorm::linear_many`], [`PreNorm::linear_silu_mul`] → [`Backend::rms_norm_linear_many`],
/// [`Backend::rms_norm_linear_silu_mul`]: on CUDA decode the norm runs inside the projections'
/// launch), and a sublayer that needs `x` itself calls [`PreNorm::x`]. Every path computes
/// the same values bit for bit. The block reads the residual `h + m` back with
/// [`PreNorm::into_sum`]. When `m` is a projection not yet computed ([`Addend::Projection`]),
/// the first call runs it with the add and the norm ([`Backend::linear_add_rms_norm`]).
pub struct PreNorm<'a, B: Backend> {
    norm: &'a RmsNorm<B>,
    /// `[N, D]`.
    h: &'a B::Tensor,
    /// The pending addend `[N, D]`, if any.
    m: Option<&'a Addend<'a, B>>,
    /// `h + m` once some call computed it.
    sum: OnceCell<B::Tensor>,
    /// `m` itself once computed, when it was handed over as a projection the backend does not
    /// fuse with the add and the norm.
    y: OnceCell<B::Tensor>,
    /// `x` once materialised.
    x: OnceCell<B::Tensor>,
}

impl<'a, B: Backend> PreNorm<'a, B> {
    /// The input `norm(h + m)` of a sublayer (`m` `None`: `norm(h)`); `h`, `m` `[N, D]`.
    pub fn new(norm: &'a RmsNorm<B>, h: &'a B::Tensor, m: Option<&'a Addend<'a, B>>) -> Self {
        Self {
            norm,
            h,
            m,
            sum: OnceCell::new(),
            y: OnceCell::new(),
            x: OnceCell::new(),
        }
    }

    /// The rows still to normalise and the addend still to add: `(h + m, None)` once the sum
    /// exists, else `(h, m)`. An addend still to project is projected first: with the add and
    /// the norm in one [`Backend::linear_add_rms_norm`] where the backend prefers that (which
    /// sets the sum and `x`), else on its own (so the caller's norm fusions still apply).
    fn operands(&self, b: &B) -> Result<(&B::Tensor, Option<&B::Tensor>)> {
        if let (None, None, Some(Addend::Projection { x, w, bias })) =
            (self.sum.get(), self.y.get(), self.m)
        {
            let g = &self.norm.weight;
            if b.prefers_linear_add_rms_norm(x, w, *bias, self.h, g) {
                let (s, x) = b.linear_add_rms_norm(x, w, *bias, self.h, g, self.norm.eps)?;
                self.keep_sum(Some(s));
                let _ = self.x.set(x);
            } else {
                let _ = self.y.set(b.linear(x, w, *bias)?);
            }
        }
        Ok(match (self.sum.get(), self.m) {
            (Some(s), _) => (s, None),
            (None, Some(Addend::Ready(m))) => (self.h, Some(m)),
            (None, Some(Addend::Projection { .. })) => (self.h, self.y.get()),
            (None, None) => (self.h, None),
        })
    }

    /// Keeps the sum a call returned (the first one; later calls add nothing).
    fn keep_sum(&self, sum: Option<B::Tensor>) {
        if let Some(s) = sum {
            let _ = self.sum.set(s);
        }
    }

    /// `x` `[N, D]` (computed once: `add_rms_norm`, or `rms_norm` of the sum or of `h`).
    pub fn x(&self, b: &B) -> Result<&B::Tensor> {
        let operands = self.operands(b)?;
        if let Some(x) = self.x.get() {
            return Ok(x);
        }
        let x = match operands {
            (a, Some(m)) => {
                let (s, x) = self.norm.add_forward(b, a, m)?;
                self.keep_sum(Some(s));
                x
            }
            (a, None) => self.norm.forward(b, a)?,
        };
        Ok(self.x.get_or_init(|| x))
    }

    /// [`Linear::forward_many`] of `x`: one [`Backend::rms_norm_linear_many`] call (the norm
    /// fused into the projections where the backend can) when every weight is dense and `x`
    /// was not materialised yet.
    pub fn linear_many(&self, b: &B, layers: &[&Linear<B>]) -> Result<Vec<B::Tensor>> {
        let (a, m) = self.operands(b)?;
        match Linear::dense_parts(layers).filter(|_| self.x.get().is_none()) {
            Some(parts) => {
                let (sum, ys) =
                    b.rms_norm_linear_many(a, m, &self.norm.weight, self.norm.eps, &parts)?;
                self.keep_sum(sum);
                Ok(ys)
            }
            None => Linear::forward_many(b, self.x(b)?, layers),
        }
    }

    /// [`Backend::moe_route`] of `x` (`gate_w` `[E, D]` f32, `bias` `[E]`) → (`ids`, `weights`)
    /// `[N, k]`: one [`Backend::rms_norm_moe_route`] call that also keeps `x` and the sum for
    /// the experts, unless `x` was materialised.
    pub fn moe_route(
        &self,
        b: &B,
        gate_w: &B::Tensor,
        bias: Option<&B::Tensor>,
        routing: &MoeRouting,
    ) -> Result<(B::Tensor, B::Tensor)> {
        let (a, m) = self.operands(b)?;
        if let Some(x) = self.x.get() {
            return b.moe_route(x, gate_w, bias, routing);
        }
        let route = b.rms_norm_moe_route(
            a,
            m,
            &self.norm.weight,
            self.norm.eps,
            gate_w,
            bias,
            routing,
        )?;
        self.keep_sum(route.sum);
        let _ = self.x.set(route.x);
        Ok((route.ids, route.weights))
    }

    /// [`PreNorm::linear_many`] for a fixed number of projections, as an array.
    pub fn linear_n<const N: usize>(
        &self,
        b: &B,
        layers: [&Linear<B>; N],
    ) -> Result<[B::Tensor; N]> {
        super::outputs("linear_many", self.linear_many(b, &layers)?)
    }

    /// [`Backend::linear_silu_mul`] of `x` with dense `w_gate`, `w_up` `[F, D]` → `[N, F]`:
    /// one [`Backend::rms_norm_linear_silu_mul`] call unless `x` was materialised.
    pub fn linear_silu_mul(
        &self,
        b: &B,
        w_gate: &B::Tensor,
        w_up: &B::Tensor,
    ) -> Result<B::Tensor> {
        let (a, m) = self.operands(b)?;
        if let Some(x) = self.x.get() {
            return b.linear_silu_mul(x, w_gate, w_up);
        }
        let (sum, y) =
            b.rms_norm_linear_silu_mul(a, m, &self.norm.weight, self.norm.eps, w_gate, w_up)?;
        self.keep_sum(sum);
        Ok(y)
    }

    /// The residual `h + m` (`h` without `m`), adding it now if no call did.
    pub fn into_sum(self, b: &B) -> Result<B::Tensor> {
        match (self.sum.into_inner(), self.y.into_inner(), self.m) {
            (Some(s), _, _) => Ok(s),
            (None, Some(y), _) => b.add(self.h, &y),
            (None, None, Some(m)) => m.add_to(b, self.h),
            (None, None, None) => Ok(self.h.clone()),
        }
    }
}
