//! Model configs: serde structs mirroring each architecture's `config.json` field names.

mod deepseek_v3;
mod glm5_next;
mod glm5_next_vision;
mod gpt_oss;
mod kimi_k25;
mod kimi_linear;
mod kimi_vl;
mod llama;
mod moonvit;
pub(crate) mod rope;

pub use deepseek_v3::DeepseekV3Config;
pub use glm5_next::{Glm5LayerKind, Glm5LinearAttnConfig, Glm5NextConfig};
pub use glm5_next_vision::{Glm5NextVision, Glm5NextVisionConfig, Glm5VisionRope};
pub use gpt_oss::{GptOssConfig, GPT_OSS_ALPHA};
pub use kimi_k25::KimiK25Config;
pub use kimi_linear::{KimiLinearConfig, LinearAttnConfig};
pub use kimi_vl::KimiVlConfig;
pub use llama::LlamaConfig;
pub use moonvit::MoonVitConfig;
pub use rope::{rope_inv_freq, RopeParameters};

use anyhow::{bail, Context, Result};

/// transformers' `mlp_layer_types` (DeepSeek-V3.2, Kimi-Linear), when present: one entry per
/// layer, each `dense` or `sparse` (MoE). Errors name the field.
pub(crate) fn check_mlp_layer_types(types: Option<&[String]>, n: usize) -> anyhow::Result<()> {
    let Some(t) = types else { return Ok(()) };
    if t.len() != n {
        anyhow::bail!(
            "field `mlp_layer_types` has {} entries but num_hidden_layers is {n}",
            t.len()
        );
    }
    if let Some((i, x)) = t
        .iter()
        .enumerate()
        .find(|(_, x)| *x != "dense" && *x != "sparse")
    {
        anyhow::bail!("field `mlp_layer_types`[{i}] is '{x}' (expected 'dense' or 'sparse')");
    }
    Ok(())
}

/// `rms_norm_eps` (the RMSNorm's ε, `x / sqrt(mean(x²) + ε)`): a number > 0 that stays finite and
/// non-zero as f32 — at 0 an all-zero row divides 0 by 0, below 0 a small row takes the root of a
/// negative number, and either fills the logits with NaN (which greedy decoding reads as
/// token 0).
pub(crate) fn check_norm_eps(eps: f64) -> Result<()> {
    // The kernels take ε as f32: 1e-46 would become 0 there and 1e39 infinity.
    let e = eps as f32;
    if !(e.is_finite() && e > 0.0) {
        anyhow::bail!("rms_norm_eps must be a finite number > 0, got {eps}");
    }
    Ok(())
}

/// transformers' attention `layer_types`, when present: one entry per layer, each
/// `full_attention` or `sliding_attention`. Errors name the field.
pub(crate) fn check_attention_layer_types(types: Option<&[String]>, n: usize) -> Result<()> {
    let Some(t) = types else { return Ok(()) };
    if t.len() != n {
        bail!(
            "field `layer_types` has {} entries but num_hidden_layers is {n}",
            t.len()
        );
    }
    if let Some((i, x)) = t
        .iter()
        .enumerate()
        .find(|(_, x)| *x != "full_attention" && *x != "sliding_attention")
    {
        bail!(
            "field `layer_types`[{i}] is '{x}' (expected 'full_attention' or 'sliding_attention')"
        );
    }
    Ok(())
}

/// Deserialises `value` as `T` (errors name the field path) and validates it.
pub(crate) fn parse_as<T: serde::de::DeserializeOwned>(
    value: &serde_json::Value,
    origin: &str,
    model_type: &str,
    validate: impl Fn(&T) -> Result<()>,
) -> Result<T> {
    let cfg: T = serde_path_to_error::deserialize(value.clone()).map_err(|e| {
        // serde names a missing field itself, at the root path `.`: no path to add then.
        let path = e.path().to_string();
        if path == "." {
            anyhow::anyhow!("{origin}: invalid `{model_type}` config: {}", e.inner())
        } else {
            anyhow::anyhow!(
                "{origin}: invalid `{model_type}` config: field `{path}`: {}",
                e.inner()
            )
        }
    })?;
    validate(&cfg).with_context(|| format!("{origin}: invalid `{model_type}` config"))?;
    Ok(cfg)
}

