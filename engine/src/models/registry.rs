//! The architectures dayone runs, one row each: the `model_type`s it answers to, how its
//! `config.json` is read, and how the config maps to a [`ModelPlan`] (layer kinds, widths and
//! tensor names; vLLM's `spec_manager_map` and gpt-fast's `transformer_configs` as the idea).
//!
//! Adding an architecture whose layers exist is one file under `models/` with its `ARCH` row,
//! plus that row here.

use super::decoder::ModelPlan;
use super::{
    deepseek_v3, deepseek_v32, glm5_next, gpt_oss, kimi_k25, kimi_linear, kimi_vl, llama, qwen2,
    qwen3,
};
use crate::config::ModelConfig;
use anyhow::{Context, Result};

/// One architecture.
#[derive(Clone, Copy)]
pub struct Architecture {
    /// `config.json` `model_type` values it loads (the first is its own name).
    pub model_types: &'static [&'static str],
    /// Deserialises and validates `config.json` (`value`, file name for errors, `model_type`).
    pub parse: fn(&serde_json::Value, &str, &str) -> Result<ModelConfig>,
    /// Maps a config this row parsed to the per-layer plan.
    pub plan: fn(&ModelConfig) -> Result<ModelPlan>,
}

/// Every architecture, in the order `dayone` lists them.
pub const ARCHITECTURES: &[Architecture] = &[
    llama::ARCH,
    qwen2::ARCH,
    qwen3::ARCH,
    deepseek_v3::ARCH,
    deepseek_v32::ARCH,
    kimi_linear::ARCH,
    glm5_next::ARCH,
    gpt_oss::ARCH,
    kimi_k25::ARCH,
    kimi_vl::ARCH,
];

/// The row that loads `model_type`, if any.
pub fn architecture(model_type: &str) -> Option<&'static Architecture> {
    ARCHITECTURES
        .iter()
        .find(|a| a.model_types.contains(&model_type))
}

/// The layer plan of a parsed config (by its `model_type`'s row).
pub fn layer_plan(config: &ModelConfig) -> Result<ModelPlan> {
    let mt = config.model_type();
    let arch = architecture(mt).with_context(|| format!("unsupported model_type '{mt}'"))?;
    (arch.plan)(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SUPPORTED_MODEL_TYPES;

    #[test]
    fn every_supported_model_type_has_one_row() {
        for mt in SUPPORTED_MODEL_TYPES {
            let rows = ARCHITECTURES
                .iter()
                .filter(|a| a.model_types.contains(mt))
                .count();
            assert_eq!(rows, 1, "{mt}");
        }
        for a in ARCHITECTURES {
            assert!(SUPPORTED_MODEL_TYPES.contains(&a.model_types[0]));
        }
    }
}
