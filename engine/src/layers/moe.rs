//! Mixture-of-Experts feed-forward with a sigmoid, group-limited router and shared experts
//! (DeepSeek-V3 report §2.1.2; HF `DeepseekV3MoE`):
//! `y = Σ_{e ∈ topk} w_e · Expert_e(x) + SharedExpert(x)`, experts being SwiGLU MLPs.

use super::Mlp;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, HostTensor, MoeRouting};

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

/// One MoE block's weights.
pub struct Moe<B: Backend> {
    /// Router weight `[E, D]` f32.
    pub gate: B::Tensor,
    /// `e_score_correction_bias` `[E]` f32 (choice only), when the checkpoint has one.
    pub bias: Option<B::Tensor>,
    /// Stacked `[gate; up]` projections `[E, 2F, D]`.
    pub gate_up: B::Tensor,
    /// Stacked down projections `[E, D, F]`.
    pub down: B::Tensor,
    /// Shared experts as one MLP.
    pub shared: Option<Mlp<B>>,
    /// Router settings.
    pub routing: MoeRouting,
}

/// Stacks equal-shaped host tensors along a new leading dimension.
fn stack(parts: &[HostTensor]) -> Result<HostTensor> {
    let mut shape = vec![parts.len()];
    shape.extend_from_slice(&parts[0].shape);
    let data = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
    HostTensor::new(shape, parts[0].dtype, data)
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
    ) -> Result<Self> {
        let (e, f, d) = (s.experts, s.expert_dim, s.hidden);
        let gate = w.get_f32(&format!("{prefix}.gate.weight"), &[e, d])?;
        let bias_name = format!("{prefix}.gate.e_score_correction_bias");
        let bias = if w.has(&bias_name) {
            Some(w.get_f32(&bias_name, &[e])?)
        } else {
            None
        };
        let fused = format!("{prefix}.experts.gate_up_proj");
        let (gate_up, down) = if w.has(&fused) {
            (
                w.get(&fused, &[e, 2 * f, d])?,
                w.get(&format!("{prefix}.experts.down_proj"), &[e, d, f])?,
            )
        } else {
            let mut gu = Vec::with_capacity(e);
            let mut dn = Vec::with_capacity(e);
            for i in 0..e {
                let p = format!("{prefix}.experts.{i}");
                let name = |spellings: &[&str]| {
                    let c: Vec<String> = spellings
                        .iter()
                        .map(|a| format!("{p}.{a}.weight"))
                        .collect();
                    w.first_of(&c)
                };
                let g = w.host(&name(names.gate)?, &[f, d])?;
                let u = w.host(&name(names.up)?, &[f, d])?;
                gu.push(HostTensor::new(
                    vec![2 * f, d],
                    g.dtype,
                    [g.data, u.data].concat(),
                )?);
                dn.push(w.host(&name(names.down)?, &[d, f])?);
            }
            (w.upload(stack(&gu)?)?, w.upload(stack(&dn)?)?)
        };
        let shared = if s.shared_dim > 0 {
            Some(Mlp::load(
                w,
                &format!("{prefix}.shared_experts"),
                d,
                s.shared_dim,
            )?)
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
        })
    }

    /// `x` `[N, D]` → `[N, D]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let (ids, weights) = b.moe_route(x, &self.gate, self.bias.as_ref(), &self.routing)?;
        let y = b.moe_experts(x, &ids, &weights, &self.gate_up, &self.down)?;
        match &self.shared {
            Some(mlp) => b.add(&y, &mlp.forward(b, x)?),
            None => Ok(y),
        }
    }
}
