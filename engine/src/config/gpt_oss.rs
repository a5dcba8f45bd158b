//! `config.json` of `gpt_oss` checkpoints (transformers `GptOssConfig`; OpenAI gpt-oss-20b /
//! -120b).

use super::RopeParameters;
use anyhow::{bail, Result};
use serde::Deserialize;

/// Fields of a gpt-oss `config.json`, with the Hugging Face names.
#[derive(Clone, Debug, Deserialize)]
pub struct GptOssConfig {
    /// `model_type` as written in `config.json`.
    #[serde(default)]
    pub model_type: String,
    /// Rows of `embed_tokens` and of the logits.
    pub vocab_size: usize,
    /// Residual stream width `D`.
    pub hidden_size: usize,
    /// Width `F` of each expert.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads `H`.
    pub num_attention_heads: usize,
    /// Key/value heads `Hkv`.
    pub num_key_value_heads: usize,
    /// Per-head width (64 in the released models).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Context window in tokens.
    pub max_position_embeddings: usize,
    /// `rope_theta` of the released configs.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// YaRN settings of the released configs.
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    /// RoPE settings of transformers ≥ 5.
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Whether `lm_head` shares `embed_tokens`' weight (false in the released models).
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Window of the `sliding_attention` layers (128).
    pub sliding_window: usize,
    /// Per layer `sliding_attention` or `full_attention`; absent: alternating, sliding first.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Routed experts `E`.
    pub num_local_experts: usize,
    /// Experts per token (transformers' name).
    #[serde(default)]
    pub num_experts_per_tok: Option<usize>,
    /// Experts per token (the original configs' name; both are written by the released ones).
    #[serde(default)]
    pub experts_per_token: Option<usize>,
    /// SwiGLU clamp (7.0).
    #[serde(default = "default_limit")]
    pub swiglu_limit: f64,
    /// Bias on q/k/v/o (true in the released models).
    #[serde(default = "default_true")]
    pub attention_bias: bool,
    /// BOS id (int or absent).
    #[serde(default)]
    pub bos_token_id: Option<serde_json::Value>,
    /// EOS id(s) (int, list or absent).
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

fn default_eps() -> f64 {
    1e-5
}
fn default_limit() -> f64 {
    7.0
}
fn default_true() -> bool {
    true
}

/// transformers' `GptOssExperts.alpha`: the sigmoid slope of the gated activation.
pub const GPT_OSS_ALPHA: f32 = 1.702;

impl GptOssConfig {
    /// The RoPE settings, merging `rope_parameters`, `rope_scaling` and `rope_theta`.
    pub fn rope(&self) -> RopeParameters {
        super::rope::merge_rope(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
        )
    }

    /// Experts per token: `num_experts_per_tok`, else `experts_per_token` (0 when neither).
    pub fn top_k(&self) -> usize {
        self.num_experts_per_tok
            .or(self.experts_per_token)
            .unwrap_or(0)
    }

    /// Layer `i`'s window: `Some(sliding_window)` for a `sliding_attention` layer.
    pub fn window(&self, i: usize) -> Option<usize> {
        let sliding = match &self.layer_types {
            Some(t) => t[i] == "sliding_attention",
            None => i.is_multiple_of(2),
        };
        sliding.then_some(self.sliding_window)
    }

    /// Checks the invariants the model code relies on; errors name the field.
    pub fn validate(&self) -> Result<()> {
        super::check_norm_eps(self.rms_norm_eps)?;
        let (h, kv) = (self.num_attention_heads, self.num_key_value_heads);
        if h == 0 || kv == 0 || !h.is_multiple_of(kv) {
            bail!("num_attention_heads ({h}) must be a positive multiple of num_key_value_heads ({kv})");
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("head_dim", self.head_dim),
            ("sliding_window", self.sliding_window),
            ("num_local_experts", self.num_local_experts),
            ("num_experts_per_tok", self.top_k()),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                bail!("field `{name}` must be positive");
            }
        }
        if self.top_k() > self.num_local_experts {
            bail!(
                "num_experts_per_tok ({}) exceeds num_local_experts ({})",
                self.top_k(),
                self.num_local_experts
            );
        }
        if let (Some(a), Some(b)) = (self.num_experts_per_tok, self.experts_per_token) {
            if a != b {
                bail!("num_experts_per_tok ({a}) and experts_per_token ({b}) disagree");
            }
        }
        if !self.head_dim.is_multiple_of(2) {
            bail!("head_dim ({}) must be even", self.head_dim);
        }
        if !self.swiglu_limit.is_finite() || self.swiglu_limit <= 0.0 {
            bail!("swiglu_limit ({}) must be positive", self.swiglu_limit);
        }
        super::check_attention_layer_types(self.layer_types.as_deref(), self.num_hidden_layers)?;
        super::rope::validate_rope_sources(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
        )
    }
}
