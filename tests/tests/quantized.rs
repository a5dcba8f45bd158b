//! Low-bit weights stay low-bit: compressed-tensors MXFP4 / INT4 experts, gpt-oss's MXFP4
//! experts and the real
//! SmolLM2 Q4_1 GGUF load with their codes resident (weight bytes counted at load), and the
//! online decode gives what decoding at load gives (bit for bit on the CPU reference in f32,
//! where both multiply the same f32 weights); likewise a GGUF of K-quant (Q2_K … Q6_K) and Q5
//! matrices.

use anyhow::{ensure, Result};
use dayone_backend::cpu::CpuBackend;
use dayone_backend::{Backend, DType};
use dayone_engine::default_model::default_model_path;
use dayone_engine::{loader, Engine, EngineConfig};
use dayone_tests::{fixture, greedy, reference, rel_err};

fn config(dequantize_at_load: bool) -> EngineConfig {
    EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(1024),
        dequantize_at_load,
        ..Default::default()
    }
}

/// Greedy tokens and every sampled step's logits for each reference prompt.
fn run<B: Backend>(
    e: &mut Engine<B>,
    prompts: &[Vec<u32>],
    n: usize,
) -> Result<Vec<(u32, Vec<f32>)>> {
    e.capture_logits = true;
    let mut out = Vec::new();
    for p in prompts {
        e.add_request(p.clone(), greedy(n))?;
        while e.has_unfinished() {
            for ev in e.step()? {
                out.push((ev.token, e.last_logits[0].1.clone()));
            }
        }
    }
    Ok(out)
}

fn weight_bytes<B: Backend>(e: &Engine<B>) -> u64 {
    e.rank_memory()[0].0
}

/// `layers` MoE layers of `experts` routed experts `[F, D]` gate/up + `[D, F]` down: f32 bytes
/// minus the low-bit bytes (`code_bits` per value, `scale_bytes` per 32 values).
fn saved(layers: u64, experts: u64, f: u64, d: u64, scale_bytes: u64) -> u64 {
    let values = layers * experts * 3 * f * d;
    values * 4 - (values / 2 + values / 32 * scale_bytes)
}

#[test]
fn low_bit_experts_are_resident_and_decode_like_at_load() -> Result<()> {
    // (fixture, MoE layers, experts, F, D, scale bytes per 32): deepseek_v3 tiny has layers 1-2
    // MoE; gpt_oss tiny four MoE layers (experts as gpt-oss ships them, `*_blocks`/`*_scales`).
    for (name, layers, e, f, d, scale_bytes) in [
        ("deepseek_v3_mxfp4", 2, 16, 32, 64, 1),
        ("deepseek_v3_int4", 2, 16, 32, 64, 2),
        ("gpt_oss_tiny", 4, 8, 32, 64, 1),
    ] {
        let ckpt = loader::open(&fixture(name))?;
        let mut kept = Engine::new(CpuBackend, &ckpt, &config(false), None)?;
        let mut decoded = Engine::new(CpuBackend, &ckpt, &config(true), None)?;
        let want = saved(layers, e, f, d, scale_bytes);
        let got = weight_bytes(&decoded) - weight_bytes(&kept);
        ensure!(
            got == want,
            "{name}: keeping the experts low-bit saved {got} bytes, expected {want}"
        );
        let prompts: Vec<Vec<u32>> = reference(name)?
            .cases
            .iter()
            .map(|c| c.prompt_ids.clone())
            .collect();
        let a = run(&mut kept, &prompts, 4)?;
        let b = run(&mut decoded, &prompts, 4)?;
        ensure!(
            a == b,
            "{name}: online decode differs from decoding at load"
        );
    }
    Ok(())
}

#[test]
fn smollm2_q4_1_gguf_stays_quantized() -> Result<()> {
    let path = default_model_path()?;
    let file = loader::GgufFile::open(&path)?;
    // What the file holds in kept block formats (Q4_1 projections, the Q8_0 table).
    let kept_bytes: u64 = file
        .tensors
        .iter()
        .filter(|t| loader::kept_format(t.ggml_type).is_some())
        .map(|t| file.tensor_bytes(t).len() as u64)
        .sum();
    let floats: u64 = file
        .tensors
        .iter()
        .filter(|t| loader::kept_format(t.ggml_type).is_none())
        .map(|t| t.numel() as u64 * 4)
        .sum();
    let ckpt = loader::open(&path)?;
    let wgsl = dayone_tests::wgsl();
    let mut kept = Engine::new(wgsl, &ckpt, &config(false), None)?;
    ensure!(
        weight_bytes(&kept) == kept_bytes + floats,
        "resident weights {} bytes, expected the file's {kept_bytes} low-bit bytes + {floats} f32 bytes",
        weight_bytes(&kept)
    );
    let mut decoded = Engine::new(dayone_tests::wgsl(), &ckpt, &config(true), None)?;
    ensure!(weight_bytes(&decoded) > 5 * weight_bytes(&kept));
    let prompt = ckpt
        .assets
        .tokenizer
        .as_ref()
        .expect("tokenizer")
        .encode("The capital of France is", false)?;
    let a: Vec<u32> = run(&mut kept, std::slice::from_ref(&prompt), 8)?
        .into_iter()
        .map(|t| t.0)
        .collect();
    let b: Vec<u32> = run(&mut decoded, &[prompt], 8)?
        .into_iter()
        .map(|t| t.0)
        .collect();
    ensure!(
        a == b,
        "greedy tokens differ: low-bit {a:?} vs decoded at load {b:?}"
    );
    Ok(())
}

