//! Bad input gets one clear error line naming the file or field and what was expected, a
//! non-zero exit code, and no panic or backtrace.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Runs `dayone` with `args`; asserts failure with exactly one stderr line containing each of `want`.
fn fails_with(args: &[&str], want: &[&str]) {
    fails_with_env(args, &[], want);
}

/// [`fails_with`] with extra environment variables.
fn fails_with_env(args: &[&str], env: &[(&str, &str)], want: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_BACKTRACE", "1")
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "{args:?} should fail; stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{args:?} panicked: {stderr}"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: expected one error line, got: {stderr}"
    );
    for w in want {
        assert!(
            lines[0].contains(w),
            "{args:?}: error line {:?} should mention {w:?}",
            lines[0]
        );
    }
}

/// A copy of a tiny fixture in a temp dir, for corrupting.
fn copy_fixture(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    dir
}

fn gen<'a>(model: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["generate", "--backend", "wgsl", "--model", model];
    v.extend_from_slice(extra);
    v
}

#[test]
fn missing_model_path() {
    fails_with(
        &gen("/nonexistent/model", &["--prompt-ids", "1,2"]),
        &["/nonexistent/model", "does not exist"],
    );
}

#[test]
fn bench_output_in_a_missing_directory_is_refused_before_any_run() {
    // The model path does not exist either: the output check comes first, so the error is the
    // flag's (a long bench would otherwise run to the end and then fail to save).
    for flag in ["--csv", "--plot"] {
        fails_with(
            &[
                "bench",
                "--backend",
                "cpu",
                "-m",
                "/nonexistent/model",
                flag,
                "/nonexistent/dir/out.svg",
            ],
            &[flag, "/nonexistent/dir", "does not exist"],
        );
    }
}

#[test]
fn top_k_minus_one_means_all_tokens_as_in_vllm() {
    let m = fixture("llama_tiny");
    let run = |k: &str| {
        Command::new(env!("CARGO_BIN_EXE_dayone"))
            .args([
                "generate",
                "--backend",
                "cpu",
                "-n",
                "4",
                "--seed",
                "3",
                "--temperature",
                "1",
            ])
            .args([
                "--prompt-ids",
                "1,2,3",
                "--output",
                "json",
                "--top-k",
                k,
                "--model",
            ])
            .arg(&m)
            .output()
            .expect("run dayone")
    };
    let (all, zero) = (run("-1"), run("0"));
    assert!(
        all.status.success(),
        "{}",
        String::from_utf8_lossy(&all.stderr)
    );
    let ids = |o: &std::process::Output| {
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["generated_ids"].clone()
    };
    assert!(
        ids(&all).is_array(),
        "{}",
        String::from_utf8_lossy(&all.stdout)
    );
    assert_eq!(ids(&all), ids(&zero), "-1 and 0 both keep every token");
    fails_with(
        &["generate", "--top-k", "-2", "--prompt-ids", "1"],
        &["--top-k", "-1"],
    );
}

#[test]
fn directory_without_config() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().to_str().unwrap();
    fails_with(&gen(p, &["--prompt-ids", "1"]), &["config.json"]);
}

#[test]
fn truncated_safetensors() {
    let d = copy_fixture("llama_tiny");
    let f = d.path().join("model.safetensors");
    let bytes = std::fs::read(&f).unwrap();
    std::fs::write(&f, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.safetensors"],
    );
}

#[test]
fn garbage_safetensors_header() {
    let d = copy_fixture("llama_tiny");
    std::fs::write(
        d.path().join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a header",
    )
    .unwrap();
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.safetensors"],
    );
}

#[test]
fn corrupt_gguf() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("model.gguf");
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&[0xff; 7]); // truncated tensor count
    std::fs::write(&f, bytes).unwrap();
    fails_with(
        &gen(f.to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.gguf"],
    );
}

#[test]
fn not_a_gguf_file() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("weights.bin");
    std::fs::write(&f, b"hello").unwrap();
    fails_with(
        &gen(f.to_str().unwrap(), &["--prompt-ids", "1"]),
        &["weights.bin"],
    );
}

