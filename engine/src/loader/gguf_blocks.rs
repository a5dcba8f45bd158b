//! GGUF block quants kept quantized: ggml's Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K
//! and Q6_K blocks repacked, byte count unchanged, into the device layout of [`dayone_backend::quant`]
//! (codes, then scales, then mins).
//!
//! A ggml block holds its scales before (Q6_K: after) the codes, and orders its codes for its
//! own SIMD decode: a Q4_0 block's byte `j` holds value `j` in its low nibble and value
//! `16 + j` in its high nibble (ggml `block_q4_0`); Q5's fifth bits sit in a 32-bit word (Q5_0,
//! Q5_1) or a 32-byte plane (Q5_K); Q6_K splits each value into a nibble and two high bits
//! (`dequantize_row_q6_K`); Q2_K / Q3_K hold four 2-bit values per byte, 32 values apart (and
//! Q3_K's third bit in a 32-byte `hmask`). Here every value's code is taken out in column order
//! and written to the device planes (low bits, then high bits). Scales: Q4_0/Q4_1/Q5_0/Q5_1/
//! Q8_0 move their f16 `d` (and `m`) to the scale (min) array; the K-quants keep their
//! super-block scale record verbatim (Q4_K/Q5_K: `d`, `dmin`, 12 packed bytes; Q6_K: 16 i8
//! scales, `d`; Q3_K: 12 packed bytes, `d`), Q2_K's made contiguous (16 scale bytes, `d`,
//! `dmin`). Every ggml block type dayone reads is kept; [`super::dequantize`] decodes them at
//! load under `--dequantize-at-load`.

use super::gguf_file::GgmlType;
use anyhow::{bail, Result};
use dayone_backend::{QuantFormat, QuantHost};

/// The format a ggml type is kept in on the device, `None` when it is decoded at load.
pub fn kept_format(ty: GgmlType) -> Option<QuantFormat> {
    match ty {
        GgmlType::Q4_0 => Some(QuantFormat::Q4_0),
        GgmlType::Q4_1 => Some(QuantFormat::Q4_1),
        GgmlType::Q8_0 => Some(QuantFormat::Q8_0),
        GgmlType::Q5_0 => Some(QuantFormat::Q5_0),
        GgmlType::Q5_1 => Some(QuantFormat::Q5_1),
        GgmlType::Q4_K => Some(QuantFormat::Q4_K),
        GgmlType::Q5_K => Some(QuantFormat::Q5_K),
        GgmlType::Q6_K => Some(QuantFormat::Q6_K),
        GgmlType::Q2_K => Some(QuantFormat::Q2_K),
        GgmlType::Q3_K => Some(QuantFormat::Q3_K),
        _ => None,
    }
}

/// The codes of one block of `ty` in column order (`per` values; 4, 5, 6 or 8 bits each).
fn block_codes(ty: GgmlType, b: &[u8], out: &mut Vec<u8>) {
    // Q4_0 / Q4_1 / Q5_0 / Q5_1: value j < 16 in the low nibble of byte j, 16 + j in the high.
    let q4 = |qs: &[u8], qh: u32, out: &mut Vec<u8>| {
        for v in 0..32 {
            let lo = if v < 16 { qs[v] & 15 } else { qs[v - 16] >> 4 };
            out.push(lo | ((((qh >> v) & 1) as u8) << 4));
        }
    };
    let word = |w: &[u8]| u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
    match ty {
        GgmlType::Q8_0 => out.extend_from_slice(&b[2..34]),
        GgmlType::Q4_0 => q4(&b[2..18], 0, out),
        GgmlType::Q4_1 => q4(&b[4..20], 0, out),
        GgmlType::Q5_0 => q4(&b[6..22], word(&b[2..6]), out),
        GgmlType::Q5_1 => q4(&b[8..24], word(&b[4..8]), out),
        GgmlType::Q4_K | GgmlType::Q5_K => {
            // Four chunks of 64 values: 32 low nibbles, then 32 high nibbles of 32 bytes;
            // Q5_K's fifth bit of chunk c's values is bit 2c (low) / 2c + 1 (high) of qh[l].
            let (qh, qs): (&[u8], &[u8]) = if ty == GgmlType::Q5_K {
                (&b[16..48], &b[48..176])
            } else {
                (&[], &b[16..144])
            };
            for c in 0..4 {
                for (half, shift) in [(0, 0), (1, 4)] {
                    for l in 0..32 {
                        let lo = (qs[32 * c + l] >> shift) & 15;
                        let hi = qh.get(l).map_or(0, |h| (h >> (2 * c + half)) & 1);
                        out.push(lo | (hi << 4));
                    }
                }
            }
        }
        GgmlType::Q6_K => {
            let (ql, qh) = (&b[0..128], &b[128..192]);
            for h in 0..2 {
                let (ql, qh) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32]);
                // Values 32k + l of the half: nibble k of (ql[l], ql[l + 32]) in the order low
                // of l, low of l + 32, high of l, high of l + 32; high bits 2k of qh[l].
                for k in 0..4 {
                    for l in 0..32 {
                        let byte = ql[l + 32 * (k % 2)];
                        let lo = if k < 2 { byte & 15 } else { byte >> 4 };
                        out.push(lo | (((qh[l] >> (2 * k)) & 3) << 4));
                    }
                }
            }
        }
        GgmlType::Q2_K | GgmlType::Q3_K => {
            // Two halves of 128 values from 32 bytes each: value 32j + l of a half is bits 2j of
            // byte l; Q3_K's third bit of value 128h + 32j + l is bit 4h + j of hmask[l].
            let (hmask, qs): (&[u8], &[u8]) = if ty == GgmlType::Q3_K {
                (&b[0..32], &b[32..96])
            } else {
                (&[], &b[16..80])
            };
            for h in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        let lo = (qs[32 * h + l] >> (2 * j)) & 3;
                        let hi = hmask.get(l).map_or(0, |m| (m >> (4 * h + j)) & 1);
                        out.push(lo | (hi << 2));
                    }
                }
            }
        }
        _ => unreachable!("block_codes is called for kept types only"),
    }
}

