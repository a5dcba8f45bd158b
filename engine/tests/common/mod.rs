//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use dayone_engine::loader::MetaValue;

/// Serializes a GGUF file: `tensors` are (name, dims innermost-first, ggml type id, bytes).
pub fn write_gguf(
    version: u32,
    alignment: usize,
    meta: &[(&str, MetaValue)],
    tensors: &[(&str, Vec<u64>, u32, Vec<u8>)],
) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(b"GGUF");
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    b.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, v) in meta {
        put_str(&mut b, k);
        b.extend_from_slice(&type_id(v).to_le_bytes());
        put_value(&mut b, v);
    }
    let mut offsets = Vec::new();
    let mut off = 0usize;
    for (_, _, _, data) in tensors {
        offsets.push(off);
        off += data.len();
        off = off.div_ceil(alignment) * alignment;
    }
    for ((name, dims, ty, _), o) in tensors.iter().zip(&offsets) {
        put_str(&mut b, name);
        b.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&ty.to_le_bytes());
        b.extend_from_slice(&(*o as u64).to_le_bytes());
    }
    let start = b.len().div_ceil(alignment) * alignment;
    b.resize(start, 0);
    for ((_, _, _, data), o) in tensors.iter().zip(&offsets) {
        b.resize(start + o, 0);
        b.extend_from_slice(data);
    }
    b
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn type_id(v: &MetaValue) -> u32 {
    match v {
        MetaValue::U8(_) => 0,
        MetaValue::I8(_) => 1,
        MetaValue::U16(_) => 2,
        MetaValue::I16(_) => 3,
        MetaValue::U32(_) => 4,
        MetaValue::I32(_) => 5,
        MetaValue::F32(_) => 6,
        MetaValue::Bool(_) => 7,
        MetaValue::String(_) => 8,
        MetaValue::Array(_) => 9,
        MetaValue::U64(_) => 10,
        MetaValue::I64(_) => 11,
        MetaValue::F64(_) => 12,
    }
}

fn put_value(b: &mut Vec<u8>, v: &MetaValue) {
    match v {
        MetaValue::U8(x) => b.push(*x),
        MetaValue::I8(x) => b.push(*x as u8),
        MetaValue::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::Bool(x) => b.push(*x as u8),
        MetaValue::String(s) => put_str(b, s),
        MetaValue::Array(a) => {
            let ety = a.first().map(type_id).unwrap_or(4);
            b.extend_from_slice(&ety.to_le_bytes());
            b.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                put_value(b, x);
            }
        }
        MetaValue::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        MetaValue::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
    }
}

/// A string metadata value.
pub fn s(x: &str) -> MetaValue {
    MetaValue::String(x.to_string())
}

/// An array of strings.
pub fn strs(xs: &[&str]) -> MetaValue {
    MetaValue::Array(xs.iter().map(|x| s(x)).collect())
}

/// Little-endian f32 bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian f16 bytes.
pub fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect()
}

/// Little-endian bf16 bytes.
pub fn bf16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect()
}

/// A tiny deterministic pseudo-random generator.
pub struct Lcg(pub u64);

impl Lcg {
    /// Next value.
    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 17
    }
}