/// The architectures dayone runs, keyed by `config.json`'s `model_type`.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "deepseek_v3",
    "kimi_k2",
    "deepseek_v32",
    "kimi_linear",
    "glm5_next",
    "gpt_oss",
    "kimi_k25",
    "kimi_vl",
];

/// A parsed `config.json`, one variant per supported `model_type`.
// Parsed once per model: the size of the larger variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum ModelConfig {
    /// `model_type: "llama"` (Llama 2/3, SmolLM2, Mistral-style dense decoders); also `qwen2`,
    /// whose registry row plans q/k/v biases.
    Llama(LlamaConfig),
    /// `model_type: "qwen3"`: the Llama skeleton plus per-head q/k RMSNorm and explicit `head_dim`.
    Qwen3(LlamaConfig),
    /// `model_type: "deepseek_v3"` (DeepSeek-V3/R1, Kimi-K2): MLA + sigmoid-routed MoE; also
    /// `deepseek_v32`, whose config adds the DSA indexer fields.
    DeepseekV3(DeepseekV3Config),
    /// `model_type: "kimi_linear"`: KDA linear attention beside NoPE MLA, MoE.
    KimiLinear(KimiLinearConfig),
    /// `model_type: "glm5_next"` (GLM-5.3-Flash, text): hyper-connections around KDA and NoPE
    /// MLA with a pooled DSA indexer, clamped-SwiGLU MoE.
    Glm5Next(Glm5NextConfig),
    /// `model_type: "gpt_oss"` (OpenAI gpt-oss): GQA with attention sinks, alternating
    /// sliding-window and full layers, YaRN; MoE with a biased softmax-top-k router and
    /// MXFP4 experts.
    GptOss(GptOssConfig),
    /// `model_type: "kimi_k25"` (Kimi-K2.5): a MoonViT vision tower and projector in front of a
    /// `deepseek_v3` text model; also `kimi_vl` (Kimi-VL, read by [`KimiVlConfig`]), the same
    /// model for images under other projector names.
    KimiK25(Box<KimiK25Config>),
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
        match crate::models::architecture(model_type) {
            Some(arch) => (arch.parse)(value, origin, model_type),
            None => bail!(
                "{origin}: unsupported model_type '{model_type}' (supported: {})",
                SUPPORTED_MODEL_TYPES.join(", ")
            ),
        }
    }

    /// `config.json`'s `model_type` (the key of the architecture's registry row).
    pub fn model_type(&self) -> &str {
        match self {
            ModelConfig::Llama(c) | ModelConfig::Qwen3(c) => &c.model_type,
            ModelConfig::DeepseekV3(c) => &c.model_type,
            ModelConfig::KimiLinear(c) => &c.model_type,
            ModelConfig::Glm5Next(c) => &c.model_type,
            ModelConfig::GptOss(c) => &c.model_type,
            ModelConfig::KimiK25(c) => &c.model_type,
        }
    }

    /// The per-layer plan of this config (mixer, FFN and widths of every layer), from which the
    /// model is built and its cache spec derived.
    pub fn layer_plan(&self) -> Result<crate::models::ModelPlan> {
        crate::models::layer_plan(self)
    }

    /// Longest sequence (prompt + generated tokens) the model accepts.
    pub fn max_context(&self) -> usize {
        match self {
            ModelConfig::Llama(c) | ModelConfig::Qwen3(c) => c.max_position_embeddings,
            ModelConfig::DeepseekV3(c) => c.max_position_embeddings,
            ModelConfig::KimiLinear(c) => c.max_position_embeddings,
            ModelConfig::Glm5Next(c) => c.max_position_embeddings,
            ModelConfig::GptOss(c) => c.max_position_embeddings,
            ModelConfig::KimiK25(c) => c.text.max_position_embeddings,
        }
    }

    /// Decoder layers whose tensors a checkpoint may hold: `num_hidden_layers`, plus DeepSeek's
    /// multi-token-prediction layers stored after them.
    pub fn stored_layers(&self) -> usize {
        match self {
            ModelConfig::Llama(c) | ModelConfig::Qwen3(c) => c.num_hidden_layers,
            ModelConfig::DeepseekV3(c) => c.num_hidden_layers + c.num_nextn_predict_layers,
            ModelConfig::KimiLinear(c) => c.num_hidden_layers,
            // Plus the multi-token-prediction layer stored after them.
            ModelConfig::Glm5Next(c) => c.num_hidden_layers + 1,
            ModelConfig::GptOss(c) => c.num_hidden_layers,
            ModelConfig::KimiK25(c) => c.text.num_hidden_layers + c.text.num_nextn_predict_layers,
        }
    }

    /// Vocabulary size (rows of the logits).
    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Llama(c) | ModelConfig::Qwen3(c) => c.vocab_size,
            ModelConfig::DeepseekV3(c) => c.vocab_size,
            ModelConfig::KimiLinear(c) => c.vocab_size,
            ModelConfig::Glm5Next(c) => c.vocab_size,
            ModelConfig::GptOss(c) => c.vocab_size,
            ModelConfig::KimiK25(c) => c.text.vocab_size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// A fixture's `config.json` with `edit` applied.
    fn fixture(name: &str, edit: impl FnOnce(&mut Value)) -> Value {
        let path = format!(
            "{}/../tests/fixtures/{name}/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        edit(&mut v);
        v
    }

    /// The one-line error of parsing `v` (panics when it parses).
    fn error_of(v: &Value) -> String {
        format!(
            "{:#}",
            ModelConfig::from_json(v, "config.json").unwrap_err()
        )
    }

    #[test]
    fn fixtures_parse() {
        for name in [
            "llama_tiny",
            "qwen2_tiny",
            "qwen3_tiny",
            "deepseek_v3_tiny",
            "deepseek_v32_tiny",
            "kimi_linear_tiny",
            "glm5_next_tiny",
        ] {
            ModelConfig::from_json(&fixture(name, |_| {}), name).unwrap();
        }
    }

    #[test]
    fn a_missing_field_is_named_once_without_a_root_path() {
        let v = fixture("llama_tiny", |v| {
            v.as_object_mut().unwrap().remove("hidden_size");
        });
        assert_eq!(
            error_of(&v),
            "config.json: invalid `llama` config: missing field `hidden_size`"
        );
        let v = fixture("llama_tiny", |v| v["hidden_size"] = json!("wide"));
        assert!(
            error_of(&v).contains("field `hidden_size`: invalid type"),
            "{}",
            error_of(&v)
        );
    }

    #[test]
    fn rope_factor_must_be_positive() {
        for f in [0.0, -2.0] {
            let v = fixture("deepseek_v32_tiny", |v| {
                v["rope_parameters"]["factor"] = json!(f)
            });
            let e = error_of(&v);
            assert!(
                e.contains("rope_parameters.factor must be a finite number > 0"),
                "{e}"
            );
        }
        let v = fixture("deepseek_v3_tiny", |v| {
            let p = v["rope_parameters"].take();
            v["rope_scaling"] = p;
            v["rope_scaling"]["beta_slow"] = json!(0);
        });
        let e = error_of(&v);
        assert!(e.contains("rope_scaling.beta_slow"), "{e}");
    }

    #[test]
    fn kimi_duplicate_layers_and_expert_counts_are_errors() {
        let dup = fixture("kimi_linear_tiny", |v| {
            v["linear_attn_config"]["kda_layers"] = json!([1, 1, 3]);
            v.as_object_mut().unwrap().remove("layer_types");
        });
        let e = error_of(&dup);
        assert!(
            e.contains("`linear_attn_config.kda_layers` lists layer 1 twice"),
            "{e}"
        );
        for k in [0, 9] {
            let bad = fixture("kimi_linear_tiny", |v| {
                v["num_experts_per_token"] = json!(k);
            });
            let e = error_of(&bad);
            assert!(e.contains("num_experts_per_token"), "{e}");
        }
    }

    #[test]
    fn kimi_layer_lists_must_agree() {
        let overlap = fixture("kimi_linear_tiny", |v| {
            v["linear_attn_config"]["kda_layers"] = json!([1, 2, 3]);
            v.as_object_mut().unwrap().remove("layer_types");
        });
        let e = error_of(&overlap);
        assert!(e.contains("layer 2 is in both `linear_attn_config.kda_layers` and `linear_attn_config.full_attn_layers`"), "{e}");

        let contradict = fixture("kimi_linear_tiny", |v| {
            v["layer_types"] = json!([
                "full_attention",
                "full_attention",
                "linear_attention",
                "full_attention"
            ]);
        });
        let e = error_of(&contradict);
        assert!(e.contains("`layer_types`[0] is 'full_attention' but `linear_attn_config.kda_layers` lists layer 1"), "{e}");

        let short = fixture("kimi_linear_tiny", |v| {
            v["layer_types"] = json!(["linear_attention", "full_attention"]);
        });
        let e = error_of(&short);
        assert!(
            e.contains("field `layer_types` has 2 entries but num_hidden_layers is 4"),
            "{e}"
        );

        let gap = fixture("kimi_linear_tiny", |v| {
            v["linear_attn_config"]["kda_layers"] = json!([1]);
            v.as_object_mut().unwrap().remove("layer_types");
        });
        assert!(
            error_of(&gap).contains("layer 3 is in neither"),
            "{}",
            error_of(&gap)
        );

        let bad_mlp = fixture("kimi_linear_tiny", |v| {
            v["mlp_layer_types"] = json!(["dense"])
        });
        assert!(error_of(&bad_mlp).contains("field `mlp_layer_types` has 1 entries"));

        let outside = fixture("kimi_linear_tiny", |v| {
            v["linear_attn_config"]["full_attn_layers"] = json!([2, 5]);
        });
        assert!(error_of(&outside).contains("field `linear_attn_config.full_attn_layers`: layer 5"));
    }

    #[test]
    fn deepseek_layer_types_are_checked_and_mlp_layer_types_honoured() {
        let ModelConfig::DeepseekV3(c) = ModelConfig::from_json(
            &fixture("deepseek_v32_tiny", |v| {
                v["mlp_layer_types"] = json!(["dense", "dense", "sparse"]);
            }),
            "x",
        )
        .unwrap() else {
            panic!("not deepseek")
        };
        assert_eq!(
            (0..3).map(|i| c.is_moe_layer(i)).collect::<Vec<_>>(),
            [false, false, true]
        );

        let v = fixture("deepseek_v32_tiny", |v| {
            v["layer_types"][1] = json!("full_attention")
        });
        let e = error_of(&v);
        assert!(
            e.contains("field `layer_types`[1] is 'full_attention'"),
            "{e}"
        );
        let v = fixture("deepseek_v32_tiny", |v| {
            v["mlp_layer_types"] = json!(["dense", "sparse"])
        });
        assert!(error_of(&v)
            .contains("field `mlp_layer_types` has 2 entries but num_hidden_layers is 3"));
        let v = fixture("deepseek_v32_tiny", |v| {
            v["mlp_layer_types"][2] = json!("moe")
        });
        assert!(error_of(&v).contains("field `mlp_layer_types`[2] is 'moe'"));

        // deepseek_v3 derives the pattern; a contradicting list is an error.
        let v = fixture("deepseek_v3_tiny", |v| {
            let n = v["num_hidden_layers"].as_u64().unwrap() as usize;
            v["first_k_dense_replace"] = json!(1);
            v["mlp_layer_types"] = json!(vec!["dense"; n]);
        });
        assert!(
            error_of(&v)
                .contains("field `mlp_layer_types`[1] is 'dense' but first_k_dense_replace (1)"),
            "{}",
            error_of(&v)
        );
    }
}
