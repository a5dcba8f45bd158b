//! Block-quantized weights kept in their low-bit form on the device.
//!
//! Every format here stores, per row of a `[rows, cols]` weight, `cols` codes of 2 to 8 bits
//! and one scale (and, for Q4_1, Q5_1, Q2_K, Q4_K, Q5_K, one min) per group of `group`
//! consecutive columns: `w[r, c] = value(code[r, c]) · scale[r, c / group] (+ min[r, c / group])`.
//!
//! | format | codes | value(code) | scale | min | source |
//! |---|---|---|---|---|---|
//! | MXFP4 | 4-bit | FP4 E2M1 | E8M0 `2^(s−127)` | – | OCP MX spec v1.0; gpt-oss, compressed-tensors `mxfp4-pack-quantized` |
//! | INT4 | 4-bit | `code − 8` | bf16 or f16 | – | compressed-tensors `pack-quantized` (symmetric) |
//! | Q4_0 | 4-bit | `code − 8` | f16 | – | ggml `block_q4_0` |
//! | Q4_1 | 4-bit | `code` | f16 | f16 | ggml `block_q4_1` |
//! | Q8_0 | 8-bit | `code as i8` | f16 | – | ggml `block_q8_0` |
//! | Q5_0 | 5-bit | `code − 16` | f16 | – | ggml `block_q5_0` |
//! | Q5_1 | 5-bit | `code` | f16 | f16 | ggml `block_q5_1` |
//! | Q4_K | 4-bit | `code` | `d·sc` (f16 `d`, 6-bit `sc`) | `−dmin·m` (6-bit `m`) | ggml `block_q4_K` |
//! | Q5_K | 5-bit | `code` | as Q4_K | as Q4_K | ggml `block_q5_K` |
//! | Q6_K | 6-bit | `code − 32` | `d·sc` (f16 `d`, i8 `sc` per 16) | – | ggml `block_q6_K` |
//! | Q2_K | 2-bit | `code` | `d·sc` (4-bit `sc` per 16) | `−dmin·m` (4-bit `m`) | ggml `block_q2_K` |
//! | Q3_K | 3-bit | `code − 4` | `d·(sc − 32)` (6-bit `sc` per 16) | – | ggml `block_q3_K` |
//!
//! Device layout ([`QuantHost`], [`QuantTensor`]): the codes of all rows row-major, two 4-bit
//! codes per byte with the **low nibble the even column** (as gpt-oss and compressed-tensors
//! store them; GGUF's Q4 blocks, which put column `j` and `j + 16` in one byte, are repacked at
//! load, byte count unchanged); scales row-major `[rows, cols / group]` in their stored type;
//! mins likewise. Each byte array travels as a `u32` tensor (little-endian, zero-padded to a
//! multiple of 4 bytes), so the resident bytes are the checkpoint's low-bit bytes.
//!
//! Codes of other widths are two planes in the one code array, each packed from the least
//! significant bit: first the low bits of every value ([`QuantFormat::low_bits`]: 4 for Q5_*
//! and Q6_K, whose plane is the 4-bit layout above; 2 for Q2_K and Q3_K), then the high bits
//! (`bits − low` of them: 1 for Q5_* and Q3_K, 2 for Q6_K). The K-quants' two-level scales stay
//! as ggml stores them: per 256 values (a super-block, row-major) one record
//! ([`ScaleType::K4`]: f16 `d`, f16 `dmin`, 12 bytes of 6-bit sub-block scales and mins, as
//! `block_q4_K`; [`ScaleType::K6`]: 16 i8 sub-block scales then f16 `d`, as `block_q6_K`;
//! [`ScaleType::K2`], [`ScaleType::K3`] likewise for Q2_K and Q3_K) in the scale array,
//! so every ggml format kept here is resident in exactly its file bytes. A group's scale is
//! `d · sc` and its min `−(dmin · m)`, both exact in f32 (an 11-bit f16 significand times a
//! 6- or 8-bit integer), so `value · scale + min` rounds once, like ggml's
//! `dequantize_row_q4_K` (`d1 · q − m1`).

use crate::{Backend, DType, HostTensor};
use anyhow::{bail, ensure, Result};

/// How a 4- or 8-bit code maps to a number before scaling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codes {
    /// FP4 E2M1: bit 3 sign, magnitudes `[0, 0.5, 1, 1.5, 2, 3, 4, 6]` (OCP MX §5.3.3).
    Fp4E2M1,
    /// Unsigned 4-bit, offset by 8: `code − 8` in `[−8, 7]`.
    U4Offset8,
    /// Unsigned 4-bit: `code` in `[0, 15]` (with a min).
    U4,
    /// Unsigned 5-bit, offset by 16: `code − 16` in `[−16, 15]` (Q5_0).
    U5Offset16,
    /// Unsigned 5-bit: `code` in `[0, 31]` (with a min: Q5_1, Q5_K).
    U5,
    /// Unsigned 6-bit, offset by 32: `code − 32` in `[−32, 31]` (Q6_K).
    U6Offset32,
    /// Unsigned 2-bit: `code` in `[0, 3]` (with a min: Q2_K).
    U2,
    /// Unsigned 3-bit, offset by 4: `code − 4` in `[−4, 3]` (Q3_K: ggml subtracts 4 where the
    /// `hmask` bit, the code's bit 2, is clear).
    U3Offset4,
    /// Signed 8-bit two's complement.
    I8,
}

