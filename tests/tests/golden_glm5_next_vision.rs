//! `glm5_next` with images (GLM-5.3-Flash vision tower + merger, the splice into the text
//! embeddings) vs transformers 5.24 on CPU: preprocessing bit for bit against
//! `Glm5NextImageProcessorPil`, the tower layer by layer, then logits and greedy tokens through
//! the engine, on every backend. Fixture: tests/fixtures/gen_glm5_next_vision.py
//! (`glm5_next_vision_tiny`: its `preprocessor_config.json` caps images at 64 tokens, so one
//! image is shrunk and one enlarged).

use anyhow::{ensure, Context, Result};
use dayone_backend::{Backend, DType, HostTensor};
use dayone_engine::cache::prefix::ExtraKeys;
use dayone_engine::config::{Glm5NextVision, ModelConfig};
use dayone_engine::layers::vision::Glm5Vit;
use dayone_engine::loader::{SafetensorsSource, TensorSource};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::vision::{decode_image, preprocess_glm5, Glm5ImageProcessorConfig, RgbImage};
use dayone_engine::weights::WeightLoader;
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{engine, fixture, greedy, on_every_backend, rel_err, tolerance};
use serde_json::Value;
use std::collections::HashMap;

const MODEL: &str = "glm5_next_vision_tiny";
/// `image_token_id` of the tiny config (`<|image|>`); 252/253 begin/end the image.
const IMG: u32 = 250;