fn edit_config(d: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = d.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
}

#[test]
fn unknown_model_type() {
    let d = copy_fixture("llama_tiny");
    edit_config(d.path(), |v| v["model_type"] = "mystery_net".into());
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["mystery_net", "llama"],
    );
}

#[test]
fn invalid_config_field() {
    let d = copy_fixture("llama_tiny");
    edit_config(d.path(), |v| v["hidden_size"] = "wide".into());
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["config.json", "hidden_size"],
    );
}

#[test]
fn non_positive_norm_eps() {
    // ε ≤ 0 would fill the logits with NaN, which greedy decoding reads as token 0.
    for eps in [-1.0, 0.0] {
        let d = copy_fixture("llama_tiny");
        edit_config(d.path(), |v| v["rms_norm_eps"] = eps.into());
        fails_with(
            &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
            &["config.json", "rms_norm_eps", "> 0"],
        );
    }
}

#[test]
fn tensor_with_wrong_shape() {
    // A config that promises a wider MLP than the weights have.
    let d = copy_fixture("llama_tiny");
    edit_config(d.path(), |v| v["intermediate_size"] = 96.into());
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.layers.0.mlp.gate_proj.weight", "shape", "[96, 64]"],
    );
}

/// Rewrites the JSON header of the safetensors file `f` with `edit` (the data stays; offsets are
/// relative to the header's end).
fn patch_header(f: &Path, edit: impl FnOnce(&str) -> String) {
    let mut bytes = std::fs::read(f).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let patched = edit(&header).into_bytes();
    bytes[..8].copy_from_slice(&(patched.len() as u64).to_le_bytes());
    bytes.splice(8..8 + n, patched);
    std::fs::write(f, bytes).unwrap();
}

#[test]
fn tensor_with_wrong_dtype() {
    // Rewrite one tensor's dtype in the safetensors header to I32 (same byte width as F32).
    let d = copy_fixture("llama_tiny");
    patch_header(&d.path().join("model.safetensors"), |header| {
        let key = "\"model.norm.weight\":{\"dtype\":\"F32\"";
        assert!(
            header.contains(key),
            "fixture header layout changed: {header}"
        );
        header.replace(key, "\"model.norm.weight\":{\"dtype\":\"I32\"")
    });
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.norm.weight"],
    );
}

#[test]
fn tensor_shape_that_does_not_fill_its_bytes_is_named() {
    // Rewrite one tensor's first dimension in the header (same width, another value): the header
    // no longer matches the data, and the error says which tensor.
    let d = copy_fixture("llama_tiny");
    patch_header(&d.path().join("model.safetensors"), |header| {
        let at = header
            .find("\"model.norm.weight\"")
            .expect("fixture has model.norm.weight");
        let shape = at + header[at..].find("\"shape\":[").unwrap() + "\"shape\":[".len();
        let dim_len = header[shape..].find(|c: char| !c.is_ascii_digit()).unwrap();
        let nines = "9".repeat(dim_len);
        assert_ne!(&header[shape..shape + dim_len], nines);
        format!("{}{nines}{}", &header[..shape], &header[shape + dim_len..])
    });
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.safetensors", "model.norm.weight", "data_offsets"],
    );
}

#[test]
fn missing_tensor() {
    let d = copy_fixture("llama_tiny");
    edit_config(d.path(), |v| v["num_hidden_layers"] = 3.into());
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.layers.2", "missing"],
    );
}

#[test]
fn text_prompt_without_tokenizer() {
    let p = fixture("llama_tiny");
    fails_with(
        &gen(p.to_str().unwrap(), &["--prompt", "hello"]),
        &["tokenizer", "--prompt-ids"],
    );
}

#[test]
fn empty_prompt() {
    let p = fixture("llama_tiny");
    fails_with(&gen(p.to_str().unwrap(), &["--prompt", ""]), &["empty"]);
    fails_with(&gen(p.to_str().unwrap(), &["--prompt-ids", ""]), &["empty"]);
}

