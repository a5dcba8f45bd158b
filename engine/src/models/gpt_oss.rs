//! gpt-oss (OpenAI 2025, gpt-oss-120b & gpt-oss-20b model card; HF `modeling_gpt_oss.py`):
//! pre-norm layers of GQA attention with q/k/v/o biases, YaRN half-split RoPE and a learned
//! sink logit per head, alternating sliding-window (128) and full layers; a MoE block with a
//! biased softmax-top-k router and MXFP4 experts (architectures.md §4).
//!
//! ```text
//! h = embed[ids]
//! for each layer i:  h += attn_i(rmsnorm_in(h))   (sinks; window on sliding layers)
//!                    h += moe(rmsnorm_post(h))    (layers/gpt_oss_moe.rs)
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```

use super::decoder::{Ffn, LayerPlan, Mixer, ModelPlan, Residual, RopePlan, TensorNames};
use super::registry::Architecture;
use crate::config::{parse_as, rope_inv_freq, GptOssConfig, ModelConfig, GPT_OSS_ALPHA};
use crate::layers::AttentionShape;
use anyhow::{bail, Result};
use dayone_backend::RopeStyle;

/// `gpt_oss`.
pub const ARCH: Architecture = Architecture {
    model_types: &["gpt_oss"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::GptOss(parse_as(
            v,
            origin,
            model_type,
            GptOssConfig::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::GptOss(c) => plan(c),
        other => bail!("the gpt_oss plan got a `{}` config", other.model_type()),
    },
};

fn plan(c: &GptOssConfig) -> Result<ModelPlan> {
    let shape = AttentionShape {
        hidden: c.hidden_size,
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
    };
    let rp = c.rope();
    let rope = RopePlan {
        inv_freq: rope_inv_freq(&rp, c.head_dim, 150000.0, c.max_position_embeddings)?,
        style: RopeStyle::HalfSplit,
        mscale: rp.attention_factor(c.max_position_embeddings),
    };
    let layer = |i: usize| LayerPlan {
        mixer: Mixer::Attention {
            shape,
            bias: c.attention_bias,
            qk_norm: None,
            sliding_window: c.window(i),
            sinks: true,
            rope: rope.clone(),
        },
        ffn: Ffn::GptOssMoe {
            experts: c.num_local_experts,
            expert_dim: c.intermediate_size,
            top_k: c.top_k(),
            limit: c.swiglu_limit,
            alpha: GPT_OSS_ALPHA as f64,
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
