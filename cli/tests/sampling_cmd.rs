//! `dayone generate` sampling flags end to end on tiny llama (CPU backend): a drawn seed is
//! reported and repeats the run, `--n` completions, `--logprobs`, penalties reach the engine,
//! greedy-only warnings, range errors name the flag.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn run(extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "generate",
            "--backend",
            "cpu",
            "--output",
            "json",
            "--model",
        ])
        .arg(fixture("llama_tiny"))
        .args(["--prompt-ids", "1,5,9,20", "--ignore-eos"])
        .args(extra)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone")
}

fn generate(extra: &[&str]) -> (serde_json::Value, String) {
    let out = run(extra);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let j = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    (j, stderr)
}

fn ids(j: &serde_json::Value) -> Vec<u64> {
    j["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn a_drawn_seed_is_reported_and_repeats_the_run() {
    let (a, _) = generate(&["--temperature", "1.5", "--max-tokens", "12"]);
    let seed = a["seed"].as_u64().expect("seed reported");
    let (b, _) = generate(&[
        "--temperature",
        "1.5",
        "--max-tokens",
        "12",
        "--seed",
        &seed.to_string(),
    ]);
    assert_eq!(b["seed"].as_u64(), Some(seed));
    assert_eq!(ids(&a), ids(&b), "the reported seed reproduces the sample");
    // Greedy needs no seed: 0, and the same tokens whatever the seed.
    let (g, _) = generate(&["--max-tokens", "6"]);
    assert_eq!(g["seed"].as_u64(), Some(0));
}

#[test]
fn n_completions_each_with_its_own_stream() {
    let (j, _) = generate(&[
        "--n",
        "3",
        "--temperature",
        "1.5",
        "--seed",
        "7",
        "--max-tokens",
        "10",
    ]);
    let choices = j["choices"].as_array().expect("choices with --n 3");
    assert_eq!(choices.len(), 3);
    let all: Vec<Vec<u64>> = choices.iter().map(ids).collect();
    assert_eq!(all[0], ids(&j), "the top level is completion 0");
    assert!(
        all[0] != all[1] || all[1] != all[2],
        "seeds differ per completion: {all:?}"
    );
    for c in choices {
        assert_eq!(c["finish_reason"], "length");
    }
    // Deterministic for a given seed.
    let (again, _) = generate(&[
        "--n",
        "3",
        "--temperature",
        "1.5",
        "--seed",
        "7",
        "--max-tokens",
        "10",
    ]);
    assert_eq!(j["choices"], again["choices"]);
}

#[test]
fn logprobs_of_the_chosen_and_top_tokens() {
    let (j, _) = generate(&["--logprobs", "3", "--max-tokens", "5"]);
    let lp = j["logprobs"].as_array().expect("logprobs list");
    let generated = ids(&j);
    assert_eq!(lp.len(), generated.len());
    for (entry, &tok) in lp.iter().zip(&generated) {
        assert_eq!(entry["token"].as_u64(), Some(tok));
        let top = entry["top"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let chosen = entry["logprob"].as_f64().unwrap();
        assert!(chosen <= 0.0);
        // Greedy: the chosen token is the most likely one.
        assert_eq!(top[0]["token"].as_u64(), Some(tok));
        assert!((top[0]["logprob"].as_f64().unwrap() - chosen).abs() < 1e-6);
        let p: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(
            p.windows(2).all(|w| w[0] >= w[1]),
            "most likely first: {p:?}"
        );
    }
    let (plain, _) = generate(&["--max-tokens", "5"]);
    assert_eq!(ids(&plain), generated, "logprobs do not change the tokens");
    assert!(plain["logprobs"].is_null());
}

#[test]
fn a_frequency_penalty_stops_greedy_repeats() {
    let (plain, _) = generate(&["--max-tokens", "40"]);
    let (pen, _) = generate(&[
        "--max-tokens",
        "40",
        "--frequency-penalty",
        "2",
        "--presence-penalty",
        "2",
    ]);
    let count_max = |v: &[u64]| {
        let mut c = std::collections::HashMap::new();
        v.iter().for_each(|t| *c.entry(*t).or_insert(0) += 1);
        c.into_values().max().unwrap()
    };
    let (a, b) = (ids(&plain), ids(&pen));
    assert_ne!(a, b, "the penalties reach the engine's sampler");
    assert!(
        count_max(&b) <= count_max(&a),
        "fewer repeats with penalties: {a:?} vs {b:?}"
    );
}

#[test]
fn greedy_warns_about_sampling_only_flags() {
    let (_, stderr) = generate(&["--max-tokens", "2", "--top-k", "5", "--min-p", "0.1"]);
    assert!(
        stderr.contains("warning: --top-k, --min-p have no effect at --temperature 0"),
        "{stderr}"
    );
    let (_, stderr) = generate(&["--max-tokens", "2", "--top-k", "5", "--temperature", "0.5"]);
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn sampling_ranges_are_usage_errors_naming_the_flag() {
    for (flag, value) in [
        ("--min-p", "1.5"),
        ("--repetition-penalty", "0"),
        ("--presence-penalty", "3"),
        ("--frequency-penalty", "-2.5"),
        ("--logprobs", "21"),
        ("--n", "0"),
    ] {
        let out = run(&[flag, value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
    // Stop strings match decoded text: a checkpoint without a tokenizer cannot have them.
    let out = run(&["--stop", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--stop"));
}
