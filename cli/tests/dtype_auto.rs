//! `--dtype auto` (the default) on WGSL stores a 16-bit checkpoint's weights in bf16 and an f32
//! checkpoint's in f32; `generate`, `bench` and `info` say which dtype was chosen, and `bench`
//! reports the weights' resident bytes.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Runs `dayone args…`; returns (stdout, stderr), failing the test on a non-zero exit.
fn dayone(args: &[&str], model: &str) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(args)
        .arg("--model")
        .arg(fixture(model))
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{args:?} {model}: {stderr}");
    (String::from_utf8_lossy(&out.stdout).to_string(), stderr)
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {s}"))
}

/// `generate --output json` on WGSL: (weight dtype, activation dtype) and the stats line.
fn generate_dtypes(model: &str, extra: &[&str]) -> (String, String, String) {
    let mut args = vec![
        "generate",
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
    let (out, err) = dayone(&args, model);
    let j = json(&out);
    let s = |k: &str| {
        j[k].as_str()
            .unwrap_or_else(|| panic!("{k}: {j}"))
            .to_string()
    };
    (s("weight_dtype"), s("activation_dtype"), err)
}

#[test]
fn generate_on_wgsl_keeps_a_bf16_checkpoint_16_bit_and_says_so() {
    // gpt_oss_tiny is stored in bf16 (experts MXFP4), llama_tiny in f32.
    let (w, a, err) = generate_dtypes("gpt_oss_tiny", &[]);
    assert_eq!((w.as_str(), a.as_str()), ("bf16", "f32"));
    assert!(err.contains("bf16 weights, f32 compute"), "{err}");
    let (w, a, err) = generate_dtypes("llama_tiny", &[]);
    assert_eq!((w.as_str(), a.as_str()), ("f32", "f32"));
    assert!(err.contains("| f32 |"), "{err}");
    // A named dtype wins over the checkpoint's.
    let (w, _, _) = generate_dtypes("gpt_oss_tiny", &["--dtype", "f32"]);
    assert_eq!(w, "f32");
}

#[test]
fn bench_reports_the_weight_dtype_and_resident_bytes() {
    let bench = |dtype: &str| {
        let (out, _) = dayone(
            &[
                "bench",
                "--backend",
                "wgsl",
                "--batch",
                "1",
                "--prompt-len",
                "8",
                "--gen-len",
                "3",
                "--dtype",
                dtype,
                "--json",
            ],
            "gpt_oss_tiny",
        );
        json(&out)
    };
    let (b16, b32) = (bench("auto"), bench("f32"));
    assert_eq!(b16["weight_dtype"], "bf16", "{b16}");
    assert_eq!(b32["weight_dtype"], "f32", "{b32}");
    let bytes = |j: &serde_json::Value| j["weight_resident_bytes"].as_u64().unwrap();
    // The MXFP4 experts stay packed in both; every other weight halves.
    assert!(
        bytes(&b16) < bytes(&b32) && bytes(&b16) > 0,
        "bf16 {} B vs f32 {} B",
        bytes(&b16),
        bytes(&b32)
    );
}

/// `bench`'s decode bytes, counted from the checkpoint's own tensor headers: every float weight
/// the step reads (the untied embedding table is only looked up) in the weight dtype, the MXFP4
/// experts in their stored bytes (codes + scales) while they stay packed, and as their values
/// (two per code byte, scales folded in) in the weight dtype under `--dequantize-at-load`.
#[test]
fn bench_counts_packed_experts_by_stored_bytes_and_dequantized_ones_by_values() {
    let file = fixture("gpt_oss_tiny").join("model.safetensors");
    let data = std::fs::read(&file).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&data).unwrap();
    let (mut float, mut packed_bytes, mut packed_values) = (0u64, 0u64, 0u64);
    for (name, t) in meta.tensors() {
        let numel: u64 = t.shape.iter().map(|&d| d as u64).product();
        if name == "model.embed_tokens.weight" {
            continue;
        }
        if name.ends_with("_blocks") || name.ends_with("_scales") {
            packed_bytes += (t.data_offsets.1 - t.data_offsets.0) as u64;
            packed_values += if name.ends_with("_blocks") {
                2 * numel
            } else {
                0
            };
        } else {
            float += numel;
        }
    }
    assert!(
        packed_bytes > 0 && packed_values > 0,
        "no MXFP4 experts in {file:?}"
    );
    let total = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--backend",
            "wgsl",
            "--batch",
            "1",
            "--prompt-len",
            "8",
            "--gen-len",
            "2",
            "--json",
        ];
        args.extend_from_slice(extra);
        let j = json(&dayone(&args, "gpt_oss_tiny").0);
        j["weight_bytes_total"].as_f64().unwrap() as u64
    };
    assert_eq!(total(&[]), float * 2 + packed_bytes, "bf16, experts packed");
    assert_eq!(
        total(&["--dtype", "f32"]),
        float * 4 + packed_bytes,
        "f32, experts packed"
    );
    assert_eq!(
        total(&["--dequantize-at-load"]),
        (float + packed_values) * 2,
        "bf16, experts dequantized"
    );
}

#[test]
fn info_says_what_auto_picks_per_backend() {
    let (out, _) = dayone(&["info", "--json"], "gpt_oss_tiny");
    let j = json(&out);
    assert_eq!(j["auto_dtype"]["wgsl"], "bf16", "{j}");
    assert_eq!(j["auto_dtype"]["cuda"], "bf16", "{j}");
    assert_eq!(j["auto_dtype"]["cpu"], "f32", "{j}");
    let (out, _) = dayone(&["info", "--json"], "llama_tiny");
    assert_eq!(json(&out)["auto_dtype"]["wgsl"], "f32");
    let (table, _) = dayone(&["info"], "llama_tiny");
    assert!(
        table.contains("dtype auto    bf16 on CUDA; f32 on WGSL; f32 on CPU"),
        "{table}"
    );
    // One backend per `;`: the WGSL entry's own comma does not read as a fourth backend.
    let (table, _) = dayone(&["info"], "gpt_oss_tiny");
    assert!(
        table.contains("dtype auto    bf16 on CUDA; bf16 weights, f32 compute on WGSL; f32 on CPU"),
        "{table}"
    );
}