#[test]
fn prompt_longer_than_context() {
    let p = fixture("llama_tiny");
    let long: Vec<String> = (0..600).map(|i| (i % 200).to_string()).collect();
    let long = long.join(",");
    fails_with(
        &gen(p.to_str().unwrap(), &["--prompt-ids", &long]),
        &["600 tokens", "context window", "512"],
    );
}

#[test]
fn token_id_outside_vocabulary() {
    let p = fixture("llama_tiny");
    fails_with(
        &gen(p.to_str().unwrap(), &["--prompt-ids", "1,999"]),
        &["999", "vocab"],
    );
}

#[test]
fn bad_flag_values() {
    let p = fixture("llama_tiny");
    let p = p.to_str().unwrap();
    fails_with(
        &gen(p, &["--prompt-ids", "1", "--temperature", "-1"]),
        &["--temperature"],
    );
    fails_with(
        &gen(p, &["--prompt-ids", "1", "--top-p", "1.5"]),
        &["--top-p"],
    );
    fails_with(
        &gen(p, &["--prompt-ids", "1", "--dtype", "f64"]),
        &["--dtype"],
    );
    fails_with(
        &gen(p, &["--prompt-ids", "1", "--output", "xml"]),
        &["--output"],
    );
    fails_with(
        &gen(p, &["--prompt-ids", "1", "--max-tokens", "0"]),
        &["--max-tokens"],
    );
    fails_with(&gen(p, &["--prompt-ids", "1,x"]), &["--prompt-ids", "'x'"]);
    fails_with(
        &["generate", "--backend", "tpu", "--prompt-ids", "1"],
        &["--backend"],
    );
    fails_with(
        &["generate", "--max-tokens", "lots", "--prompt-ids", "1"],
        &["--max-tokens"],
    );
    fails_with(&["generate", "--no-such-flag"], &["--no-such-flag"]);
}

#[test]
fn chat_without_template() {
    let p = fixture("llama_tiny");
    fails_with(
        &gen(p.to_str().unwrap(), &["--prompt", "hi", "--chat"]),
        &["tokenizer"],
    );
}

#[test]
fn request_larger_than_the_kv_cache_is_refused_up_front() {
    let p = fixture("llama_tiny");
    fails_with(
        &gen(
            p.to_str().unwrap(),
            &["--prompt-ids", "1,2,3", "--kv-cache-tokens", "16"],
        ),
        &[
            "prompt (3 tokens)",
            "--max-tokens (128)",
            "130",
            "holds 16",
            "--kv-cache-tokens",
        ],
    );
    // --max-tokens past the context window is clipped to it first (512 − 3 generated tokens).
    fails_with(
        &gen(
            p.to_str().unwrap(),
            &[
                "--prompt-ids",
                "1,2,3",
                "--kv-cache-tokens",
                "64",
                "--max-tokens",
                "99999999999",
            ],
        ),
        &[
            "509 generated tokens",
            "context window of 512",
            "511 tokens",
            "holds 64",
        ],
    );
}

/// A cache larger than the device's free memory is refused before it is allocated, and a size
/// whose byte count overflows is refused too — never an out-of-memory kill. Runs on the CPU
/// backend, which always reports (host) free memory.
#[test]
fn kv_cache_larger_than_free_memory_is_refused() {
    let p = fixture("llama_tiny");
    let p = p.to_str().unwrap();
    let cpu = |tokens: &'static str| {
        vec![
            "generate",
            "--backend",
            "cpu",
            "--model",
            p,
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "4",
            "--kv-cache-tokens",
            tokens,
        ]
    };
    fails_with(
        &cpu("4000000000"),
        &[
            "--kv-cache-tokens 4000000000 is too large",
            "free",
            "lower --kv-cache-tokens",
        ],
    );
    fails_with(
        &cpu("18446744073709551615"),
        &["too large", "--kv-cache-tokens"],
    );
}

