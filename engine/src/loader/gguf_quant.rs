//! Dequantization of ggml block formats to f32.
//!
//! Layouts (bytes in block order, little-endian, `f16` scales):
//! - Q8_0 (32 values, 34 bytes): `d`, 32 × i8; `x = q·d`.
//! - Q4_0 (32, 18): `d`, 16 bytes; element `j` is the low nibble of byte `j`, element `16 + j`
//!   the high nibble; `x = (q − 8)·d`.
//! - Q4_1 (32, 20): `d`, `m`, 16 bytes as Q4_0; `x = q·d + m`.
//! - Q5_0 (32, 22): `d`, 4 bytes of fifth bits (bit `j` for element `j`), 16 bytes of nibbles
//!   as Q4_0; `x = (q − 16)·d`.
//! - Q5_1 (32, 24): `d`, `m`, fifth bits, nibbles; `x = q·d + m`.
//! - K-quants (256 values per super-block, sub-blocks of 16 or 32 with their own scales):
//!   Q2_K (84 bytes), Q3_K (110), Q4_K (144), Q5_K (176), Q6_K (210).

use super::gguf_file::GgmlType;
use anyhow::{bail, Result};

/// The ggml types that load (raw or dequantized), for error messages.
pub(crate) const SUPPORTED_TYPES: &str =
    "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K";

fn f16(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}

/// Dequantizes `numel` values of type `ty` from `bytes` (which must hold exactly that many).
/// F32/F16/BF16 are widened. Errors for other types or a size mismatch.
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize) -> Result<Vec<f32>> {
    let Some((per, bsize)) = ty.block() else {
        bail!(
            "ggml type {} cannot be dequantized (supported: {SUPPORTED_TYPES})",
            ty.name()
        );
    };
    if !numel.is_multiple_of(per) || numel / per * bsize != bytes.len() {
        bail!(
            "{} data of {} bytes does not hold {numel} values",
            ty.name(),
            bytes.len()
        );
    }
    let mut out = Vec::with_capacity(numel);
    let blocks = bytes.chunks_exact(bsize);
    match ty {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(f16)),
        GgmlType::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        GgmlType::Q8_0 => blocks.for_each(|b| q8_0(b, &mut out)),
        GgmlType::Q4_0 => blocks.for_each(|b| q4_0(b, &mut out)),
        GgmlType::Q4_1 => blocks.for_each(|b| q4_1(b, &mut out)),
        GgmlType::Q5_0 => blocks.for_each(|b| q5(&b[6..], f16(b), None, &b[2..6], &mut out)),
        GgmlType::Q5_1 => {
            blocks.for_each(|b| q5(&b[8..], f16(b), Some(f16(&b[2..])), &b[4..8], &mut out))
        }
        GgmlType::Q2_K => blocks.for_each(|b| q2_k(b, &mut out)),
        GgmlType::Q3_K => blocks.for_each(|b| q3_k(b, &mut out)),
        GgmlType::Q4_K => blocks.for_each(|b| q4_k(b, &mut out)),
        GgmlType::Q5_K => blocks.for_each(|b| q5_k(b, &mut out)),
        GgmlType::Q6_K => blocks.for_each(|b| q6_k(b, &mut out)),
        GgmlType::Other(_) => bail!("ggml type {} cannot be dequantized", ty.name()),
    }
    Ok(out)
}

fn q8_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16(b);
    out.extend(b[2..34].iter().map(|&q| q as i8 as f32 * d));
}

fn q4_0(b: &[u8], out: &mut Vec<f32>) {
    let d = f16(b);
    let qs = &b[2..18];
    out.extend(qs.iter().map(|&q| ((q & 0x0F) as i32 - 8) as f32 * d));
    out.extend(qs.iter().map(|&q| ((q >> 4) as i32 - 8) as f32 * d));
}

fn q4_1(b: &[u8], out: &mut Vec<f32>) {
    let (d, m) = (f16(b), f16(&b[2..]));
    let qs = &b[4..20];
    out.extend(qs.iter().map(|&q| (q & 0x0F) as f32 * d + m));
    out.extend(qs.iter().map(|&q| (q >> 4) as f32 * d + m));
}

/// Q5_0 (`min = None`: values offset by −16) and Q5_1 (`min = Some(m)`).
fn q5(qs: &[u8], d: f32, min: Option<f32>, qh: &[u8], out: &mut Vec<f32>) {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let val = |q: u32| match min {
        None => (q as i32 - 16) as f32 * d,
        Some(m) => q as f32 * d + m,
    };
    for (j, &q) in qs.iter().enumerate().take(16) {
        out.push(val((q & 0x0F) as u32 | (((qh >> j) & 1) << 4)));
    }
    for (j, &q) in qs.iter().enumerate().take(16) {
        out.push(val((q >> 4) as u32 | (((qh >> (j + 16)) & 1) << 4)));
    }
}