/// The stored type of a group's scale (and min).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleType {
    /// One byte, `2^(s − 127)`; 255 is NaN (refused at load).
    E8M0,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// ggml Q4_K / Q5_K super-block record, 16 bytes per 256 values (8 groups of 32): f16 `d`,
    /// f16 `dmin`, then 12 bytes holding eight 6-bit scales `sc` and mins `m` (ggml
    /// `get_scale_min_k4`). Group `j`'s scale is `d · sc_j`, its min `−(dmin · m_j)`.
    K4,
    /// ggml Q6_K super-block record, 18 bytes per 256 values (16 groups of 16): 16 i8 scales
    /// `sc`, then f16 `d`. Group `j`'s scale is `d · sc_j`.
    K6,
    /// ggml Q2_K super-block record, 20 bytes per 256 values (16 groups of 16): 16 bytes of
    /// (4-bit scale `sc` low, 4-bit min `m` high), f16 `d`, f16 `dmin` (ggml stores the codes
    /// between the bytes and `d`). Group `j`'s scale is `d · sc_j`, its min `−(dmin · m_j)`.
    K2,
    /// ggml Q3_K super-block record, 14 bytes per 256 values (16 groups of 16): 12 bytes of
    /// sixteen 6-bit scales, f16 `d`. Group `j`'s scale is `d · (sc_j − 32)`.
    K3,
}

impl ScaleType {
    /// Bytes per scale (per group); for the super-block records [`ScaleType::K4`] and
    /// [`ScaleType::K6`], bytes per record of [`QK_K`] values.
    pub fn size(self) -> usize {
        match self {
            ScaleType::E8M0 => 1,
            ScaleType::F16 | ScaleType::BF16 => 2,
            ScaleType::K4 => 16,
            ScaleType::K6 => 18,
            ScaleType::K2 => 20,
            ScaleType::K3 => 14,
        }
    }

    /// Whether scales are super-block records of [`QK_K`] values rather than one per group.
    pub fn is_super_block(self) -> bool {
        matches!(
            self,
            ScaleType::K4 | ScaleType::K6 | ScaleType::K2 | ScaleType::K3
        )
    }

    /// The scale of group `i` of `bytes` (`i` counted in groups, not bytes): for the
    /// super-block records, `d · sc` of sub-block `i % (256 / group)` of record
    /// `i / (256 / group)`.
    pub fn read(self, bytes: &[u8], i: usize) -> f32 {
        let f16_at = |o: usize| half::f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32();
        match self {
            ScaleType::E8M0 => e8m0(bytes[i]),
            ScaleType::F16 => f16_at(2 * i),
            ScaleType::BF16 => half::bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
            ScaleType::K4 => {
                let r = &bytes[16 * (i / 8)..16 * (i / 8) + 16];
                f16_at(16 * (i / 8)) * scale_min_k4(i % 8, &r[4..]).0 as f32
            }
            ScaleType::K6 => {
                let o = 18 * (i / 16);
                f16_at(o + 16) * bytes[o + i % 16] as i8 as f32
            }
            ScaleType::K2 => {
                let o = 20 * (i / 16);
                f16_at(o + 16) * (bytes[o + i % 16] & 15) as f32
            }
            ScaleType::K3 => {
                let o = 14 * (i / 16);
                f16_at(o + 12) * scale_k3(i % 16, &bytes[o..o + 12]) as f32
            }
        }
    }
}

/// Values per ggml K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// The signed scale `sc − 32` of sub-block `j` (`0..16`) from the 12 packed bytes of a Q3_K
/// record: low 4 bits from byte `j` (`j < 8`) or the high nibble of byte `j − 8`, high 2 bits
/// from bits `2·(j / 4)` of byte `8 + j % 4` (ggml `dequantize_row_q3_K`'s `kmask` unpacking).
pub fn scale_k3(j: usize, s: &[u8]) -> i32 {
    let low = if j < 8 { s[j] & 15 } else { s[j - 8] >> 4 };
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i32 - 32
}

/// The 6-bit scale and min of sub-block `j` (`0..8`) from the 12 packed bytes of a Q4_K / Q5_K
/// record (ggml `get_scale_min_k4`).
pub fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// `2^(s − 127)` exactly in f32 (`s = 0` is the subnormal `2^−127`); `s = 255` gives NaN.
pub fn e8m0(s: u8) -> f32 {
    match s {
        0 => f32::from_bits(1 << 22),
        255 => f32::NAN,
        s => f32::from_bits((s as u32) << 23),
    }
}

