//! Tiny `kimi_vl` (Kimi-VL) vs transformers, on every backend. transformers 5.24 has no Kimi-VL
//! class, so the reference is kimi_k25_tiny's (tests/fixtures/gen_kimi_k25.py): kimi_vl_tiny holds
//! the same weights under Kimi-VL's config and projector names (tests/fixtures/gen_kimi_vl.py),
//! and for still images Kimi-VL's math is K2.5's (no time term at t = 1; vision.md §2). Kimi-VL's
//! own image processor (`pad_input`, `in_token_limit`, center crop) is checked against the remote
//! processor's steps run with PIL + torchvision (`processor_reference.json`).

use anyhow::{ensure, Context, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::cache::prefix::ExtraKeys;
use dayone_engine::config::ModelConfig;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::vision::{decode_image, preprocess, ImageProcessorConfig, RgbImage};
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{engine, fixture, greedy, on_every_backend, rel_err, tolerance};
use serde_json::{json, Value};

/// The tiny model's `<|media_pad|>` (`media_placeholder_token_id`).
const PAD: u32 = 250;

fn read_json(dir: &str, file: &str) -> Value {
    let p = fixture(dir).join(file);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn load_image(name: &str) -> RgbImage {
    decode_image(&std::fs::read(fixture("kimi_k25_images").join(name)).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// The reference prompt with each image's placeholder run collapsed to one id, as a user
/// writes it.
fn collapsed(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for &t in ids {
        if !(t == PAD && out.last() == Some(&PAD)) {
            out.push(t);
        }
    }
    out
}

/// Runs one request: its greedy tokens and the logits row of the first sampled token.
fn run<B: Backend>(
    e: &mut Engine<B>,
    prompt: Vec<u32>,
    images: &[RgbImage],
    n: usize,
) -> Result<(Vec<u32>, Vec<f32>)> {
    e.capture_logits = true;
    e.add_request_with_images(prompt, greedy(n), ExtraKeys::default(), images)?;
    let (mut toks, mut first) = (Vec::new(), None);
    while e.has_unfinished() {
        for ev in e.step()? {
            toks.push(ev.token);
            if first.is_none() {
                first = Some(e.last_logits[0].1.clone());
            }
        }
    }
    Ok((toks, first.context("no token")?))
}

/// Every kimi_k25_tiny reference case through the kimi_vl_tiny engine: the last prompt row's
/// logits within the f32 tolerance and the greedy tokens identical, with prefill chunks of
/// `chunk` tokens.
fn check_generate<B: Backend>(b: B, chunk: usize) -> Result<()> {
    let cfg = EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(1024),
        scheduler: SchedulerConfig {
            max_batched_tokens: chunk,
            max_prefill_chunk: chunk,
            block_size: 4,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut e = engine(b, "kimi_vl_tiny", cfg)?;
    ensure!(e.accepts_images() && e.image_placeholder() == Some(PAD));
    let reference = read_json("kimi_k25_tiny", "reference.json");
    let mut images_seen = 0;
    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let images: Vec<RgbImage> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| load_image(f.as_str().unwrap()))
            .collect();
        for (im, g) in images
            .iter()
            .zip(case["grids"].as_array().into_iter().flatten())
        {
            let want = (g[0].as_u64().unwrap() / 2) * (g[1].as_u64().unwrap() / 2);
            let got = e.image_tokens(im.height, im.width);
            ensure!(
                got == Some(want as usize),
                "{name}: {got:?} image tokens vs {want}"
            );
        }
        images_seen += images.len();
        let want_toks = ids(&case["greedy_ids"]);
        let last3 = floats(&case["logits_last3"]);
        let want_logits = &last3[last3.len() / 3 * 2..];
        let (toks, logits) = run(&mut e, collapsed(&ids(&case["prompt_ids"])), &images, 6)?;
        let err = rel_err(&logits, want_logits);
        ensure!(
            err < tolerance(DType::F32),
            "{name} (chunk {chunk}): last prompt row logits rel err {err:.3e}"
        );
        ensure!(
            toks == want_toks,
            "{name}: greedy {toks:?} vs transformers {want_toks:?}"
        );
    }
    ensure!(images_seen >= 4, "only {images_seen} images checked");
    Ok(())
}

on_every_backend! {
    generate_f32 => |mk: fn() -> _| check_generate(mk(), 512);
    generate_chunked_f32 => |mk: fn() -> _| check_generate(mk(), 5);
}

/// The fixture's config parses as Kimi-VL: MoonViT sizes from `MoonViTConfig` names, the
/// placeholder, and the `kimi_k25` runtime shape under `model_type` `kimi_vl`.
#[test]
fn config_reads_kimi_vl_names() {
    let v = read_json("kimi_vl_tiny", "config.json");
    let ModelConfig::KimiK25(c) = ModelConfig::from_json(&v, "config.json").unwrap() else {
        panic!("kimi_vl did not parse as the MoonViT + DeepSeek-V3 model")
    };
    assert_eq!(c.model_type, "kimi_vl");
    let vis = &c.vision;
    assert_eq!((vis.hidden_size, vis.num_layers, vis.num_heads), (64, 2, 4));
    assert_eq!((vis.pos_emb_height, vis.pos_emb_width), (8, 8));
    assert_eq!((vis.intermediate_size, vis.text_hidden_size), (128, 64));
    assert_eq!(c.media_placeholder_token_id, PAD);
    assert_eq!(c.text.num_hidden_layers, 2);
    assert_eq!(
        dayone_engine::vision::image_markup("kimi_vl"),
        Some("<|media_start|>image<|media_content|><|media_pad|><|media_end|>")
    );
}

/// A kimi_vl config without a required part, or with a wrong one, is refused naming the field.
#[test]
fn config_errors_name_the_field() {
    let error = |edit: &dyn Fn(&mut Value)| {
        let mut v = read_json("kimi_vl_tiny", "config.json");
        edit(&mut v);
        format!(
            "{:#}",
            ModelConfig::from_json(&v, "kimi_vl_tiny/config.json").unwrap_err()
        )
    };
    for key in ["vision_config", "text_config"] {
        let e = error(&|v| {
            v.as_object_mut().unwrap().remove(key);
        });
        assert!(
            e.contains("kimi_vl_tiny/config.json")
                && e.contains(&format!("field `{key}` is missing")),
            "{e}"
        );
    }
    let e = error(&|v| {
        v["text_config"]
            .as_object_mut()
            .unwrap()
            .remove("hidden_size");
    });
    assert!(e.contains("hidden_size"), "{e}");
    let e = error(&|v| v["text_config"]["model_type"] = json!("qwen2"));
    assert!(e.contains("text_config.model_type"), "{e}");
    let e = error(&|v| v["vision_config"]["merge_kernel_size"] = json!("2x2"));
    assert!(e.contains("vision_config.merge_kernel_size"), "{e}");
    let e = error(&|v| v["media_placeholder_token_id"] = json!("pad"));
    assert!(e.contains("media_placeholder_token_id"), "{e}");
}

/// Kimi-VL's processor (center crop with `pad_input: false`, padding with `true`, the shrink past
/// `in_token_limit`, CLIP or 0.5 statistics) against the remote processor's steps.
#[test]
fn processor_matches_kimi_vl_reference() {
    let reference = read_json("kimi_vl_tiny", "processor_reference.json");
    let cases = reference["cases"].as_array().unwrap();
    assert!(cases.len() >= 4);
    for case in cases {
        let name = case["image"].as_str().unwrap();
        let cfg = ImageProcessorConfig::from_json(&case["kwargs"], None, None).unwrap();
        let pad = case["kwargs"]["pad_input"].as_bool().unwrap();
        assert_eq!(cfg.pad_input, pad, "{name}");
        let img = load_image(name);
        let got = preprocess(&img, &cfg);
        let grid = [got.grid_h as u64, got.grid_w as u64];
        assert_eq!(
            grid,
            [
                case["grid"][0].as_u64().unwrap(),
                case["grid"][1].as_u64().unwrap()
            ],
            "{name} pad_input {pad}"
        );
        let want = floats(&case["pixels"]);
        let err = rel_err(&got.pixels, &want);
        assert!(
            err < 1e-5,
            "{name} pad_input {pad}: pixels rel err {err:.3e}"
        );
        let max = got
            .pixels
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(max < 1e-5, "{name} pad_input {pad}: max abs diff {max}");
    }
}

/// With no preprocessor file a kimi_vl model takes the `KimiVLImageProcessor` class defaults;
/// a side under one merge cell is padded to one cell instead of being cropped to nothing.
#[test]
fn processor_defaults_and_thin_images() {
    let cfg = ImageProcessorConfig::for_model("kimi_vl", &Value::Null, Some(14), Some(2)).unwrap();
    assert_eq!(cfg, ImageProcessorConfig::kimi_vl());
    assert_eq!((cfg.max_patches, cfg.pad_input), (4096, false));
    let k25 = ImageProcessorConfig::for_model("kimi_k25", &Value::Null, Some(14), Some(2)).unwrap();
    assert_eq!(k25, ImageProcessorConfig::default());
    // 20 x 500: the crop keeps 476 rows (34 patches); the 20 columns pad to one cell (2 patches).
    let thin = preprocess(&load_image("gray_20x500.png"), &cfg);
    assert_eq!((thin.grid_h, thin.grid_w), (34, 2));
    assert_eq!(cfg.num_tokens(500, 20), 17);
    let bad = json!({"pad_input": "yes"});
    let e = ImageProcessorConfig::from_json(&bad, None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("pad_input"), "{e}");
}

/// A config shaped like the hub's Kimi-VL-A3B one parses: `text_config` without `model_type`,
/// `q_lora_rank: null`, a plain `rope_theta`, `noaux_tc` sigmoid routing; `vision_config` with only
/// `MoonViTConfig` names; no `media_placeholder_token_id` (the class default 163605).
#[test]
fn hub_shaped_config_parses() {
    let v = json!({
        "architectures": ["KimiVLForConditionalGeneration"],
        "model_type": "kimi_vl",
        "ignore_index": -100,
        "vision_config": {
            "model_type": "moonvit", "patch_size": 14, "init_pos_emb_height": 64,
            "init_pos_emb_width": 64, "num_attention_heads": 16, "num_hidden_layers": 27,
            "hidden_size": 1152, "intermediate_size": 4304, "merge_kernel_size": [2, 2]
        },
        "text_config": {
            "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 11264,
            "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
            "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
            "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
            "n_group": 1, "topk_group": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.446,
            "scoring_func": "sigmoid", "topk_method": "noaux_tc", "kv_lora_rank": 512,
            "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
            "v_head_dim": 128, "rope_theta": 800000.0, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": false
        }
    });
    let ModelConfig::KimiK25(c) = ModelConfig::from_json(&v, "a3b/config.json").unwrap() else {
        panic!("not the MoonViT + DeepSeek-V3 model")
    };
    assert_eq!(c.model_type, "kimi_vl");
    assert_eq!((c.vision.hidden_size, c.vision.num_layers), (1152, 27));
    assert_eq!(
        (c.vision.merged_size(), c.vision.text_hidden_size),
        (4608, 2048)
    );
    assert_eq!(c.media_placeholder_token_id, 163_605);
    assert_eq!(c.text.q_lora_rank, None);
    assert!(!c.text.tie_word_embeddings);
    let plan = ModelConfig::KimiK25(c).layer_plan().unwrap();
    assert_eq!(plan.layers.len(), 27);
}
