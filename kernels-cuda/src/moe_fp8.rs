//! Routed low-bit experts through FP8 tensor cores (`Backend::moe_experts_fp8`, issue [11]'s
//! opt-in prefill path, `--moe-fp8`): the step's chosen MXFP4 / INT4 experts are converted
//! into e4m3 codes with one f32 scale per 32-value K block inside the float workspace of the
//! decode path (1.125 bytes a value where the decode writes 2), the A rows are rounded to e4m3
//! per 32-value block (scale = amax / 448), and `moe_fp8_mma_*` (kernels/moe_fp8.cu, `mma.sync
//! m16n8k32 e4m3`, sm_89+) runs the grouped GEMMs with moe_mma's tiles and epilogues; the
//! `moe` family's sort and combine do the rest. Only the activation rounding (≈ 3 % per value,
//! relative) differs from the decode path: the weight conversion is exact.
//!
//! [`e4m3`] holds the host encoding the GPU test's reference emulates.

use crate::mla_moe::{act_code, check_expert_biases, check_routing};
use crate::moe_quant::direct_kind;
use crate::{dtype_suffix, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::{DType, ExpertOptions, QuantFormat, QuantTensor};

/// The smallest compute capability (×10) with e4m3 `mma.sync` (Ada, sm_89).
pub const FP8_MIN_ARCH: u32 = 89;

/// Rows of the FP8 GEMM's tiles (`F8_BM` in kernels/moe_fp8.cu).
const FP8_TILE_ROWS: u32 = 64;

/// FP8 E4M3 (OCP FP8 "e4m3fn": bias 7, no infinities, ±448 largest, 0x7F / 0xFF NaN) on the
/// host, as `cvt.rn.satfinite.e4m3x2.f32` computes it: round to nearest even, finite values
/// beyond ±448 saturate. Used by the reference of the GPU conformance test.
pub mod e4m3 {
    /// The largest finite e4m3 value.
    pub const MAX: f32 = 448.0;

    /// `x` → e4m3 byte (round to nearest, ties to even; |x| > 448 → ±448; NaN → 0x7F).
    pub fn encode(x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs();
        if a.is_nan() {
            return 0x7F;
        }
        if a >= MAX {
            return sign | 0x7E;
        }
        // Below 2^-6 the values are multiples of 2^-9 (subnormals); the scaling is exact.
        if a < 2f32.powi(-6) {
            let q = (a * 512.0).round_ties_even() as u8; // 0..=8 (8 is 2^-6, exponent field 1)
            return sign | q;
        }
        let e = ((a.to_bits() >> 23) as i32) - 127; // -6..=8
        let m = a / 2f32.powi(e); // [1, 2), exact
        let q = ((m - 1.0) * 8.0).round_ties_even() as u32; // 0..=8 (8 carries)
        let bits = (((e + 7) as u32) << 3) + q;
        if bits > 0x7E {
            return sign | 0x7E;
        }
        sign | bits as u8
    }

    /// e4m3 byte → f32 (exact).
    pub fn decode(b: u8) -> f32 {
        let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((b >> 3) & 15) as i32;
        let m = (b & 7) as f32;
        if e == 15 && b & 7 == 7 {
            return f32::NAN;
        }
        if e == 0 {
            sign * m * 2f32.powi(-9)
        } else {
            sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
        }
    }

    /// One 32-value activation block as the GPU rounds it: scale = amax / 448 and codes
    /// e4m3(x · (448 / amax)) (each product rounded once; all zero for amax = 0). Returns the
    /// decoded values (the codes' values) and the scale: x ≈ value · scale.
    pub fn quantize_block(x: &[f32]) -> (Vec<f32>, f32) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = if amax > 0.0 { MAX / amax } else { 0.0 };
        let vals = x.iter().map(|&v| decode(encode(v * inv))).collect();
        (vals, amax / MAX)
    }

    /// An FP4 E2M1 code (bit 3 sign) → the e4m3 byte of the same value (kernels/moe_fp8.cu
    /// `f8_from_e2m1`).
    pub fn from_e2m1(c: u8) -> u8 {
        let (e, m) = ((c >> 1) & 3, c & 1);
        let mag = if e == 0 {
            if m == 1 {
                0x30
            } else {
                0
            }
        } else {
            ((e + 6) << 3) | (m << 2)
        };
        mag | ((c & 8) << 4)
    }

    /// An INT4 code (u4 − 8) → the e4m3 byte of its value −8..7 (`f8_from_int4`).
    pub fn from_int4(c: u8) -> u8 {
        let v = (c & 15) as i32 - 8;
        let a = v.unsigned_abs();
        if a == 0 {
            return 0;
        }
        let p = 31 - a.leading_zeros();
        let bits = (((p + 7) << 3) | ((a << (3 - p)) & 7)) as u8;
        bits | if v < 0 { 0x80 } else { 0 }
    }
}