/// FP4 E2M1 magnitudes by the low three bits of a code.
pub const FP4_E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// A block-quantized weight format: codes, their mapping, scale type, min, group length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantFormat {
    /// Code width and value mapping.
    pub codes: Codes,
    /// Stored type of the per-group scale (and min).
    pub scale: ScaleType,
    /// Whether each group also has an additive min (Q4_1, Q5_1: a separate min array; Q4_K,
    /// Q5_K: in the scale record).
    pub has_min: bool,
    /// Columns per scale (32 for MXFP4 and the GGUF formats, 16 for Q6_K; 32 or 128 for INT4).
    pub group: usize,
}

impl QuantFormat {
    /// MXFP4 (OCP MX): FP4 E2M1 codes, E8M0 scale per 32.
    pub const MXFP4: QuantFormat = QuantFormat {
        codes: Codes::Fp4E2M1,
        scale: ScaleType::E8M0,
        has_min: false,
        group: 32,
    };
    /// ggml Q4_0: `(code − 8) · d`, f16 `d` per 32.
    pub const Q4_0: QuantFormat = QuantFormat {
        codes: Codes::U4Offset8,
        scale: ScaleType::F16,
        has_min: false,
        group: 32,
    };
    /// ggml Q4_1: `code · d + m`, f16 `d` and `m` per 32.
    pub const Q4_1: QuantFormat = QuantFormat {
        codes: Codes::U4,
        scale: ScaleType::F16,
        has_min: true,
        group: 32,
    };
    /// ggml Q8_0: `code · d`, signed 8-bit codes, f16 `d` per 32.
    pub const Q8_0: QuantFormat = QuantFormat {
        codes: Codes::I8,
        scale: ScaleType::F16,
        has_min: false,
        group: 32,
    };

    /// ggml Q5_0: `(code − 16) · d`, f16 `d` per 32.
    pub const Q5_0: QuantFormat = QuantFormat {
        codes: Codes::U5Offset16,
        scale: ScaleType::F16,
        has_min: false,
        group: 32,
    };
    /// ggml Q5_1: `code · d + m`, f16 `d` and `m` per 32.
    pub const Q5_1: QuantFormat = QuantFormat {
        codes: Codes::U5,
        scale: ScaleType::F16,
        has_min: true,
        group: 32,
    };
    /// ggml Q4_K: `code · (d · sc) − dmin · m`, [`ScaleType::K4`] records, groups of 32.
    pub const Q4_K: QuantFormat = QuantFormat {
        codes: Codes::U4,
        scale: ScaleType::K4,
        has_min: true,
        group: 32,
    };
    /// ggml Q5_K: as Q4_K with 5-bit codes.
    pub const Q5_K: QuantFormat = QuantFormat {
        codes: Codes::U5,
        scale: ScaleType::K4,
        has_min: true,
        group: 32,
    };
    /// ggml Q2_K: `code · (d · sc) − dmin · m`, [`ScaleType::K2`] records, groups of 16.
    pub const Q2_K: QuantFormat = QuantFormat {
        codes: Codes::U2,
        scale: ScaleType::K2,
        has_min: true,
        group: 16,
    };
    /// ggml Q3_K: `(code − 4) · (d · (sc − 32))`, [`ScaleType::K3`] records, groups of 16.
    pub const Q3_K: QuantFormat = QuantFormat {
        codes: Codes::U3Offset4,
        scale: ScaleType::K3,
        has_min: false,
        group: 16,
    };
    /// ggml Q6_K: `(code − 32) · (d · sc)`, [`ScaleType::K6`] records, groups of 16.
    pub const Q6_K: QuantFormat = QuantFormat {
        codes: Codes::U6Offset32,
        scale: ScaleType::K6,
        has_min: false,
        group: 16,
    };

    /// compressed-tensors symmetric INT4 with `group` columns per scale of type `scale`.
    pub fn int4(group: usize, scale: ScaleType) -> QuantFormat {
        QuantFormat {
            codes: Codes::U4Offset8,
            scale,
            has_min: false,
            group,
        }
    }

    /// Bits per code (4, 5, 6 or 8).
    pub fn code_bits(&self) -> usize {
        match self.codes {
            Codes::I8 => 8,
            Codes::U5Offset16 | Codes::U5 => 5,
            Codes::U6Offset32 => 6,
            Codes::U2 => 2,
            Codes::U3Offset4 => 3,
            _ => 4,
        }
    }

    /// Bits of a code in the first (low) plane: 8 for 8-bit codes, 2 for 2- and 3-bit codes,
    /// else 4; the remaining `code_bits − low_bits` high bits are in the second plane.
    pub fn low_bits(&self) -> usize {
        match self.code_bits() {
            8 => 8,
            2 | 3 => 2,
            _ => 4,
        }
    }

    /// Whether the mins are an array of their own (Q4_1, Q5_1) rather than in the scale
    /// records (Q4_K, Q5_K) or absent.
    pub fn separate_mins(&self) -> bool {
        self.has_min && !self.scale.is_super_block()
    }

    /// Bytes of the codes of `n` values (both planes for 5- and 6-bit codes).
    pub fn code_bytes(&self, n: usize) -> usize {
        n * self.code_bits() / 8
    }