/// On WGSL a cache tensor must fit in one storage binding (the cache ops cannot bind a tensor
/// split across buffers): a larger `--kv-cache-tokens` is refused when the engine is built,
/// naming the largest capacity that works, not at the first step. The binding is pinned to
/// lavapipe's 128 MiB so that GPU adapters with larger bindings give the same figures.
#[test]
fn kv_cache_tensor_larger_than_one_binding_is_refused() {
    let env = [("DAYONE_WGSL_MAX_CHUNK_BYTES", "134217728")];
    // llama_tiny: K and V `[blocks, 16, 2, 16]` f32, 128 B per token each → 1048576 tokens.
    let p = fixture("llama_tiny");
    let start = std::time::Instant::now();
    fails_with_env(
        &gen(
            p.to_str().unwrap(),
            &["--prompt-ids", "1,5", "--kv-cache-tokens", "3000000"],
        ),
        &env,
        &[
            "--kv-cache-tokens 3000000 is too large",
            "at most 1048576 tokens on this backend",
            "one cache tensor may not exceed 128.0 MiB",
        ],
    );
    // Refused before the cache is allocated or a step runs (those take far longer on lavapipe).
    assert!(
        start.elapsed() < std::time::Duration::from_secs(60),
        "took {:?}",
        start.elapsed()
    );
    // deepseek_v32_tiny: the latent cache `[blocks, 16, 40]` f32, 160 B per token.
    let p = fixture("deepseek_v32_tiny");
    fails_with_env(
        &gen(
            p.to_str().unwrap(),
            &["--prompt-ids", "1,5", "--kv-cache-tokens", "1000000"],
        ),
        &env,
        &[
            "--kv-cache-tokens 1000000 is too large",
            "at most 838848 tokens on this backend",
            "one cache tensor may not exceed 128.0 MiB",
        ],
    );
}

#[test]
fn conflicting_and_dangling_prompt_flags() {
    let p = fixture("llama_tiny");
    let p = p.to_str().unwrap();
    fails_with(
        &gen(p, &["--prompt", "hi", "--prompt-ids", "1"]),
        &["--prompt", "--prompt-ids"],
    );
    fails_with(
        &gen(p, &["--chat", "--prompt-ids", "1"]),
        &["--chat", "--prompt-ids"],
    );
    fails_with(
        &gen(p, &["--system", "be nice", "--prompt-ids", "1"]),
        &["--system", "--chat"],
    );
    fails_with(
        &gen(p, &["--chat", "--prompt", "hi"]),
        &["no chat template", "--chat"],
    );
    fails_with(
        &gen(p, &["--prompt-ids", "1,,2"]),
        &["--prompt-ids", "empty"],
    );
}

#[test]
fn numeric_flags_name_the_flag_for_zero_and_negative_values() {
    let p = fixture("llama_tiny");
    let p = p.to_str().unwrap();
    for (flag, v) in [
        ("--max-tokens", "-1"),
        ("--kv-cache-tokens", "0"),
        ("--kv-cache-tokens", "-5"),
        ("--top-k", "-2"),
        ("--seed", "-1"),
    ] {
        fails_with(&gen(p, &["--prompt-ids", "1", flag, v]), &[flag, v]);
    }
    let bench = |extra: &[&str], want: &[&str]| {
        let mut args = vec!["bench", "--backend", "wgsl", "--model", p];
        args.extend_from_slice(extra);
        fails_with(&args, want);
    };
    bench(
        &["--max-batched-tokens", "0"],
        &["--max-batched-tokens", "at least 1"],
    );
    bench(&["--gen-len", "-3"], &["--gen-len"]);
    bench(&["--batch", "2,0"], &["--batch"]);
    bench(&["--prompt-len", "-1"], &["--prompt-len"]);
}

#[test]
fn bench_past_the_context_window_is_refused() {
    let p = fixture("llama_tiny");
    fails_with(
        &[
            "bench",
            "--backend",
            "wgsl",
            "--model",
            p.to_str().unwrap(),
            "--batch",
            "1",
            "--prompt-len",
            "500",
            "--gen-len",
            "100",
            "--json",
        ],
        &["--prompt-len 500", "--gen-len 100", "context window of 512"],
    );
}

