//! Qwen2 / Qwen2.5 (Qwen team 2024; HF `modeling_qwen2.py`): the Llama skeleton with a bias on
//! the q, k and v projections (none on `o_proj`; HF hardcodes it, the config has no field), and
//! optional sliding-window layers (`use_sliding_window`, `max_window_layers`, `layer_types`),
//! which the backends cannot run yet and are refused at load.
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += attn_qkvbias(rmsnorm_in(h));  h += mlp(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```

use super::registry::Architecture;
use crate::config::{parse_as, LlamaConfig, ModelConfig};
use anyhow::bail;

/// `qwen2` (parsed into the Llama config; its `model_type` picks this row's plan).
pub const ARCH: Architecture = Architecture {
    model_types: &["qwen2"],
    parse: |v, origin, model_type| {
        Ok(ModelConfig::Llama(parse_as(
            v,
            origin,
            model_type,
            LlamaConfig::validate,
        )?))
    },
    plan: |c| match c {
        ModelConfig::Llama(c) if c.model_type == "qwen2" => {
            super::llama::plan_with(c, true, None, |i| c.qwen_window(i))
        }
        other => bail!("the qwen2 plan got a `{}` config", other.model_type()),
    },
};

#[cfg(test)]
mod tests {
    use crate::config::ModelConfig;
    use crate::models::Mixer;
    use serde_json::{json, Value};

    fn config(edit: impl FnOnce(&mut Value)) -> ModelConfig {
        let path = format!(
            "{}/../tests/fixtures/qwen2_tiny/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        edit(&mut v);
        ModelConfig::from_json(&v, "config.json").unwrap()
    }

    fn windows(c: &ModelConfig) -> Vec<(bool, Option<usize>)> {
        c.layer_plan()
            .unwrap()
            .layers
            .iter()
            .map(|l| match &l.mixer {
                Mixer::Attention {
                    bias,
                    sliding_window,
                    ..
                } => (*bias, *sliding_window),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn qkv_bias_always_and_sliding_layers_from_the_config() {
        // No `attention_bias` field: Qwen2 has the biases regardless.
        assert_eq!(windows(&config(|_| {})), vec![(true, None); 2]);
        // transformers ≥ 5: `layer_types`.
        let c = config(|v| {
            v["use_sliding_window"] = json!(true);
            v["sliding_window"] = json!(8);
            v["layer_types"] = json!(["full_attention", "sliding_attention"]);
        });
        assert_eq!(windows(&c), vec![(true, None), (true, Some(8))]);
        // Older configs: layers from `max_window_layers` on.
        let c = config(|v| {
            v.as_object_mut().unwrap().remove("layer_types");
            v["use_sliding_window"] = json!(true);
            v["sliding_window"] = json!(8);
            v["max_window_layers"] = json!(1);
        });
        assert_eq!(windows(&c), vec![(true, None), (true, Some(8))]);
        // `use_sliding_window: false` (Qwen2.5's configs carry a `sliding_window` anyway).
        let c = config(|v| {
            v.as_object_mut().unwrap().remove("layer_types");
            v["sliding_window"] = json!(32768);
            v["max_window_layers"] = json!(0);
        });
        assert_eq!(windows(&c), vec![(true, None); 2]);
    }
}
