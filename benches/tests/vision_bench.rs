//! `vision-bench` on the tiny kimi_k25 fixture: it runs on the CPU and WGSL backends and reports
//! every field, with the grid and token count of transformers' processor (tests/fixtures/
//! gen_kimi_k25.py: 100×73 → 6×8 patches, 12 tokens) and the FLOP count of the formula shared with
//! benches/gpu/torch_kimi_k25.py. Timings are not checked.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn vision_bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_vision-bench"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run vision-bench")
}

fn report(backend: &str, images_per_call: &str) -> Value {
    let model = fixture("kimi_k25_tiny");
    let image = fixture("kimi_k25_images").join("rgb_100x73.png");
    let out = vision_bench(&[
        "--backend",
        backend,
        "--model",
        model.to_str().unwrap(),
        "--image",
        image.to_str().unwrap(),
        "--images-per-call",
        images_per_call,
        "--warmup",
        "1",
        "--iters",
        "2",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// The tiny config (C 64, F 128, 2 layers, patch 14, text hidden 64) on a 6×8 grid: N = 48,
/// M = 12; patch embed 2·48·588·64 = 3 612 672; per layer 2·48·64·192 + 4·48²·64 + 2·48·64² +
/// 4·48·64·128 = 3 735 552, ×2 layers; projector 2·12·256² + 2·12·256·64 = 1 966 080.
const TINY_FLOPS: f64 = 3_612_672.0 + 2.0 * 3_735_552.0 + 1_966_080.0;

fn check(r: &Value, per_call: u64) {
    assert_eq!(r["grid"], "6x8", "{r}");
    assert_eq!(r["patches"].as_u64(), Some(48), "{r}");
    assert_eq!(r["image_tokens"].as_u64(), Some(12), "{r}");
    assert_eq!(r["images_per_call"].as_u64(), Some(per_call), "{r}");
    let gflop = r["gflop_per_image"].as_f64().unwrap();
    assert!((gflop * 1e9 - TINY_FLOPS).abs() < 1.0, "{r}");
    for key in [
        "images_per_s",
        "tflops",
        "ms_per_call_median",
        "pos_emb_host_ms",
        "preprocess_ms",
    ] {
        let v = r[key].as_f64().unwrap_or(f64::NAN);
        assert!(v.is_finite() && v > 0.0, "{key}: {r}");
    }
}

#[test]
fn reports_on_cpu() {
    check(&report("cpu", "1"), 1);
}

#[test]
fn reports_on_wgsl_with_two_images_per_call() {
    check(&report("wgsl", "2"), 2);
}

#[test]
fn bad_flags_are_named() {
    let out = vision_bench(&[
        "--backend",
        "cpu",
        "--model",
        fixture("llama_tiny").to_str().unwrap(),
        "--image",
        fixture("kimi_k25_images")
            .join("rgb_100x73.png")
            .to_str()
            .unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("model_type 'llama'") && stderr.contains("MoonViT"),
        "{stderr}"
    );
}
