//! Qwen3 (Qwen team 2025; HF `modeling_qwen3.py`): the Llama skeleton with an explicit
//! `head_dim` and an RMSNorm over each head of q and k before RoPE (`q_norm`, `k_norm`).
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += attn_qknorm(rmsnorm_in(h));  h += mlp(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```

use super::registry::Architecture;
use crate::config::{parse_as, LlamaConfig, ModelConfig};
use anyhow::bail;

/// `qwen3`.
pub const ARCH: Architecture = Architecture {
    model_types: &["qwen3"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::Qwen3(parse_as(
            v,
            origin,
            model_type,
            LlamaConfig::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::Qwen3(c) => {
            super::llama::plan_with(c, c.attention_bias, Some(c.rms_norm_eps), |i| {
                c.qwen_window(i)
            })
        }
        other => bail!("the qwen3 plan got a `{}` config", other.model_type()),
    },
};
