//! `dayone info`: what a checkpoint is and what it needs, from its config and tensor headers
//! alone (no weights are read): architecture, parameters, stored dtypes or quantisation,
//! context window, layer types, cache bytes per token, memory for weights + cache.
//!
//! The per-layer cache layout is derived from the config by the same rules the models use
//! (`engine/src/models/*.rs`, `cache_spec`): paged K/V for attention layers, one latent row (plus
//! the DSA indexer key row) for MLA layers, per-sequence state for KDA layers. A CLI test checks
//! the figures against the loaded engine's [`dayone_engine::Engine::cache_bytes_per_token`].

use crate::{load, outln};
use anyhow::Result;
use clap::Args;
use dayone_engine::cache::{human_bytes, CacheSpec, LayerCacheSpec};
use dayone_engine::config::ModelConfig;
use dayone_engine::loader::{Checkpoint, GgufFile, SafetensorsSource};
use dayone_engine::models::Ffn;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::serving_config::{auto_dtype, BackendName};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Flags of `dayone info`.
#[derive(Args, Debug)]
pub struct InfoArgs {
    /// Model directory or .gguf file; default: SmolLM2-135M-Instruct.
    #[arg(short = 'm', long)]
    pub model: Option<PathBuf>,
    /// One JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The engine's default cache capacity for a context window (`EngineConfig::kv_cache_tokens`:
/// the window clamped to 4096..=65536 tokens).
fn default_cache_tokens(ctx: usize) -> usize {
    ctx.clamp(4096, 65536)
}

/// Per-layer cache specs from the config, by the rules of the models' `cache_spec`.
pub fn cache_spec(c: &ModelConfig) -> CacheSpec {
    match c {
        ModelConfig::Llama(l) | ModelConfig::Qwen3(l) => CacheSpec::paged_kv(
            l.num_hidden_layers,
            l.kv_heads(),
            l.head_dim(),
            l.head_dim(),
        ),
        // The text model's cache; the vision tower keeps none.
        ModelConfig::KimiK25(k) => cache_spec(&ModelConfig::DeepseekV3(k.text.clone())),
        ModelConfig::DeepseekV3(d) => {
            let width = d.kv_lora_rank + d.qk_rope_head_dim;
            let layer = match d.indexer() {
                Some((_, index_width, _)) => {
                    LayerCacheSpec::PagedLatentIndexed { width, index_width }
                }
                None => LayerCacheSpec::PagedLatent { width },
            };
            CacheSpec {
                layers: vec![layer; d.num_hidden_layers],
            }
        }
        ModelConfig::KimiLinear(k) => CacheSpec {
            layers: (0..k.num_hidden_layers)
                .map(|i| {
                    if k.is_kda_layer(i) {
                        LayerCacheSpec::Recurrent {
                            convs: 3,
                            conv_channels: k.kda_heads() * k.kda_head_dim(),
                            conv_taps: k.conv_width() - 1,
                            heads: k.kda_heads(),
                            k_dim: k.kda_head_dim(),
                            v_dim: k.kda_head_dim(),
                        }
                    } else {
                        LayerCacheSpec::PagedLatent {
                            width: k.kv_lora_rank + k.qk_rope_head_dim,
                        }
                    }
                })
                .collect(),
        },
        ModelConfig::Glm5Next(_) | ModelConfig::GptOss(_) => c
            .layer_plan()
            .map(|p| p.cache_spec())
            .unwrap_or(CacheSpec { layers: vec![] }),
    }
}

/// One line per kind of layer: `30 × attention (paged K/V, 3 KV heads × 64)`.
fn layer_types(c: &ModelConfig, spec: &CacheSpec) -> Vec<String> {
    let plan = c.layer_plan().ok();
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for (i, l) in spec.layers.iter().enumerate() {
        let mixer = match *l {
            LayerCacheSpec::PagedKv {
                kv_heads, k_dim, ..
            } => {
                format!("attention (paged K/V, {kv_heads} KV heads × {k_dim})")
            }
            LayerCacheSpec::PagedLatent { width } => format!("MLA (latent {width} per token)"),
            LayerCacheSpec::PagedLatentIndexed { width, index_width } => {
                format!("MLA + DSA indexer (latent {width} + index key {index_width} per token)")
            }
            LayerCacheSpec::Recurrent { heads, k_dim, .. } => {
                format!("KDA linear attention ({heads} heads × {k_dim}, state per sequence)")
            }
        };
        let ffn = match plan.as_ref().and_then(|p| p.layers.get(i)).map(|l| &l.ffn) {
            Some(Ffn::Moe { shape, routing }) => {
                format!("MoE {} of {} experts", routing.top_k, shape.experts)
            }
            Some(Ffn::GptOssMoe { experts, top_k, .. }) => {
                format!("MoE {top_k} of {experts} experts")
            }
            _ => "dense MLP".to_string(),
        };
        let kind = format!("{mixer}, {ffn}");
        match kinds.last_mut() {
            Some((k, n)) if *k == kind => *n += 1,
            _ => kinds.push((kind, 1)),
        }
    }
    kinds
        .into_iter()
        .map(|(k, n)| format!("{n} × {k}"))
        .collect()
}

/// Stored dtype (or GGUF quantisation type) → (parameters, bytes on disk, whether the engine
/// keeps it low-bit on the device: every GGUF block type, MXFP4, INT4).
fn stored_types(ckpt: &Checkpoint) -> Result<BTreeMap<String, (u64, u64, bool)>> {
    let mut out: BTreeMap<String, (u64, u64, bool)> = BTreeMap::new();
    if ckpt.path.is_file() {
        let g = GgufFile::open(&ckpt.path)?;
        for t in &g.tensors {
            let e = out.entry(t.ggml_type.name()).or_default();
            e.0 += t.numel() as u64;
            e.1 += t.nbytes as u64;
            e.2 = dayone_engine::loader::kept_format(t.ggml_type).is_some();
        }
    } else {
        let s = SafetensorsSource::open_dir(&ckpt.path)?;
        let packed = low_bit(ckpt)?;
        // Packed codes and their scales under the format's name (mxfp4, int4), counted in values.
        let format_of = |n: &str| -> Option<&'static str> {
            let base = n
                .strip_suffix(".weight_scale")
                .or_else(|| n.strip_suffix(".weight_shape"))
                .map(|p| format!("{p}.weight_packed"))
                .unwrap_or_else(|| n.to_string());
            if base.ends_with("_blocks") || base.ends_with("_scales") {
                return Some("mxfp4");
            }
            match s.raw_dtype(&base).map(|d| format!("{d:?}")).as_deref() {
                Some("I32") if base.ends_with(".weight_packed") => Some("int4"),
                Some("U8") if base.ends_with(".weight_packed") => Some("mxfp4"),
                _ => None,
            }
        };
        for n in ckpt.tensors.names() {
            let (Some(dt), Some(shape)) = (s.raw_dtype(&n), ckpt.tensors.shape(&n)) else {
                continue;
            };
            let numel = shape.iter().product::<usize>() as u64;
            let (key, values, low) = match (packed.get(&n), format_of(&n)) {
                (Some(&(per, _)), Some(f)) => (f.to_string(), numel * per, true),
                _ => (format!("{dt:?}"), numel, false),
            };
            let e = out.entry(key).or_default();
            e.0 += values;
            e.2 |= low;
            e.1 += s.raw_bytes(&n).map_or(0, |b| b.len()) as u64;
        }
    }
    Ok(out)
}

