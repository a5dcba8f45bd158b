//! Llama (Touvron et al. 2023; HF `modeling_llama.py`): pre-norm decoder layers of GQA attention
//! with half-split RoPE and a SwiGLU MLP; final RMSNorm; `lm_head` (or the tied embedding).
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += attn(rmsnorm_in(h));  h += mlp(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```

use super::decoder::{Ffn, LayerPlan, Mixer, ModelPlan, Residual, RopePlan, TensorNames};
use super::registry::Architecture;
use crate::config::{parse_as, rope_inv_freq, LlamaConfig, ModelConfig};
use crate::layers::AttentionShape;
use anyhow::{bail, Result};
use dayone_backend::RopeStyle;

/// `llama` (also `mistral` configs, with their `sliding_window` on every layer when set).
pub const ARCH: Architecture = Architecture {
    model_types: &["llama", "mistral"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::Llama(parse_as(
            v,
            origin,
            model_type,
            LlamaConfig::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::Llama(c) => plan_with(c, c.attention_bias, None, |_| {
            (c.model_type == "mistral")
                .then_some(c.sliding_window)
                .flatten()
        }),
        other => bail!("the llama plan got a `{}` config", other.model_type()),
    },
};

/// The Llama layer plan with q/k/v `bias`; `qk_norm = Some(eps)` adds Qwen3's per-head q/k
/// RMSNorm; `window(i)` is layer `i`'s sliding window (`None`: full attention).
pub(super) fn plan_with(
    c: &LlamaConfig,
    bias: bool,
    qk_norm: Option<f64>,
    window: impl Fn(usize) -> Option<usize>,
) -> Result<ModelPlan> {
    let shape = AttentionShape {
        hidden: c.hidden_size,
        heads: c.num_attention_heads,
        kv_heads: c.kv_heads(),
        head_dim: c.head_dim(),
    };
    let rope = RopePlan {
        inv_freq: rope_inv_freq(
            &c.rope(),
            shape.head_dim,
            10000.0,
            c.max_position_embeddings,
        )?,
        style: RopeStyle::HalfSplit,
        mscale: 1.0,
    };
    let layer = |i: usize| LayerPlan {
        mixer: Mixer::Attention {
            shape,
            bias,
            qk_norm,
            sliding_window: window(i),
            sinks: false,
            rope: rope.clone(),
        },
        ffn: Ffn::Dense {
            intermediate: c.intermediate_size,
        },
        norm_eps: c.rms_norm_eps,
        residual: Residual::Plain,
        swiglu_limit: None,
    };
    Ok(ModelPlan {
        hidden: c.hidden_size,
        vocab: c.vocab_size,
        norm_eps: c.rms_norm_eps,
        tied_embeddings: c.tie_word_embeddings,
        names: TensorNames::HF,
        layers: (0..c.num_hidden_layers).map(layer).collect(),
    })
}
