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
