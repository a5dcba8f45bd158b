//! ggml block formats decoded like gguf-py (`gguf.quants.dequantize`, the Python port of
//! ggml-quants.c's `dequantize_row_*`), bit for bit: random blocks of every type dayone reads
//! (`fixtures/gguf_blocks_reference.json`, `fixtures/gen_gguf_kquants.py`) through the
//! decode-at-load path, and, all of them being kept quantized, through the repacked device layout: the host decode and `dequantize_into` on the
//! CPU reference and WGSL (and CUDA where a GPU is present).

use anyhow::{ensure, Context, Result};
use dayone_backend::{Backend, HostTensor, QuantTensor};
use dayone_engine::loader::{self, GgmlType};
use dayone_tests::{fixture, on_every_backend};
use serde::Deserialize;
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct Blocks {
    /// Raw ggml blocks of `rows × cols` values, hex.
    bytes: String,
    /// gguf-py's decoded values, little-endian f32, hex.
    f32: String,
}

#[derive(Deserialize)]
struct BlockReference {
    rows: usize,
    cols: usize,
    /// By gguf-py's type name (`Q4_K`, …).
    types: BTreeMap<String, Blocks>,
}

fn unhex(s: &str) -> Result<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).context("hex byte"))
        .collect()
}

/// One recorded type: `rows × cols` values as raw blocks and gguf-py's f32 bits.
struct Case {
    ty: GgmlType,
    rows: usize,
    cols: usize,
    bytes: Vec<u8>,
    want: Vec<u32>,
}

/// Every recorded type.
fn cases() -> Result<Vec<Case>> {
    let p = fixture("gguf_blocks_reference.json");
    let r: BlockReference = serde_json::from_str(&std::fs::read_to_string(&p)?)
        .with_context(|| format!("parsing {}", p.display()))?;
    let mut out = Vec::new();
    for (name, b) in &r.types {
        let ty = (0..40)
            .map(GgmlType::from_id)
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .with_context(|| format!("unknown ggml type {name}"))?;
        let want = unhex(&b.f32)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.push(Case {
            ty,
            rows: r.rows,
            cols: r.cols,
            bytes: unhex(&b.bytes)?,
            want,
        });
    }
    ensure!(
        out.len() == 10,
        "expected 10 ggml types, found {}",
        out.len()
    );
    Ok(out)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn decode_at_load_equals_gguf_py() -> Result<()> {
    for Case {
        ty,
        rows,
        cols,
        bytes,
        want,
    } in cases()?
    {
        let got = loader::dequantize(ty, &bytes, rows * cols)?;
        ensure!(
            bits(&got) == want,
            "{}: decode at load differs from gguf-py",
            ty.name()
        );
    }
    Ok(())
}

/// The repacked weight keeps the file's bytes and decodes, on the host and on `b`, to gguf-py's
/// values bit for bit.
fn kept_decode_equals_gguf_py<B: Backend>(b: B) -> Result<()> {
    let mut kept = 0;
    for Case {
        ty,
        rows,
        cols,
        bytes,
        want,
    } in cases()?
    {
        if loader::kept_format(ty).is_none() {
            continue;
        }
        kept += 1;
        let name = ty.name();
        let q = loader::repack(&name, ty, &bytes, rows, cols)?;
        ensure!(
            q.bytes() == bytes.len() as u64,
            "{name}: {} resident bytes for {} file bytes",
            q.bytes(),
            bytes.len()
        );
        ensure!(
            bits(&q.dequantize()) == want,
            "{name}: host decode differs from gguf-py"
        );
        let dq = QuantTensor::upload(&b, &q)?;
        let out = b.upload(&HostTensor::from_f32(
            vec![1, rows, cols],
            &vec![0.0; rows * cols],
        )?)?;
        b.dequantize_into(&dq, &b.upload(&HostTensor::from_u32(vec![1], &[0])?)?, &out)?;
        ensure!(
            bits(&b.download(&out)?.to_f32()) == want,
            "{name}: dequantize_into differs from gguf-py"
        );
    }
    ensure!(kept == 10, "expected 10 kept types, found {kept}");
    Ok(())
}

on_every_backend! {
    kept_blocks_decode_like_gguf_py => |mk: fn() -> _| kept_decode_equals_gguf_py(mk());
}