/// Repacks `rows` rows of `cols` values of type `ty` (`bytes`: the tensor's blocks, row-major).
/// Errors for a type without a kept format or a byte count that does not match.
pub fn repack(
    what: &str,
    ty: GgmlType,
    bytes: &[u8],
    rows: usize,
    cols: usize,
) -> Result<QuantHost> {
    let Some(format) = kept_format(ty) else {
        bail!("{what}: ggml type {} is not kept quantized", ty.name());
    };
    let (per, bsize) = ty.block().expect("block types have a block size");
    if !cols.is_multiple_of(per) || bytes.len() != rows * cols / per * bsize {
        bail!(
            "{what}: {} bytes do not hold {rows} rows of {cols} {} values",
            bytes.len(),
            ty.name()
        );
    }
    let n = rows * cols;
    let mut all = Vec::with_capacity(n);
    let mut scales = Vec::with_capacity(format.scale_bytes(n));
    let mut mins = Vec::with_capacity(format.min_bytes(n));
    for b in bytes.chunks_exact(bsize) {
        block_codes(ty, b, &mut all);
        match ty {
            GgmlType::Q4_K | GgmlType::Q5_K => scales.extend_from_slice(&b[..16]),
            GgmlType::Q6_K => scales.extend_from_slice(&b[192..210]),
            GgmlType::Q2_K => {
                scales.extend_from_slice(&b[0..16]);
                scales.extend_from_slice(&b[80..84]);
            }
            GgmlType::Q3_K => scales.extend_from_slice(&b[96..110]),
            _ => {
                scales.extend_from_slice(&b[..2]);
                if format.separate_mins() {
                    mins.extend_from_slice(&b[2..4]);
                }
            }
        }
    }
    QuantHost::new(
        what,
        format,
        [1, rows, cols],
        pack_codes(format, &all),
        scales,
        mins,
    )
}

/// Codes in column order (one per byte) packed into the device planes of `format`.
fn pack_codes(format: QuantFormat, all: &[u8]) -> Vec<u8> {
    let (bits, lb) = (format.code_bits(), format.low_bits());
    if bits == 8 {
        return all.to_vec();
    }
    // `width`-bit fields of the codes shifted right by `shift`, packed from the least
    // significant bit, `8 / width` codes per byte.
    let plane = |width: usize, shift: usize| -> Vec<u8> {
        let mask = (1u8 << width) - 1;
        all.chunks_exact(8 / width)
            .map(|p| {
                p.iter().enumerate().fold(0u8, |acc, (i, &c)| {
                    acc | (((c >> shift) & mask) << (i * width))
                })
            })
            .collect()
    };
    let mut out = plane(lb, 0);
    if bits > lb {
        out.extend(plane(bits - lb, lb));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::dequantize;

    #[test]
    fn repacked_blocks_decode_like_ggml() {
        let mut seed = 7u32;
        let mut next = || {
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (seed >> 24) as u8
        };
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
        ] {
            let (per, bsize) = ty.block().unwrap();
            let (rows, cols) = (3, 2 * per);
            let mut bytes = Vec::new();
            for _ in 0..rows * cols / per {
                // f16 scale and min in [2^-4, 2^-3): exponent byte 0x2c/0x2d.
                let mut b: Vec<u8> = (0..bsize).map(|_| next()).collect();
                match ty {
                    GgmlType::Q6_K => b[209] = 0x2c,
                    GgmlType::Q3_K => b[109] = 0x2c,
                    GgmlType::Q2_K => (b[81], b[83]) = (0x2c, 0x2d),
                    _ => b[1] = 0x2c,
                }
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    b[3] = 0xad; // negative min
                }
                if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                    b[3] = 0x2d; // dmin
                }
                bytes.extend(b);
            }
            let want = dequantize(ty, &bytes, rows * cols).unwrap();
            let q = repack("t", ty, &bytes, rows, cols).unwrap();
            assert_eq!(
                q.bytes() as usize,
                bytes.len(),
                "{} keeps its bytes",
                ty.name()
            );
            assert_eq!(q.dequantize(), want, "{}", ty.name());
        }
        assert!(repack("t", GgmlType::F16, &[0; 512], 1, 256).is_err());
        assert!(repack("t", GgmlType::Q4_K, &[0; 144], 1, 128).is_err());
        assert!(repack("t", GgmlType::Q8_0, &[0; 33], 1, 32).is_err());
    }
}
