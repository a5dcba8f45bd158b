//! Hugging Face checkpoint directories: `config.json`, safetensors, tokenizer files.

use super::{Checkpoint, SafetensorsSource, TokenizerAssets};
use crate::tokenizer::{self, Tokenizer};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::path::Path;

/// Opens an HF directory as a [`Checkpoint`]: `config.json`, the safetensors weights
/// (see [`SafetensorsSource::open_dir`]) and the tokenizer assets (see [`read_assets`]).
pub fn open_hf_dir(dir: &Path) -> Result<Checkpoint> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        bail!(
            "{}: no config.json (expected a Hugging Face model directory or a .gguf file)",
            dir.display()
        );
    }
    let config = read_json(&config_path)?;
    if !config.is_object() {
        bail!("{}: expected a JSON object", config_path.display());
    }
    check_quant_method(&config, &config_path)?;
    let fp8_block = config
        .get("quantization_config")
        .and_then(|q| q.get("weight_block_size"))
        .and_then(|b| serde_json::from_value::<[usize; 2]>(b.clone()).ok());
    let tensors = SafetensorsSource::open_dir(dir)?.with_fp8_block(fp8_block);
    let assets = read_assets(dir, &config)?;
    Ok(Checkpoint {
        path: dir.to_path_buf(),
        config,
        tensors: Box::new(tensors),
        assets,
    })
}

/// The `quantization_config.quant_method` values whose tensors dayone reads: DeepSeek's
/// block-scaled FP8, gpt-oss's MXFP4 and compressed-tensors (packed INT4 / MXFP4, FP8).
pub const QUANT_METHODS: [&str; 3] = ["fp8", "mxfp4", "compressed-tensors"];

/// Refuses a checkpoint quantized by a method dayone cannot read (AWQ, GPTQ, bitsandbytes, …),
/// naming the file, the field and the methods it reads — instead of failing later on a missing
/// or oddly typed tensor.
fn check_quant_method(config: &Value, path: &Path) -> Result<()> {
    let q = match config.get("quantization_config") {
        None | Some(Value::Null) => return Ok(()),
        Some(q @ Value::Object(_)) => q,
        Some(other) => bail!(
            "{}: quantization_config is {other}; expected an object with a quant_method ({})",
            path.display(),
            QUANT_METHODS.join(", ")
        ),
    };
    match q.get("quant_method") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if QUANT_METHODS.contains(&m.as_str()) => Ok(()),
        Some(other) => bail!(
            "{}: quantization_config.quant_method is {other}; dayone reads {} checkpoints \
             (or the unquantized model)",
            path.display(),
            QUANT_METHODS.join(", ")
        ),
    }
}

/// Reads and parses a JSON file; errors name the file.
pub(crate) fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: invalid JSON", path.display()))
}

/// Reads a JSON file when it exists.
fn read_json_opt(path: &Path) -> Result<Option<Value>> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// A special token written as `"<s>"` or `{"content": "<s>", ...}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o
            .get("content")
            .and_then(|c| c.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// An id field written as an integer or a list of integers. Errors name the file and field.
fn ids_field(v: Option<&Value>, file: &Path, field: &str) -> Result<Vec<u32>> {
    let bad = || {
        anyhow::anyhow!(
            "{}: field {field} should be a token id or a list of token ids",
            file.display()
        )
    };
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Number(n)) => Ok(vec![n
            .as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(bad)?]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(bad)
            })
            .collect(),
        Some(_) => Err(bad()),
    }
}

/// The chat template of `tokenizer_config.json`: a string, or a list of
/// `{name, template}` (the one named `default`, else the first).
fn chat_template_field(v: Option<&Value>, file: &Path) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |want: Option<&str>| {
                list.iter().find_map(|t| {
                    let name = t.get("name").and_then(|n| n.as_str());
                    let tpl = t.get("template").and_then(|n| n.as_str())?;
                    match want {
                        Some(w) if name != Some(w) => None,
                        _ => Some(tpl.to_string()),
                    }
                })
            };
            match named(Some("default")).or_else(|| named(None)) {
                Some(t) => Ok(Some(t)),
                None => bail!(
                    "{}: chat_template list has no entry with a `template` string",
                    file.display()
                ),
            }
        }
        Some(_) => bail!(
            "{}: chat_template should be a string or a list of {{name, template}} objects",
            file.display()
        ),
    }
}