    /// Bytes of the scales of `n` values (a multiple of the group, and of [`QK_K`] for the
    /// super-block records).
    pub fn scale_bytes(&self, n: usize) -> usize {
        if self.scale.is_super_block() {
            n / QK_K * self.scale.size()
        } else {
            n / self.group * self.scale.size()
        }
    }

    /// Bytes of the separate mins of `n` values (0 without [`Self::separate_mins`]).
    pub fn min_bytes(&self, n: usize) -> usize {
        if self.separate_mins() {
            self.scale_bytes(n)
        } else {
            0
        }
    }

    /// Values per column-count unit: a weight's columns must be a multiple of this (the group,
    /// or [`QK_K`] for the super-block records).
    pub fn block(&self) -> usize {
        if self.scale.is_super_block() {
            QK_K
        } else {
            self.group
        }
    }

    /// A short name for logs and errors (`mxfp4`, `int4/g128`, `q4_1`, `q4_K`, …).
    pub fn name(&self) -> String {
        let ggml = [
            (Self::Q4_0, "q4_0"),
            (Self::Q4_1, "q4_1"),
            (Self::Q8_0, "q8_0"),
            (Self::Q5_0, "q5_0"),
            (Self::Q5_1, "q5_1"),
            (Self::Q4_K, "q4_K"),
            (Self::Q5_K, "q5_K"),
            (Self::Q6_K, "q6_K"),
            (Self::Q2_K, "q2_K"),
            (Self::Q3_K, "q3_K"),
        ];
        if let Some((_, n)) = ggml.iter().find(|(f, _)| f == self) {
            return (*n).into();
        }
        match self.codes {
            Codes::Fp4E2M1 => "mxfp4".into(),
            _ => format!("int4/g{}", self.group),
        }
    }

    /// The code of value `e` (counted over all items and rows) of `n` values in `codes`.
    pub fn code_at(&self, codes: &[u8], n: usize, e: usize) -> u8 {
        let (bits, lb) = (self.code_bits(), self.low_bits());
        if bits == 8 {
            return codes[e];
        }
        let bit = e * lb;
        let lo = (codes[bit / 8] >> (bit % 8)) & ((1 << lb) - 1);
        let hb = bits - lb;
        if hb == 0 {
            return lo;
        }
        let bit = e * hb;
        let hi = (codes[n * lb / 8 + bit / 8] >> (bit % 8)) & ((1 << hb) - 1);
        lo | (hi << lb)
    }

    /// The min of group `g`: from `mins` (separate mins) or the scale record (`−dmin · m`);
    /// `None` without a min.
    pub fn min_at(&self, scales: &[u8], mins: &[u8], g: usize) -> Option<f32> {
        if !self.has_min {
            return None;
        }
        Some(match self.scale {
            ScaleType::K4 => {
                let o = 16 * (g / 8);
                let dmin = half::f16::from_le_bytes([scales[o + 2], scales[o + 3]]).to_f32();
                -(dmin * scale_min_k4(g % 8, &scales[o + 4..o + 16]).1 as f32)
            }
            ScaleType::K2 => {
                let o = 20 * (g / 16);
                let dmin = half::f16::from_le_bytes([scales[o + 18], scales[o + 19]]).to_f32();
                -(dmin * (scales[o + g % 16] >> 4) as f32)
            }
            s => s.read(mins, g),
        })
    }

    /// The value before scaling of `code` (its low `code_bits` bits).
    pub fn code_value(&self, code: u8) -> f32 {
        match self.codes {
            Codes::Fp4E2M1 => {
                let m = FP4_E2M1[(code & 7) as usize];
                if code & 8 != 0 {
                    -m
                } else {
                    m
                }
            }
            Codes::U4Offset8 => (code & 15) as f32 - 8.0,
            Codes::U4 => (code & 15) as f32,
            Codes::U5Offset16 => (code & 31) as f32 - 16.0,
            Codes::U5 => (code & 31) as f32,
            Codes::U6Offset32 => (code & 63) as f32 - 32.0,
            Codes::U2 => (code & 3) as f32,
            Codes::U3Offset4 => (code & 7) as f32 - 4.0,
            Codes::I8 => code as i8 as f32,
        }
    }

    /// The four `u32` parameters the device kernels take: `[codes, scale, has_min, group]`
    /// with codes `0` FP4, `1` U4Offset8, `2` U4, `3` I8, `4` U5Offset16, `5` U5,
    /// `6` U6Offset32, `7` U2, `8` U3Offset4 and scale `0` E8M0, `1` F16, `2` BF16, `3` K4,
    /// `4` K6, `5` K2, `6` K3.
    pub fn kernel_params(&self) -> [u32; 4] {
        let c = match self.codes {
            Codes::Fp4E2M1 => 0,
            Codes::U4Offset8 => 1,
            Codes::U4 => 2,
            Codes::I8 => 3,
            Codes::U5Offset16 => 4,
            Codes::U5 => 5,
            Codes::U6Offset32 => 6,
            Codes::U2 => 7,
            Codes::U3Offset4 => 8,
        };
        let s = match self.scale {
            ScaleType::E8M0 => 0,
            ScaleType::F16 => 1,
            ScaleType::BF16 => 2,
            ScaleType::K4 => 3,
            ScaleType::K6 => 4,
            ScaleType::K2 => 5,
            ScaleType::K3 => 6,
        };
        [c, s, self.has_min as u32, self.group as u32]
    }
}

