//! `--config FILE` and `dayone config`: the effective settings print as YAML that reads back to
//! the same settings; flags beat the file, the file beats the defaults; bad files and values this
//! build cannot serve are usage errors (exit 2) naming the file and the key path.

use std::path::Path;
use std::process::{Command, Output};

fn dayone(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

const SEED_LAYOUT: &str = "\
serving:
  model: {path: /models/x, dtype: bfloat16}
  parallel: {tensor_parallel_size: 1, expert_parallel_size: 1, pipeline_parallel_size: 1}
  context: {max_model_len: 1000000, chunked_prefill_size: 8192}
  cache: {kv_layout: paged, prefix_caching: true, host_cache_gb: 64, distributed_kv: false}
  runtime: {continuous_batching: true, max_num_seqs: 256, long_prefill_threshold: 32768,
            max_long_partial_prefills: 1, max_queued_requests: 1024, backend: cpu}
";

#[test]
fn effective_settings_round_trip_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(dir.path(), "serve.yaml", SEED_LAYOUT);
    let first = stdout(&dayone(&[
        "config",
        "--config",
        &f,
        "--max-num-seqs",
        "7",
        "--no-prefix-caching",
        "--chunked-prefill-size",
        "512",
    ]));
    // The flags override the file, the rest of the file stays.
    for want in [
        "max_num_seqs: 7",
        "prefix_caching: false",
        "chunked_prefill_size: 512",
        "max_model_len: 1000000",
        "host_cache_gb: 64",
        "dtype: bfloat16",
        "backend: cpu",
        "path: /models/x",
    ] {
        assert!(first.contains(want), "missing `{want}` in:\n{first}");
    }
    // The printed settings are a config file that gives the same settings again.
    let again = write(dir.path(), "effective.yaml", &first);
    let second = stdout(&dayone(&["config", "--config", &again]));
    assert_eq!(first, second);
}

#[test]
fn batch_invariant_from_the_flag_or_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let plain = stdout(&dayone(&["config", "--backend", "cpu"]));
    assert!(plain.contains("batch_invariant: false"), "{plain}");
    let flag = stdout(&dayone(&[
        "config",
        "--backend",
        "cpu",
        "--batch-invariant",
    ]));
    assert!(flag.contains("batch_invariant: true"), "{flag}");
    let f = write(
        dir.path(),
        "inv.yaml",
        "serving:\n  runtime: {batch-invariant: true, backend: cpu}\n",
    );
    let file = stdout(&dayone(&["config", "--config", &f]));
    assert!(file.contains("batch_invariant: true"), "{file}");
    let bad = write(
        dir.path(),
        "bad.yaml",
        "serving:\n  runtime: {batch_invariant: 3}\n",
    );
    let o = dayone(&["config", "--config", &bad]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bad.yaml") && err.contains("serving.runtime.batch_invariant"),
        "{err}"
    );
}

/// `--enforce-eager` / `runtime.enforce_eager` (CUDA graphs off) is set like its neighbours,
/// every engine command takes it, and on the CPU and WGSL backends (no graphs) a run with it
/// gives the same tokens; `bench --json` records it.
#[test]
fn enforce_eager_from_the_flag_or_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let plain = stdout(&dayone(&["config", "--backend", "cpu"]));
    assert!(plain.contains("enforce_eager: false"), "{plain}");
    let flag = stdout(&dayone(&["config", "--backend", "cpu", "--enforce-eager"]));
    assert!(flag.contains("enforce_eager: true"), "{flag}");
    let f = write(
        dir.path(),
        "eager.yaml",
        "serving:\n  runtime: {enforce-eager: true, backend: cpu}\n",
    );
    let file = stdout(&dayone(&["config", "--config", &f]));
    assert!(file.contains("enforce_eager: true"), "{file}");
    let off = stdout(&dayone(&["config", "--config", &f, "--no-enforce-eager"]));
    assert!(off.contains("enforce_eager: false"), "{off}");
    let o = dayone(&["config", "--enforce-eager", "--no-enforce-eager"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "both switches at once are a usage error"
    );
    let bad = write(
        dir.path(),
        "bad.yaml",
        "serving:\n  runtime: {enforce_eager: 3}\n",
    );
    let o = dayone(&["config", "--config", &bad]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bad.yaml") && err.contains("serving.runtime.enforce_eager"),
        "{err}"
    );
    for cmd in [
        "generate",
        "bench",
        "check",
        "chat",
        "perplexity",
        "needle",
        "serve",
    ] {
        let help = stdout(&dayone(&[cmd, "--help"]));
        assert!(help.contains("--enforce-eager"), "{cmd} --help lacks it");
    }
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/llama_tiny");
    for backend in ["cpu", "wgsl"] {
        let ids = |extra: &[&str]| {
            let mut args = vec![
                "generate",
                "-m",
                model,
                "--backend",
                backend,
                "--prompt-ids",
                "5,6,7,8",
                "--max-tokens",
                "4",
                "--output",
                "json",
            ];
            args.extend_from_slice(extra);
            let j: serde_json::Value =
                serde_json::from_str(stdout(&dayone(&args)).trim()).expect("one JSON object");
            j["generated_ids"].clone()
        };
        assert_eq!(ids(&[]), ids(&["--enforce-eager"]), "{backend}");
    }
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "-m",
            model,
            "--backend",
            "cpu",
            "--batch",
            "1",
            "--prompt-len",
            "4",
            "--gen-len",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        let j: serde_json::Value =
            serde_json::from_str(stdout(&dayone(&args)).trim()).expect("one JSON object");
        j["enforce_eager"].clone()
    };
    assert_eq!(bench(&[]), serde_json::json!(false));
    assert_eq!(bench(&["--enforce-eager"]), serde_json::json!(true));
}

