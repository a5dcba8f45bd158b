//! Conformance of the quantized-weight ops ([`Backend::dequantize_into`],
//! [`Backend::linear_quant`]) against [`crate::quant`]'s host decode, for every format, and of
//! the low-bit routed experts ([`Backend::moe_experts_quant`], [`check_experts_quant`]) against
//! the reference experts on the decoded weights.

use crate::conformance::{compare, rand_tensor, tolerance, Rng};
use crate::quant::{QuantFormat, QuantHost, QuantTensor, ScaleType};
use crate::{reference, Backend, DType, ExpertAct, ExpertOptions, HostTensor};
use anyhow::{ensure, Result};

/// The formats checked: MXFP4, INT4 (bf16 scale, group 32; f16 scale, group 64), Q4_0, Q4_1,
/// Q8_0, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
pub fn formats() -> Vec<QuantFormat> {
    vec![
        QuantFormat::MXFP4,
        QuantFormat::int4(32, ScaleType::BF16),
        QuantFormat::int4(64, ScaleType::F16),
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q8_0,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q2_K,
        QuantFormat::Q3_K,
        QuantFormat::Q4_K,
        QuantFormat::Q5_K,
        QuantFormat::Q6_K,
    ]
}

/// A random weight of `format` and `shape`: random codes (every code value occurs), scales
/// near 1/16 (E8M0 bytes 119..=126, including the edge byte 0 once), mins in [−0.5, 0.5);
/// K-quant records with random sub-block bytes (every 6-bit scale and min, every i8 scale)
/// and `d`, `dmin` that keep values within a few units.
pub fn rand_quant(rng: &mut Rng, format: QuantFormat, shape: [usize; 3]) -> Result<QuantHost> {
    let n: usize = shape.iter().product();
    let codes = (0..format.code_bytes(n))
        .map(|_| rng.next_u64() as u8)
        .collect();
    if format.scale.is_super_block() {
        let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
        let mut scales = Vec::with_capacity(format.scale_bytes(n));
        for _ in 0..n / crate::quant::QK_K {
            let sub: Vec<u8> = (0..16).map(|_| rng.next_u64() as u8).collect();
            match format.scale {
                ScaleType::K4 => {
                    scales.extend(f16(0.001 + 0.002 * rng.uniform().abs()));
                    scales.extend(f16(0.002 + 0.004 * rng.uniform().abs()));
                    scales.extend(&sub[..12]);
                }
                ScaleType::K2 => {
                    scales.extend(&sub);
                    scales.extend(f16(0.01 + 0.03 * rng.uniform().abs()));
                    scales.extend(f16(0.01 + 0.03 * rng.uniform().abs()));
                }
                ScaleType::K3 => {
                    scales.extend(&sub[..12]);
                    scales.extend(f16(0.005 + 0.01 * rng.uniform().abs()));
                }
                _ => {
                    scales.extend(&sub);
                    scales.extend(f16(0.0005 + 0.001 * rng.uniform().abs()));
                }
            }
        }
        return QuantHost::new("random weight", format, shape, codes, scales, vec![]);
    }
    let groups = n / format.group;
    let half_bytes = |v: f32| match format.scale {
        ScaleType::BF16 => half::bf16::from_f32(v).to_le_bytes().to_vec(),
        _ => half::f16::from_f32(v).to_le_bytes().to_vec(),
    };
    let scales: Vec<u8> = match format.scale {
        ScaleType::E8M0 => (0..groups)
            .map(|g| if g == 1 { 0 } else { 119 + rng.below(8) as u8 })
            .collect(),
        _ => (0..groups)
            .flat_map(|_| half_bytes(0.02 + 0.06 * rng.uniform().abs()))
            .collect(),
    };
    let mins = if format.has_min {
        (0..groups)
            .flat_map(|_| half_bytes(0.5 * rng.uniform()))
            .collect()
    } else {
        Vec::new()
    };
    QuantHost::new("random weight", format, shape, codes, scales, mins)
}

/// `dequantize_into`: items out of order and repeated, an out-of-range item (zeros), and a
/// workspace row beyond the items that must keep its values; then `linear_quant` at 1, 3, 8
/// and 37 rows, with and without bias, against the reference linear of the decoded weight.
pub fn check_quant<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(71);
    let dts = crate::conformance::activation_dtypes(b);
    for f in formats() {
        // Columns: a multiple of the K-quants' 256-value super-blocks.
        let (cd, cl) = if f.scale.is_super_block() {
            (256, 512)
        } else {
            (128, 192)
        };
        let q = rand_quant(&mut rng, f, [4, 6, cd])?;
        let dq = QuantTensor::upload(b, &q)?;
        let items = [2u32, 0, 2, 9];
        for &dt in &dts {
            let marker = HostTensor::from_f32_as(vec![5, 6, cd], &vec![7.0; 5 * 6 * cd], dt)?;
            let out = b.upload(&marker)?;
            b.dequantize_into(
                &dq,
                &b.upload(&HostTensor::from_u32(vec![4], &items)?)?,
                &out,
            )?;
            let mut want = q.dequantize_items(&items);
            want.extend(std::iter::repeat_n(7.0, 6 * cd));
            let want = HostTensor::from_f32_as(vec![5, 6, cd], &want, dt)?;
            let case = format!("{} {dt} [4, 6, {cd}] items {items:?}", f.name());
            // Decoding is exact in f32 and rounded once to a 16-bit dtype.
            compare("dequantize_into", &case, &b.download(&out)?, &want, 1e-6)?;
        }
        let w = rand_quant(&mut rng, f, [1, 40, cl])?;
        let dw = QuantTensor::upload(b, &w)?;
        for &dt in &dts {
            let wf = w.to_host(dt)?;
            for (m, bias) in [(1, false), (3, true), (8, false), (20, true), (37, true)] {
                let x = rand_tensor(&mut rng, &[m, cl], dt, 1.0)?;
                let bt = if bias {
                    Some(rand_tensor(&mut rng, &[40], dt, 1.0)?)
                } else {
                    None
                };
                let want = reference::linear(&x, &wf, bt.as_ref())?;
                let bd = match &bt {
                    Some(t) => Some(b.upload(t)?),
                    None => None,
                };
                let got = b.linear_quant(&b.upload(&x)?, &dw, bd.as_ref())?;
                let case = format!("{} {dt} x [{m}, {cl}] w [40, {cl}] bias {bias}", f.name());
                compare(
                    "linear_quant",
                    &case,
                    &b.download(&got)?,
                    &want,
                    tolerance(dt),
                )?;
            }
        }
    }
    let bad = rand_quant(&mut rng, QuantFormat::Q8_0, [1, 4, 32])?;
    let r = b.linear_quant(
        &b.upload(&HostTensor::from_f32(vec![1, 64], &[0.0; 64])?)?,
        &QuantTensor::upload(b, &bad)?,
        None,
    );
    ensure!(
        r.is_err(),
        "linear_quant: x of 64 columns against a weight of 32 must be an error"
    );
    Ok(())
}