#[test]
fn bad_check_flags() {
    let p = fixture("llama_tiny");
    let p = p.to_str().unwrap();
    let r = fixture("llama_tiny").join("reference.json");
    let r = r.to_str().unwrap();
    let check = |extra: &[&str], want: &[&str]| {
        let mut args = vec!["check", "--model", p, "--reference", r];
        args.extend_from_slice(extra);
        fails_with(&args, want);
    };
    for t in ["nan", "inf", "-1", "0"] {
        check(&["--tolerance", t], &["--tolerance", "finite number > 0"]);
    }
    check(&["--tokens", "0"], &["--tokens"]);
    check(&["--backends", "wgsl,wgsl"], &["--backends", "twice"]);
    check(&["--backends", "wgsl,tpu"], &["--backends", "tpu"]);
    check(&["--prompt", "hi"], &["--reference", "--prompt"]);
    check(&["--prompt-ids", "1"], &["--reference", "--prompt-ids"]);
    fails_with(
        &[
            "check",
            "--model",
            p,
            "--backends",
            "cpu",
            "--prompt-ids",
            "1",
        ],
        &["nothing to compare", "--backends", "--reference"],
    );
}

#[test]
fn unusable_reference_files() {
    let p = fixture("llama_tiny");
    let d = tempfile::tempdir().unwrap();
    for (name, body, want) in [
        ("empty.json", "{}", "`cases`"),
        ("no_cases.json", r#"{"cases": []}"#, "no prompts"),
        ("other.json", r#"{"data": [1, 2]}"#, "`prompts`"),
        (
            "no_f32.json",
            r#"{"cases": [{"prompt_ids": [1]}]}"#,
            "float32",
        ),
        (
            "bad_ids.json",
            r#"{"cases": [{"prompt_ids": "1,2", "float32": {}}]}"#,
            "prompt_ids",
        ),
        (
            "raw_no_greedy.json",
            r#"{"prompts": [{"raw": {"prompt_ids": [1]}}]}"#,
            "greedy_ids",
        ),
    ] {
        let f = d.path().join(name);
        std::fs::write(&f, body).unwrap();
        fails_with(
            &[
                "check",
                "--model",
                p.to_str().unwrap(),
                "--reference",
                f.to_str().unwrap(),
            ],
            &[name, want],
        );
    }
}

#[test]
fn full_stdout_is_a_clear_error() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        return; // not Linux
    };
    let p = fixture("llama_tiny");
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(gen(
            p.to_str().unwrap(),
            &["--prompt-ids", "1,2", "--max-tokens", "2"],
        ))
        .stdout(full)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("error: writing to stdout"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn max_model_len_above_the_model_window() {
    let m = fixture("llama_tiny");
    let m = m.to_str().unwrap();
    fails_with(
        &gen(m, &["--prompt-ids", "1,2", "--max-model-len", "100000"]),
        &["--max-model-len", "100000", "512", "config.json"],
    );
}

/// `dayone generate --backend cpu --model llama_tiny --prompt-ids 1,2 <extra>` exits 2 (a usage
/// error) and its stderr mentions every string of `want`.
fn generate_usage_error(extra: &[&str], want: &[&str]) {
    let m = fixture("llama_tiny");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "generate",
            "--backend",
            "cpu",
            "--prompt-ids",
            "1,2",
            "--model",
        ])
        .arg(&m)
        .args(extra)
        .output()
        .expect("run dayone");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
    for w in want {
        assert!(
            stderr.contains(w),
            "{extra:?}: stderr should mention {w:?}: {stderr}"
        );
    }
}

#[test]
fn empty_stop_string_is_a_usage_error() {
    generate_usage_error(&["--stop", ""], &["--stop", "empty"]);
}

#[test]
fn logprobs_in_text_output_is_a_usage_error() {
    generate_usage_error(&["--logprobs", "2"], &["--output json"]);
}
