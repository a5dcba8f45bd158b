//! Layer composition by config: checkpoints whose layers are re-typed by `config.json` alone run
//! through the same decoder with no new code, and match transformers 5.24.
//!
//! - `kimi_linear_mix` (`fixtures/gen_kimi_linear.py`): kimi_linear_tiny's widths with
//!   `kda_layers` [2, 3] / `full_attn_layers` [1, 4] (MLA, KDA, KDA, MLA) and `mlp_layer_types`
//!   [sparse, dense, sparse, dense]: an MLA first layer and an MoE first FFN, which no other
//!   fixture has.
//! - `deepseek_v3_mix` (`fixtures/gen_deepseek.py`): deepseek_v3_tiny's shapes with
//!   `first_k_dense_replace` 2 (dense, dense, MoE).

use anyhow::Result;
use dayone_backend::DType;
use dayone_engine::cache::LayerCacheSpec;
use dayone_engine::config::ModelConfig;
use dayone_engine::models::{Ffn, Mixer};
use dayone_tests::{check_golden, fixture, on_every_backend};

/// A fixture's layer kinds from its config alone: (`mixer`, `ffn`) per layer.
fn layer_kinds(name: &str) -> Result<Vec<(&'static str, &'static str)>> {
    let path = fixture(name).join("config.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let plan = ModelConfig::from_json(&json, name)?.layer_plan()?;
    Ok(plan
        .layers
        .iter()
        .map(|l| {
            let mixer = match &l.mixer {
                Mixer::Attention { .. } => "attention",
                Mixer::Mla { indexer: None, .. } => "mla",
                Mixer::Mla { .. } => "mla+dsa",
                Mixer::Kda { .. } => "kda",
            };
            let ffn = match l.ffn {
                Ffn::Dense { .. } => "dense",
                Ffn::Moe { .. } | Ffn::GptOssMoe { .. } => "moe",
            };
            (mixer, ffn)
        })
        .collect())
}

#[test]
fn plans_follow_the_configs() -> Result<()> {
    assert_eq!(
        layer_kinds("kimi_linear_tiny")?,
        [
            ("kda", "dense"),
            ("mla", "moe"),
            ("kda", "moe"),
            ("mla", "moe")
        ]
    );
    assert_eq!(
        layer_kinds("kimi_linear_mix")?,
        [
            ("mla", "moe"),
            ("kda", "dense"),
            ("kda", "moe"),
            ("mla", "dense")
        ]
    );
    assert_eq!(
        layer_kinds("deepseek_v3_tiny")?,
        [("mla", "dense"), ("mla", "moe"), ("mla", "moe")]
    );
    assert_eq!(
        layer_kinds("deepseek_v3_mix")?,
        [("mla", "dense"), ("mla", "dense"), ("mla", "moe")]
    );
    assert_eq!(
        layer_kinds("deepseek_v32_tiny")?,
        [("mla+dsa", "dense"), ("mla+dsa", "moe"), ("mla+dsa", "moe")]
    );
    Ok(())
}

#[test]
fn cache_specs_follow_the_mixers() -> Result<()> {
    let path = fixture("kimi_linear_mix").join("config.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let spec = ModelConfig::from_json(&json, "kimi_linear_mix")?
        .layer_plan()?
        .cache_spec();
    let kinds: Vec<bool> = spec
        .layers
        .iter()
        .map(|l| matches!(l, LayerCacheSpec::Recurrent { .. }))
        .collect();
    assert_eq!(kinds, [false, true, true, false]);
    assert_eq!(
        spec.layers[0],
        LayerCacheSpec::PagedLatent { width: 16 + 8 }
    );
    Ok(())
}

on_every_backend! {
    kimi_mix_f32 => |mk: fn() -> _| check_golden(mk(), "kimi_linear_mix", DType::F32);
    kimi_mix_bf16 => |mk: fn() -> _| check_golden(mk(), "kimi_linear_mix", DType::BF16);
    deepseek_mix_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_mix", DType::F32);
    deepseek_mix_bf16 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_mix", DType::BF16);
}
