//! Element-wise, normalisation, rotary and selection ops: `rms_norm`, `rope`, `silu_mul`, `add`,
//! `stream_mix`, `argmax`.

use crate::pipelines::Spec;
use crate::{f32_param, pipelines, WTensor, WgslBackend};
use anyhow::{ensure, Result};
use dayone_backend::{DType, RopeStyle, TensorInfo};

impl WgslBackend {
    fn elementwise(&self, op: &str, spec: &Spec, a: &WTensor, b: &WTensor) -> Result<WTensor> {
        self.elementwise_with(op, spec, a, b, 0)
    }

    /// [`Self::elementwise`] with one more parameter word (`silu_mul_limit`'s clamp as f32 bits).
    fn elementwise_with(
        &self,
        op: &str,
        spec: &Spec,
        a: &WTensor,
        b: &WTensor,
        param: u32,
    ) -> Result<WTensor> {
        let a = &self.f32_of(op, "a", a)?;
        let b = &self.f32_of(op, "b", b)?;
        ensure!(
            a.shape == b.shape,
            "{op}: operands must have equal shapes, got {:?} and {:?}",
            a.shape,
            b.shape
        );
        let out = self.alloc(&a.shape, DType::F32)?;
        let n = a.numel();
        let g = Self::grid(op, (n as u64).div_ceil(1024))?;
        self.dispatch(
            spec,
            &[n as u32, param, 0, 0],
            &[
                a.single(op, "a")?,
                b.single(op, "b")?,
                out.single(op, "out")?,
            ],
            g,
        )?;
        Ok(out)
    }

