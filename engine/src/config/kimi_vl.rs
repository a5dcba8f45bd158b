//! `model_type: kimi_vl` (Moonshot's Kimi-VL, e.g. `moonshotai/Kimi-VL-A3B-Instruct`; hub remote
//! code `configuration_kimi_vl.py`, as copied into vLLM's `transformers_utils/configs/kimi_vl.py`
//! and `moonvit.py`): a MoonViT tower (`vision_config`, `MoonViTConfig` names `hidden_size`,
//! `init_pos_emb_height`, …) and a patch-merger projector in front of a DeepSeek-V3 text model
//! (`text_config`).
//!
//! For still images the encoder is K2.5's MoonViT without the time term, which adds nothing at
//! t = 1 (vision.md §2), and the projector is the same LayerNorm → Linear → GELU → Linear under
//! other names (`multi_modal_projector.{pre_norm,linear_1,linear_2}`, resolved by
//! [`crate::layers::vision::MoonVit::load`]). So a parsed Kimi-VL config becomes a
//! [`KimiK25Config`] ([`KimiVlConfig::into_k25`]) and runs on the `kimi_k25` code paths; what
//! differs is the image processor (`in_token_limit`, `pad_input`;
//! [`crate::vision::ImageProcessorConfig::kimi_vl`]).

use super::{DeepseekV3Config, KimiK25Config, MoonVitConfig};
use anyhow::{Context, Result};
use serde_json::Value;

/// Kimi-VL's projector LayerNorm eps: a constant in the remote code (`nn.LayerNorm(…, eps=1e-5)`),
/// not a config field.
const PROJECTOR_LN_EPS: f32 = 1e-5;

/// A parsed `kimi_vl` `config.json`, field for field (`KimiVLConfig`).
#[derive(Clone, Debug)]
pub struct KimiVlConfig {
    /// `vision_config` (`MoonViTConfig`: `patch_size`, `init_pos_emb_height/width`,
    /// `num_attention_heads`, `num_hidden_layers`, `hidden_size`, `intermediate_size`,
    /// `merge_kernel_size`; the class defaults are K2.5's sizes, 1152 wide, 27 layers).
    pub vision_config: MoonVitConfig,
    /// `text_config` (`model_type` `deepseek_v3`; vLLM reads it as its `DeepseekV2Config`, which
    /// carries the V3 routing fields).
    pub text_config: DeepseekV3Config,
    /// `media_placeholder_token_id`: the image placeholder `<|media_pad|>` (the `KimiVLConfig`
    /// default 163605, K2.5's too), one per image in a prompt, expanded to the image's token count.
    pub media_placeholder_token_id: u32,
    /// `ignore_index` (training only; -100).
    pub ignore_index: i64,
}

impl KimiVlConfig {
    /// Parses `value` (`origin` names the file).
    ///
    /// Errors name the field: a missing `vision_config` or `text_config` (the remote class would
    /// silently build a default 1152-wide model; a checkpoint always has both), a text model
    /// other than `deepseek_v3`/`kimi_k2`, or any bad text or vision field.
    pub fn from_json(value: &Value, origin: &str) -> Result<Self> {
        for key in ["vision_config", "text_config"] {
            match value.get(key) {
                Some(Value::Object(_)) => {}
                None | Some(Value::Null) => {
                    anyhow::bail!("{origin}: invalid `kimi_vl` config: field `{key}` is missing")
                }
                Some(x) => anyhow::bail!(
                    "{origin}: invalid `kimi_vl` config: field `{key}` is {x}, expected an object"
                ),
            }
        }
        // The text/vision readers are K2.5's (they read Kimi-VL's names); the differences are set
        // below.
        let k25 = KimiK25Config::from_json(value, origin, "kimi_vl")?;
        let ignore_index = match value.get("ignore_index") {
            None | Some(Value::Null) => -100,
            Some(x) => x
                .as_i64()
                .with_context(|| format!("{origin}: field `ignore_index` must be an integer"))?,
        };
        let mut vision = k25.vision;
        vision.projector_ln_eps = PROJECTOR_LN_EPS;
        Ok(Self {
            vision_config: vision,
            text_config: k25.text,
            media_placeholder_token_id: k25.media_placeholder_token_id,
            ignore_index,
        })
    }

    /// The runtime shape shared with `kimi_k25` (`model_type` stays `kimi_vl`).
    pub fn into_k25(self) -> KimiK25Config {
        KimiK25Config {
            model_type: "kimi_vl".to_string(),
            text: self.text_config,
            vision: self.vision_config,
            media_placeholder_token_id: self.media_placeholder_token_id,
        }
    }
}
