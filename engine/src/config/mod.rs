//! Model configs: serde structs mirroring each architecture's `config.json` field names.

mod deepseek_v3;
mod kimi_linear;
mod llama;
pub(crate) mod rope;

pub use deepseek_v3::DeepseekV3Config;
pub use kimi_linear::{KimiLinearConfig, LinearAttnConfig};
pub use llama::LlamaConfig;
pub use rope::{rope_inv_freq, RopeParameters};

use anyhow::{bail, Context, Result};

/// Deserialises `value` as `T` (errors name the field path) and validates it.
fn parse_as<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    origin: &str,
    model_type: &str,
    validate: impl Fn(&T) -> Result<()>,
) -> Result<T> {
    let cfg: T = serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        anyhow::anyhow!(
            "{origin}: invalid `{model_type}` config: field `{}`: {}",
            e.path(),
            e.inner()
        )
    })?;
    validate(&cfg).with_context(|| format!("{origin}: invalid `{model_type}` config"))?;
    Ok(cfg)
}

/// The architectures dayone runs, keyed by `config.json`'s `model_type`.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "qwen3",
    "deepseek_v3",
    "deepseek_v32",
    "kimi_linear",
];

/// A parsed `config.json`, one variant per supported `model_type`.
#[derive(Clone, Debug)]
pub enum ModelConfig {
    /// `model_type: "llama"` (Llama 2/3, SmolLM2, Mistral-style dense decoders).
    Llama(LlamaConfig),
    /// `model_type: "qwen3"`: the Llama skeleton plus per-head q/k RMSNorm and explicit `head_dim`.
    Qwen3(LlamaConfig),
    /// `model_type: "deepseek_v3"` (DeepSeek-V3/R1, Kimi-K2): MLA + sigmoid-routed MoE; also
    /// `deepseek_v32`, whose config adds the DSA indexer fields.
    DeepseekV3(DeepseekV3Config),
    /// `model_type: "kimi_linear"`: KDA linear attention beside NoPE MLA, MoE.
    KimiLinear(KimiLinearConfig),
}

impl ModelConfig {
    /// Parses a `config.json` value; `origin` names the file for error messages.
    ///
    /// Errors: a missing or unknown `model_type` (the message lists the supported ones), or a
    /// field with the wrong type or an inconsistent value (the message names the field).
    pub fn from_json(value: &serde_json::Value, origin: &str) -> Result<Self> {
        let model_type = value
            .get("model_type")
            .and_then(|v| v.as_str())
            .with_context(|| format!("{origin}: field `model_type` is missing (expected one of {SUPPORTED_MODEL_TYPES:?})"))?;
        let llama = || parse_as(value, origin, model_type, LlamaConfig::validate);
        Ok(match model_type {
            "llama" | "mistral" => ModelConfig::Llama(llama()?),
            "qwen3" => ModelConfig::Qwen3(llama()?),
            "deepseek_v32" => ModelConfig::DeepseekV3(parse_as(
                value,
                origin,
                model_type,
                DeepseekV3Config::validate_v32,
            )?),
            "deepseek_v3" | "kimi_k2" => ModelConfig::DeepseekV3(parse_as(
                value,
                origin,
                model_type,
                DeepseekV3Config::validate,
            )?),
            "kimi_linear" => ModelConfig::KimiLinear(parse_as(
                value,
                origin,
                model_type,
                KimiLinearConfig::validate,
            )?),
            other => bail!(
                "{origin}: unsupported model_type '{other}' (supported: {})",
                SUPPORTED_MODEL_TYPES.join(", ")
            ),
        })
    }

    /// Longest sequence (prompt + generated tokens) the model accepts.
    pub fn max_context(&self) -> usize {
        match self {
            ModelConfig::Llama(c) | ModelConfig::Qwen3(c) => c.max_position_embeddings,
            ModelConfig::DeepseekV3(c) => c.max_position_embeddings,
            ModelConfig::KimiLinear(c) => c.max_position_embeddings,
        }
    }

    /// Vocabulary size (rows of the logits).
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Llama(c) | ModelConfig::Qwen3(c) => c.vocab_size,
            ModelConfig::DeepseekV3(c) => c.vocab_size,
            ModelConfig::KimiLinear(c) => c.vocab_size,
        }
    }
}