impl CudaBackend {
    /// Whether the FP8 expert GEMM can run `format` here: sm_89+, MXFP4 or INT4 with groups
    /// of a multiple of 32 (the direct kernels' formats), not in batch-invariant mode.
    pub(crate) fn moe_fp8_available_impl(&self, format: QuantFormat) -> bool {
        self.info.arch >= FP8_MIN_ARCH && !self.invariant() && direct_kind(&format).is_some()
    }

    /// `Backend::moe_experts_fp8`: `x` `[N, D]`, `slot_ids` `[N, k]` u32 (workspace slots),
    /// `chosen` `[M]` u32 (the experts in slot order), biases of `opts` in slot order;
    /// `Ok(None)` where this path does not apply (device, format, shape, alignment, a
    /// workspace too small for the e4m3 codes and scales).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_experts_fp8_impl(
        &self,
        x: &CudaTensor,
        slot_ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &QuantTensor<CudaTensor>,
        down: &QuantTensor<CudaTensor>,
        chosen: &CudaTensor,
        opts: &ExpertOptions<CudaTensor>,
        (gu_ws, dn_ws): (&CudaTensor, &CudaTensor),
    ) -> Result<Option<CudaTensor>> {
        const OP: &str = "moe_experts_fp8";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (f, d) = crate::moe_quant::quant_expert_dims(OP, x, gate_up, down)?;
        let f2 = 2 * f;
        let n = x.shape[0];
        check_routing(OP, n, slot_ids, weights)?;
        if chosen.dtype != DType::U32 || chosen.shape.len() != 1 {
            bail!(
                "{OP}: chosen must be u32 [M], got {} {:?}",
                chosen.dtype,
                chosen.shape
            );
        }
        let m = chosen.shape[0];
        let slots = gu_ws.shape.first().copied().unwrap_or(0);
        check_expert_biases(OP, x, (slots, f, d), opts.gate_up_bias, opts.down_bias)?;
        // e4m3 codes then f32 block scales per projection, inside its workspace tensor.
        let fits = |ws: &CudaTensor, values: usize| values + values / 8 <= ws.num_bytes();
        let usable = self.moe_fp8_available_impl(gate_up.format)
            && self.moe_fp8_available_impl(down.format)
            && d.is_multiple_of(32)
            && f.is_multiple_of(32)
            && m <= slots
            && fits(gu_ws, slots * f2 * d)
            && fits(dn_ws, slots * d * f)
            && [&gate_up.codes, &down.codes, x, gu_ws, dn_ws]
                .iter()
                .all(|t| t.device_ptr().is_multiple_of(16));
        if !usable {
            // The caller decodes into bf16 instead; say so once, since `--moe-fp8` was asked.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "warning: --moe-fp8: the FP8 expert GEMM does not take these experts \
                     (D {d}, F {f}: multiples of 32 needed; {m} experts for {slots} workspace \
                     slots; 16-byte aligned buffers); they are decoded to bf16 instead"
                )
            });
            return Ok(None);
        }
        let k = slot_ids.shape[1];
        let (out, done) = self.experts_output(x, (n, d), (k, slots, f))?;
        if done || m == 0 {
            if !done {
                self.memset0(&out)?;
            }
            return Ok(Some(out));
        }
        // The chosen experts, converted: codes at the workspace start, scales after them.
        let mut wq = [(0u64, 0u64); 2];
        for (i, (q, ws, rows, cols)) in [(gate_up, gu_ws, f2, d), (down, dn_ws, d, f)]
            .into_iter()
            .enumerate()
        {
            let per_item = rows * cols;
            let codes = ws.device_ptr();
            let scales = codes + (slots * per_item) as u64;
            let [_, scale, _, group] = q.format.kernel_params();
            let kind = u32::from(direct_kind(&q.format) == Some("int4"));
            let blocks = (m * per_item / 32).div_ceil(256).min(65535 * 8);
            let fun = self.func("moe_fp8", sfx, "moe_fp8_weights")?;
            self.launch(
                OP,
                &fun,
                (to_u32(OP, "blocks", blocks)?, 1, 1),
                (256, 1, 1),
                0,
                kparams![
                    q.codes.device_ptr(),
                    q.scales.device_ptr(),
                    chosen.device_ptr(),
                    codes,
                    scales,
                    m as u32,
                    per_item as u64,
                    kind,
                    scale,
                    group
                ],
            )?;
            wq[i] = (codes, scales);
        }
        let (act, alpha, limit) = act_code(opts.act);
        let p = n * k;
        let sp = self.sort_pairs(OP, sfx, slot_ids, (p, slots), FP8_TILE_ROWS)?;
        let maxt = sp.max_tiles;
        let h = self.alloc(vec![p, f], x.dtype)?;
        let y2 = self.alloc(vec![p, d], x.dtype)?;
        let bias_ptr = |b: Option<&CudaTensor>| b.map_or(0u64, |t| t.device_ptr());
        // (A rows, A row count, weights, output, gather k, outputs, reduction, weight rows,
        // tag, bias)
        let projections = [
            (
                x,
                n,
                wq[0],
                &h,
                k as u32,
                f,
                d,
                f2,
                "gu",
                bias_ptr(opts.gate_up_bias),
            ),
            (
                &h,
                p,
                wq[1],
                &y2,
                0u32,
                d,
                f,
                d,
                "dn",
                bias_ptr(opts.down_bias),
            ),
        ];
        for (a, arows, (wc, wsc), o, gather, nout, kdim, wrows, tag, bias) in projections {
            let (aq, asc) = self.fp8_rows(OP, sfx, a, arows, kdim)?;
            let fun = self.func("moe_fp8", sfx, &format!("moe_fp8_mma_{sfx}_{tag}"))?;
            let cols = if tag == "gu" { 64 } else { 128 };
            self.launch(
                OP,
                &fun,
                (to_u32(OP, "grid.x", nout.div_ceil(cols))?, maxt, 1),
                (256, 1, 1),
                0,
                kparams![
                    aq.device_ptr(),
                    asc.device_ptr(),
                    wc,
                    wsc,
                    o.device_ptr(),
                    sp.offsets.device_ptr(),
                    sp.sorted.device_ptr(),
                    sp.tiles.device_ptr(),
                    sp.ntiles.device_ptr(),
                    gather,
                    to_u32(OP, "output width", nout)?,
                    to_u32(OP, "reduction width", kdim)?,
                    to_u32(OP, "weight rows", wrows)?,
                    limit,
                    bias,
                    act,
                    alpha
                ],
            )?;
        }
        self.combine_pairs(OP, sfx, &y2, &sp, weights, &out, (n, k, d))?;
        Ok(Some(out))
    }

    /// `a` `[rows, kdim]` (kdim % 32 = 0) rounded to e4m3 per 32-value block: codes
    /// `[rows, kdim]` bytes and f32 scales `[rows, kdim / 32]`.
    fn fp8_rows(
        &self,
        op: &str,
        sfx: &'static str,
        a: &CudaTensor,
        rows: usize,
        kdim: usize,
    ) -> Result<(CudaTensor, CudaTensor)> {
        let nblocks = rows * kdim / 32;
        let q = self.alloc(vec![nblocks * 8], DType::U32)?;
        let s = self.scratch_f32(nblocks)?;
        let fun = self.func("moe_fp8", sfx, &format!("moe_fp8_act_{sfx}"))?;
        self.launch(
            op,
            &fun,
            (
                to_u32(op, "blocks", nblocks.div_ceil(256).min(65535 * 8))?,
                1,
                1,
            ),
            (256, 1, 1),
            0,
            kparams![
                a.device_ptr(),
                q.device_ptr(),
                s.device_ptr(),
                nblocks as u64
            ],
        )?;
        Ok((q, s))
    }
}

