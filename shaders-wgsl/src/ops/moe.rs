//! Mixture-of-experts ops: `moe_route` and `moe_experts`.

use crate::{f32_param, pipelines, WTensor, WgslBackend};
use anyhow::{ensure, Context, Result};
use dayone_backend::{Backend, DType, ExpertAct, ExpertOptions, MoeRouting};

impl WgslBackend {
    pub(crate) fn moe_route_impl(
        &self,
        x: &WTensor,
        gate_w: &WTensor,
        bias: Option<&WTensor>,
        routing: &MoeRouting,
    ) -> Result<(WTensor, WTensor)> {
        const OP: &str = "moe_route";
        ensure!(
            x.shape.len() == 2 && gate_w.shape.len() == 2 && gate_w.shape[1] == x.shape[1],
            "{OP}: expected x [N, D] and gate_w [E, D], got {:?} and {:?}",
            x.shape,
            gate_w.shape
        );
        let (n, e) = (x.shape[0], gate_w.shape[0]);
        let k = routing.top_k;
        let g = routing.n_group.max(1);
        ensure!(k >= 1 && k <= e, "{OP}: top_k {k} must be in 1..={e}");
        ensure!(
            e.is_multiple_of(g) && routing.topk_group >= 1 && routing.topk_group <= g && g <= 32,
            "{OP}: {e} experts in {g} groups (at most 32), topk_group {} must be in 1..={g}",
            routing.topk_group
        );
        let bias = match bias {
            Some(b) => {
                ensure!(
                    b.shape == [e],
                    "{OP}: bias must have shape [{e}], got {:?}",
                    b.shape
                );
                Some(self.f32_of(OP, "bias", b)?)
            }
            None => None,
        };
        // Router logits x · gate_wᵀ [N, E] in f32, then one invocation per token.
        let logits = self
            .linear(x, gate_w, None)
            .context("moe_route: router logits")?;
        let ids = self.alloc(&[n, k], DType::U32)?;
        let weights = self.alloc(&[n, k], DType::F32)?;
        if n == 0 {
            return Ok((ids, weights));
        }
        let bb = match &bias {
            Some(b) => b.single(OP, "bias")?,
            None => &self.dummy,
        };
        let p = [
            n as u32,
            e as u32,
            k as u32,
            g as u32,
            (e / g) as u32,
            routing.topk_group as u32,
            routing.norm_topk_prob as u32,
            bias.is_some() as u32,
            f32_param(routing.routed_scaling_factor),
            0,
            0,
            0,
        ];
        self.dispatch(
            &pipelines::MOE_ROUTE_K,
            &p,
            &[
                logits.single(OP, "logits")?,
                bb,
                ids.single(OP, "ids")?,
                weights.single(OP, "weights")?,
            ],
            Self::grid(OP, (n as u64).div_ceil(64))?,
        )?;
        Ok((ids, weights))
    }