/// Reads the tokenizer, chat template and special tokens of an HF directory:
/// `tokenizer.json` (optional), `tokenizer_config.json` (`chat_template`, `bos_token`,
/// `eos_token`, `add_bos_token`), `chat_template.jinja` (preferred over the config's template),
/// `generation_config.json` (`eos_token_id`, `bos_token_id`), falling back to `config.json`'s ids
/// and then to the ids of the BOS/EOS token texts.
pub fn read_assets(dir: &Path, config: &Value) -> Result<TokenizerAssets> {
    let tok = tokenizer::load_optional(&dir.join("tokenizer.json"))?;
    let tc_path = dir.join("tokenizer_config.json");
    let tc = read_json_opt(&tc_path)?;
    let gc_path = dir.join("generation_config.json");
    let gc = read_json_opt(&gc_path)?;
    let config_path = dir.join("config.json");

    let jinja = dir.join("chat_template.jinja");
    let mut chat_template = if jinja.is_file() {
        Some(
            std::fs::read_to_string(&jinja)
                .with_context(|| format!("{}: cannot read", jinja.display()))?,
        )
    } else {
        None
    };
    let mut bos_token = None;
    let mut eos_token = None;
    let mut add_bos_cfg = None;
    if let Some(tc) = &tc {
        if chat_template.is_none() {
            chat_template = chat_template_field(tc.get("chat_template"), &tc_path)?;
        }
        bos_token = token_text(tc.get("bos_token"));
        eos_token = token_text(tc.get("eos_token"));
        add_bos_cfg = tc.get("add_bos_token").and_then(|v| v.as_bool());
    }

    // Every special id either file spells must be a row of the logits.
    let vocab = config.get("vocab_size").and_then(Value::as_u64);
    let mut sources = vec![(config, config_path.as_path())];
    sources.extend(gc.as_ref().map(|g| (g, gc_path.as_path())));
    for (json, file) in sources {
        let Some(v) = vocab else { break };
        for field in ["eos_token_id", "bos_token_id", "pad_token_id"] {
            // Only non-negative integers are ids here; other shapes are judged where used.
            let ids: Vec<u64> = match json.get(field) {
                Some(Value::Number(n)) => n.as_u64().into_iter().collect(),
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).collect(),
                _ => Vec::new(),
            };
            if let Some(bad) = ids.into_iter().find(|&i| i >= v) {
                bail!(
                    "{}: field {field} is {bad}, outside the vocabulary (expected an id below vocab_size {v})",
                    file.display()
                );
            }
        }
    }

    // EOS ids: generation_config.json, else config.json, else the EOS token's id.
    let mut eos_ids = match &gc {
        Some(gc) => ids_field(gc.get("eos_token_id"), &gc_path, "eos_token_id")?,
        None => Vec::new(),
    };
    if eos_ids.is_empty() {
        eos_ids = ids_field(config.get("eos_token_id"), &config_path, "eos_token_id")?;
    }
    if eos_ids.is_empty() {
        if let (Some(t), Some(text)) = (&tok, &eos_token) {
            eos_ids.extend(t.token_to_id(text));
        }
    }

    // BOS id: generation_config.json, else config.json, else the BOS token's id.
    let mut bos_id = match &gc {
        Some(gc) => ids_field(gc.get("bos_token_id"), &gc_path, "bos_token_id")?
            .first()
            .copied(),
        None => None,
    };
    if bos_id.is_none() {
        bos_id = ids_field(config.get("bos_token_id"), &config_path, "bos_token_id")?
            .first()
            .copied();
    }
    if bos_id.is_none() {
        if let (Some(t), Some(text)) = (&tok, &bos_token) {
            bos_id = t.token_to_id(text);
        }
    }
    // Token texts from ids when the config does not spell them.
    if let Some(t) = &tok {
        if bos_token.is_none() {
            bos_token = bos_id.and_then(|i| t.id_to_token(i));
        }
        if eos_token.is_none() {
            eos_token = eos_ids.first().and_then(|&i| t.id_to_token(i));
        }
    }

    let add_bos = match add_bos_cfg {
        Some(b) => b && bos_id.is_some(),
        None => match (&tok, bos_id) {
            (Some(t), Some(b)) => post_processor_adds(t, b),
            _ => false,
        },
    };

    Ok(TokenizerAssets {
        tokenizer: tok,
        chat_template,
        bos_token,
        eos_token,
        bos_id,
        add_bos,
        eos_ids,
    })
}

/// Whether the tokenizer's post-processor puts `bos` in front of an encoded text.
fn post_processor_adds(t: &Tokenizer, bos: u32) -> bool {
    let with = t.encode("a", true).unwrap_or_default();
    let without = t.encode("a", false).unwrap_or_default();
    with.first() == Some(&bos) && without.first() != Some(&bos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_quant_methods_are_refused_by_name() {
        let p = Path::new("/m/config.json");
        for ok in ["fp8", "mxfp4", "compressed-tensors"] {
            check_quant_method(&json!({"quantization_config": {"quant_method": ok}}), p).unwrap();
        }
        check_quant_method(&json!({}), p).unwrap();
        check_quant_method(
            &json!({"quantization_config": {"weight_block_size": [128, 128]}}),
            p,
        )
        .unwrap();
        let e = check_quant_method(&json!({"quantization_config": "awq"}), p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("quantization_config is \"awq\"; expected an object"),
            "{e}"
        );
        for bad in [json!("awq"), json!("gptq"), json!(3)] {
            let c = json!({"quantization_config": {"quant_method": bad}});
            let e = check_quant_method(&c, p).unwrap_err().to_string();
            assert!(
                e.contains("/m/config.json: quantization_config.quant_method is ")
                    && e.contains(&bad.to_string())
                    && e.contains("fp8, mxfp4, compressed-tensors"),
                "{e}"
            );
        }
    }

    #[test]
    fn special_ids_outside_the_vocabulary_are_errors_naming_file_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let config = json!({"vocab_size": 256, "eos_token_id": 2, "bos_token_id": 1});
        assert_eq!(read_assets(dir.path(), &config).unwrap().eos_ids, vec![2]);
        for (field, value) in [
            ("eos_token_id", json!(300)),
            ("eos_token_id", json!([2, 256])),
            ("bos_token_id", json!(1000)),
            ("pad_token_id", json!(256)),
        ] {
            let mut c = config.clone();
            c[field] = value;
            let e = read_assets(dir.path(), &c).unwrap_err().to_string();
            assert!(e.contains("config.json: field "), "{e}");
            assert!(e.contains(&format!("{field} is ")), "{e}");
            assert!(
                e.contains("outside the vocabulary (expected an id below vocab_size 256)"),
                "{e}"
            );
        }
        std::fs::write(
            dir.path().join("generation_config.json"),
            r#"{"eos_token_id": [2, 999]}"#,
        )
        .unwrap();
        let e = read_assets(dir.path(), &config).unwrap_err().to_string();
        assert!(
            e.contains("generation_config.json: field eos_token_id is 999"),
            "{e}"
        );
    }
}
