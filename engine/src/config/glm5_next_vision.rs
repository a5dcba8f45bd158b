//! The vision tower of `glm5_next` checkpoints (GLM-5.3-Flash; transformers 5.24
//! `Glm5NextVisionConfig`), read from `config.json`'s `vision_config`, plus the top-level image
//! token ids (`Glm5NextConfig.image_token_id`, …). Field names mirror transformers'; defaults
//! are its defaults (vision.md §6).

use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// `rope_parameters` of the vision config (only `axial` RoPE exists upstream).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Glm5VisionRope {
    /// RoPE base θ (10000).
    #[serde(default = "d_theta")]
    pub rope_theta: f64,
    /// Must be `axial`.
    #[serde(default = "d_rope_type")]
    pub rope_type: String,
}

impl Default for Glm5VisionRope {
    fn default() -> Self {
        Self {
            rope_theta: d_theta(),
            rope_type: d_rope_type(),
        }
    }
}

/// `vision_config` of a `glm5_next` checkpoint. Shapes: `C` = `hidden_size`, `p` =
/// `patch_size`, `m` = `spatial_merge_size`, `D` = `out_hidden_size` (= the text hidden size).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Glm5NextVisionConfig {
    /// Encoder blocks (24).
    #[serde(default = "d_depth", alias = "num_hidden_layers")]
    pub depth: usize,
    /// Encoder width `C` (1024).
    #[serde(default = "d_hidden")]
    pub hidden_size: usize,
    /// Activation of the SwiGLUs (`silu`, the only one supported).
    #[serde(default = "d_act")]
    pub hidden_act: String,
    /// Bias on `qkv`, `proj` and the block MLP linears (true).
    #[serde(default = "yes")]
    pub attention_bias: bool,
    /// Attention heads (16; head dim `C / heads`).
    #[serde(default = "d_heads", alias = "num_attention_heads")]
    pub num_heads: usize,
    /// Input channels (3).
    #[serde(default = "d_channels")]
    pub in_channels: usize,
    /// Patch side in pixels `p` (14).
    #[serde(default = "d_patch")]
    pub patch_size: usize,
    /// RMSNorm eps of the blocks, q/k norms and `post_layernorm` (1e-5).
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    /// Patches merged per side `m` (2).
    #[serde(default = "d_merge")]
    pub spatial_merge_size: usize,
    /// Frames per temporal patch `T` (2; a still image is repeated T times).
    #[serde(default = "d_temporal")]
    pub temporal_patch_size: usize,
    /// Width after the downsample and of the merger `D` (1536 by default; must equal the text
    /// hidden size).
    #[serde(default = "d_out")]
    pub out_hidden_size: usize,
    /// Block MLP width (4096).
    #[serde(default = "d_inter")]
    pub intermediate_size: usize,
    /// Merger SwiGLU width (10240).
    #[serde(default = "d_proj_inter")]
    pub projection_intermediate_size: usize,
    /// Clamp of every vision SwiGLU: gate ≤ l, up ∈ [−l, l] (10).
    #[serde(default = "d_limit")]
    pub swiglu_limit: f64,
    /// Axial RoPE settings.
    #[serde(default)]
    pub rope_parameters: Glm5VisionRope,
}

/// The vision tower's settings and the image token ids of a `glm5_next` config.
#[derive(Clone, Debug, PartialEq)]
pub struct Glm5NextVision {
    /// `vision_config`.
    pub vision: Glm5NextVisionConfig,
    /// `<|image|>` (`image_token_id`, 154854): one per merged token in the prompt.
    pub image_token_id: u32,
    /// `<|begin_of_image|>` (`image_start_token_id`, 154830).
    pub image_start_token_id: u32,
    /// `<|end_of_image|>` (`image_end_token_id`, 154831).
    pub image_end_token_id: u32,
    /// Text hidden size (`text_config.hidden_size`, or top-level for a flat config).
    pub text_hidden_size: usize,
}

impl Glm5NextVisionConfig {
    /// Head dim `C / heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Patches per merged token, `m²`.
    pub fn merge_area(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }
}

