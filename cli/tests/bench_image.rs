//! `dayone bench --image`: TTFT of an image + text prompt on the tiny vision fixtures. The
//! timings are not checked (speed lives in benchmarks); the report's fields are: the image's
//! token count equals transformers' (tests/fixtures/gen_kimi_k25.py's grids), the prompt is image
//! + text tokens, the figures are finite. Bad uses get one clear error.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn dayone(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone")
}

/// Merged tokens of `image` in the transformers reference (`grids` of the case holding it).
fn reference_tokens(image: &str) -> u64 {
    let path = fixture("kimi_k25_tiny").join("reference.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in v["cases"].as_array().unwrap() {
        let images = case["images"].as_array().unwrap();
        if let Some(i) = images.iter().position(|f| f == image) {
            let g = &case["grids"][i];
            return g[0].as_u64().unwrap() / 2 * (g[1].as_u64().unwrap() / 2);
        }
    }
    panic!("{image} is in no reference case")
}

/// Runs `bench --json` with `image` on `model` and returns its reports.
fn bench(model: &str, backend: &str, image: &str, prompt_lens: &str) -> Vec<Value> {
    let image = fixture("kimi_k25_images").join(image);
    let out = dayone(&[
        "bench",
        "--model",
        fixture(model).to_str().unwrap(),
        "--backend",
        backend,
        "--image",
        image.to_str().unwrap(),
        "--prompt-len",
        prompt_lens,
        "--gen-len",
        "2",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Each report: the image field, image + text = prompt tokens, finite positive TTFT.
fn check(reports: &[Value], prompt_lens: &[u64], image_tokens: Option<u64>) {
    assert_eq!(reports.len(), prompt_lens.len());
    for (r, &p) in reports.iter().zip(prompt_lens) {
        assert!(r["image"].as_str().is_some(), "{r}");
        let n = r["image_tokens"].as_u64().expect("image_tokens");
        if let Some(want) = image_tokens {
            assert_eq!(n, want, "{r}");
        }
        assert!(n > 0, "{r}");
        assert_eq!(r["prompt_len"].as_u64(), Some(p), "{r}");
        assert_eq!(r["prompt_tokens"].as_u64(), Some(p + n), "{r}");
        let ttft = r["ttft_median_s"].as_f64().expect("ttft_median_s");
        assert!(ttft.is_finite() && ttft > 0.0, "{r}");
        assert!(r["prefill_tokens_per_s"]
            .as_f64()
            .is_some_and(f64::is_finite));
    }
}

#[test]
fn kimi_k25_image_and_text_on_cpu() {
    let reports = bench("kimi_k25_tiny", "cpu", "rgb_100x73.png", "8,5");
    check(&reports, &[8, 5], Some(reference_tokens("rgb_100x73.png")));
}

#[test]
fn kimi_k25_image_and_text_on_wgsl() {
    let reports = bench("kimi_k25_tiny", "wgsl", "gray_20x500.png", "4");
    check(&reports, &[4], Some(reference_tokens("gray_20x500.png")));
}

#[test]
fn glm5_next_image_and_text_on_cpu() {
    let reports = bench("glm5_next_vision_tiny", "cpu", "rgb_100x73.png", "6");
    check(&reports, &[6], None);
}

#[test]
fn image_for_a_text_only_model_is_refused() {
    let image = fixture("kimi_k25_images").join("rgb_100x73.png");
    let out = dayone(&[
        "bench",
        "--model",
        fixture("llama_tiny").to_str().unwrap(),
        "--backend",
        "cpu",
        "--image",
        image.to_str().unwrap(),
        "--prompt-len",
        "4",
        "--gen-len",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--image") && stderr.contains("takes no images"),
        "{stderr}"
    );
}

#[test]
fn missing_image_file_is_named() {
    let out = dayone(&[
        "bench",
        "--model",
        fixture("kimi_k25_tiny").to_str().unwrap(),
        "--backend",
        "cpu",
        "--image",
        "/nonexistent/picture.png",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("/nonexistent/picture.png"), "{stderr}");
}