/// Values per stored element of each tensor the engine keeps low-bit on the device (GGUF
/// block types: 1; compressed-tensors `weight_packed`: 2 (U8) or 8 (I32); gpt-oss
/// `*_blocks`: 2; their scales and shapes: 0), with the tensor's stored bytes. Other tensors are
/// absent from the map.
pub(crate) fn low_bit(ckpt: &Checkpoint) -> Result<BTreeMap<String, (u64, u64)>> {
    let mut out = BTreeMap::new();
    if ckpt.path.is_file() {
        let g = GgufFile::open(&ckpt.path)?;
        for t in &g.tensors {
            if dayone_engine::loader::kept_format(t.ggml_type).is_some() {
                if let Some(hf) = dayone_engine::loader::hf_tensor_name(&t.name) {
                    out.insert(hf, (1, t.nbytes as u64));
                }
            }
        }
        return Ok(out);
    }
    let s = SafetensorsSource::open_dir(&ckpt.path)?;
    for n in ckpt.tensors.names() {
        let dt = s.raw_dtype(&n).map(|d| format!("{d:?}"));
        let per_element = match (dt.as_deref(), n.as_str()) {
            (Some("I32"), n) if n.ends_with(".weight_packed") => 8,
            (_, n) if n.ends_with(".weight_packed") || n.ends_with("_blocks") => 2,
            (_, n)
                if n.ends_with(".weight_scale")
                    || n.ends_with("_scales")
                    || n.ends_with(".weight_shape") =>
            {
                0
            }
            _ => continue,
        };
        let bytes = s.raw_bytes(&n).map_or(0, |b| b.len()) as u64;
        out.insert(n, (per_element, bytes));
    }
    Ok(out)
}

