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

/// A short WGSL `bench` of `model` (batch 1, 8 prompt tokens, 2 new) with `extra` flags:
/// stdout and stderr.
fn tiny_bench(model: &str, extra: &[&str]) -> (String, String) {
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
    ];
    args.extend_from_slice(extra);
    dayone(&args, model)
}

/// `bench` says whether `--moe-fp8` was given (`moe_fp8` in `--json`, `| moe-fp8` in the
/// header), so saved reports of a speed comparison tell the two runs apart; on WGSL the load
/// also warns that it fell back.
#[test]
fn bench_reports_moe_fp8() {
    let plain = json(&tiny_bench("gpt_oss_tiny", &["--json"]).0);
    assert_eq!(plain["moe_fp8"], false, "{plain}");
    let (out, stderr) = tiny_bench("gpt_oss_tiny", &["--json", "--moe-fp8"]);
    assert_eq!(json(&out)["moe_fp8"], true, "{out}");
    assert!(stderr.contains("no FP8 expert GEMM"), "{stderr}");
    let (table, _) = tiny_bench("gpt_oss_tiny", &["--moe-fp8"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("model ") && l.ends_with("| moe-fp8")),
        "{table}"
    );
}

#[test]
fn bench_reports_the_weight_dtype_and_resident_bytes() {
    let bench = |dtype: &str| json(&tiny_bench("gpt_oss_tiny", &["--dtype", dtype, "--json"]).0);
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

/// (float elements, low-bit stored bytes, low-bit values) of a checkpoint as a decode step
/// reads it, from its own tensor headers: the untied embedding table is only looked up; MXFP4
/// `*_blocks` and compressed-tensors `weight_packed` hold 2 values a byte (INT4: 8 an I32
/// word), their scales fold into the values; INT4's `weight_shape` is not a weight.
fn decode_weights(model: &str) -> (u64, u64, u64) {
    let file = fixture(model).join("model.safetensors");
    let data = std::fs::read(&file).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&data).unwrap();
    let tensors = meta.tensors();
    let tied = !tensors.contains_key("lm_head.weight");
    let (mut float, mut low_bytes, mut low_values) = (0u64, 0u64, 0u64);
    for (name, t) in tensors {
        let numel: u64 = t.shape.iter().map(|&d| d as u64).product();
        let bytes = (t.data_offsets.1 - t.data_offsets.0) as u64;
        if (name == "model.embed_tokens.weight" && !tied) || name.ends_with(".weight_shape") {
            continue;
        }
        if name.ends_with("_blocks") || name.ends_with(".weight_packed") {
            low_bytes += bytes;
            low_values += numel
                * if format!("{:?}", t.dtype) == "I32" {
                    8
                } else {
                    2
                };
        } else if name.ends_with("_scales") || name.ends_with(".weight_scale") {
            low_bytes += bytes;
        } else {
            float += numel;
        }
    }
    assert!(
        low_bytes > 0 && low_values > 0,
        "no low-bit tensors in {file:?}"
    );
    (float, low_bytes, low_values)
}

/// `bench`'s decode bytes against [`decode_weights`]: float weights in the weight dtype, the
/// low-bit experts (gpt-oss MXFP4, compressed-tensors INT4) in their stored bytes (codes +
/// scales) while they stay packed, and as their values in the weight dtype under
/// `--dequantize-at-load`.
#[test]
fn bench_counts_packed_experts_by_stored_bytes_and_dequantized_ones_by_values() {
    let total = |model: &str, extra: &[&str]| {
        let extra = [extra, &["--json"]].concat();
        let j = json(&tiny_bench(model, &extra).0);
        j["weight_bytes_total"].as_f64().unwrap() as u64
    };
    let (float, low_bytes, low_values) = decode_weights("gpt_oss_tiny");
    assert_eq!(
        total("gpt_oss_tiny", &[]),
        float * 2 + low_bytes,
        "bf16, experts packed"
    );
    assert_eq!(
        total("gpt_oss_tiny", &["--dtype", "f32"]),
        float * 4 + low_bytes,
        "f32, experts packed"
    );
    assert_eq!(
        total("gpt_oss_tiny", &["--dequantize-at-load"]),
        (float + low_values) * 2,
        "bf16, experts dequantized"
    );
    // The table says what the roofline counts.
    let (table, _) = tiny_bench("gpt_oss_tiny", &[]);
    assert!(table.contains("weights read per decode step"), "{table}");
    // An f32 checkpoint with INT4 experts: weights in f32.
    let (float, low_bytes, low_values) = decode_weights("deepseek_v3_int4");
    assert_eq!(
        total("deepseek_v3_int4", &[]),
        float * 4 + low_bytes,
        "INT4 packed"
    );
    assert_eq!(
        total("deepseek_v3_int4", &["--dequantize-at-load"]),
        (float + low_values) * 4,
        "INT4 dequantized"
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
