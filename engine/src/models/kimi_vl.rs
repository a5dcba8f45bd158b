//! Kimi-VL (`kimi_vl`): Kimi-K2.5's layout ([`super::kimi_k25`]) under Kimi-VL's config and
//! projector names. Its config ([`KimiVlConfig`]) becomes a [`ModelConfig::KimiK25`] with
//! `model_type` `kimi_vl`, so the text model, the MoonViT tower, the embedding splice and the
//! tensor-name views are the `kimi_k25` ones; the engine picks Kimi-VL's image processor by the
//! `model_type`.

use super::registry::Architecture;
use crate::config::{KimiVlConfig, ModelConfig};
use anyhow::bail;

/// `kimi_vl`.
pub const ARCH: Architecture = Architecture {
    model_types: &["kimi_vl"],
    parse: |v, origin, _model_type| {
        Ok(ModelConfig::KimiK25(Box::new(
            KimiVlConfig::from_json(v, origin)?.into_k25(),
        )))
    },
    plan: |c| match c {
        ModelConfig::KimiK25(c) => super::deepseek_v3::plan(&c.text),
        other => bail!("the kimi_vl plan got a `{}` config", other.model_type()),
    },
};