/// A quantized weight on the host: `items` stacked `[rows, cols]` matrices (experts of one layer,
/// or one matrix with `items = 1`), in the device layout of the module docs.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantHost {
    /// Format of codes and scales.
    pub format: QuantFormat,
    /// `[items, rows, cols]`.
    pub shape: [usize; 3],
    /// `items · rows · cols · bits / 8` bytes ([`QuantFormat::code_bytes`]).
    pub codes: Vec<u8>,
    /// `items · rows · cols / group` scales of `format.scale.size()` bytes, or one record per
    /// 256 values ([`QuantFormat::scale_bytes`]).
    pub scales: Vec<u8>,
    /// Mins like `scales` when [`QuantFormat::separate_mins`], else empty.
    pub mins: Vec<u8>,
}

impl QuantHost {
    /// Checks the byte counts against `shape` and `format` and refuses groups whose values
    /// would not be finite (E8M0 byte 255, an E8M0 scale that overflows the group's codes, a
    /// NaN or infinite f16/bf16 scale or min). `what` names the tensor in errors.
    pub fn new(
        what: &str,
        format: QuantFormat,
        shape: [usize; 3],
        codes: Vec<u8>,
        scales: Vec<u8>,
        mins: Vec<u8>,
    ) -> Result<Self> {
        let [items, rows, cols] = shape;
        let g = format.group;
        let block = format.block();
        ensure!(
            g > 0 && g.is_multiple_of(8) && block.is_multiple_of(g) && cols.is_multiple_of(block),
            "{what}: {} weight of {cols} columns: the column count must be a multiple of the {} length {block} (a group of {g}, itself a multiple of 8)",
            format.name(),
            if format.scale.is_super_block() { "super-block" } else { "group" }
        );
        let n = items * rows * cols;
        let want_codes = format.code_bytes(n);
        ensure!(
            codes.len() == want_codes,
            "{what}: {} codes of shape {shape:?} take {want_codes} bytes, found {}",
            format.name(),
            codes.len()
        );
        let want_scales = format.scale_bytes(n);
        ensure!(
            scales.len() == want_scales,
            "{what}: {} scales of shape {shape:?} take {want_scales} bytes, found {}",
            format.name(),
            scales.len()
        );
        let want_mins = format.min_bytes(n);
        ensure!(
            mins.len() == want_mins,
            "{what}: {} mins take {want_mins} bytes, found {}",
            format.name(),
            mins.len()
        );
        let q = Self {
            format,
            shape,
            codes,
            scales,
            mins,
        };
        if let Some((g, why)) = q.bad_group() {
            let per_item = rows * cols / format.group;
            let at = if items > 1 {
                format!(
                    "expert {}, row {}",
                    g / per_item,
                    (g % per_item) / (cols / format.group)
                )
            } else {
                format!("row {}", g / (cols / format.group))
            };
            bail!(
                "{what}: {why} at {at}, group {} (columns {}..{}): the checkpoint is corrupt",
                g % (cols / format.group),
                g % (cols / format.group) * format.group,
                (g % (cols / format.group) + 1) * format.group
            );
        }
        Ok(q)
    }

    /// The first group whose decoded values would not be finite, and why: an E8M0 scale byte
    /// 255 (NaN), an E8M0 scale so large that a code of the group overflows f32
    /// (`|value(code)| · 2^(s − 127) ≥ 2^128`), or a non-finite f16/bf16 scale or min (for
    /// the K-quant records: a non-finite `d` or `dmin`).
    fn bad_group(&self) -> Option<(usize, String)> {
        let f = self.format;
        let n = self.shape.iter().product::<usize>();
        let groups = n / f.group;
        for g in 0..groups {
            match f.scale {
                ScaleType::E8M0 => {
                    let s = self.scales[g];
                    if s == 255 {
                        return Some((g, "E8M0 scale byte 255 (NaN)".into()));
                    }
                    if s >= 253 {
                        let lim = 2f32.powi(255 - s as i32);
                        let big = (g * f.group..(g + 1) * f.group)
                            .any(|c| f.code_value(f.code_at(&self.codes, n, c)).abs() >= lim);
                        if big {
                            return Some((
                                g,
                                format!("E8M0 scale byte {s} overflows f32 for the group's codes"),
                            ));
                        }
                    }
                }
                _ => {
                    let s = f.scale.read(&self.scales, g);
                    if !s.is_finite() {
                        return Some((g, format!("scale {s} is not finite")));
                    }
                    if let Some(m) = f.min_at(&self.scales, &self.mins, g) {
                        if !m.is_finite() {
                            return Some((g, format!("min {m} is not finite")));
                        }
                    }
                }
            }
        }
        None
    }
    /// Resident bytes (codes + scales + mins).
    pub fn bytes(&self) -> u64 {
        (self.codes.len() + self.scales.len() + self.mins.len()) as u64
    }