#[cfg(test)]
mod tests {
    use super::e4m3;

    /// Every finite e4m3 byte decodes to a value that encodes back to the same byte, and the
    /// values are those of the OCP FP8 spec at the edges.
    #[test]
    fn e4m3_round_trips_and_edges() {
        for b in 0u8..=255 {
            if b & 0x7F == 0x7F {
                assert!(e4m3::decode(b).is_nan());
                continue;
            }
            let v = e4m3::decode(b);
            let back = e4m3::encode(v);
            // -0 encodes as 0x80, +0 as 0.
            assert_eq!(back, b, "byte {b:#04x} value {v}");
        }
        assert_eq!(e4m3::decode(0x7E), 448.0);
        assert_eq!(e4m3::decode(0x01), 2f32.powi(-9));
        assert_eq!(e4m3::decode(0x08), 2f32.powi(-6));
        assert_eq!(e4m3::decode(0x38), 1.0);
    }

    /// Round to nearest even between neighbours, saturation past 448.
    #[test]
    fn e4m3_rounding() {
        // 1.0 and 1.125 are neighbours: 1.0625 ties to even (1.0), just above goes up.
        assert_eq!(e4m3::decode(e4m3::encode(1.0625)), 1.0);
        assert_eq!(e4m3::decode(e4m3::encode(1.0626)), 1.125);
        // 1.125 (mantissa 1) and 1.25 (mantissa 2): the tie goes to 1.25.
        assert_eq!(e4m3::decode(e4m3::encode(1.1875)), 1.25);
        // Carry into the exponent: 1.9375 is the tie between 1.875 and 2.0 → 2.0.
        assert_eq!(e4m3::decode(e4m3::encode(1.9375)), 2.0);
        // Subnormal ties: 1.5 · 2^-9 → 2 · 2^-9; 0.5 · 2^-9 → 0.
        assert_eq!(e4m3::encode(1.5 * 2f32.powi(-9)), 2);
        assert_eq!(e4m3::encode(0.5 * 2f32.powi(-9)), 0);
        assert_eq!(e4m3::encode(1000.0), 0x7E);
        assert_eq!(e4m3::encode(-1000.0), 0xFE);
        assert_eq!(e4m3::encode(-3.0), 0xC4);
        // Every value within 1/16 relative of its rounding (normal range).
        let mut x = 0.02f32;
        while x < 448.0 {
            let r = e4m3::decode(e4m3::encode(x));
            assert!((r - x).abs() <= x / 16.0 + 1e-12, "{x} → {r}");
            x *= 1.013;
        }
    }

