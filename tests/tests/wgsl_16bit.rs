//! `--dtype auto` on WGSL keeps a 16-bit checkpoint 16-bit on the device (f32 activations and
//! accumulation): `llama_tiny` rewritten in bf16 (round to nearest even, as transformers'
//! `model.to(torch.bfloat16)` rounds) loads as bf16 weights holding about half the bytes of the
//! f32 checkpoint, and its logits stay within the bf16 golden rule of transformers' float32
//! reference (`check_golden`'s rule), greedy tokens included up to a bf16 near-tie.

use anyhow::{ensure, Context, Result};
use dayone_backend::{DType, HostTensor};
use dayone_engine::loader::{self, SafetensorsSource, TensorSource};
use dayone_engine::serving_config::{auto_dtype, BackendName};
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{check_golden_dir, fixture, wgsl};
use dayone_wgsl::{KernelChoice, Options, WgslBackend};
use std::path::Path;

/// Writes `tensors` (name, shape, little-endian bytes of `dtype`, BF16 or F16) as one
/// safetensors file.
fn write_safetensors(
    path: &Path,
    dtype: DType,
    tensors: &[(String, Vec<usize>, Vec<u8>)],
) -> Result<()> {
    let spelled = match dtype {
        DType::BF16 => "BF16",
        DType::F16 => "F16",
        other => anyhow::bail!("write_safetensors: {other} is not a 16-bit float"),
    };
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape, bytes) in tensors {
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": spelled,
                "shape": shape,
                "data_offsets": [offset, offset + bytes.len()],
            }),
        );
        offset += bytes.len();
    }
    let mut head = serde_json::Value::Object(header).to_string().into_bytes();
    // The format pads the header with spaces to a multiple of 8 bytes.
    head.resize(head.len().next_multiple_of(8), b' ');
    let mut out = (head.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&head);
    for (_, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

/// A copy of fixture `name` (an f32 safetensors checkpoint) with every tensor stored in
/// `dtype` (BF16 or F16, rounded to nearest even).
fn copy_as(name: &str, dtype: DType) -> Result<tempfile::TempDir> {
    let src_dir = fixture(name);
    let dir = tempfile::tempdir()?;
    for entry in std::fs::read_dir(&src_dir)? {
        let p = entry?.path();
        let file = p.file_name().context("a file name")?;
        if p.extension().is_none_or(|x| x != "safetensors") {
            std::fs::copy(&p, dir.path().join(file))?;
        }
    }
    let src = SafetensorsSource::open_dir(&src_dir)?;
    let mut names = src.names();
    names.sort();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = names
        .into_iter()
        .map(|n| {
            let t = src.load(&n)?;
            let b = HostTensor::from_f32_as(t.shape.clone(), &t.to_f32(), dtype)?;
            Ok((n, b.shape, b.data))
        })
        .collect::<Result<_>>()?;
    write_safetensors(&dir.path().join("model.safetensors"), dtype, &tensors)?;
    Ok(dir)
}

fn config(dtype: DType) -> EngineConfig {
    EngineConfig {
        dtype,
        kv_cache_tokens: Some(2048),
        ..Default::default()
    }
}

#[test]
fn auto_keeps_a_bf16_checkpoint_16_bit_on_wgsl() -> Result<()> {
    let dir = copy_as("llama_tiny", DType::BF16)?;
    let ckpt16 = loader::open(dir.path())?;
    let ckpt32 = loader::open(&fixture("llama_tiny"))?;
    let stored16 = loader::stored_float_dtype(ckpt16.tensors.as_ref());
    let stored32 = loader::stored_float_dtype(ckpt32.tensors.as_ref());
    ensure!(
        stored16 == Some(DType::BF16),
        "bf16 copy read as {stored16:?}"
    );
    ensure!(
        stored32 == Some(DType::F32),
        "f32 fixture read as {stored32:?}"
    );
    // What `--dtype auto` picks on WGSL: the checkpoint's width.
    let auto16 = auto_dtype(BackendName::Wgsl, stored16);
    ensure!(auto16 == DType::BF16, "auto on WGSL for bf16: {auto16}");
    let auto32 = auto_dtype(BackendName::Wgsl, stored32);
    ensure!(auto32 == DType::F32, "auto on WGSL for f32: {auto32}");

    let e16 = Engine::new(wgsl(), &ckpt16, &config(auto16), None)?;
    let e32 = Engine::new(wgsl(), &ckpt32, &config(auto32), None)?;
    ensure!(e16.weight_dtype() == DType::BF16 && e16.activation_dtype() == DType::F32);
    let (b16, b32) = (e16.rank_memory()[0].0, e32.rank_memory()[0].0);
    let ratio = b16 as f64 / b32 as f64;
    // Every matrix is packed; only rows whose width is not a multiple of 8 would be widened.
    ensure!(
        (0.5..0.52).contains(&ratio),
        "resident weights: bf16 {b16} B vs f32 {b32} B (ratio {ratio:.3}, want ≈ 0.5)"
    );
    drop((e16, e32));

    // Logits and greedy tokens against transformers' float32 run, bf16 golden rule; with the
    // adapter's kernels (lavapipe: lanes over outputs) and with the GPU ones (workgroup
    // reductions along K), which lavapipe runs too.
    check_golden_dir(wgsl(), "llama_tiny", dir.path(), config(auto16))?;
    let gpu_kernels = WgslBackend::with_options(Options {
        kernels: KernelChoice::Gpu,
        ..Default::default()
    })?;
    check_golden_dir(gpu_kernels, "llama_tiny", dir.path(), config(auto16))
}

/// An f16 checkpoint: there is no f16 weight kernel, so `auto` on WGSL rounds it to bf16 at
/// load (16-bit on the device, still within the bf16 golden rule).
#[test]
fn auto_stores_an_f16_checkpoint_as_bf16_on_wgsl() -> Result<()> {
    let dir = copy_as("llama_tiny", DType::F16)?;
    let ckpt = loader::open(dir.path())?;
    let stored = loader::stored_float_dtype(ckpt.tensors.as_ref());
    ensure!(stored == Some(DType::F16), "f16 copy read as {stored:?}");
    let dtype = auto_dtype(BackendName::Wgsl, stored);
    ensure!(dtype == DType::BF16, "auto on WGSL for f16: {dtype}");
    let e = Engine::new(wgsl(), &ckpt, &config(dtype), None)?;
    ensure!(e.weight_dtype() == DType::BF16 && e.activation_dtype() == DType::F32);
    drop(e);
    check_golden_dir(wgsl(), "llama_tiny", dir.path(), config(dtype))
}
