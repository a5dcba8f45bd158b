//! GGUF block quants kept quantized: ggml's Q4_0, Q4_1 and Q8_0 blocks repacked, byte for byte,
//! into the device layout of [`dayone_backend::quant`] (codes, then scales, then mins).
//!
//! A ggml block of 32 values holds its f16 scale `d` (and Q4_1's min `m`) before the codes; a
//! Q4 block's byte `j` holds value `j` in its low nibble and value `16 + j` in its high nibble
//! (ggml `block_q4_0`), which becomes value `2j` low / `2j + 1` high here. Other types (the
//! K-quants, Q5) are decoded to floats at load by [`super::dequantize`].

use super::gguf_file::GgmlType;
use anyhow::{bail, Result};
use dayone_backend::{QuantFormat, QuantHost};

/// The format a ggml type is kept in on the device, `None` when it is decoded at load.
pub fn kept_format(ty: GgmlType) -> Option<QuantFormat> {
    match ty {
        GgmlType::Q4_0 => Some(QuantFormat::Q4_0),
        GgmlType::Q4_1 => Some(QuantFormat::Q4_1),
        GgmlType::Q8_0 => Some(QuantFormat::Q8_0),
        _ => None,
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
    let blocks = rows * cols / per;
    let code_bytes = if ty == GgmlType::Q8_0 { 32 } else { 16 };
    let mut codes = Vec::with_capacity(blocks * code_bytes);
    let mut scales = Vec::with_capacity(blocks * 2);
    let mut mins = Vec::new();
    for b in bytes.chunks_exact(bsize) {
        scales.extend_from_slice(&b[..2]);
        let qs = match ty {
            GgmlType::Q4_1 => {
                mins.extend_from_slice(&b[2..4]);
                &b[4..20]
            }
            GgmlType::Q8_0 => {
                codes.extend_from_slice(&b[2..34]);
                continue;
            }
            _ => &b[2..18],
        };
        let nib = |v: usize| {
            if v < 16 {
                qs[v] & 15
            } else {
                qs[v - 16] >> 4
            }
        };
        codes.extend((0..16).map(|j| nib(2 * j) | (nib(2 * j + 1) << 4)));
    }
    QuantHost::new(what, format, [1, rows, cols], codes, scales, mins)
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
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let (per, bsize) = ty.block().unwrap();
            let (rows, cols) = (3, 2 * per);
            let mut bytes = Vec::new();
            for _ in 0..rows * cols / per {
                // f16 scale and min in [2^-4, 2^-3): exponent byte 0x2c/0x2d.
                let mut b: Vec<u8> = (0..bsize).map(|_| next()).collect();
                b[1] = 0x2c;
                if ty == GgmlType::Q4_1 {
                    b[3] = 0xad; // negative min
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
        assert!(repack("t", GgmlType::Q4_K, &[0; 144], 1, 256).is_err());
        assert!(repack("t", GgmlType::Q8_0, &[0; 33], 1, 32).is_err());
    }
}