    /// Groups in one row.
    fn row_groups(&self) -> usize {
        self.shape[2] / self.format.group
    }

    /// Row `r` (counted over all items, `0..items·rows`) decoded to f32, `cols` values:
    /// `value(code) · scale (+ min)`, the product and sum each rounded once (no fused
    /// multiply-add), as the device kernels compute it.
    pub fn dequantize_row(&self, r: usize) -> Vec<f32> {
        let f = self.format;
        let cols = self.shape[2];
        let n = self.shape.iter().product::<usize>();
        let g0 = r * self.row_groups();
        let table: Vec<f32> = (0..=255u8).map(|c| f.code_value(c)).collect();
        let mut out = Vec::with_capacity(cols);
        for g in 0..self.row_groups() {
            let s = f.scale.read(&self.scales, g0 + g);
            let m = f.min_at(&self.scales, &self.mins, g0 + g);
            for c in g * f.group..(g + 1) * f.group {
                let code = f.code_at(&self.codes, n, r * cols + c);
                let v = table[code as usize] * s;
                out.push(match m {
                    Some(m) => v + m,
                    None => v,
                });
            }
        }
        out
    }

    /// All items decoded: `[items, rows, cols]` f32 values (rows split over the host's cores:
    /// decoding a 20 B-parameter checkpoint at load is tens of billions of values).
    pub fn dequantize(&self) -> Vec<f32> {
        let [items, rows, cols] = self.shape;
        let total = items * rows;
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(total.div_ceil(64).max(1));
        let mut out = vec![0f32; total * cols];
        if cols == 0 {
            return out;
        }
        let per = total.div_ceil(threads);
        std::thread::scope(|sc| {
            for (i, chunk) in out.chunks_mut(per * cols).enumerate() {
                sc.spawn(move || {
                    for (j, row) in chunk.chunks_mut(cols).enumerate() {
                        row.copy_from_slice(&self.dequantize_row(i * per + j));
                    }
                });
            }
        });
        out
    }

    /// Items `items` decoded in that order, `[items.len(), rows, cols]` f32 (an item `≥ E`
    /// gives zeros): the reference of [`crate::Backend::dequantize_into`].
    pub fn dequantize_items(&self, items: &[u32]) -> Vec<f32> {
        let [e, rows, cols] = self.shape;
        let mut out = Vec::with_capacity(items.len() * rows * cols);
        for &i in items {
            let i = i as usize;
            if i >= e {
                out.resize(out.len() + rows * cols, 0.0);
                continue;
            }
            for r in 0..rows {
                out.extend(self.dequantize_row(i * rows + r));
            }
        }
        out
    }

    /// The decoded weight as a host tensor of `dtype` (f32, bf16 or f16), shape
    /// `[items, rows, cols]`, or `[rows, cols]` when `items == 1`.
    pub fn to_host(&self, dtype: DType) -> Result<HostTensor> {
        let [items, rows, cols] = self.shape;
        let shape = if items == 1 {
            vec![rows, cols]
        } else {
            vec![items, rows, cols]
        };
        HostTensor::from_f32_as(shape, &self.dequantize(), dtype)
    }

    /// Stacks weights of one format and equal `[rows, cols]` along dimension 0 (items), or,
    /// with `as_rows`, concatenates their rows into one item (`[gate; up]`).
    pub fn concat(parts: &[QuantHost], as_rows: bool) -> Result<QuantHost> {
        let Some(first) = parts.first() else {
            bail!("no quantized weights to concatenate");
        };
        let mut rows = 0;
        let mut items = 0;
        for p in parts {
            ensure!(
                p.format == first.format && p.shape[2] == first.shape[2],
                "cannot join a {} weight {:?} with a {} weight {:?}",
                p.format.name(),
                p.shape,
                first.format.name(),
                first.shape
            );
            ensure!(
                as_rows || p.shape[1] == first.shape[1],
                "cannot stack quantized weights of {} and {} rows",
                p.shape[1],
                first.shape[1]
            );
            rows += p.shape[0] * p.shape[1];
            items += p.shape[0];
        }
        let shape = if as_rows {
            [1, rows, first.shape[2]]
        } else {
            [items, first.shape[1], first.shape[2]]
        };
        let cat = |f: fn(&QuantHost) -> &Vec<u8>| parts.iter().flat_map(|p| f(p).clone()).collect();
        // Two-plane codes: the low planes of all parts, then their high planes.
        let f = first.format;
        let codes = if f.code_bits() != f.low_bits() {
            let low = |p: &QuantHost| p.shape.iter().product::<usize>() * f.low_bits() / 8;
            let mut c: Vec<u8> = parts
                .iter()
                .flat_map(|p| p.codes[..low(p)].to_vec())
                .collect();
            c.extend(parts.iter().flat_map(|p| p.codes[low(p)..].to_vec()));
            c
        } else {
            cat(|p| &p.codes)
        };
        QuantHost::new(
            "concatenated weight",
            first.format,
            shape,
            codes,
            cat(|p| &p.scales),
            cat(|p| &p.mins),
        )
    }
}