/// The K-quant llama GGUF (Q2_K … Q6_K, Q5_0, Q5_1, Q4_0, Q4_1, Q8_0 matrices) loads with
/// exactly the file's block bytes resident, and gives what decoding at load gives: every logits
/// row bit for bit on the CPU reference; on WGSL (whose decode GEMV sums in another order than
/// its dense GEMM) the same greedy tokens and logits within f32 tolerance.
fn k_quant_gguf_stays_quantized<B: Backend>(mk: fn() -> B, exact: bool) -> Result<()> {
    let path = fixture("llama_kquant/model.gguf");
    let file = loader::GgufFile::open(&path)?;
    let mut kept_types = std::collections::BTreeSet::new();
    let (mut kept_bytes, mut floats) = (0u64, 0u64);
    for t in &file.tensors {
        if loader::kept_format(t.ggml_type).is_some() {
            kept_types.insert(t.ggml_type.name());
            kept_bytes += file.tensor_bytes(t).len() as u64;
        } else {
            floats += t.numel() as u64 * 4;
        }
    }
    ensure!(kept_types.len() == 10, "fixture types {kept_types:?}");
    let ckpt = loader::open(&path)?;
    let mut kept = Engine::new(mk(), &ckpt, &config(false), None)?;
    ensure!(
        weight_bytes(&kept) == kept_bytes + floats,
        "resident weights {} bytes, expected the file's {kept_bytes} low-bit bytes + {floats} f32 bytes",
        weight_bytes(&kept)
    );
    let mut decoded = Engine::new(mk(), &ckpt, &config(true), None)?;
    ensure!(weight_bytes(&decoded) > 5 * weight_bytes(&kept));
    let prompts: Vec<Vec<u32>> = reference("llama_kquant")?
        .cases
        .iter()
        .map(|c| c.prompt_ids.clone())
        .collect();
    let a = run(&mut kept, &prompts, 8)?;
    let b = run(&mut decoded, &prompts, 8)?;
    ensure!(a.len() == b.len() && a.len() == prompts.len() * 8);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        ensure!(
            x.0 == y.0,
            "step {i}: greedy token {} low-bit vs {} decoded at load",
            x.0,
            y.0
        );
        let err = rel_err(&x.1, &y.1);
        ensure!(
            if exact { x.1 == y.1 } else { err < 1e-4 },
            "step {i}: logits differ from decoding at load (rel err {err:.2e})"
        );
    }
    Ok(())
}

#[test]
fn k_quant_gguf_stays_quantized_cpu() -> Result<()> {
    k_quant_gguf_stays_quantized(|| CpuBackend, true)
}

#[test]
fn k_quant_gguf_stays_quantized_wgsl() -> Result<()> {
    k_quant_gguf_stays_quantized(dayone_tests::wgsl, false)
}

/// A NaN scale (E8M0 byte 255) in a gpt-oss expert is a load error naming the tensor, the
/// expert and the row, not NaN logits.
#[test]
fn a_nan_mxfp4_scale_is_a_load_error() -> Result<()> {
    let dir = tempfile::tempdir()?;
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixture("gpt_oss_tiny").join(f), dir.path().join(f))?;
    }
    let path = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path)?;
    let header_len = u64::from_le_bytes(bytes[..8].try_into()?) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len])?;
    let name = "model.layers.2.mlp.experts.down_proj_scales";
    let start = header[name]["data_offsets"][0].as_u64().expect("offsets") as usize;
    // Expert 3, row 5 of the [8, 64, 1] scales.
    bytes[8 + header_len + start + 3 * 64 + 5] = 255;
    std::fs::write(&path, bytes)?;
    let ckpt = loader::open(dir.path())?;
    let err = match Engine::new(CpuBackend, &ckpt, &config(false), None) {
        Ok(_) => anyhow::bail!("a NaN scale loaded"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        err.contains("down_proj")
            && err.contains("255")
            && err.contains("expert 3, row 5")
            && err.contains("columns 0..32"),
        "{err}"
    );
    Ok(())
}
