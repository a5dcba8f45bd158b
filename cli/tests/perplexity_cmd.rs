//! `dayone perplexity` against transformers (tests/fixtures/gen_perplexity.py →
//! perplexity_reference.json): tiny llama with a word-level tokenizer on CPU and WGSL, SmolLM2 on
//! WGSL (when its GGUF is cached); PPL within 1e-4 relative in f32 and the same window and
//! scored-token counts. KL mode: a run against itself is 0, bf16 against f32 small and positive.
//! Bad input: clear errors, exit 2 for flag problems.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn reference() -> Value {
    let p = fixture("perplexity_reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// llama_tiny with the reference's word-level tokenizer, and the reference text, in a temp dir.
struct Tiny {
    dir: tempfile::TempDir,
}

impl Tiny {
    fn new() -> Self {
        let r = reference();
        let dir = tempfile::tempdir().unwrap();
        let src = fixture("llama_tiny");
        let model = dir.path().join("model");
        std::fs::create_dir(&model).unwrap();
        for f in ["model.safetensors", "generation_config.json", "config.json"] {
            std::fs::copy(src.join(f), model.join(f)).unwrap();
        }
        let t = &r["tiny"];
        std::fs::write(model.join("tokenizer.json"), t["tokenizer"].to_string()).unwrap();
        std::fs::write(
            model.join("tokenizer_config.json"),
            t["tokenizer_config"].to_string(),
        )
        .unwrap();
        std::fs::write(dir.path().join("text.txt"), t["text"].as_str().unwrap()).unwrap();
        Tiny { dir }
    }
    fn model(&self) -> PathBuf {
        self.dir.path().join("model")
    }
    fn text(&self) -> PathBuf {
        self.dir.path().join("text.txt")
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn dayone(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dayone"))
        .arg("perplexity")
        .args(args)
        .env("DAYONE_LOG", "error")
        .output()
        .unwrap()
}

/// Runs with `--json` and returns the object; panics with stderr on failure.
fn json(model: &Path, file: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "--model",
        model.to_str().unwrap(),
        "--file",
        file.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = dayone(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "dayone {args:?} failed: {stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn check_case(got: &Value, want: &Value, text_tokens: &Value, what: &str) {
    let (g, w) = (got["ppl"].as_f64().unwrap(), want["ppl"].as_f64().unwrap());
    let rel = (g - w).abs() / w;
    eprintln!("{what}: dayone {g:.6} transformers {w:.6} (rel {rel:.2e})");
    assert!(
        rel < 1e-4,
        "{what}: ppl {g} vs transformers {w} (rel {rel:e})"
    );
    assert_eq!(got["scored_tokens"], want["scored_tokens"], "{what}");
    assert_eq!(got["windows"], want["windows"], "{what}");
    assert_eq!(&got["text_tokens"], text_tokens, "{what}");
    let (gs, ws) = (
        got["ppl_stderr"].as_f64().unwrap(),
        want["ppl_stderr"].as_f64().unwrap(),
    );
    assert!((gs - ws).abs() / ws < 1e-3, "{what}: stderr {gs} vs {ws}");
}

fn tiny_matches(backend: &str) {
    let r = reference();
    let t = Tiny::new();
    for case in r["tiny"]["cases"].as_array().unwrap() {
        let ctx = case["ctx"].to_string();
        let mut extra = vec!["--backend", backend, "--ctx", &ctx];
        if case["bos"].as_bool().unwrap() {
            extra.push("--bos");
        }
        let got = json(&t.model(), &t.text(), &extra);
        let what = format!("tiny {backend} ctx {ctx} bos {}", case["bos"]);
        check_case(&got, case, &r["tiny"]["text_tokens"], &what);
    }
}

#[test]
fn tiny_matches_transformers_cpu() {
    tiny_matches("cpu");
}

#[test]
fn tiny_matches_transformers_wgsl() {
    tiny_matches("wgsl");
}

/// One window per step or all at once: the same numbers.
#[test]
fn batching_does_not_change_the_result() {
    let t = Tiny::new();
    let base = ["--backend", "cpu", "--ctx", "16"];
    let one = json(
        &t.model(),
        &t.text(),
        &[&base[..], &["--batch-windows", "1"]].concat(),
    );
    let all = json(
        &t.model(),
        &t.text(),
        &[&base[..], &["--batch-windows", "12"]].concat(),
    );
    let (a, b) = (one["ppl"].as_f64().unwrap(), all["ppl"].as_f64().unwrap());
    assert!((a - b).abs() / a < 1e-6, "{a} vs {b}");
    assert_eq!(all["batch_windows"], 12);
}

#[test]
fn smollm2_matches_transformers_wgsl() {
    let r = reference();
    let Some(s) = r["smollm2"].as_object() else {
        eprintln!("skipped: the reference has no smollm2 section");
        return;
    };
    let Ok(model) = dayone_engine::default_model::default_model_path() else {
        eprintln!("skipped: SmolLM2 is not cached");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("text.txt");
    std::fs::write(&file, s["text"].as_str().unwrap()).unwrap();
    // The case without BOS (the BOS one is checked on the CPU in docs/perplexity.md's figures).
    let case = &s["cases"][0];
    let ctx = case["ctx"].to_string();
    let got = json(&model, &file, &["--backend", "wgsl", "--ctx", &ctx]);
    check_case(&got, case, &s["text_tokens"], "smollm2 wgsl");
}

#[test]
fn kl_against_itself_is_zero_and_bf16_is_small() {
    let t = Tiny::new();
    let saved = t.path("f32.lp");
    let s = saved.to_str().unwrap();
    let base = ["--backend", "cpu", "--ctx", "16", "--bos"];
    let f32_run = json(
        &t.model(),
        &t.text(),
        &[&base[..], &["--save-logprobs", s, "--save-top", "8"]].concat(),
    );
    assert!(saved.exists() && !t.path("f32.lp.partial").exists());
    // The temporary file is PATH.partial: an unrelated `f32.partial` is left alone.
    std::fs::write(t.path("f32.partial"), "keep").unwrap();
    json(
        &t.model(),
        &t.text(),
        &[&base[..], &["--save-logprobs", s, "--save-top", "8"]].concat(),
    );
    assert_eq!(
        std::fs::read_to_string(t.path("f32.partial")).unwrap(),
        "keep"
    );
    let same = json(
        &t.model(),
        &t.text(),
        &[&base[..], &["--kl-base", s]].concat(),
    );
    let kl = &same["kl"];
    assert_eq!(kl["mean"].as_f64(), Some(0.0), "{kl}");
    assert_eq!(kl["max"].as_f64(), Some(0.0), "{kl}");
    assert_eq!(kl["top1_agreement"].as_f64(), Some(1.0), "{kl}");
    assert_eq!(kl["mean_abs_dlogp"].as_f64(), Some(0.0), "{kl}");
    assert_eq!(kl["tokens"], f32_run["scored_tokens"]);
    assert_eq!(
        kl["base_ppl"].as_f64().map(|p| (p * 1e6).round()),
        f32_run["ppl"].as_f64().map(|p| (p * 1e6).round())
    );
    let bf16 = json(
        &t.model(),
        &t.text(),
        &[&base[..], &["--kl-base", s, "--dtype", "bf16"]].concat(),
    );
    let kl = &bf16["kl"];
    let mean = kl["mean"].as_f64().unwrap();
    eprintln!("bf16 vs f32: {kl}");
    assert!(mean > 0.0 && mean < 0.05, "bf16 vs f32 KL {kl}");
    assert!(kl["top1_agreement"].as_f64().unwrap() > 0.8, "{kl}");
}

fn fails(args: &[&str], code: i32, needle: &str) {
    let out = dayone(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: {needle:?} not in {stderr}"
    );
}

#[test]
fn bad_input_gives_clear_errors() {
    let t = Tiny::new();
    let m = t.model();
    let m = m.to_str().unwrap();
    let text = t.text();
    let text = text.to_str().unwrap();
    let empty = t.path("empty.txt");
    std::fs::write(&empty, "\n").unwrap();
    let short = t.path("short.txt");
    std::fs::write(&short, "hello world a b").unwrap();
    let run = |file: &str, extra: &[&str]| {
        let mut v = vec!["--backend", "cpu", "--model", m, "--file", file];
        v.extend_from_slice(extra);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let call = |args: Vec<String>, code, needle| {
        fails(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            code,
            needle,
        )
    };
    call(run(empty.to_str().unwrap(), &["--ctx", "8"]), 1, "is empty");
    call(
        run(short.to_str().unwrap(), &["--ctx", "8"]),
        1,
        "shorter than one window",
    );
    call(run(text, &["--ctx", "1"]), 2, "--ctx must be at least 2");
    let same = t.dir.path().join("same.lp");
    let same = same.to_str().unwrap();
    call(
        run(
            text,
            &["--ctx", "8", "--save-logprobs", same, "--kl-base", same],
        ),
        2,
        "name the same file",
    );
    call(
        run(text, &["--ctx", "513"]),
        2,
        "above the model's context window of 512",
    );
    call(
        run(text, &["--ctx", "8", "--save-top", "4"]),
        2,
        "--save-logprobs",
    );
    call(
        run("/nonexistent/x.txt", &["--ctx", "8"]),
        1,
        "/nonexistent/x.txt",
    );
    // A saved run from a model with another vocabulary (its header says 300 ids).
    let saved = t.path("a.lp");
    let s = saved.to_str().unwrap();
    json(
        &t.model(),
        &t.text(),
        &["--backend", "cpu", "--ctx", "16", "--save-logprobs", s],
    );
    let bytes = std::fs::read(&saved).unwrap();
    let nl = bytes.iter().position(|&b| b == b'\n').unwrap();
    let mut h: Value = serde_json::from_slice(&bytes[..nl]).unwrap();
    h["vocab_size"] = 300.into();
    let other = t.path("other.lp");
    let mut v = h.to_string().into_bytes();
    v.extend_from_slice(&bytes[nl..]);
    std::fs::write(&other, v).unwrap();
    call(
        run(text, &["--ctx", "16", "--kl-base", other.to_str().unwrap()]),
        1,
        "vocabulary of 300 tokens",
    );
    // Other windows, and a file that is not a saved run.
    call(
        run(text, &["--ctx", "8", "--kl-base", s]),
        1,
        "was saved with --ctx 16",
    );
    call(
        run(text, &["--ctx", "16", "--kl-base", text]),
        1,
        "not a file written by --save-logprobs",
    );
}