/// A quantized weight on a device: the byte arrays of [`QuantHost`] as `u32` tensors.
#[derive(Clone, Debug)]
pub struct QuantTensor<T> {
    /// Format of codes and scales.
    pub format: QuantFormat,
    /// `[items, rows, cols]`.
    pub shape: [usize; 3],
    /// Codes, `[ceil(bytes / 4)]` u32.
    pub codes: T,
    /// Scales, `[ceil(bytes / 4)]` u32.
    pub scales: T,
    /// Mins (Q4_1, Q5_1: [`QuantFormat::separate_mins`]), `[ceil(bytes / 4)]` u32.
    pub mins: Option<T>,
    /// Resident bytes (codes + scales + mins, before padding).
    pub bytes: u64,
}

/// Bytes as a zero-padded `[ceil(len / 4)]` u32 tensor (little-endian words).
pub fn bytes_as_words(bytes: &[u8]) -> Result<HostTensor> {
    let words = bytes.len().div_ceil(4).max(1);
    let mut data = bytes.to_vec();
    data.resize(words * 4, 0);
    HostTensor::new(vec![words], DType::U32, data)
}

impl<T: Clone> QuantTensor<T> {
    /// Uploads a host weight.
    pub fn upload<B: Backend<Tensor = T>>(b: &B, h: &QuantHost) -> Result<Self> {
        let mins = if h.format.separate_mins() {
            Some(b.upload(&bytes_as_words(&h.mins)?)?)
        } else {
            None
        };
        Ok(Self {
            format: h.format,
            shape: h.shape,
            codes: b.upload(&bytes_as_words(&h.codes)?)?,
            scales: b.upload(&bytes_as_words(&h.scales)?)?,
            mins,
            bytes: h.bytes(),
        })
    }

    /// The same device bytes seen as `shape` (equal `items · rows` and `cols`): a `[V, D]`
    /// table as `[V, 1, D]` for row lookups.
    pub fn reshaped(&self, shape: [usize; 3]) -> Result<Self> {
        ensure!(
            shape[0] * shape[1] == self.shape[0] * self.shape[1] && shape[2] == self.shape[2],
            "a quantized weight of shape {:?} cannot be seen as {shape:?}",
            self.shape
        );
        let mut q = self.clone();
        q.shape = shape;
        Ok(q)
    }