/// What `--dtype auto` stores the float weights in on each backend for this checkpoint
/// ([`auto_dtype`] of its stored float dtype): `{"cuda": "bf16", "wgsl": …, "cpu": …}`.
fn auto_dtypes(ckpt: &Checkpoint) -> Value {
    let stored = dayone_engine::loader::stored_float_dtype(ckpt.tensors.as_ref());
    let of = |b: BackendName| auto_dtype(b, stored).to_string();
    json!({
        "cuda": of(BackendName::Cuda),
        "wgsl": of(BackendName::Wgsl),
        "cpu": of(BackendName::Cpu),
    })
}

/// `1.23 B`, `134.5 M`, `52.3 K`.
fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.1} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// Everything `info` reports, as JSON (the text table is printed from it).
pub fn describe(ckpt: &Checkpoint) -> Result<Value> {
    let origin = ckpt.path.join("config.json");
    let cfg = ModelConfig::from_json(&ckpt.config, &origin.display().to_string())?;
    let names = ckpt.tensors.names();
    // Parameters: stored elements, times the values a packed element holds (scales count 0).
    let packed = low_bit(ckpt)?;
    let values = |keep: &dyn Fn(&str) -> bool| -> u64 {
        names
            .iter()
            .filter(|n| !n.ends_with("_scale_inv") && keep(n))
            .filter_map(|n| {
                let numel = ckpt.tensors.shape(n)?.iter().product::<usize>() as u64;
                Some(numel * packed.get(n.as_str()).map_or(1, |p| p.0))
            })
            .sum()
    };
    let is_expert = |n: &str| n.contains(".experts.");
    let params = values(&|_| true);
    let experts = values(&is_expert);
    let packed_values = values(&|n| packed.contains_key(n));
    let packed_bytes: u64 = packed.values().map(|p| p.1).sum();
    let (e, k) = match &cfg {
        ModelConfig::DeepseekV3(c) => (c.n_routed_experts, c.num_experts_per_tok),
        ModelConfig::KimiK25(c) => (c.text.n_routed_experts, c.text.num_experts_per_tok),
        ModelConfig::KimiLinear(c) => (c.num_local_experts, c.num_experts_per_tok),
        ModelConfig::Glm5Next(c) => (c.n_routed_experts, c.num_experts_per_tok),
        ModelConfig::GptOss(c) => (c.num_local_experts, c.top_k()),
        _ => (0, 0),
    };
    let active = if e > 0 {
        params - experts + (experts as f64 * k as f64 / e as f64) as u64
    } else {
        params
    };
    let spec = cache_spec(&cfg);
    let ctx = cfg.max_context();
    let cache_tokens = default_cache_tokens(ctx);
    let slots = SchedulerConfig::default().max_num_seqs;
    let stored = stored_types(ckpt)?;
    let mut memory = serde_json::Map::new();
    for (dtype, size) in [("f32", 4u64), ("bf16", 2u64)] {
        // Low-bit tensors stay low-bit on the device; the rest is stored in `dtype`.
        let weights = (params - packed_values) * size + packed_bytes;
        let cache = spec.elements_per_token() as u64 * size * cache_tokens as u64;
        let state = spec.state_elements_per_seq() as u64 * 4 * slots as u64;
        memory.insert(
            dtype.into(),
            json!({
                "weights_bytes": weights,
                "cache_bytes": cache,
                "state_bytes": state,
                "total_bytes": weights + cache + state,
            }),
        );
    }
    let model_type = ckpt
        .config
        .get("model_type")
        .cloned()
        .unwrap_or(Value::Null);
    Ok(json!({
        "model": ckpt.path.display().to_string(),
        "model_type": model_type,
        "architectures": ckpt.config.get("architectures").cloned().unwrap_or(Value::Null),
        "format": if ckpt.path.is_file() { "gguf" } else { "safetensors" },
        "parameters": params,
        "active_parameters": active,
        "stored_types": stored.iter().map(|(t, (n, b, low))| (t.clone(), json!({"parameters": n, "bytes": b, "low_bit_on_device": low}))).collect::<serde_json::Map<_, _>>(),
        "quantization_config": ckpt.config.get("quantization_config").cloned().unwrap_or(Value::Null),
        "context_window": ctx,
        "vocab_size": cfg.vocab_size(),
        "layers": spec.layers.len(),
        "vision": match &cfg {
            ModelConfig::KimiK25(k) => json!({
                "tower": "MoonViT",
                "layers": k.vision.num_layers,
                "hidden_size": k.vision.hidden_size,
                "heads": k.vision.num_heads,
                "patch_size": k.vision.patch_size,
                "merge_kernel": [k.vision.merge_kernel.0, k.vision.merge_kernel.1],
                "image_placeholder_id": k.media_placeholder_token_id,
            }),
            // A `vision_config` whose tower the checkpoint stores (else the model is text only).
            ModelConfig::Glm5Next(_) => match dayone_engine::config::Glm5NextVision::from_json(
                &ckpt.config,
                "config.json",
            )? {
                Some(g) if ckpt.tensors.shape("model.visual.patch_embed.proj.weight").is_some() => {
                    json!({
                        "tower": "GLM-5.3-Flash ViT",
                        "layers": g.vision.depth,
                        "hidden_size": g.vision.hidden_size,
                        "heads": g.vision.num_heads,
                        "patch_size": g.vision.patch_size,
                        "merge_kernel": [g.vision.spatial_merge_size, g.vision.spatial_merge_size],
                        "image_placeholder_id": g.image_token_id,
                    })
                }
                _ => Value::Null,
            },
            _ => Value::Null,
        },
        "hidden_size": ckpt.config.get("hidden_size").cloned().unwrap_or(Value::Null),
        "layer_types": layer_types(&cfg, &spec),
        "cache_bytes_per_token": {
            "f32": spec.elements_per_token() * 4,
            "bf16": spec.elements_per_token() * 2,
        },
        "state_bytes_per_sequence": spec.state_elements_per_seq() * 4,
        "default_cache_tokens": cache_tokens,
        "state_slots": slots,
        "memory": memory,
        "auto_dtype": auto_dtypes(ckpt),
        "has_tokenizer": ckpt.assets.tokenizer.is_some(),
        "has_chat_template": ckpt.assets.chat_template.is_some(),
    }))
}

