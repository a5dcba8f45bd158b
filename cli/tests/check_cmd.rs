//! `dayone check` against the recorded transformers activations: passes on the real fixture,
//! fails (non-zero exit) when the reference is perturbed.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn check(model: &Path, reference: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(["check", "--backends", "wgsl", "--tokens", "8", "--model"])
        .arg(model)
        .arg("--reference")
        .arg(reference)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn check_passes_against_the_reference() {
    let m = fixture("qwen3_tiny");
    let (ok, text) = check(&m, &m.join("reference.json"));
    assert!(ok, "{text}");
    assert!(
        text.contains("layer 1") && text.contains("logits") && text.contains("greedy"),
        "{text}"
    );
}

#[test]
fn check_fails_on_a_perturbed_reference() {
    let m = fixture("qwen3_tiny");
    let mut r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("reference.json")).unwrap()).unwrap();
    // Nudge one hidden value of layer 1 by 1%: far past the f32 tolerance.
    let v = &mut r["cases"][1]["float32"]["hidden_states"][1][3];
    *v = (v.as_f64().unwrap() * 1.01 + 0.01).into();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("reference.json");
    std::fs::write(&p, serde_json::to_string(&r).unwrap()).unwrap();
    let (ok, text) = check(&m, &p);
    assert!(!ok, "a perturbed reference must fail: {text}");
    assert!(text.contains("check failed"), "{text}");
}

#[test]
fn check_compares_wgsl_with_the_cpu_backend() {
    let m = fixture("llama_tiny");
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "check",
            "--backends",
            "wgsl,cpu",
            "--tokens",
            "4",
            "--prompt-ids",
            "1,2,3",
        ])
        .arg("--model")
        .arg(&m)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("cpu-reference") && text.contains("wgsl"),
        "{text}"
    );
}

#[test]
fn check_bf16_uses_the_golden_tolerance_rule() {
    // The MLA/MoE fixture whose bf16 reference is itself far from its f32 run.
    let m = fixture("deepseek_v3_nolora");
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "check",
            "--backends",
            "wgsl",
            "--tokens",
            "8",
            "--dtype",
            "bf16",
            "--model",
        ])
        .arg(&m)
        .arg("--reference")
        .arg(m.join("reference.json"))
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("judged against its float32 run"), "{text}");
    assert!(text.contains("1.5 × reference bf16-vs-f32 error"), "{text}");
}

/// The smollm2_reference.json layout (`prompts[].raw`: prompt and greedy ids, no logits), built
/// from a fixture's float32 greedy ids.
fn smollm2_layout(perturb: bool) -> tempfile::TempDir {
    let m = fixture("qwen3_tiny");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(m.join("reference.json")).unwrap()).unwrap();
    let prompts: Vec<serde_json::Value> = r["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let mut greedy = c["float32"]["greedy_ids"].clone();
            if perturb {
                greedy[2] = (greedy[2].as_u64().unwrap() + 1).into();
            }
            serde_json::json!({"raw": {"prompt_ids": c["prompt_ids"], "greedy_ids": greedy}})
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("ref.json"),
        serde_json::json!({ "prompts": prompts }).to_string(),
    )
    .unwrap();
    dir
}

#[test]
fn check_reads_the_smollm2_reference_layout() {
    let m = fixture("qwen3_tiny");
    let good = smollm2_layout(false);
    let (ok, text) = check(&m, &good.path().join("ref.json"));
    assert!(ok, "{text}");
    assert!(
        text.contains("prompts[0].raw") && text.contains("8/8 with reference"),
        "{text}"
    );
    let bad = smollm2_layout(true);
    let (ok, text) = check(&m, &bad.path().join("ref.json"));
    assert!(!ok, "a wrong greedy token must fail: {text}");
    assert!(text.contains("check failed"), "{text}");
}

/// Without --backends, `check` checks the config file's `runtime.backend` (here the CPU
/// reference alone: nothing to compare, a usage error), not auto.
#[test]
fn check_takes_the_config_files_backend() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cpu.yaml");
    std::fs::write(&cfg, "serving:\n  runtime: {backend: cpu}\n").unwrap();
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/llama_tiny");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "check",
            "--model",
            model,
            "--prompt-ids",
            "1,2,3",
            "--config",
        ])
        .arg(&cfg)
        .output()
        .expect("run dayone");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("runtime.backend"), "{stderr}");
}