    /// The words of a tensor's bytes back on the host (for the reference path).
    pub fn download<B: Backend<Tensor = T>>(&self, b: &B) -> Result<QuantHost> {
        let bytes = |t: &T, n: usize| -> Result<Vec<u8>> {
            let mut d = b.download(t)?.data;
            d.truncate(n);
            Ok(d)
        };
        let [items, rows, cols] = self.shape;
        let n = items * rows * cols;
        let f = self.format;
        let mins = match &self.mins {
            Some(m) => bytes(m, f.min_bytes(n))?,
            None => Vec::new(),
        };
        QuantHost::new(
            "device weight",
            f,
            self.shape,
            bytes(&self.codes, f.code_bytes(n))?,
            bytes(&self.scales, f.scale_bytes(n))?,
            mins,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_edges() {
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(128), 2.0);
        assert_eq!(e8m0(126), 0.5);
        assert_eq!(e8m0(254), 2f32.powi(127));
        assert_eq!(e8m0(1), 2f32.powi(-126));
        assert_eq!(e8m0(0), 2f32.powi(-127));
        assert!(e8m0(0) > 0.0);
        assert!(e8m0(255).is_nan());
    }

    #[test]
    fn fp4_codes_and_nibble_order() {
        let f = QuantFormat::MXFP4;
        let table: Vec<f32> = (0..16).map(|c| f.code_value(c)).collect();
        assert_eq!(&table[..8], &FP4_E2M1);
        for c in 8..16 {
            assert_eq!(table[c], -FP4_E2M1[c - 8]);
        }
        assert!(table[8] == 0.0 && table[8].is_sign_negative());
        // One row of 32 columns: byte j holds column 2j (low nibble) and 2j + 1 (high).
        let mut codes = vec![0u8; 16];
        codes[0] = 0x71; // col 0 = code 1 (0.5), col 1 = code 7 (6)
        codes[15] = 0xA0; // col 30 = 0, col 31 = code 10 (−1)
        let q = QuantHost::new("t", f, [1, 1, 32], codes, vec![128], vec![]).unwrap();
        let v = q.dequantize_row(0);
        assert_eq!((v[0], v[1], v[30], v[31]), (1.0, 12.0, 0.0, -2.0));
    }

    #[test]
    fn int_formats() {
        let codes: Vec<u8> = (0..16)
            .map(|j| (j as u8) | (((15 - j) as u8) << 4))
            .collect();
        let d = half::f16::from_f32(0.25).to_le_bytes().to_vec();
        let m = half::f16::from_f32(-1.0).to_le_bytes().to_vec();
        let q40 = QuantHost::new(
            "t",
            QuantFormat::Q4_0,
            [1, 1, 32],
            codes.clone(),
            d.clone(),
            vec![],
        )
        .unwrap()
        .dequantize_row(0);
        assert_eq!((q40[0], q40[1], q40[2]), (-2.0, 1.75, -1.75));
        let q41 = QuantHost::new("t", QuantFormat::Q4_1, [1, 1, 32], codes, d.clone(), m)
            .unwrap()
            .dequantize_row(0);
        assert_eq!((q41[0], q41[1]), (-1.0, 2.75));
        let q8: Vec<u8> = (0..32).map(|i| (i as i8 - 16) as u8).collect();
        let v = QuantHost::new("t", QuantFormat::Q8_0, [1, 1, 32], q8, d, vec![])
            .unwrap()
            .dequantize_row(0);
        assert_eq!((v[0], v[31]), (-4.0, 3.75));
        let bf = half::bf16::from_f32(2.0).to_le_bytes().to_vec();
        let i4 = QuantHost::new(
            "t",
            QuantFormat::int4(32, ScaleType::BF16),
            [1, 1, 32],
            vec![0x8F; 16],
            bf,
            vec![],
        )
        .unwrap()
        .dequantize_row(0);
        assert_eq!((i4[0], i4[1]), (14.0, 0.0));
    }

    #[test]
    fn bad_bytes_are_named() {
        let e = QuantHost::new(
            "w.scales",
            QuantFormat::MXFP4,
            [1, 2, 64],
            vec![0; 64],
            vec![1, 2, 255, 4],
            vec![],
        )
        .unwrap_err();
        let s = format!("{e:#}");
        assert!(
            s.contains("w.scales") && s.contains("255") && s.contains("row 1"),
            "{s}"
        );
        let e = QuantHost::new(
            "w",
            QuantFormat::MXFP4,
            [1, 2, 64],
            vec![0; 63],
            vec![0; 4],
            vec![],
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("64 bytes"));
        let e = QuantHost::new(
            "w",
            QuantFormat::MXFP4,
            [1, 2, 48],
            vec![0; 48],
            vec![0; 3],
            vec![],
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("multiple of the group length 32"));
    }

    #[test]
    fn k_quant_records_are_checked() {
        // A Q4_K row of 256: codes 128 bytes, one 16-byte record with an infinite dmin (times the
        // 6-bit min 0: NaN).
        let mut rec = vec![0u8; 16];
        rec[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
        rec[2..4].copy_from_slice(&half::f16::INFINITY.to_le_bytes());
        let e = QuantHost::new(
            "blk.0.ffn_up",
            QuantFormat::Q4_K,
            [1, 1, 256],
            vec![0; 128],
            rec,
            vec![],
        )
        .unwrap_err();
        let s = format!("{e:#}");
        assert!(
            s.contains("blk.0.ffn_up") && s.contains("min NaN is not finite"),
            "{s}"
        );
        // Q6_K needs whole 256-value super-blocks per row.
        let e = QuantHost::new(
            "w",
            QuantFormat::Q6_K,
            [1, 2, 128],
            vec![0; 192],
            vec![0; 18],
            vec![],
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("super-block length 256"), "{e:#}");
        // Q3_K: d = 2, every sub-block scale 33 − 32 = 1 (low nibbles 1, high bits 2), codes
        // 0..8 → −4..3, so values are 2 · (code − 4).
        let mut rec = vec![0u8; 14];
        rec[..8].fill(0x11);
        rec[8..12].fill(0b1010_1010);
        rec[12..14].copy_from_slice(&half::f16::from_f32(2.0).to_le_bytes());
        let codes: Vec<u8> = (0..256).map(|e| (e % 8) as u8).collect();
        let n = 256;
        let mut packed = vec![0u8; n * 3 / 8];
        for (e, &c) in codes.iter().enumerate() {
            packed[e / 4] |= (c & 3) << (2 * (e % 4));
            packed[n / 4 + e / 8] |= (c >> 2) << (e % 8);
        }
        let q = QuantHost::new("t", QuantFormat::Q3_K, [1, 1, 256], packed, rec, vec![]).unwrap();
        let want: Vec<f32> = codes.iter().map(|&c| 2.0 * (c as f32 - 4.0)).collect();
        assert_eq!(q.dequantize_row(0), want);
    }

    #[test]
    fn concat_items_and_rows() {
        let codes: Vec<u8> = (0..48).map(|i| i as u8).collect();
        let q = QuantHost::new(
            "t",
            QuantFormat::MXFP4,
            [3, 1, 32],
            codes,
            vec![120, 127, 130],
            vec![],
        )
        .unwrap();
        let all = q.dequantize();
        let c = QuantHost::concat(&[q.clone(), q.clone()], false).unwrap();
        assert_eq!(c.shape, [6, 1, 32]);
        assert_eq!(&c.dequantize()[96..], &all[..]);
        let rows = QuantHost::concat(&[q.clone(), q.clone()], true).unwrap();
        assert_eq!(rows.shape, [1, 6, 32]);
    }
}
