//! DeepSeek-V3.2 (DeepSeek-AI 2025, DeepSeek-V3.2-Exp report; HF `modeling_deepseek_v32.py`):
//! DeepSeek-V3 whose every MLA layer attends only to the `index_topk` keys its lightning indexer
//! scores highest (DeepSeek Sparse Attention).
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += mla_dsa(rmsnorm_in(h));  h += (moe | mlp)(rmsnorm_post(h))
//!     mla_dsa: sel = topk_s Σ_h w_h relu(q_h · k_s)  (indexer keys in their own cache);
//!              MLA over the latent rows in sel
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```
//! The indexer ropes half-split whatever the MLA's layout.

use super::decoder::{IndexerPlan, RopePlan};
use super::registry::Architecture;
use crate::config::{parse_as, DeepseekV3Config, ModelConfig};
use anyhow::bail;
use dayone_backend::RopeStyle;

/// `deepseek_v32`: the DeepSeek-V3 plan, validated to carry the indexer fields.
pub const ARCH: Architecture = Architecture {
    model_types: &["deepseek_v32"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::DeepseekV3(parse_as(
            v,
            origin,
            model_type,
            DeepseekV3Config::validate_v32,
        )?))
    },
    plan: |c| match c {
        ModelConfig::DeepseekV3(c) => super::deepseek_v3::plan(c),
        other => bail!(
            "the deepseek_v32 plan got a `{}` config",
            other.model_type()
        ),
    },
};

/// The indexer of each MLA layer, when the config has the DSA fields (`index_n_heads`,
/// `index_head_dim`, `index_topk`) and a query latent for it to read. `inv_freq` and `mscale` are
/// the MLA's rotary settings.
pub(super) fn indexer(c: &DeepseekV3Config, inv_freq: &[f32], mscale: f32) -> Option<IndexerPlan> {
    let (heads, head_dim, topk) = c.indexer()?;
    Some(IndexerPlan {
        heads,
        head_dim,
        topk,
        q_lora_rank: c.q_lora_rank?,
        rope: RopePlan {
            inv_freq: inv_freq.to_vec(),
            style: RopeStyle::HalfSplit,
            mscale,
        },
    })
}
