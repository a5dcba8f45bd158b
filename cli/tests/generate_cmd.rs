//! `dayone generate` reports why generation stopped: `finish_reason` in `--output json`, a note
//! line on stderr when the context window cut the output short.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Runs `generate` on llama_tiny (context window 512) on WGSL; returns (json on stdout, stderr).
fn generate(ids: &str, extra: &[&str]) -> (serde_json::Value, String) {
    generate_on("wgsl", ids, extra)
}

/// Runs `generate` on llama_tiny on `backend`; returns (json on stdout, stderr).
fn generate_on(backend: &str, ids: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "generate",
            "--backend",
            backend,
            "--output",
            "json",
            "--model",
        ])
        .arg(fixture("llama_tiny"))
        .args(["--prompt-ids", ids])
        .args(extra)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let j = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    (j, stderr)
}

#[test]
fn max_tokens_reached_is_length() {
    let (j, stderr) = generate("1,2,3", &["--max-tokens", "5"]);
    assert_eq!(j["finish_reason"], "length", "{j}");
    assert_eq!(j["generated_ids"].as_array().unwrap().len(), 5, "{j}");
    assert!(!stderr.contains("context window"), "{stderr}");
}

#[test]
fn context_window_is_reported() {
    // 510 prompt tokens leave room for 2 of the 4 requested tokens in a 512-token window.
    let ids: Vec<String> = (0..510).map(|i| (i % 200).to_string()).collect();
    let (j, stderr) = generate(&ids.join(","), &["--max-tokens", "4"]);
    assert_eq!(j["finish_reason"], "context", "{j}");
    assert_eq!(j["generated_ids"].as_array().unwrap().len(), 2, "{j}");
    let notes: Vec<&str> = stderr.lines().filter(|l| l.starts_with("note:")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(
        notes[0].contains("context window") && notes[0].contains("512"),
        "{stderr}"
    );
}

#[test]
fn huge_max_tokens_stops_at_the_context_window() {
    let (j, _) = generate("1,2,3", &["--max-tokens", "99999999999"]);
    assert_eq!(j["finish_reason"], "context", "{j}");
    assert_eq!(j["generated_ids"].as_array().unwrap().len(), 509, "{j}");
}

#[test]
fn cpu_backend_matches_wgsl() {
    let (w, _) = generate("1,2,3", &["--max-tokens", "6"]);
    let (c, _) = generate_on("cpu", "1,2,3", &["--max-tokens", "6"]);
    assert_eq!(w["generated_ids"], c["generated_ids"]);
    assert!(c["backend"].as_str().unwrap().contains("cpu"), "{c}");
}

/// `--moe-fp8` where it cannot run says so in exactly one line and generates the same tokens as
/// without the flag: a dense model, low-bit experts decoded at load, and low-bit experts on a
/// backend without the FP8 GEMM (the CPU backend); once per job, not per rank.
#[test]
fn moe_fp8_says_once_why_it_does_nothing() {
    let run = |model: &str, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
            .args([
                "generate",
                "--backend",
                "cpu",
                "--output",
                "json",
                "-n",
                "3",
            ])
            .args(["--prompt-ids", "5,6,7", "--model"])
            .arg(fixture(model))
            .args(extra)
            .env("XDG_RUNTIME_DIR", "/tmp")
            .env_remove("DAYONE_LOG")
            .output()
            .expect("run dayone");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        let j: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
        (j["generated_ids"].clone(), stderr)
    };
    for (model, extra, why) in [
        ("llama_tiny", &[][..], "no MXFP4 / INT4 routed experts"),
        (
            "deepseek_v3_mxfp4",
            &["--dequantize-at-load"][..],
            "decoded at load",
        ),
        ("deepseek_v3_int4", &[][..], "no FP8 expert GEMM"),
        // Two context-parallel ranks: still one line (the first rank's).
        ("deepseek_v3_int4", &["-cp", "2"][..], "no FP8 expert GEMM"),
        (
            "llama_tiny",
            &["-cp", "2"][..],
            "no MXFP4 / INT4 routed experts",
        ),
    ] {
        let (plain, _) = run(model, extra);
        let (ids, stderr) = run(model, &[extra, &["--moe-fp8"]].concat());
        assert_eq!(ids, plain, "{model}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("--moe-fp8")).collect();
        assert_eq!(lines.len(), 1, "{model} {extra:?}: {stderr}");
        assert!(lines[0].contains(why), "{model} {extra:?}: {stderr}");
    }
}