/// 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K.
fn scale_min_k4(j: usize, s: &[u8]) -> (f32, f32) {
    if j < 4 {
        ((s[j] & 63) as f32, (s[j + 4] & 63) as f32)
    } else {
        let sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

/// Q2_K: 16 bytes of (scale nibble, min nibble), 64 bytes of 2-bit values, `d`, `dmin`.
fn q2_k(b: &[u8], out: &mut Vec<f32>) {
    let (scales, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (f16(&b[80..]), f16(&b[82..]));
    let mut is = 0;
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0u32, 2, 4, 6] {
            for part in 0..2 {
                let sc = scales[is];
                is += 1;
                let (dl, ml) = (d * (sc & 0x0F) as f32, dmin * (sc >> 4) as f32);
                for &x in &q[part * 16..part * 16 + 16] {
                    out.push(dl * ((x >> shift) & 3) as f32 - ml);
                }
            }
        }
    }
}

/// Q3_K: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of packed 6-bit scales, `d`.
fn q3_k(b: &[u8], out: &mut Vec<f32>) {
    let (hmask, qs, packed) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = f16(&b[108..]);
    // Sixteen 6-bit scales: low 4 bits from bytes 0..8 (low then high nibbles), high 2 bits
    // from bytes 8..12.
    let mut scales = [0i32; 16];
    for (i, s) in scales.iter_mut().enumerate() {
        let low = if i < 8 {
            packed[i] & 0x0F
        } else {
            packed[i - 8] >> 4
        };
        let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
        *s = (low | (high << 4)) as i32 - 32;
    }
    let mut is = 0;
    let mut m = 1u8;
    for half in 0..2 {
        let q = &qs[half * 32..half * 32 + 32];
        for shift in [0u32, 2, 4, 6] {
            for part in 0..2 {
                let dl = d * scales[is] as f32;
                is += 1;
                for l in part * 16..part * 16 + 16 {
                    let low = ((q[l] >> shift) & 3) as i32;
                    let sub = if hmask[l] & m != 0 { 0 } else { 4 };
                    out.push(dl * (low - sub) as f32);
                }
            }
            m = m.wrapping_shl(1);
        }
    }
}

/// Q4_K: `d`, `dmin`, 12 bytes of packed scales/mins, 128 bytes of nibbles.
fn q4_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (f16(b), f16(&b[2..]));
    let (scales, qs) = (&b[4..16], &b[16..144]);
    for chunk in 0..4 {
        let q = &qs[chunk * 32..chunk * 32 + 32];
        let (s1, m1) = scale_min_k4(2 * chunk, scales);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, scales);
        out.extend(q.iter().map(|&x| d * s1 * (x & 0x0F) as f32 - dmin * m1));
        out.extend(q.iter().map(|&x| d * s2 * (x >> 4) as f32 - dmin * m2));
    }
}

/// Q5_K: `d`, `dmin`, 12 bytes of packed scales/mins, 32 bytes of fifth bits, 128 of nibbles.
fn q5_k(b: &[u8], out: &mut Vec<f32>) {
    let (d, dmin) = (f16(b), f16(&b[2..]));
    let (scales, qh, qs) = (&b[4..16], &b[16..48], &b[48..176]);
    for chunk in 0..4 {
        let q = &qs[chunk * 32..chunk * 32 + 32];
        let (u1, u2) = (1u8 << (2 * chunk), 1u8 << (2 * chunk + 1));
        let (s1, m1) = scale_min_k4(2 * chunk, scales);
        let (s2, m2) = scale_min_k4(2 * chunk + 1, scales);
        for l in 0..32 {
            let hi = if qh[l] & u1 != 0 { 16 } else { 0 };
            out.push(d * s1 * ((q[l] & 0x0F) + hi) as f32 - dmin * m1);
        }
        for l in 0..32 {
            let hi = if qh[l] & u2 != 0 { 16 } else { 0 };
            out.push(d * s2 * ((q[l] >> 4) + hi) as f32 - dmin * m2);
        }
    }
}

/// Q6_K: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 i8 scales, `d`.
fn q6_k(b: &[u8], out: &mut Vec<f32>) {
    let (ql_all, qh_all, sc_all) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = f16(&b[208..]);
    for half in 0..2 {
        let ql = &ql_all[half * 64..half * 64 + 64];
        let qh = &qh_all[half * 32..half * 32 + 32];
        let sc = &sc_all[half * 8..half * 8 + 8];
        let mut y = [0f32; 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
        out.extend_from_slice(&y);
    }
}
