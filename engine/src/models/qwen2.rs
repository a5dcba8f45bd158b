//! Qwen2 / Qwen2.5 (Qwen team 2024; HF `modeling_qwen2.py`): the Llama skeleton with a bias on
//! the q, k and v projections (none on `o_proj`; HF hardcodes it, the config has no field), and
//! optional sliding-window layers (`use_sliding_window`, `max_window_layers`, `layer_types`),
//! which the backends cannot run yet and are refused at load.
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += attn_qkvbias(rmsnorm_in(h));  h += mlp(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```

use super::registry::Architecture;
use crate::config::{parse_as, LlamaConfig, ModelConfig};
use anyhow::bail;

/// `qwen2` (parsed into the Llama config; its `model_type` picks this row's plan).
pub const ARCH: Architecture = Architecture {
    model_types: &["qwen2"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::Llama(parse_as(
            v,
            origin,
            model_type,
            LlamaConfig::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::Llama(c) if c.model_type == "qwen2" => {
            super::llama::plan_with(c, true, None, |i| c.qwen_window(i))
        }
        other => bail!("the qwen2 plan got a `{}` config", other.model_type()),
    },
};
