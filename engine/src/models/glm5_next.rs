//! GLM-5.3-Flash text model (Z.ai 2026; HF `modeling_glm5_next.py`, `Glm5NextTextModel`): the
//! residual is `hc_mult` hyper-connection streams, and each layer wraps a KDA (lower-bound gate)
//! or NoPE MLA mixer — sparse through a pooled DSA indexer, or reusing the previous layer's
//! selection (`shared`) — and a dense or MoE FFN, every SwiGLU clamped at `swiglu_limit`.
//!
//! ```text
//! X = [embed[ids]] × n
//! for each layer:  X = hc_attn(X, x ↦ (kda | mla_pooled_dsa)(rmsnorm_in(x)))
//!                  X = hc_ffn(X,  x ↦ (mlp | moe)(rmsnorm_post(x)))
//! logits = lm_head(rmsnorm(mean_i X_i)[logit_rows])
//! ```
//! Names are `model.language_model.*` (the multimodal checkpoint layout; the vision tower and the
//! MTP layer are not loaded).

use super::decoder::{
    Ffn, LayerPlan, Mixer, ModelPlan, PooledIndexerPlan, Residual, SparsePlan, TensorNames,
};
use super::registry::Architecture;
use crate::config::{parse_as, Glm5LayerKind, Glm5NextConfig, ModelConfig};
use crate::layers::{KdaShape, MlaShape, MoeShape};
use anyhow::bail;
use dayone_backend::MoeRouting;

/// `glm5_next`.
pub const ARCH: Architecture = Architecture {
    model_types: &["glm5_next"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::Glm5Next(parse_as(
            &Glm5NextConfig::from_value(v),
            origin,
            model_type,
            Glm5NextConfig::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::Glm5Next(c) => Ok(plan(c)),
        other => bail!("the glm5_next plan got a `{}` config", other.model_type()),
    },
};

/// transformers' names: everything of the text model under `model.language_model`.
const NAMES: TensorNames = TensorNames {
    layers: "model.language_model.layers",
    model: "model.language_model",
    ..TensorNames::HF
};

/// The layer plan: KDA / pooled-DSA MLA / shared-selection MLA by `layer_types` and
/// `indexer_types`, dense or MoE by `mlp_layer_types`, hyper-connections everywhere.
fn plan(c: &Glm5NextConfig) -> ModelPlan {
    let eps = c.rms_norm_eps;
    let (kda_heads, kda_dim, conv, lb) = c.kda();
    let kda = Mixer::Kda {
        shape: KdaShape {
            hidden: c.hidden_size,
            heads: kda_heads,
            head_dim: kda_dim,
            conv_width: conv,
        },
        eps,
        lower_bound: lb,
    };
    let mla = |indexer| Mixer::Mla {
        shape: MlaShape {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            q_lora_rank: c.q_lora_rank,
            kv_lora_rank: c.kv_lora_rank,
            nope_dim: c.qk_nope_head_dim,
            rope_dim: 0,
            v_dim: c.v_head_dim,
        },
        latent_eps: eps,
        scale: 1.0 / (c.qk_nope_head_dim as f32).sqrt(),
        rope: None,
        indexer: Some(indexer),
    };
    let pooled = SparsePlan::Pooled(PooledIndexerPlan {
        heads: c.index_n_heads,
        head_dim: c.index_head_dim,
        topk: c.index_topk,
        q_lora_rank: c.q_lora_rank.unwrap_or(0),
        kpool: c.index_kpool,
        tail: c.index_kpool_always_select_tail,
    });
    let moe = Ffn::Moe {
        shape: MoeShape {
            hidden: c.hidden_size,
            experts: c.n_routed_experts,
            expert_dim: c.moe_intermediate_size,
            shared_dim: c.moe_intermediate_size * c.n_shared_experts,
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
    let residual = Residual::HyperConnections {
        n: c.hc_mult,
        hc_eps: c.hc_eps,
        sinkhorn_iters: c.hc_sinkhorn_iters,
    };
    let layers = (0..c.num_hidden_layers)
        .map(|i| LayerPlan {
            mixer: match c.layer_kind(i) {
                Glm5LayerKind::Linear => kda.clone(),
                Glm5LayerKind::IndexedFull => mla(pooled.clone()),
                Glm5LayerKind::IndexedShared => mla(SparsePlan::Shared),
            },
            ffn: if c.is_moe_layer(i) {
                moe.clone()
            } else {
                dense.clone()
            },
            norm_eps: eps,
            residual,
            swiglu_limit: c.swiglu_limit,
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