/// Runs `dayone info`.
pub fn run(a: InfoArgs) -> Result<()> {
    let path = load::model_path(a.model.clone())?;
    let ckpt = load::open(&path)?;
    let j = describe(&ckpt)?;
    if a.json {
        return outln!("{j}");
    }
    let u = |k: &str| j[k].as_u64().unwrap_or(0);
    let row = |k: &str, v: String| outln!("{k:<14}{v}");
    row("model", j["model"].as_str().unwrap_or("").to_string())?;
    let arch = match j["architectures"].as_array().and_then(|a| a.first()) {
        Some(a) => format!(
            "{} ({})",
            j["model_type"].as_str().unwrap_or("?"),
            a.as_str().unwrap_or("?")
        ),
        None => j["model_type"].as_str().unwrap_or("?").to_string(),
    };
    row(
        "architecture",
        format!("{arch}, {}", j["format"].as_str().unwrap_or("")),
    )?;
    let mut params = format!("{} ({})", human_count(u("parameters")), u("parameters"));
    if u("active_parameters") != u("parameters") {
        params += &format!(", {} active per token", human_count(u("active_parameters")));
    }
    row("parameters", params)?;
    let total = u("parameters").max(1) as f64;
    let types: Vec<String> = j["stored_types"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(t, v)| {
            format!(
                "{t} {:.0}% ({}{})",
                100.0 * v["parameters"].as_f64().unwrap_or(0.0) / total,
                human_bytes(v["bytes"].as_u64().unwrap_or(0)),
                if v["low_bit_on_device"].as_bool() == Some(true) {
                    ", kept low-bit"
                } else {
                    ""
                }
            )
        })
        .collect();
    row("stored as", types.join(", "))?;
    let auto = &j["auto_dtype"];
    let of = |b: &str| auto[b].as_str().unwrap_or("?").to_string();
    let wgsl = match of("wgsl").as_str() {
        "f32" => "f32".to_string(),
        w => format!("{w} weights, f32 compute"),
    };
    row(
        "dtype auto",
        format!(
            "{} on CUDA; {wgsl} on WGSL; {} on CPU",
            of("cuda"),
            of("cpu")
        ),
    )?;
    if !j["quantization_config"].is_null() {
        row("quantization", j["quantization_config"].to_string())?;
    }
    row(
        "context",
        format!(
            "{} tokens (vocabulary {})",
            u("context_window"),
            u("vocab_size")
        ),
    )?;
    row("layers", format!("{}", u("layers")))?;
    for t in j["layer_types"].as_array().into_iter().flatten() {
        row("", format!("  {}", t.as_str().unwrap_or("")))?;
    }
    if let Some(v) = j["vision"].as_object() {
        let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
        row(
            "vision",
            format!(
                "{}, {} blocks of width {} ({} heads), {}-pixel patches merged {}×{}; images at token {}",
                v.get("tower").and_then(Value::as_str).unwrap_or("?"),
                n("layers"),
                n("hidden_size"),
                n("heads"),
                n("patch_size"),
                v["merge_kernel"][0],
                v["merge_kernel"][1],
                n("image_placeholder_id")
            ),
        )?;
    }
    let cbt = &j["cache_bytes_per_token"];
    row(
        "cache",
        format!(
            "{} B per token in f32, {} B in bf16",
            cbt["f32"].as_u64().unwrap_or(0),
            cbt["bf16"].as_u64().unwrap_or(0)
        ),
    )?;
    if u("state_bytes_per_sequence") > 0 {
        row(
            "state",
            format!(
                "{} per sequence (f32)",
                human_bytes(u("state_bytes_per_sequence"))
            ),
        )?;
    }
    for dtype in ["f32", "bf16"] {
        let m = &j["memory"][dtype];
        let b = |k: &str| human_bytes(m[k].as_u64().unwrap_or(0));
        let state = if m["state_bytes"].as_u64().unwrap_or(0) > 0 {
            format!(
                " + state {} ({} sequences)",
                b("state_bytes"),
                u("state_slots")
            )
        } else {
            String::new()
        };
        row(
            &format!("memory {dtype}"),
            format!(
                "{} = weights {} + cache {} ({} tokens){state}",
                b("total_bytes"),
                b("weights_bytes"),
                b("cache_bytes"),
                u("default_cache_tokens"),
            ),
        )?;
    }
    row(
        "tokenizer",
        match (
            j["has_tokenizer"].as_bool(),
            j["has_chat_template"].as_bool(),
        ) {
            (Some(true), Some(true)) => "yes, with a chat template".into(),
            (Some(true), _) => "yes, no chat template".into(),
            _ => "none (use --prompt-ids)".into(),
        },
    )?;
    Ok(())
}