fn json(file: &str) -> Value {
    let p = fixture(MODEL).join(file);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// The recorded tensors (`vision_reference.safetensors`).
fn tensors() -> Result<SafetensorsSource> {
    let p = fixture(MODEL).join("vision_reference.safetensors");
    SafetensorsSource::open_files(&[p], MODEL.into())
}

fn want(src: &SafetensorsSource, key: &str) -> Result<HostTensor> {
    src.load(key)
        .with_context(|| format!("reference tensor {key}"))
}

fn processor() -> Result<Glm5ImageProcessorConfig> {
    Glm5ImageProcessorConfig::from_json(&json("preprocessor_config.json"), None, None, None)
}

fn load_image(name: &str) -> RgbImage {
    let p = fixture("kimi_k25_images").join(name);
    decode_image(&std::fs::read(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Every processor case (default and small budgets; enlarged, shrunk, padded, extreme aspect,
/// gray, palette and alpha images): grid and pixels equal to transformers'.
#[test]
fn preprocess_matches_transformers() -> Result<()> {
    let src = tensors()?;
    let cases = json("vision_reference.json")["preprocess"].clone();
    let mut checked = 0;
    for case in cases.as_array().unwrap() {
        let key = case["key"].as_str().unwrap();
        let cfg = Glm5ImageProcessorConfig::from_json(&case["kwargs"], None, None, None)?;
        let im = preprocess_glm5(&load_image(case["image"].as_str().unwrap()), &cfg);
        let g = ids(&case["grid"]);
        ensure!(
            [im.grid_h as u32, im.grid_w as u32] == [g[1], g[2]],
            "{key}: grid {}x{} vs transformers {g:?}",
            im.grid_h,
            im.grid_w
        );
        let want = want(&src, key)?.to_f32();
        let diff = im
            .pixels
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        ensure!(
            im.pixels.len() == want.len() && diff <= 1e-6,
            "{key}: max |Δpixel| {diff:e}"
        );
        checked += 1;
    }
    ensure!(checked >= 7, "only {checked} cases");
    Ok(())
}

/// The tower, layer by layer, on every image case (one image; two of different sizes in one
/// call, each attending only to itself).
fn check_encoder<B: Backend>(b: B, dtype: DType) -> Result<()> {
    let cfg = Glm5NextVision::from_json(&json("config.json"), MODEL)?.context("vision_config")?;
    let src = SafetensorsSource::open_dir(&fixture(MODEL))?;
    let dtype = b.activation_dtype(dtype);
    let loader = WeightLoader::new(&b, &src, dtype);
    let vit = Glm5Vit::load(&loader, &cfg.vision)?;
    let reference = tensors()?;
    let pcfg = processor()?;
    let mut checked = 0;
    for case in json("vision_reference.json")["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let images: Vec<_> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| preprocess_glm5(&load_image(f.as_str().unwrap()), &pcfg))
            .collect();
        let pixels: Vec<f32> = images.iter().flat_map(|im| im.pixels.clone()).collect();
        let err = rel_err(
            &pixels,
            &want(&reference, &format!("{name}.pixels"))?.to_f32(),
        );
        ensure!(err == 0.0, "{name}: pixels rel err {err:e}");
        let mut got: HashMap<String, Vec<f32>> = HashMap::new();
        vit.encode_traced(&b, &images, &mut |k, t| {
            got.insert(k.to_string(), b.download(t)?.to_f32());
            Ok(())
        })?;
        let mut keys: Vec<&String> = got.keys().collect();
        keys.sort();
        for key in keys {
            let want = want(&reference, &format!("{name}.{key}"))?.to_f32();
            let err = rel_err(&got[key], &want);
            ensure!(
                err < tolerance(dtype),
                "{name} {key} ({dtype}): rel err {err:.3e} > {}",
                tolerance(dtype)
            );
            checked += 1;
        }
    }
    // patch_embed, 2 blocks, post_layernorm, downsample, merger; two cases.
    ensure!(checked == 2 * 6, "{checked} tensors compared");
    Ok(())
}

fn engine_config(dtype: DType, chunk: usize) -> EngineConfig {
    EngineConfig {
        dtype,
        kv_cache_tokens: Some(1024),
        scheduler: SchedulerConfig {
            max_batched_tokens: chunk,
            max_prefill_chunk: chunk,
            block_size: 4,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The reference prompt with each image's `<|image|>` run collapsed to one id, as a user (or
/// `image_markup`) writes it.
fn collapsed(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for &t in ids {
        if !(t == IMG && out.last() == Some(&IMG)) {
            out.push(t);
        }
    }
    out
}

/// One request to completion: its tokens and every sampled step's logits row.
fn run<B: Backend>(
    e: &mut Engine<B>,
    prompt: Vec<u32>,
    images: &[RgbImage],
    n: usize,
) -> Result<(Vec<u32>, Vec<Vec<f32>>)> {
    e.capture_logits = true;
    e.add_request_with_images(prompt, greedy(n), ExtraKeys::default(), images)?;
    let (mut toks, mut logits) = (Vec::new(), Vec::new());
    while e.has_unfinished() {
        for ev in e.step()? {
            toks.push(ev.token);
            logits.push(e.last_logits[0].1.clone());
        }
    }
    Ok((toks, logits))
}

/// Every case through the engine (placeholders expanded, images encoded and spliced), prefill
/// chunks of `chunk` tokens: the logits of each step until the greedy paths part, the greedy
/// tokens identical in f32.
fn check_generate<B: Backend>(b: B, dtype: DType, chunk: usize) -> Result<()> {
    let mut e = engine(b, MODEL, engine_config(dtype, chunk))?;
    ensure!(e.accepts_images() && e.image_placeholder() == Some(IMG));
    for case in json("vision_reference.json")["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let prompt = ids(&case["prompt_ids"]);
        let images: Vec<RgbImage> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| load_image(f.as_str().unwrap()))
            .collect();
        let mut tokens = 0;
        for im in &images {
            tokens += e.image_tokens(im.height, im.width).unwrap();
        }
        ensure!(
            tokens == prompt.iter().filter(|&&t| t == IMG).count(),
            "{name}: image_tokens {tokens}"
        );
        // bf16: within max(2e-2, 1.5 × transformers' own bf16-vs-f32 error), the golden rule.
        let own = case["bf16_own_rel_err"].as_f64().unwrap_or(0.0);
        let tol = match dtype {
            DType::F32 => tolerance(dtype),
            _ => tolerance(dtype).max(1.5 * own),
        };
        let want_toks = ids(&case["greedy_ids"]);
        let (toks, logits) = run(&mut e, collapsed(&prompt), &images, want_toks.len())?;
        for (step, row) in logits.iter().enumerate() {
            let want: Vec<f32> = case["logits"][step]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let err = rel_err(row, &want);
            ensure!(
                err < tol,
                "{name} ({dtype}, chunk {chunk}) step {step}: logits rel err {err:.3e} > {tol:.3e}"
            );
            if toks[step] != want_toks[step] {
                break;
            }
        }
        if dtype == DType::F32 {
            ensure!(
                toks == want_toks,
                "{name}: greedy {toks:?} vs transformers {want_toks:?}"
            );
        }
    }
    Ok(())
}

/// The same image twice hits the encoder cache and the prefix cache past the image; a
/// different image of the same size misses both and changes the output.
fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}

fn check_caches<B: Backend>(b: B) -> Result<()> {
    let cfg = EngineConfig {
        batch_invariant: true,
        ..engine_config(DType::F32, 512)
    };
    let align_b = b.recurrent_split_alignment();
    let mut e = engine(b, MODEL, cfg)?;
    let img = load_image("rgb_100x73.png");
    let mut other = img.clone();
    for v in other.data.iter_mut().step_by(7) {
        *v = 255 - *v;
    }
    // 61 text tokens, the image (20), 50 text tokens: long enough that a prefix hit reaches
    // past the image even where recurrent state is checkpointed only every 64 tokens (WGSL).
    let text = |n: usize, k: usize| (0..n).map(move |i| ((i * 7 + k) % 240 + 3) as u32);
    let mut prompt: Vec<u32> = std::iter::once(1).chain(text(60, 0)).collect();
    let image_at = prompt.len();
    prompt.extend([252, IMG, 253]);
    prompt.extend(text(50, 5));
    let align = lcm(4, align_b.max(1));
    let first = run(&mut e, prompt.clone(), std::slice::from_ref(&img), 3)?;
    let hit0 = e.counters().prefix_hit_tokens;
    let again = run(&mut e, prompt.clone(), std::slice::from_ref(&img), 3)?;
    let hit1 = e.counters().prefix_hit_tokens - hit0;
    let stats = e.encoder_cache_stats();
    ensure!(stats.hits == 1 && stats.misses == 1, "{stats:?}");
    // 133 prompt tokens once expanded: every whole aligned span before the last token.
    let expanded = prompt.len() - 1 + 20;
    let whole = (expanded - 1) / align * align;
    ensure!(
        hit1 >= whole as u64 && whole > image_at + 20,
        "same image: {hit1} prefix-cache hit tokens, expected {whole} (alignment {align})"
    );
    ensure!(first == again, "a cache hit changed the output");
    let before = e.counters().prefix_hit_tokens;
    let diff = run(&mut e, prompt, std::slice::from_ref(&other), 3)?;
    let hit2 = e.counters().prefix_hit_tokens - before;
    ensure!(
        e.encoder_cache_stats().misses == 2,
        "{:?}",
        e.encoder_cache_stats()
    );
    // Only tokens before the image may be shared.
    ensure!(
        hit2 <= image_at as u64,
        "a different image hit {hit2} prefix tokens"
    );
    ensure!(
        diff.1[0] != first.1[0],
        "a different image gave the same logits"
    );
    Ok(())
}

on_every_backend! {
    encoder_f32 => |mk: fn() -> _| check_encoder(mk(), DType::F32);
    encoder_bf16 => |mk: fn() -> _| check_encoder(mk(), DType::BF16);
    generate_f32 => |mk: fn() -> _| check_generate(mk(), DType::F32, 512);
    generate_chunked_f32 => |mk: fn() -> _| check_generate(mk(), DType::F32, 5);
    generate_bf16 => |mk: fn() -> _| check_generate(mk(), DType::BF16, 512);
    caches => |mk: fn() -> _| check_caches(mk());
}

/// A placeholder count that differs from the image count is refused, and the engine keeps
/// serving; the text-only fixture's config is still read as text (the model loads).
#[test]
fn bad_requests_and_config_errors() -> Result<()> {
    let mut e = engine(
        dayone_backend::cpu::CpuBackend,
        MODEL,
        engine_config(DType::F32, 512),
    )?;
    let img = load_image("rgb_100x73.png");
    let err = e
        .add_request_with_images(
            vec![1, 2, 3],
            greedy(2),
            ExtraKeys::default(),
            std::slice::from_ref(&img),
        )
        .unwrap_err()
        .to_string();
    ensure!(err.contains("0 image placeholder"), "{err}");
    let err = e
        .add_request_with_images(
            vec![1, IMG, 5, IMG],
            greedy(2),
            ExtraKeys::default(),
            std::slice::from_ref(&img),
        )
        .unwrap_err()
        .to_string();
    ensure!(err.contains("2 image placeholder"), "{err}");
    let ok = run(&mut e, vec![1, 252, IMG, 253, 5], &[img], 2)?;
    ensure!(ok.0.len() == 2);

    let mut v = json("config.json");
    ModelConfig::from_json(&v, MODEL)?;
    v["vision_config"]["out_hidden_size"] = 48.into();
    let err = format!("{:#}", Glm5NextVision::from_json(&v, "x").unwrap_err());
    ensure!(err.contains("out_hidden_size"), "{err}");
    v["vision_config"]["out_hidden_size"] = 64.into();
    v["vision_config"]["rope_parameters"]["rope_type"] = "default".into();
    let err = format!("{:#}", Glm5NextVision::from_json(&v, "x").unwrap_err());
    ensure!(err.contains("rope_type"), "{err}");
    v["vision_config"]["rope_parameters"]["rope_type"] = "axial".into();
    v["vision_config"]["num_heads"] = 3.into();
    let err = format!("{:#}", Glm5NextVision::from_json(&v, "x").unwrap_err());
    ensure!(err.contains("num_heads"), "{err}");
    v["vision_config"]["num_heads"] = "two".into();
    let err = format!("{:#}", Glm5NextVision::from_json(&v, "x").unwrap_err());
    ensure!(err.contains("vision_config"), "{err}");
    let bad = serde_json::json!({"max_image_tokens": 4, "min_image_tokens": 16});
    let err = Glm5ImageProcessorConfig::from_json(&bad, None, None, None)
        .unwrap_err()
        .to_string();
    ensure!(err.contains("min_image_tokens"), "{err}");
    Ok(())
}
