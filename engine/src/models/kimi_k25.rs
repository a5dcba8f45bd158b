//! Kimi-K2.5 (`kimi_k25`): the DeepSeek-V3 text decoder of [`super::deepseek_v3`] behind a MoonViT
//! vision tower ([`crate::layers::vision::MoonVit`]). The decoder sees only embeddings: image
//! rows replace the `<|media_pad|>` placeholders' embeddings at the embedding step
//! ([`crate::models::EmbedSplice`]). Text tensors load through
//! [`crate::loader::TextModelView`] (original or transformers-5 names).

use super::registry::Architecture;
use crate::config::{KimiK25Config, ModelConfig};
use anyhow::bail;

/// `kimi_k25`.
pub const ARCH: Architecture = Architecture {
    model_types: &["kimi_k25"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::KimiK25(Box::new(KimiK25Config::from_json(
            v, origin, model_type,
        )?)))
    },
    plan: |c| match c {
        ModelConfig::KimiK25(c) => super::deepseek_v3::plan(&c.text),
        other => bail!("the kimi_k25 plan got a `{}` config", other.model_type()),
    },
};
