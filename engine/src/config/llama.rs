//! `config.json` of `llama`, `qwen2` and `qwen3` checkpoints (transformers `LlamaConfig` /
//! `Qwen2Config` / `Qwen3Config`).

use super::RopeParameters;
use anyhow::{bail, Result};
use serde::Deserialize;

/// Fields of a Llama-family `config.json`, with the Hugging Face names.
#[derive(Clone, Debug, Deserialize)]
pub struct LlamaConfig {
    /// `model_type` as written in `config.json` (picks the architecture's registry row).
    #[serde(default)]
    pub model_type: String,
    /// Rows of `embed_tokens` and of the logits.
    pub vocab_size: usize,
    /// Residual stream width `D`.
    pub hidden_size: usize,
    /// Width `F` of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads `H`.
    pub num_attention_heads: usize,
    /// Key/value heads `Hkv` (GQA); defaults to `H`.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width; defaults to `D / H` (Qwen3 sets it explicitly).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Context window in tokens.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// `rope_theta` of older configs (transformers ≥ 5 moves it into `rope_parameters`).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// RoPE scaling of older configs (`rope_type`/`type`, `factor`, …).
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    /// RoPE settings of transformers ≥ 5 (`rope_type`, `rope_theta`, `factor`, …).
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Whether `lm_head` shares `embed_tokens`' weight.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v/o projections.
    #[serde(default)]
    pub attention_bias: bool,
    /// Bias on the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// MLP activation; only `silu` is supported.
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Qwen2/Qwen3: whether `sliding_window` applies (to layers from `max_window_layers` on).
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Attention window of sliding layers (Mistral, Qwen2 with `use_sliding_window`).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2/Qwen3: layers below this index keep full attention when `use_sliding_window`.
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// transformers ≥ 5: per-layer `full_attention` / `sliding_attention`.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// BOS id (int or absent).
    #[serde(default)]
    pub bos_token_id: Option<serde_json::Value>,
    /// EOS id(s) (int, list or absent).
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
}

fn default_eps() -> f64 {
    1e-6
}
fn default_max_pos() -> usize {
    2048
}
fn default_act() -> String {
    "silu".into()
}

impl LlamaConfig {
    /// Key/value heads (`num_key_value_heads`, else `num_attention_heads`).
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Per-head width (`head_dim`, else `hidden_size / num_attention_heads`).
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The RoPE settings, merging `rope_parameters`, `rope_scaling` and `rope_theta`.
    pub fn rope(&self) -> RopeParameters {
        super::rope::merge_rope(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
        )
    }

    /// Qwen2/Qwen3's sliding layers: from `layer_types` when present, else (older configs) the
    /// layers from `max_window_layers` on when `use_sliding_window` and `sliding_window` are set.
    /// `Some(window)` for a sliding layer.
    pub fn qwen_window(&self, layer: usize) -> Option<usize> {
        let window = self.sliding_window?;
        match &self.layer_types {
            Some(t) => {
                (t.get(layer).map(String::as_str) == Some("sliding_attention")).then_some(window)
            }
            None => (self.use_sliding_window && layer >= self.max_window_layers.unwrap_or(0))
                .then_some(window),
        }
    }

    /// Checks the invariants the model code relies on; errors name the field.
    pub fn validate(&self) -> Result<()> {
        super::check_norm_eps(self.rms_norm_eps)?;
        let h = self.num_attention_heads;
        let kv = self.kv_heads();
        if h == 0 || kv == 0 || !h.is_multiple_of(kv) {
            bail!("num_attention_heads ({h}) must be a positive multiple of num_key_value_heads ({kv})");
        }
        if self.head_dim() == 0 || !self.head_dim().is_multiple_of(2) {
            bail!("head_dim ({}) must be positive and even", self.head_dim());
        }
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                bail!("field `{name}` must be positive");
            }
        }
        if self.hidden_act != "silu" {
            bail!(
                "hidden_act '{}' is not supported (expected 'silu')",
                self.hidden_act
            );
        }
        super::check_attention_layer_types(self.layer_types.as_deref(), self.num_hidden_layers)?;
        if self.mlp_bias {
            bail!("mlp_bias = true is not supported yet");
        }
        super::rope::validate_rope_sources(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
        )
    }
}