/// `moe_experts_quant` for MXFP4 (E8M0 per 32) and INT4 (bf16 scale per 32, f16 per 64) experts,
/// and Q4_1 (a min: CUDA's direct kernels decline it and decode instead), at 1, 3 and 8 tokens with top-k 4, 2 and 4 over 6 experts (experts repeated across tokens,
/// and once within a token), for SwiGLU, the clamped SwiGLU and the gpt-oss GLU with biases (and
/// SwiGLU with biases), against [`reference::moe_experts_ext`] on the decoded weights. Not in
/// [`crate::conformance::check_all`]: run by the backends with a direct low-bit kernel (and the
/// reference backend, whose default decodes).
pub fn check_experts_quant<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(73);
    let (e, d, f) = (6, 128, 64);
    let gpt_oss = ExpertAct::GptOss {
        alpha: 1.702,
        limit: 7.0,
    };
    let acts = [
        (ExpertAct::Swiglu, false),
        (ExpertAct::Swiglu, true),
        (ExpertAct::SwigluClamped { limit: 7.0 }, false),
        (gpt_oss, true),
    ];
    for fmt in [
        QuantFormat::MXFP4,
        QuantFormat::int4(32, ScaleType::BF16),
        QuantFormat::int4(64, ScaleType::F16),
        QuantFormat::Q4_1,
    ] {
        let gu = rand_quant(&mut rng, fmt, [e, 2 * f, d])?;
        let dn = rand_quant(&mut rng, fmt, [e, d, f])?;
        let (gud, dnd) = (QuantTensor::upload(b, &gu)?, QuantTensor::upload(b, &dn)?);
        let (guf, dnf) = (gu.to_host(DType::F32)?, dn.to_host(DType::F32)?);
        for dt in crate::conformance::activation_dtypes(b) {
            let gu_bias = rand_tensor(&mut rng, &[e, 2 * f], dt, 1.0)?;
            let dn_bias = rand_tensor(&mut rng, &[e, d], dt, 1.0)?;
            let (gbd, dbd) = (b.upload(&gu_bias)?, b.upload(&dn_bias)?);
            // (tokens, k, ids): distinct experts of one token; expert 4 in every token and twice
            // in the last; eight tokens over six experts.
            let mut cases = vec![
                (1usize, 4usize, vec![3u32, 0, 5, 1]),
                (3, 2, vec![4, 1, 2, 4, 4, 4]),
            ];
            let mut ids8 = Vec::new();
            for _ in 0..8 {
                let mut all: Vec<u32> = (0..e as u32).collect();
                rng.shuffle(&mut all);
                ids8.extend_from_slice(&all[..4]);
            }
            cases.push((8, 4, ids8));
            for (n, k, ids) in cases {
                let x = rand_tensor(&mut rng, &[n, d], dt, 3.0)?;
                let w: Vec<f32> = (0..n * k)
                    .map(|_| 0.1 + 0.4 * rng.uniform().abs())
                    .collect();
                let ids = HostTensor::from_u32(vec![n, k], &ids)?;
                let weights = HostTensor::from_f32(vec![n, k], &w)?;
                let (xd, idd, wd) = (b.upload(&x)?, b.upload(&ids)?, b.upload(&weights)?);
                for (act, biased) in acts {
                    let (gb, db) = if biased {
                        (Some(&gu_bias), Some(&dn_bias))
                    } else {
                        (None, None)
                    };
                    let want =
                        reference::moe_experts_ext(&x, &ids, &weights, &guf, &dnf, act, gb, db)?;
                    let opts = ExpertOptions {
                        act,
                        gate_up_bias: biased.then_some(&gbd),
                        down_bias: biased.then_some(&dbd),
                        fp8: false,
                    };
                    let got = b.moe_experts_quant(&xd, &idd, &wd, &gud, &dnd, &opts)?;
                    compare(
                        "moe_experts_quant",
                        &format!(
                            "{} {dt} {act:?} biases {biased} x [{n}, {d}] E {e} F {f} ids {:?}",
                            fmt.name(),
                            ids.to_u32()?
                        ),
                        &b.download(&got)?,
                        &want,
                        tolerance(dt),
                    )?;
                }
            }
        }
    }
    Ok(())
}