    /// The weight conversion is exact: each FP4 / INT4 code's e4m3 byte has the code's value.
    #[test]
    fn weight_codes_convert_exactly() {
        let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for c in 0u8..16 {
            let want = if c & 8 != 0 {
                -e2m1[(c & 7) as usize]
            } else {
                e2m1[c as usize]
            };
            assert_eq!(e4m3::decode(e4m3::from_e2m1(c)), want, "e2m1 {c}");
            assert_eq!(e4m3::decode(e4m3::from_int4(c)), c as f32 - 8.0, "int4 {c}");
        }
    }

    /// Block quantisation: the amax value maps to ±448 exactly, the scale is amax / 448, every
    /// value is recovered within e4m3's half-ulp (1/16 relative) plus the subnormal step.
    #[test]
    fn activation_blocks() {
        let x: Vec<f32> = (0..32)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.173)
            .collect();
        let (vals, s) = e4m3::quantize_block(&x);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(s, amax / 448.0);
        for (v, &xi) in vals.iter().zip(&x) {
            let back = v * s;
            assert!(
                (back - xi).abs() <= xi.abs() / 16.0 + 2f32.powi(-9) * s + 1e-7,
                "{xi} → {back}"
            );
            if xi.abs() == amax {
                assert_eq!(v.abs(), 448.0);
            }
        }
        let (zeros, s0) = e4m3::quantize_block(&[0.0; 32]);
        assert_eq!(s0, 0.0);
        assert!(zeros.iter().all(|&v| v == 0.0));
    }
}