    pub(crate) fn moe_experts_impl(
        &self,
        x: &WTensor,
        ids: &WTensor,
        weights: &WTensor,
        gate_up: &WTensor,
        down: &WTensor,
        opts: &ExpertOptions<WTensor>,
    ) -> Result<WTensor> {
        const OP: &str = "moe_experts";
        ensure!(
            x.shape.len() == 2 && gate_up.shape.len() == 3 && down.shape.len() == 3,
            "{OP}: expected x [N, D], gate_up [E, 2F, D], down [E, D, F], got {:?}, {:?}, {:?}",
            x.shape,
            gate_up.shape,
            down.shape
        );
        let (n, d) = (x.shape[0], x.shape[1]);
        let (e, f2) = (gate_up.shape[0], gate_up.shape[1]);
        let f = f2 / 2;
        ensure!(
            gate_up.shape[2] == d && f2 % 2 == 0 && f > 0,
            "{OP}: gate_up must have shape [E, 2F, {d}], got {:?}",
            gate_up.shape
        );
        ensure!(
            down.shape == [e, d, f],
            "{OP}: down must have shape [{e}, {d}, {f}], got {:?}",
            down.shape
        );
        ensure!(
            ids.shape.len() == 2 && ids.shape[0] == n && weights.shape == ids.shape,
            "{OP}: ids and weights must have shape [{n}, k], got {:?} and {:?}",
            ids.shape,
            weights.shape
        );
        let k = ids.shape[1];
        Self::u32_in(OP, "ids", ids)?;
        let x = &self.f32_of(OP, "x", x)?;
        let weights = &self.f32_of(OP, "weights", weights)?;
        let (gub, gbf) = self.weight_in(OP, "gate_up", gate_up)?;
        let (dnb, dbf) = self.weight_in(OP, "down", down)?;
        let out = self.alloc(&[n, d], DType::F32)?;
        if n * d == 0 {
            return Ok(out);
        }
        ensure!(
            (n * k * f) < u32::MAX as usize && (e * f2 * d) < u32::MAX as usize,
            "{OP}: sizes exceed 32-bit indexing"
        );
        let hmid = self.alloc(&[n, k.max(1), f], DType::F32)?;
        let hb = hmid.single(OP, "scratch")?;
        let ib = ids.single(OP, "ids")?;
        let wg = !self.cpu_kernels;
        // silu(g) ⊙ u for every (token, slot) into the scratch [N, k, F].
        let total = n * k * f;
        let (spec, g) = if wg {
            (&pipelines::MOE_ACT_WG, Self::grid(OP, total as u64)?)
        } else {
            (
                &pipelines::MOE_ACT_LANES,
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )
        };
        let (act, alpha, limit) = match opts.act {
            ExpertAct::Swiglu => (0, 0.0, 0.0),
            ExpertAct::GptOss { alpha, limit } => (1, alpha, limit),
            ExpertAct::SwigluClamped { limit } => (2, 0.0, limit),
        };
        let bias =
            |t: Option<&WTensor>, shape: [usize; 2], what: &str| -> Result<Option<WTensor>> {
                match t {
                    Some(t) => {
                        ensure!(
                            t.shape == shape,
                            "{OP}: {what} must be {shape:?}, got {:?}",
                            t.shape
                        );
                        Ok(Some(self.f32_of(OP, what, t)?))
                    }
                    None => Ok(None),
                }
            };
        let gu_bias = bias(opts.gate_up_bias, [e, f2], "gate_up_bias")?;
        let dn_bias = bias(opts.down_bias, [e, d], "down_bias")?;
        fn buf<'a>(dummy: &'a wgpu::Buffer, t: &'a Option<WTensor>) -> Result<&'a wgpu::Buffer> {
            match t {
                Some(t) => t.single("moe_experts", "bias"),
                None => Ok(dummy),
            }
        }
        let p = [
            d as u32,
            f as u32,
            k as u32,
            e as u32,
            total as u32,
            gbf,
            act,
            gu_bias.is_some() as u32,
            f32_param(alpha),
            f32_param(limit),
            0,
            0,
        ];
        self.dispatch(
            spec,
            &p,
            &[x.single(OP, "x")?, ib, gub, hb, buf(&self.dummy, &gu_bias)?],
            g,
        )?;
        // The weighted down-projection sum per (token, output).
        let total = n * d;
        let (spec, g) = if wg {
            (&pipelines::MOE_DOWN_WG, Self::grid(OP, total as u64)?)
        } else {
            (
                &pipelines::MOE_DOWN_LANES,
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )
        };
        let p = [
            d as u32,
            f as u32,
            k as u32,
            e as u32,
            total as u32,
            dbf,
            dn_bias.is_some() as u32,
            0,
        ];
        self.dispatch(
            spec,
            &p,
            &[
                hb,
                ib,
                weights.single(OP, "weights")?,
                dnb,
                out.single(OP, "output")?,
                buf(&self.dummy, &dn_bias)?,
            ],
            g,
        )?;
        Ok(out)
    }
}
