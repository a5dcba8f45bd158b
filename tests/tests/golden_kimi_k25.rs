//! Tiny `kimi_k25` (MoonViT + projector) vs transformers 5.24 on CPU, layer by layer, on every
//! backend. Fixture: tests/fixtures/gen_kimi_k25.py (original checkpoint names; the pixels are
//! preprocessed here by dayone, which tests/tests/vision_preprocess.rs shows bit-equal to the HF
//! processor on these PNGs).

use anyhow::{ensure, Context, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::cache::prefix::ExtraKeys;
use dayone_engine::config::MoonVitConfig;
use dayone_engine::layers::vision::MoonVit;
use dayone_engine::loader::SafetensorsSource;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::vision::RgbImage;
use dayone_engine::vision::{decode_image, preprocess, ImageProcessorConfig};
use dayone_engine::weights::WeightLoader;
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{engine, fixture, greedy, on_every_backend, rel_err, tolerance};
use serde_json::Value;
use std::collections::HashMap;

fn reference() -> Value {
    let p = fixture("kimi_k25_tiny").join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn config() -> Result<MoonVitConfig> {
    let p = fixture("kimi_k25_tiny").join("config.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&p)?)?;
    MoonVitConfig::from_json(&v, "kimi_k25_tiny/config.json")
}

/// Encodes every image case and compares each recorded intermediate.
fn check_encoder<B: Backend>(b: B, dtype: DType, model: &str) -> Result<()> {
    check_encoder_at(b, dtype, model, None)
}

/// [`check_encoder`] with the attention run at head width `attn_dim` (zero-padded heads) when
/// given, as CUDA does for head dims its kernel lacks.
fn check_encoder_at<B: Backend>(
    b: B,
    dtype: DType,
    model: &str,
    attn_dim: Option<usize>,
) -> Result<()> {
    let cfg = config()?;
    let src = SafetensorsSource::open_dir(&fixture(model))?;
    let dtype = b.activation_dtype(dtype);
    let loader = WeightLoader::new(&b, &src, dtype);
    let vit = match attn_dim {
        Some(d) => MoonVit::load_with_attention_dim(&loader, &cfg, d)?,
        None => MoonVit::load(&loader, &cfg)?,
    };
    let pcfg = ImageProcessorConfig::default();
    let reference = reference();
    let mut checked = 0;
    for case in reference["cases"].as_array().unwrap() {
        let files = case["images"].as_array().unwrap();
        if files.is_empty() {
            continue;
        }
        let name = case["name"].as_str().unwrap();
        let images: Vec<_> = files
            .iter()
            .map(|f| {
                let path = fixture("kimi_k25_images").join(f.as_str().unwrap());
                let img = decode_image(&std::fs::read(path).unwrap()).unwrap();
                preprocess(&img, &pcfg)
            })
            .collect();
        for (im, g) in images.iter().zip(case["grids"].as_array().unwrap()) {
            ensure!(
                [im.grid_h as u64, im.grid_w as u64]
                    == [g[0].as_u64().unwrap(), g[1].as_u64().unwrap()],
                "{name}: grid {}x{} vs reference {g}",
                im.grid_h,
                im.grid_w
            );
        }
        let mut got: HashMap<String, Vec<f32>> = HashMap::new();
        vit.encode_traced(&b, &images, &mut |k, t| {
            got.insert(k.to_string(), b.download(t)?.to_f32());
            Ok(())
        })?;
        let tensors = case["tensors"].as_object().unwrap();
        for (key, want) in tensors {
            let want: Vec<f32> = want["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            let ours = got
                .get(key)
                .with_context(|| format!("{name}: no `{key}` from the encoder"))?;
            let err = rel_err(ours, &want);
            ensure!(
                err < tolerance(dtype),
                "{name} {key} ({dtype}): rel err {err:.3e} > {}",
                tolerance(dtype)
            );
            checked += 1;
        }
    }
    ensure!(checked >= 3 * 7, "only {checked} tensors compared");
    Ok(())
}

/// The tiny model's image placeholder id (`image_token_id` in its config).
const PAD: u32 = 250;

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

fn load_image(name: &str) -> RgbImage {
    decode_image(&std::fs::read(fixture("kimi_k25_images").join(name)).unwrap()).unwrap()
}

/// The reference prompt with each image's expanded placeholder run collapsed to one id, as a
/// user writes it.
fn collapsed(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    for &t in ids {
        if !(t == PAD && out.last() == Some(&PAD)) {
            out.push(t);
        }
    }
    out
}

/// Runs one request to completion: its tokens and the logits row of the first sampled token.
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

/// Every reference case (images and text only) through the engine: the last prompt row's
/// logits and the greedy tokens, with prefill chunks of `chunk` tokens (small chunks cut through
/// the images' placeholder runs).
fn check_generate<B: Backend>(b: B, dtype: DType, chunk: usize, model: &str) -> Result<()> {
    let mut e = engine(b, model, engine_config(dtype, chunk))?;
    ensure!(e.accepts_images() && e.image_placeholder() == Some(PAD));
    for case in reference()["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let ids: Vec<u32> = case["prompt_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let images: Vec<RgbImage> = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| load_image(f.as_str().unwrap()))
            .collect();
        let want_toks: Vec<u32> = case["greedy_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let last3: Vec<f32> = case["logits_last3"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let want_logits = &last3[last3.len() / 3 * 2..];
        let (toks, logits) = run(&mut e, collapsed(&ids), &images, want_toks.len())?;
        let err = rel_err(&logits, want_logits);
        ensure!(
            err < tolerance(dtype),
            "{name} ({dtype}, chunk {chunk}): last prompt row logits rel err {err:.3e}"
        );
        if dtype == DType::F32 {
            ensure!(
                toks == want_toks,
                "{name}: greedy {toks:?} vs transformers {want_toks:?}"
            );
        }
    }
    Ok(())
}

/// The same image twice hits the encoder cache and the prefix cache (past the image); a
/// different image with the same placeholder count misses both, and its output differs.
fn check_caches<B: Backend>(b: B) -> Result<()> {
    // Bit for bit across a cache hit: batch-invariant kernels, as the other parity tests (CUDA's
    // default kernels may sum a prefix-hit step's rows in another order).
    let cfg = EngineConfig {
        batch_invariant: true,
        ..engine_config(DType::F32, 512)
    };
    let mut e = engine(b, "kimi_k25_tiny", cfg)?;
    let img = load_image("rgb_100x73.png");
    let mut other = img.clone();
    for v in other.data.iter_mut().step_by(7) {
        *v = 255 - *v;
    }
    let prompt = vec![1, 10, 11, 252, 20, 253, PAD, 254, 21, 30, 31, 32, 33];
    let first = run(&mut e, prompt.clone(), std::slice::from_ref(&img), 3)?;
    let (hit0, q0) = (
        e.counters().prefix_hit_tokens,
        e.counters().prefix_query_tokens,
    );
    let again = run(&mut e, prompt.clone(), std::slice::from_ref(&img), 3)?;
    let hit1 = e.counters().prefix_hit_tokens - hit0;
    ensure!(
        e.encoder_cache_stats().hits == 1,
        "{:?}",
        e.encoder_cache_stats()
    );
    ensure!(
        e.encoder_cache_stats().misses == 1,
        "{:?}",
        e.encoder_cache_stats()
    );
    // 6 text + 12 image + 6 text tokens: every full 4-token block but the last position's.
    ensure!(
        hit1 >= 20,
        "same image: {hit1} prefix-cache hit tokens (queried {q0})"
    );
    ensure!(first == again, "a cache hit changed the output");
    let hit_before = e.counters().prefix_hit_tokens;
    let diff = run(&mut e, prompt, std::slice::from_ref(&other), 3)?;
    let hit2 = e.counters().prefix_hit_tokens - hit_before;
    ensure!(
        e.encoder_cache_stats().misses == 2,
        "{:?}",
        e.encoder_cache_stats()
    );
    // Only the blocks before the image may be shared: tokens 0..4 (block 1 holds the image).
    ensure!(hit2 <= 4, "a different image hit {hit2} prefix tokens");
    ensure!(diff.1 != first.1, "a different image gave the same logits");
    Ok(())
}

/// Bad image requests get errors naming the problem, and the engine keeps serving.
fn check_bad_requests<B: Backend>(b: B) -> Result<()> {
    // Bit for bit across a cache hit: batch-invariant kernels, as the other parity tests (CUDA's
    // default kernels may sum a prefix-hit step's rows in another order).
    let cfg = EngineConfig {
        batch_invariant: true,
        ..engine_config(DType::F32, 512)
    };
    let mut e = engine(b, "kimi_k25_tiny", cfg)?;
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
    // An image whose tokens overflow the 512-token window is refused from its grid, before the
    // encoder runs (a 1400 × 1400 image is 50 × 50 merged tokens here).
    let big = RgbImage {
        width: 1400,
        height: 1400,
        data: vec![128; 1400 * 1400 * 3],
    };
    let err = e
        .add_request_with_images(vec![1, PAD, 5], greedy(2), ExtraKeys::default(), &[big])
        .unwrap_err()
        .to_string();
    ensure!(
        err.contains("image tokens") && err.contains("context window is 512"),
        "{err}"
    );
    ensure!(
        e.encoder_cache_stats().misses == 0,
        "the encoder ran for a refused request"
    );
    let ok = run(&mut e, vec![1, PAD, 5], &[img], 2)?;
    ensure!(ok.0.len() == 2);
    Ok(())
}

on_every_backend! {
    generate_f32 => |mk: fn() -> _| check_generate(mk(), DType::F32, 512, "kimi_k25_tiny");
    generate_chunked_f32 => |mk: fn() -> _| check_generate(mk(), DType::F32, 5, "kimi_k25_tiny");
    generate_bf16 => |mk: fn() -> _| check_generate(mk(), DType::BF16, 512, "kimi_k25_tiny");
    caches => |mk: fn() -> _| check_caches(mk());
    bad_requests => |mk: fn() -> _| check_bad_requests(mk());
    encoder_f32 => |mk: fn() -> _| check_encoder(mk(), DType::F32, "kimi_k25_tiny");
    encoder_bf16 => |mk: fn() -> _| check_encoder(mk(), DType::BF16, "kimi_k25_tiny");
    // The same weights under transformers 5's in-memory names (q/k rows permuted for rotate-half
    // RoPE, fused experts, `model.language_model.*`).
    encoder_hf_names => |mk: fn() -> _| check_encoder(mk(), DType::F32, "kimi_k25_tiny_hf");
    // Heads of 16 run as 32 wide with zero dims (the CUDA route for K2.5's 72 → 128).
    encoder_padded_heads => |mk: fn() -> _| check_encoder_at(mk(), DType::F32, "kimi_k25_tiny", Some(32));
    encoder_padded_heads_hf_names => |mk: fn() -> _| check_encoder_at(mk(), DType::F32, "kimi_k25_tiny_hf", Some(32));
    generate_hf_names => |mk: fn() -> _| check_generate(mk(), DType::F32, 512, "kimi_k25_tiny_hf");
    gelu_ops => |mk: fn() -> _| dayone_backend::conformance_vision::check_gelu(&mk());
}

#[test]
fn config_reads_original_names_first() {
    let cfg = config().unwrap();
    assert_eq!((cfg.hidden_size, cfg.num_layers, cfg.num_heads), (64, 2, 4));
    assert_eq!((cfg.pos_emb_height, cfg.pos_emb_width), (8, 8));
    // `vt_*` wins over transformers' names when they disagree.
    let p = fixture("kimi_k25_tiny").join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    v["vision_config"]["hidden_size"] = 1152.into();
    assert_eq!(MoonVitConfig::from_json(&v, "x").unwrap().hidden_size, 64);
    v["vision_config"]["vt_num_attention_heads"] = 5.into();
    let e = MoonVitConfig::from_json(&v, "x").unwrap_err().to_string();
    assert!(e.contains("divisible by 4"), "{e}");
    v["vision_config"]["mm_projector_type"] = "patchmergerv2".into();
    v["vision_config"]["vt_num_attention_heads"] = 4.into();
    let e = MoonVitConfig::from_json(&v, "x").unwrap_err().to_string();
    assert!(e.contains("mm_projector_type"), "{e}");
}

/// Two ranks (tensor parallel, threads on the CPU backend): rank 0 refuses a request with images
/// (its spliced rows would not reach rank 1) and still serves text.
#[test]
fn several_ranks_refuse_images() {
    use dayone_backend::comm::{thread_group, HostComm, HostGroup};
    use dayone_backend::cpu::CpuBackend;
    use dayone_engine::parallel::{Distributed, Parallel};
    use std::sync::Arc;
    let handles: Vec<_> = thread_group(2, std::time::Duration::from_secs(60))
        .into_iter()
        .map(|g| {
            std::thread::spawn(move || -> Result<()> {
                let group: Arc<dyn HostGroup> = Arc::new(g);
                let rank = group.rank();
                let dist = Distributed {
                    parallel: Parallel::new(Arc::new(HostComm::new(group.clone())), 1)?,
                    group,
                    done: None,
                    memory_shared_by: 2,
                };
                let ckpt = dayone_engine::loader::open(&fixture("kimi_k25_tiny"))?;
                let cfg = EngineConfig {
                    tensor_parallel_size: 2,
                    ..engine_config(DType::F32, 512)
                };
                let mut e = Engine::new_distributed(CpuBackend, &ckpt, &cfg, None, Some(dist))?;
                if rank == 0 {
                    let img = load_image("rgb_100x73.png");
                    let err = e
                        .add_request_with_images(
                            vec![1, PAD, 5],
                            greedy(2),
                            ExtraKeys::default(),
                            &[img],
                        )
                        .unwrap_err()
                        .to_string();
                    ensure!(err.contains("several ranks"), "{err}");
                    e.add_request(vec![1, 2, 3], greedy(2))?;
                    let done = e.run_to_completion()?;
                    ensure!(done.len() == 1 && done[0].1.len() == 2, "{done:?}");
                } else {
                    e.follow()?;
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().expect("rank panicked").unwrap();
    }
}
