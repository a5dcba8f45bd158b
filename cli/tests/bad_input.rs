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
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(args)
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
fn tensor_with_wrong_shape() {
    // A config that promises a wider MLP than the weights have.
    let d = copy_fixture("llama_tiny");
    edit_config(d.path(), |v| v["intermediate_size"] = 96.into());
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.layers.0.mlp.gate_proj.weight", "shape", "[96, 64]"],
    );
}

#[test]
fn tensor_with_wrong_dtype() {
    // Rewrite one tensor's dtype in the safetensors header to I32 (same byte width as F32).
    let d = copy_fixture("llama_tiny");
    let f = d.path().join("model.safetensors");
    let mut bytes = std::fs::read(&f).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let key = "\"model.norm.weight\":{\"dtype\":\"F32\"";
    assert!(
        header.contains(key),
        "fixture header layout changed: {header}"
    );
    let patched = header.replace(key, "\"model.norm.weight\":{\"dtype\":\"I32\"");
    bytes.splice(8..8 + n, patched.into_bytes());
    std::fs::write(&f, bytes).unwrap();
    fails_with(
        &gen(d.path().to_str().unwrap(), &["--prompt-ids", "1"]),
        &["model.norm.weight"],
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
