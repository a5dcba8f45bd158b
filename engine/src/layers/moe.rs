//! Mixture-of-Experts feed-forward with a sigmoid, group-limited router and shared experts
//! (DeepSeek-V3 report §2.1.2; HF `DeepseekV3MoE`):
//! `y = Σ_{e ∈ topk} w_e · Expert_e(x) + SharedExpert(x)`, experts being SwiGLU MLPs.

use super::{Mlp, PreNorm, QuantExperts};
use crate::loader::Split;
use crate::parallel::Parallel;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, ExpertAct, ExpertOptions, MoeRouting, QuantHost};

/// Widths of an MoE block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeShape {
    /// Residual width `D`.
    pub hidden: usize,
    /// Routed experts `E`.
    pub experts: usize,
    /// Width `F` of each routed expert.
    pub expert_dim: usize,
    /// Width of the shared expert MLP (0: none).
    pub shared_dim: usize,
}

/// The spellings of the per-expert projection names an architecture's checkpoints use (each
/// list tried in order; DeepSeek's `gate_proj`/`up_proj`/`down_proj`, Kimi's `w1`/`w3`/`w2`).
/// The architecture files hold the tables; the layer only looks the names up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertNames {
    /// Gate projection `[F, D]`.
    pub gate: &'static [&'static str],
    /// Up projection `[F, D]`.
    pub up: &'static [&'static str],
    /// Down projection `[D, F]`.
    pub down: &'static [&'static str],
}

/// One MoE block's weights. Over several ranks a rank holds experts
/// `first_expert..first_expert + local_experts` (its expert group's), each cut to its share of
/// the width, and its slice of the shared experts; [`Moe::forward`] sums the ranks' parts.
pub struct Moe<B: Backend> {
    /// Router weight `[E, D]` f32.
    pub gate: B::Tensor,
    /// `e_score_correction_bias` `[E]` f32 (choice only), when the checkpoint has one.
    pub bias: Option<B::Tensor>,
    /// Stacked `[gate; up]` projections `[E, 2F, D]` (`[1, 1, 1]` when the experts are kept
    /// quantized in `quant`).
    pub gate_up: B::Tensor,
    /// Stacked down projections `[E, D, F]` (likewise).
    pub down: B::Tensor,
    /// The routed experts in their low-bit form, decoded per step ([`QuantExperts`]).
    pub quant: Option<Box<QuantExperts<B>>>,
    /// Shared experts as one MLP.
    pub shared: Option<Mlp<B>>,
    /// Router settings.
    pub routing: MoeRouting,
    /// SwiGLU clamp (`swiglu_limit`): the routed experts then run through
    /// [`Backend::moe_experts_ext`] with [`ExpertAct::SwigluClamped`].
    pub clamped: Option<f32>,
    /// The first routed expert this rank holds.
    pub first_expert: usize,
    /// Routed experts this rank holds (`E` on one rank).
    pub local_experts: usize,
    /// All routed experts `E` (the router's width).
    pub experts: usize,
    /// The ranks holding the other experts and slices.
    pub parallel: Parallel<B>,
}

/// The prefix `{p}.{spelling}` of the first spelling whose weight the checkpoint has, in any
/// stored form (`.weight`, or compressed-tensors' `.weight_packed`).
fn expert_prefix<B: Backend>(w: &WeightLoader<B>, p: &str, spellings: &[&str]) -> Result<String> {
    let c: Vec<String> = spellings.iter().map(|a| format!("{p}.{a}")).collect();
    match c.iter().find(|c| w.has_weight(c)) {
        Some(c) => Ok(c.clone()),
        None => {
            let names: Vec<String> = c.iter().map(|c| format!("{c}.weight")).collect();
            w.first_of(&names)
        }
    }
}

