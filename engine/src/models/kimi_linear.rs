//! Kimi-Linear (Moonshot AI 2025, arXiv:2510.26692; HF `modeling_kimi_linear.py`): a hybrid of
//! KDA linear-attention layers and NoPE MLA layers (which kind per layer comes from
//! `linear_attn_config`, whose lists are 1-based), with a dense first layer and sigmoid-routed
//! MoE after it.
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += (kda | mla)(rmsnorm_in(h));  h += (mlp | moe)(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```
//! KDA layers keep a fixed-size state per sequence (state slots); MLA layers keep the paged
//! latent cache `[c_kv | k_pe]` (`k_pe` unrotated: no RoPE anywhere).

use super::decoder::{Ffn, LayerPlan, Mixer, ModelPlan, Residual, TensorNames};
use super::registry::Architecture;
use crate::config::{parse_as, KimiLinearConfig, ModelConfig};
use crate::layers::{ExpertNames, KdaShape, MlaShape, MoeShape};
use anyhow::bail;
use dayone_backend::MoeRouting;

/// `kimi_linear`.
pub const ARCH: Architecture = Architecture {
    model_types: &["kimi_linear"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::KimiLinear(parse_as(
            v,
            origin,
            model_type,
            KimiLinearConfig::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::KimiLinear(c) => Ok(plan(c)),
        other => bail!("the kimi_linear plan got a `{}` config", other.model_type()),
    },
};

/// Kimi's checkpoint names: published checkpoints name the FFN `mlp` (dense) /
/// `block_sparse_moe` (MoE), transformers 5 saves both as `block_sparse_moe`; experts are `w1`
/// (gate), `w3` (up), `w2` (down).
const NAMES: TensorNames = TensorNames {
    ffn: &["block_sparse_moe", "mlp"],
    experts: ExpertNames {
        gate: &["gate_proj", "w1"],
        up: &["up_proj", "w3"],
        down: &["down_proj", "w2"],
    },
    ..TensorNames::HF
};

/// The layer plan: KDA or NoPE MLA by `is_kda_layer`, dense or MoE by `is_moe_layer`.
fn plan(c: &KimiLinearConfig) -> ModelPlan {
    let eps = c.rms_norm_eps;
    let kda = Mixer::Kda {
        shape: KdaShape {
            hidden: c.hidden_size,
            heads: c.kda_heads(),
            head_dim: c.kda_head_dim(),
            conv_width: c.conv_width(),
        },
        eps,
        lower_bound: c.linear_attn_config.gate_lower_bound,
    };
    let mla = Mixer::Mla {
        shape: MlaShape {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            q_lora_rank: c.q_lora_rank,
            kv_lora_rank: c.kv_lora_rank,
            nope_dim: c.qk_nope_head_dim,
            rope_dim: c.qk_rope_head_dim,
            v_dim: c.v_head_dim,
        },
        // transformers builds the latent norms with its default eps 1e-6.
        latent_eps: 1e-6,
        scale: 1.0 / ((c.qk_nope_head_dim + c.qk_rope_head_dim) as f32).sqrt(),
        rope: None,
        indexer: None,
    };
    let moe = Ffn::Moe {
        shape: MoeShape {
            hidden: c.hidden_size,
            experts: c.num_local_experts,
            expert_dim: c.moe_intermediate_size,
            shared_dim: c.moe_intermediate_size * c.n_shared_experts.unwrap_or(0),
        },
        routing: MoeRouting {
            top_k: c.num_experts_per_tok,
            n_group: c.n_group,
            topk_group: c.topk_group,
            // Kimi's reference renormalises only when more than one expert is chosen.
            norm_topk_prob: c.norm_topk_prob && c.num_experts_per_tok > 1,
            routed_scaling_factor: c.routed_scaling_factor as f32,
        },
    };
    let dense = Ffn::Dense {
        intermediate: c.intermediate_size,
    };
    let layers = (0..c.num_hidden_layers)
        .map(|i| LayerPlan {
            mixer: if c.is_kda_layer(i) {
                kda.clone()
            } else {
                mla.clone()
            },
            ffn: if c.is_moe_layer(i) {
                moe.clone()
            } else {
                dense.clone()
            },
            norm_eps: eps,
            residual: Residual::Plain,
            swiglu_limit: None,
        })
        .collect();
    ModelPlan {
        hidden: c.hidden_size,
        vocab: c.vocab_size,
        norm_eps: eps,
        tied_embeddings: c.tie_word_embeddings,
        names: NAMES,
        layers,
    }
}
