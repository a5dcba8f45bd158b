//! `dayone needle`: bad flags are usage errors (exit 2) naming the flag, a checkpoint without a
//! tokenizer is refused, and a small run on the default model (SmolLM2) prints one JSON object
//! whose accuracy figures agree with its cases and whose second wave hits the prefix cache.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn needle(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dayone"))
        .arg("needle")
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone")
}

/// Exit code 2 and an stderr naming `flag`.
fn assert_usage_error(args: &[&str], flag: &str) {
    let out = needle(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(flag), "{args:?}: {stderr}");
}

#[test]
fn bad_flags_are_usage_errors() {
    assert_usage_error(&["--depths", "0,120"], "--depths");
    assert_usage_error(&["--depths", "-5"], "--depths");
    assert_usage_error(&["--lengths", "0"], "--lengths");
    assert_usage_error(&["--lengths", "512,x"], "--lengths");
    assert_usage_error(&["--lengths", "512,512"], "--lengths");
    assert_usage_error(&["--depths", "50,50"], "--depths");
    assert_usage_error(&["--trials", "0"], "--trials");
}

#[test]
fn lengths_must_fit_the_prompt_and_the_window() {
    // SmolLM2's window is 8192 tokens; its chat-templated needle prompt needs ~80 tokens.
    assert_usage_error(
        &["--lengths", "8192", "--max-tokens", "1"],
        "context window",
    );
    assert_usage_error(&["--lengths", "16"], "too short");
    // Without --lengths the defaults (512, 1024, 2048) are clipped to the window; an error only
    // when none fits, saying they were the defaults.
    assert_usage_error(&["--max-model-len", "300"], "default --lengths");
}

#[test]
fn a_checkpoint_without_tokenizer_is_refused() {
    let out = needle(&["--model", fixture("llama_tiny").to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("no tokenizer"), "{stderr}");
}

#[test]
fn json_run_reports_cases_and_consistent_accuracy() {
    let out = needle(&[
        "--backend",
        "wgsl",
        "--lengths",
        "128",
        "--depths",
        "0,100",
        "--max-tokens",
        "4",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let j: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stderr}"));
    let cases = j["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2, "{j}");
    for c in cases {
        let tokens = c["prompt_tokens"].as_u64().unwrap();
        assert!(tokens <= 128 && tokens > 100, "{c}");
        let n = c["answer_ids"].as_array().unwrap().len();
        assert!((1..=4).contains(&n), "{c}");
        let correct = c["answer"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains(c["needle"].as_str().unwrap());
        assert_eq!(c["correct"].as_bool(), Some(correct), "{c}");
    }
    let found = cases.iter().filter(|c| c["correct"] == true).count();
    assert_eq!(
        j["accuracy"]["overall"].as_f64(),
        Some(found as f64 / 2.0),
        "{j}"
    );
    assert_eq!(j["accuracy"]["grid"].as_array().unwrap().len(), 1, "{j}");
    assert_eq!(j["prefix_caching"], true, "{j}");
    // The depth-0 case goes after the depth-100 one and shares its chat header and intro.
    let hits = j["prefix_cache_hit_tokens"].as_u64().expect("hit tokens");
    let queries = j["prefix_cache_query_tokens"]
        .as_u64()
        .expect("query tokens");
    assert!(hits > 0 && hits <= queries, "{j}");
}