impl<B: Backend> Moe<B> {
    /// Loads `{prefix}.gate.weight`, `{prefix}.gate.e_score_correction_bias` (optional), the experts —
    /// either per expert (`{prefix}.experts.{e}.{gate,up,down}_proj.weight`, as DeepSeek ships them)
    /// or fused (`{prefix}.experts.gate_up_proj` `[E, 2F, D]`, `{prefix}.experts.down_proj`
    /// `[E, D, F]`, as transformers 5 saves them) — and `{prefix}.shared_experts`. `names` gives
    /// the per-expert projection spellings.
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        s: MoeShape,
        routing: MoeRouting,
        names: &ExpertNames,
        limit: Option<f32>,
    ) -> Result<Self> {
        let (e_all, d) = (s.experts, s.hidden);
        let par = w.parallel();
        let (e0, e, width) = par.experts(s.experts, s.expert_dim)?;
        let f = s.expert_dim / width.parts;
        let gate = w.get_f32(&format!("{prefix}.gate.weight"), &[e_all, d])?;
        let bias_name = format!("{prefix}.gate.e_score_correction_bias");
        let bias = if w.has(&bias_name) {
            Some(w.get_f32(&bias_name, &[e_all])?)
        } else {
            None
        };
        // This rank's experts (dim 0 of the stacks), then its slice of each one's width.
        let mine = Split::along(0, e_all / e, e0 / e);
        let fused = format!("{prefix}.experts.gate_up_proj");
        let mut quant = None;
        let (gate_up, down) = if w.has(&fused) {
            let full = s.expert_dim;
            let gu = w.host_split(&fused, &[e_all, 2 * full, d], mine)?;
            let gu = Split { dim: 1, ..width }.grouped(2).apply_owned(gu)?;
            let dn = w.host_split(
                &format!("{prefix}.experts.down_proj"),
                &[e_all, d, full],
                mine,
            )?;
            let dn = Split { dim: 2, ..width }.apply_owned(dn)?;
            (w.upload(gu)?, w.upload(dn)?)
        } else if let Some(q) = Self::quant_experts(w, prefix, s, names, limit)? {
            quant = Some(Box::new(q));
            let one = w.backend().zeros(&[1, 1, 1], w.dtype())?;
            (one.clone(), one)
        } else {
            // Each expert's rows are appended to one buffer per stack (one copy out of the
            // file map; a 48B-A3B checkpoint moves ≈ 90 GB through here).
            let full = s.expert_dim;
            let es = w.dtype().size();
            let mut gu = w.stack_buffer(e * 2 * f * d * es);
            let mut dn = w.stack_buffer(e * d * f * es);
            for i in 0..e {
                let p = format!("{prefix}.experts.{}", e0 + i);
                let name = |spellings: &[&str]| expert_prefix(w, &p, spellings);
                let g = w.host_weight_split(&name(names.gate)?, full, d, width)?;
                let u = w.host_weight_split(&name(names.up)?, full, d, width)?;
                let dw =
                    w.host_weight_split(&name(names.down)?, d, full, Split { dim: 1, ..width })?;
                gu.extend_from_slice(&g.data);
                gu.extend_from_slice(&u.data);
                dn.extend_from_slice(&dw.data);
            }
            (
                w.upload_stacked(vec![e, 2 * f, d], gu)?,
                w.upload_stacked(vec![e, d, f], dn)?,
            )
        };
        let shared = if s.shared_dim > 0 {
            Some(
                Mlp::load(w, &format!("{prefix}.shared_experts"), d, s.shared_dim)?
                    .with_limit(limit),
            )
        } else {
            None
        };
        Ok(Self {
            gate,
            bias,
            gate_up,
            down,
            shared,
            routing,
            clamped: limit,
            quant,
            first_expert: e0,
            local_experts: e,
            experts: e_all,
            parallel: par.clone(),
        })
    }

    /// The routed experts `{prefix}.experts.{e}.*` in their low-bit form when the checkpoint
    /// stores them so (compressed-tensors MXFP4 / INT4), the loader keeps quantized weights and
    /// the layer runs the plain SwiGLU (no clamp) on one rank; `None` otherwise.
    fn quant_experts(
        w: &WeightLoader<B>,
        prefix: &str,
        s: MoeShape,
        names: &ExpertNames,
        limit: Option<f32>,
    ) -> Result<Option<QuantExperts<B>>> {
        let (e, f, d) = (s.experts, s.expert_dim, s.hidden);
        let p0 = format!("{prefix}.experts.0");
        let gate0 = expert_prefix(w, &p0, names.gate)?;
        if !w.keeps_quantized() || limit.is_some() || w.quant_host(&gate0, f, d)?.is_none() {
            return Ok(None);
        }
        let (mut gu, mut dn) = (Vec::with_capacity(e), Vec::with_capacity(e));
        for i in 0..e {
            let p = format!("{prefix}.experts.{i}");
            let get = |spellings: &[&str], out: usize, inp: usize| -> Result<QuantHost> {
                let name = expert_prefix(w, &p, spellings)?;
                w.quant_host(&name, out, inp)?.ok_or_else(|| {
                    anyhow::anyhow!(
                        "{}: {name} is stored in floats but expert 0 of {prefix} is quantized; mixed experts are not supported",
                        w.origin()
                    )
                })
            };
            gu.push(QuantHost::concat(
                &[get(names.gate, f, d)?, get(names.up, f, d)?],
                true,
            )?);
            dn.push(get(names.down, d, f)?);
        }
        let gate_up = QuantHost::concat(&gu, false)?;
        let down = QuantHost::concat(&dn, false)?;
        QuantExperts::load(w, &gate_up, &down).map(Some)
    }

    /// `x` `[N, D]` → `[N, D]`, summed over the ranks. With every expert on every rank (each
    /// cut by width), a rank adds its slices of the routed and shared experts and one
    /// all-reduce sums them; with experts over expert groups, the routed part goes by dispatch
    /// and combine ([`super::moe_dispatch`]) and the shared experts' slices are summed apart.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let (ids, weights) = b.moe_route(x, &self.gate, self.bias.as_ref(), &self.routing)?;
        self.experts(b, x, &ids, &weights)
    }

    /// [`Moe::forward`] of a pre-norm input: the norm runs inside the router's call where the
    /// backend can ([`PreNorm::moe_route`]; one decode launch on CUDA), the same values.
    pub fn forward_pre(&self, b: &B, input: &PreNorm<B>) -> Result<B::Tensor> {
        let (ids, weights) = input.moe_route(b, &self.gate, self.bias.as_ref(), &self.routing)?;
        self.experts(b, input.x(b)?, &ids, &weights)
    }

    /// The routed and shared experts of `x` `[N, D]` for the router's choice `ids`, `weights`
    /// `[N, k]` → `[N, D]` (summed over tensor-parallel ranks).
    fn experts(
        &self,
        b: &B,
        x: &B::Tensor,
        ids: &B::Tensor,
        weights: &B::Tensor,
    ) -> Result<B::Tensor> {
        if self.dispatches() {
            let y = self.dispatched_experts(b, x, ids, weights)?;
            return match &self.shared {
                Some(mlp) => b.add(&y, &mlp.forward(b, x)?),
                None => Ok(y),
            };
        }
        let dense_shared = self.shared.as_ref().and_then(Mlp::dense_swiglu);
        let y = match (self.clamped, &self.quant, dense_shared) {
            // Routed and shared experts in one op (two launches at decode on CUDA).
            (None, None, Some(shared)) => {
                b.moe_experts_shared(x, ids, weights, &self.gate_up, &self.down, shared)?
            }
            (clamped, quant, _) => {
                let y = match (clamped, quant) {
                    (Some(l), _) => self.clamped_experts(b, x, ids, weights, l)?,
                    (None, Some(q)) => q.forward(b, x, ids, weights)?,
                    (None, None) => b.moe_experts(x, ids, weights, &self.gate_up, &self.down)?,
                };
                match &self.shared {
                    Some(mlp) => b.add(&y, &mlp.forward_partial(b, x)?)?,
                    None => y,
                }
            }
        };
        self.parallel.all_reduce(b, &y)
    }

    /// The routed experts with a clamped SwiGLU (HF `Glm5NextTextExperts`): `[gate; up]` rows,
    /// `silu(min(g, l)) ⊙ clamp(u, −l, l)`, on the device.
    pub(super) fn clamped_experts(
        &self,
        b: &B,
        x: &B::Tensor,
        ids: &B::Tensor,
        weights: &B::Tensor,
        l: f32,
    ) -> Result<B::Tensor> {
        let opts = ExpertOptions {
            act: ExpertAct::SwigluClamped { limit: l },
            gate_up_bias: None,
            down_bias: None,
            fp8: false,
        };
        b.moe_experts_ext(x, ids, weights, &self.gate_up, &self.down, &opts)
    }
}