    pub(crate) fn rms_norm_impl(&self, x: &WTensor, w: &WTensor, eps: f32) -> Result<WTensor> {
        const OP: &str = "rms_norm";
        ensure!(
            !x.shape.is_empty(),
            "{OP}: x must have shape [R, D], got {:?}",
            x.shape
        );
        let d = *x.shape.last().unwrap_or(&0);
        ensure!(
            w.shape == [d],
            "{OP}: w must have shape [{d}] to match x {:?}, got {:?}",
            x.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let w = &self.f32_of(OP, "w", w)?;
        let rows = x.numel().checked_div(d).unwrap_or(0);
        let out = self.alloc(&x.shape, DType::F32)?;
        let g = Self::grid(OP, rows as u64)?;
        self.dispatch(
            &pipelines::RMS_NORM,
            &[rows as u32, d as u32, f32_param(eps), 0],
            &[
                x.single(OP, "x")?,
                w.single(OP, "w")?,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
    }

    /// [`dayone_backend::Backend::add_rms_norm`]: one `add_rms_norm` dispatch (norm.wgsl),
    /// both outputs bit-equal to `add` then `rms_norm`. Errors: `a`, `r` of different shapes;
    /// `w` not `[D]`.
    pub(crate) fn add_rms_norm_impl(
        &self,
        a: &WTensor,
        r: &WTensor,
        w: &WTensor,
        eps: f32,
    ) -> Result<(WTensor, WTensor)> {
        const OP: &str = "add_rms_norm";
        ensure!(
            !a.shape.is_empty() && a.shape == r.shape,
            "{OP}: a and r must have one shape [R, D], got {:?} and {:?}",
            a.shape,
            r.shape
        );
        let d = *a.shape.last().unwrap_or(&0);
        ensure!(
            w.shape == [d],
            "{OP}: w must have shape [{d}] to match a {:?}, got {:?}",
            a.shape,
            w.shape
        );
        let a = &self.f32_of(OP, "a", a)?;
        let r = &self.f32_of(OP, "r", r)?;
        let w = &self.f32_of(OP, "w", w)?;
        let rows = a.numel().checked_div(d).unwrap_or(0);
        let sum = self.alloc(&a.shape, DType::F32)?;
        let out = self.alloc(&a.shape, DType::F32)?;
        let g = Self::grid(OP, rows as u64)?;
        self.dispatch(
            &pipelines::ADD_RMS_NORM,
            &[rows as u32, d as u32, f32_param(eps), 0],
            &[
                a.single(OP, "a")?,
                w.single(OP, "w")?,
                out.single(OP, "output")?,
                r.single(OP, "r")?,
                sum.single(OP, "sum")?,
            ],
            g,
        )?;
        Ok((sum, out))
    }

    pub(crate) fn rope_impl(
        &self,
        x: &WTensor,
        positions: &WTensor,
        inv_freq: &WTensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<WTensor> {
        const OP: &str = "rope";
        ensure!(
            x.shape.len() == 3,
            "{OP}: x must have shape [N, H, hd], got {:?}",
            x.shape
        );
        let (n, h, hd) = (x.shape[0], x.shape[1], x.shape[2]);
        ensure!(
            rot_dim > 0 && rot_dim.is_multiple_of(2) && rot_dim <= hd,
            "{OP}: rot_dim {rot_dim} must be even, positive and <= hd {hd}"
        );
        ensure!(
            positions.shape == [n],
            "{OP}: positions must have shape [{n}], got {:?}",
            positions.shape
        );
        ensure!(
            inv_freq.shape == [rot_dim / 2],
            "{OP}: inv_freq must have shape [{}], got {:?}",
            rot_dim / 2,
            inv_freq.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        Self::u32_in(OP, "positions", positions)?;
        let inv_freq = &self.f32_of(OP, "inv_freq", inv_freq)?;
        let out = self.alloc(&x.shape, DType::F32)?;
        let total = n * h * hd;
        let g = Self::grid(OP, (total as u64).div_ceil(256))?;
        let p = [
            total as u32,
            h as u32,
            hd as u32,
            rot_dim as u32,
            (style == RopeStyle::Interleaved) as u32,
            f32_param(mscale),
            0,
            0,
        ];
        self.dispatch(
            &pipelines::ROPE_K,
            &p,
            &[
                x.single(OP, "x")?,
                positions.single(OP, "positions")?,
                inv_freq.single(OP, "inv_freq")?,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
    }

    pub(crate) fn silu_mul_impl(&self, gate: &WTensor, up: &WTensor) -> Result<WTensor> {
        self.elementwise("silu_mul", &pipelines::SILU_MUL, gate, up)
    }

    pub(crate) fn silu_mul_limit_impl(
        &self,
        gate: &WTensor,
        up: &WTensor,
        limit: f32,
    ) -> Result<WTensor> {
        let p = crate::f32_param(limit);
        self.elementwise_with("silu_mul_limit", &pipelines::SILU_MUL_LIMIT, gate, up, p)
    }

    /// GELU (exact, or tanh with `approximate`); `x` is bound as both operands, the second unread.
    pub(crate) fn gelu_impl(&self, x: &WTensor, approximate: bool) -> Result<WTensor> {
        let spec = if approximate {
            &pipelines::GELU_TANH
        } else {
            &pipelines::GELU
        };
        self.elementwise("gelu", spec, x, x)
    }

    pub(crate) fn add_impl(&self, a: &WTensor, b: &WTensor) -> Result<WTensor> {
        self.elementwise("add", &pipelines::ADD, a, b)
    }

    /// `out[t, m, :] = Σ_s w[t, s, m] · x[t, s, :]`: `x` `[N, S, D]`, `w` `[N, S, M]` f32 →
    /// `[N, M, D]` f32 (one invocation per output element).
    pub(crate) fn stream_mix_impl(&self, x: &WTensor, w: &WTensor) -> Result<WTensor> {
        const OP: &str = "stream_mix";
        ensure!(
            x.shape.len() == 3,
            "{OP}: x must have shape [N, S, D], got {:?}",
            x.shape
        );
        let (n, s, d) = (x.shape[0], x.shape[1], x.shape[2]);
        ensure!(
            w.shape.len() == 3 && w.shape[0] == n && w.shape[1] == s,
            "{OP}: w must have shape [{n}, {s}, M] to match x {:?}, got {:?}",
            x.shape,
            w.shape
        );
        Self::float_in(OP, "w", w)?;
        let m = w.shape[2];
        let x = &self.f32_of(OP, "x", x)?;
        let out = self.alloc(&[n, m, d], DType::F32)?;
        let total = n * m * d;
        if total == 0 {
            return Ok(out);
        }
        ensure!(
            total <= u32::MAX as usize,
            "{OP}: output [{n}, {m}, {d}] exceeds 2^32 elements"
        );
        let g = Self::grid(OP, (total as u64).div_ceil(256))?;
        self.dispatch(
            &pipelines::STREAM_MIX_K,
            &[total as u32, s as u32, d as u32, m as u32],
            &[
                x.single(OP, "x")?,
                w.single(OP, "w")?,
                out.single(OP, "output")?,
            ],
            g,
        )?;
        Ok(out)
    }

    pub(crate) fn argmax_impl(&self, x: &WTensor) -> Result<WTensor> {
        const OP: &str = "argmax";
        ensure!(
            x.shape.len() == 2 && x.shape[1] > 0,
            "{OP}: x must have shape [R, V] with V > 0, got {:?}",
            x.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let (r, v) = (x.shape[0], x.shape[1]);
        let out = self.alloc(&[r], DType::U32)?;
        let g = Self::grid(OP, r as u64)?;
        self.dispatch(
            &pipelines::ARGMAX_K,
            &[r as u32, v as u32, 0, 0],
            &[x.single(OP, "x")?, out.single(OP, "output")?],
            g,
        )?;
        Ok(out)
    }
}
