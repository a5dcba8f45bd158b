//! `model_type: kimi_k25` (Kimi-K2.5 / K2.6; transformers `Kimi_K25Config`): a MoonViT vision
//! tower and patch-merger projector ([`MoonVitConfig`]) in front of a DeepSeek-V3 / Kimi-K2 text
//! model (`text_config`, [`DeepseekV3Config`]). Text positions are plain 1-D (no M-RoPE,
//! vision.md §0.3).

use super::{parse_as, DeepseekV3Config, MoonVitConfig};
use anyhow::{Context, Result};
use serde_json::Value;

/// A parsed `kimi_k25` `config.json`.
#[derive(Clone, Debug)]
pub struct KimiK25Config {
    /// `model_type` (`kimi_k25`).
    pub model_type: String,
    /// `text_config` (`model_type` `deepseek_v3` or `kimi_k2`).
    pub text: DeepseekV3Config,
    /// `vision_config` plus the projector fields.
    pub vision: MoonVitConfig,
    /// The image placeholder id `<|media_pad|>` (`media_placeholder_token_id`, transformers'
    /// `image_token_id`; K2.5 163605). One per image in a prompt, expanded to its token count.
    pub media_placeholder_token_id: u32,
}

impl KimiK25Config {
    /// Parses `value` (`origin` names the file). `tie_word_embeddings` is read from the top
    /// level when present (the hub config says `false`; transformers' class default `true`
    /// would tie a checkpoint that ships its own `lm_head`), else from `text_config`.
    ///
    /// Errors name the field.
    pub fn from_json(value: &Value, origin: &str, model_type: &str) -> Result<Self> {
        let mut text = value
            .get("text_config")
            .cloned()
            .with_context(|| format!("{origin}: field `text_config` is missing"))?;
        if let (Some(tie), Some(obj)) = (value.get("tie_word_embeddings"), text.as_object_mut()) {
            obj.insert("tie_word_embeddings".into(), tie.clone());
        }
        let text_type = text
            .get("model_type")
            .and_then(Value::as_str)
            .unwrap_or("deepseek_v3")
            .to_string();
        anyhow::ensure!(
            text_type == "deepseek_v3" || text_type == "kimi_k2",
            "{origin}: field `text_config.model_type` is '{text_type}' (expected deepseek_v3 or kimi_k2)"
        );
        let text: DeepseekV3Config = parse_as(
            &text,
            &format!("{origin} (text_config)"),
            &text_type,
            DeepseekV3Config::validate,
        )?;
        let vision = MoonVitConfig::from_json(value, origin)?;
        let placeholder = ["media_placeholder_token_id", "image_token_id"]
            .iter()
            .find_map(|k| value.get(*k))
            .map(|v| {
                v.as_u64().with_context(|| {
                    format!("{origin}: field `media_placeholder_token_id` must be a token id")
                })
            })
            .transpose()?
            .unwrap_or(163_605) as u32;
        Ok(Self {
            model_type: model_type.to_string(),
            text,
            vision,
            media_placeholder_token_id: placeholder,
        })
    }
}