/// The JSON of a run says whether the backend ran batch-invariant kernels (WGSL: only when
/// asked; the flag changes its kernels).
#[test]
fn generate_json_records_batch_invariance() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/llama_tiny");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "-m",
            model,
            "--backend",
            "wgsl",
            "--prompt-ids",
            "5,6,7,8",
            "--max-tokens",
            "2",
            "--output",
            "json",
        ];
        args.extend_from_slice(extra);
        let out = stdout(&dayone(&args));
        let j: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        (j["batch_invariant"].clone(), j["generated_ids"].clone())
    };
    let (plain, ids) = run(&[]);
    let (inv, inv_ids) = run(&["--batch-invariant"]);
    assert_eq!(plain, serde_json::json!(false));
    assert_eq!(inv, serde_json::json!(true));
    assert_eq!(ids, inv_ids, "greedy tokens agree");
}

#[test]
fn vllm_spellings_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let f = write(
        dir.path(),
        "kebab.yaml",
        "serving:\n  runtime: {max-num-seqs: 9, backend: cpu}\n  context: {max-num-batched-tokens: 300}\n",
    );
    let out = stdout(&dayone(&[
        "config",
        "--config",
        &f,
        "--max-batched-tokens",
        "200",
    ]));
    assert!(out.contains("max_num_seqs: 9"), "{out}");
    assert!(
        out.contains("chunked_prefill_size: 200"),
        "bench's flag name overrides: {out}"
    );
}

#[test]
fn bad_files_name_the_file_and_key_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text, key) in [
        (
            "ep.yaml",
            SEED_LAYOUT
                .replace("tensor_parallel_size: 1", "tensor_parallel_size: 4")
                .replace("expert_parallel_size: 1", "expert_parallel_size: 3"),
            "serving.parallel.expert_parallel_size",
        ),
        (
            "unknown.yaml",
            "serving:\n  cache: {prefix_cachin: true}\n".into(),
            "prefix_cachin",
        ),
        (
            "type.yaml",
            "serving:\n  runtime: {max_num_seqs: lots}\n".into(),
            "serving.runtime.max_num_seqs",
        ),
        (
            "dist.yaml",
            "serving:\n  cache: {distributed_kv: true}\n".into(),
            "serving.cache.distributed_kv",
        ),
        (
            "layout.yaml",
            "serving:\n  cache: {kv_layout: contiguous}\n".into(),
            "serving.cache.kv_layout",
        ),
        (
            "cb.yaml",
            "serving:\n  runtime: {continuous_batching: false}\n".into(),
            "serving.runtime.continuous_batching",
        ),
        (
            "f16.yaml",
            "serving:\n  model: {dtype: float16}\n".into(),
            "serving.model.dtype",
        ),
    ] {
        let f = write(dir.path(), name, &text);
        let o = dayone(&["config", "--config", &f]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(name) && err.contains(key), "{name}: {err}");
    }
    let o = dayone(&["config", "--config", "/nonexistent/serve.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("/nonexistent/serve.yaml"));
}

#[test]
fn parallel_flags_set_the_split_and_bad_ones_are_usage_errors() {
    for flag in ["-tp", "--tensor-parallel-size"] {
        let out = stdout(&dayone(&[
            "config",
            flag,
            "4",
            "-ep",
            "2",
            "--backend",
            "cpu",
        ]));
        assert!(
            out.contains("tensor_parallel_size: 4") && out.contains("expert_parallel_size: 2"),
            "{flag}: {out}"
        );
    }
    for (args, want) in [
        (&["config", "-pp", "2"][..], "--pipeline-parallel-size"),
        (
            &["config", "--expert-parallel-size", "2"][..],
            "must divide",
        ),
        (&["config", "-tp", "4", "-ep", "3"][..], "must divide"),
    ] {
        let o = dayone(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn bench_and_generate_take_the_shared_engine_flags() {
    // `bench` suggested --kv-cache-tokens without having it: every command has the same set.
    for cmd in ["generate", "bench", "check", "chat"] {
        let o = dayone(&[cmd, "--help"]);
        let help = stdout(&o);
        for flag in [
            "--config",
            "--kv-cache-tokens",
            "--max-num-seqs",
            "--chunked-prefill-size",
            "--no-prefix-caching",
        ] {
            assert!(help.contains(flag), "{cmd} --help lacks {flag}");
        }
    }
}