impl Glm5NextVision {
    /// Reads a whole `glm5_next` `config.json` value (`origin` names the file). `Ok(None)`: the
    /// config has no `vision_config` (a text-only checkpoint).
    ///
    /// Errors name the field: a value of the wrong type, zero sizes, a head dim not divisible
    /// by 4 (the axial RoPE splits each rotate-half half into row and column quarters), an
    /// activation other than `silu`, a RoPE type other than `axial`, `out_hidden_size` unequal to
    /// the text hidden size (the splice replaces embedding rows one for one).
    pub fn from_json(cfg: &Value, origin: &str) -> Result<Option<Self>> {
        let Some(v) = cfg.get("vision_config").filter(|v| !v.is_null()) else {
            return Ok(None);
        };
        let vision: Glm5NextVisionConfig = serde_json::from_value(v.clone())
            .with_context(|| format!("{origin}: field `vision_config`"))?;
        let id = |key: &str, default: u32| -> Result<u32> {
            match cfg.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .with_context(|| format!("{origin}: field `{key}` must be a token id")),
            }
        };
        let text = cfg.get("text_config").unwrap_or(cfg);
        let text_hidden_size = match text.get("hidden_size") {
            None | Some(Value::Null) => 4096,
            Some(x) => x
                .as_u64()
                .context("field `text_config.hidden_size` must be an integer")?
                as usize,
        };
        let c = Self {
            vision,
            image_token_id: id("image_token_id", 154854)?,
            image_start_token_id: id("image_start_token_id", 154830)?,
            image_end_token_id: id("image_end_token_id", 154831)?,
            text_hidden_size,
        };
        c.validate()
            .with_context(|| format!("{origin}: `vision_config`"))?;
        Ok(Some(c))
    }

    fn validate(&self) -> Result<()> {
        super::check_norm_eps(self.vision.rms_norm_eps)?;
        let v = &self.vision;
        for (name, n) in [
            ("depth", v.depth),
            ("hidden_size", v.hidden_size),
            ("num_heads", v.num_heads),
            ("patch_size", v.patch_size),
            ("spatial_merge_size", v.spatial_merge_size),
            ("temporal_patch_size", v.temporal_patch_size),
            ("out_hidden_size", v.out_hidden_size),
            ("intermediate_size", v.intermediate_size),
            (
                "projection_intermediate_size",
                v.projection_intermediate_size,
            ),
        ] {
            if n == 0 {
                bail!("`{name}` must be > 0");
            }
        }
        if v.in_channels != 3 {
            bail!("`in_channels` {} is not supported (RGB: 3)", v.in_channels);
        }
        if !v.hidden_size.is_multiple_of(v.num_heads) || !v.head_dim().is_multiple_of(4) {
            bail!(
                "`hidden_size` {} must split into `num_heads` {} heads of a multiple of 4",
                v.hidden_size,
                v.num_heads
            );
        }
        if v.hidden_act != "silu" {
            bail!(
                "`hidden_act` `{}` is not supported (expected silu)",
                v.hidden_act
            );
        }
        if v.rope_parameters.rope_type != "axial" {
            bail!(
                "`rope_parameters.rope_type` `{}` is not supported (expected axial)",
                v.rope_parameters.rope_type
            );
        }
        if v.out_hidden_size != self.text_hidden_size {
            bail!(
                "`out_hidden_size` {} differs from the text hidden size {}: image rows could not replace token embeddings",
                v.out_hidden_size,
                self.text_hidden_size
            );
        }
        Ok(())
    }
}

fn yes() -> bool {
    true
}
fn d_depth() -> usize {
    24
}
fn d_hidden() -> usize {
    1024
}
fn d_act() -> String {
    "silu".into()
}
fn d_heads() -> usize {
    16
}
fn d_channels() -> usize {
    3
}
fn d_patch() -> usize {
    14
}
fn d_eps() -> f64 {
    1e-5
}
fn d_merge() -> usize {
    2
}
fn d_temporal() -> usize {
    2
}
fn d_out() -> usize {
    1536
}
fn d_inter() -> usize {
    4096
}
fn d_proj_inter() -> usize {
    10240
}
fn d_limit() -> f64 {
    10.0
}
fn d_theta() -> f64 {
    10000.0
}
fn d_rope_type() -> String {
    "axial".into()
}
