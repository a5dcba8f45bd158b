//! DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437; HF `modeling_deepseek_v3.py`), which also
//! loads Kimi-K2: pre-norm decoder layers of MLA attention and, after the first
//! `first_k_dense_replace` dense layers, a sigmoid-routed MoE with shared experts.
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += mla(rmsnorm_in(h));  h += (moe | mlp)(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```
//! The multi-token-prediction layers stored after `num_hidden_layers` are not loaded.

use super::decoder::{
    Ffn, LayerPlan, Mixer, ModelPlan, Residual, RopePlan, SparsePlan, TensorNames,
};
use super::registry::Architecture;
use crate::config::{parse_as, rope_inv_freq, DeepseekV3Config, ModelConfig};
use crate::layers::{MlaShape, MoeShape};
use anyhow::{bail, Result};
use dayone_backend::{MoeRouting, RopeStyle};

/// `deepseek_v3` and `kimi_k2`.
pub const ARCH: Architecture = Architecture {
    model_types: &["deepseek_v3", "kimi_k2"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::DeepseekV3(parse_as(
            v,
            origin,
            model_type,
            DeepseekV3Config::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::DeepseekV3(c) => plan(c),
        other => bail!("the deepseek_v3 plan got a `{}` config", other.model_type()),
    },
};

/// The layer plan: MLA on every layer (with DeepSeek-V3.2's indexer when the config has one),
/// dense or MoE FFN by `is_moe_layer`.
pub(super) fn plan(c: &DeepseekV3Config) -> Result<ModelPlan> {
    let rp = c.rope();
    let inv_freq = rope_inv_freq(&rp, c.qk_rope_head_dim, 10000.0, c.max_position_embeddings)?;
    let style = if c.rope_interleave {
        RopeStyle::Interleaved
    } else {
        RopeStyle::HalfSplit
    };
    let mscale = rp.attention_factor(c.max_position_embeddings);
    if c.num_nextn_predict_layers > 0 {
        tracing::info!(
            "skipping {} multi-token-prediction layer(s) for plain decoding",
            c.num_nextn_predict_layers
        );
    }
    let mixer = Mixer::Mla {
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
        scale: c.softmax_scale(),
        indexer: super::deepseek_v32::indexer(c, &inv_freq, mscale).map(SparsePlan::Lightning),
        rope: Some(RopePlan {
            inv_freq,
            style,
            mscale,
        }),
    };
    let moe = Ffn::Moe {
        shape: MoeShape {
            hidden: c.hidden_size,
            experts: c.n_routed_experts,
            expert_dim: c.moe_intermediate_size,
            shared_dim: c.moe_intermediate_size * c.n_shared_experts.unwrap_or(0),
        },
        routing: MoeRouting {
            top_k: c.num_experts_per_tok,
            n_group: c.n_group,
            topk_group: c.topk_group,
            norm_topk_prob: c.norm_topk_prob,
            routed_scaling_factor: c.routed_scaling_factor as f32,
        },
    };
    let dense = Ffn::Dense {
        intermediate: c.intermediate_size,
    };
    let layers = (0..c.num_hidden_layers)
        .map(|i| LayerPlan {
            mixer: mixer.clone(),
            ffn: if c.is_moe_layer(i) {
                moe.clone()
            } else {
                dense.clone()
            },
            norm_eps: c.rms_norm_eps,
            residual: Residual::Plain,
            swiglu_limit: None,
        })
        .collect();
    Ok(ModelPlan {
        hidden: c.hidden_size,
        vocab: c.vocab_size,
        norm_eps: c.rms_norm_eps,
        tied_embeddings: c.tie_word_embeddings,
        names: TensorNames::HF,
        layers,
    })
}
