//! The FP8 expert GEMM (`Backend::moe_experts_fp8`, kernels/moe_fp8.cu; `--moe-fp8`) on a real
//! GPU of sm_89+, against a host reference that rounds the activations to e4m3 exactly as the
//! kernels do (per 32-value block, scale = amax / 448; `dayone_cuda::moe_fp8::e4m3`) and then
//! computes in f64, so the tolerance is that of f32 accumulation. The gate/up input x rounds
//! identically on both sides; the down input h is the GPU's own f32 result, which may sit on the
//! other side of an e4m3 rounding midpoint than the reference's: each h value within a small
//! window of a midpoint adds the effect of the other rounding to that output's allowed error
//! (`slack`), so the check stays tight everywhere else.
//! Skips (a line on stderr) without a CUDA device, or on a device below sm_89.

use dayone_backend::conformance::{rand_tensor, Rng};
use dayone_backend::conformance_quant::rand_quant;
use dayone_backend::quant::ScaleType;
use dayone_backend::quant_moe::{expert_slots, moe_experts_decoded};
use dayone_backend::{
    Backend, DType, ExpertAct, ExpertOptions, HostTensor, QuantFormat, QuantHost, QuantTensor,
};
use dayone_cuda::moe_fp8::e4m3;
use dayone_cuda::CudaBackend;

/// Relative error allowed beyond the slack, `max |got − want| / max |want|`: f32 accumulation
/// (f32 activations) or one bf16 rounding of h and of the output (bf16).
fn tol(dt: DType) -> f32 {
    if dt == DType::F32 {
        1e-3
    } else {
        2e-2
    }
}

/// The e4m3 value next to `q` (the rounding of `v`) on `v`'s side: the other candidate of a
/// round-to-nearest.
fn other_rounding(q: f32, v: f32) -> f32 {
    let b = e4m3::encode(q);
    let (mag, neg) = (b & 0x7F, b & 0x80 != 0);
    let away = (v.abs() > q.abs()) || (q == 0.0);
    let alt = if away {
        if mag >= 0x7E {
            return q;
        }
        e4m3::decode(mag + 1)
    } else if mag == 0 {
        return q;
    } else {
        e4m3::decode(mag - 1)
    };
    let negative = if q == 0.0 { v < 0.0 } else { neg };
    if negative {
        -alt
    } else {
        alt
    }
}

/// One activation row in e4m3 blocks: (values, block scales, per-value ambiguity = |other
/// rounding − value| where the scaled value lies within `window` of a rounding midpoint, else 0).
fn quantize_row(x: &[f32], window: f32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut vals, mut scales, mut amb) = (Vec::new(), Vec::new(), Vec::new());
    for blk in x.chunks(32) {
        let (q, s) = e4m3::quantize_block(blk);
        let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
        let inv = if amax > 0.0 { e4m3::MAX / amax } else { 0.0 };
        for (&qi, &xi) in q.iter().zip(blk) {
            let v = xi * inv;
            let alt = other_rounding(qi, v);
            let mid = 0.5 * (qi + alt);
            amb.push(if (v - mid).abs() <= window {
                (alt - qi).abs()
            } else {
                0.0
            });
        }
        vals.extend(q);
        scales.push(s);
    }
    (vals, scales, amb)
}

fn act_value(act: ExpertAct, g: f64, u: f64) -> f64 {
    let silu = |g: f64| g / (1.0 + (-g).exp());
    match act {
        ExpertAct::Swiglu => silu(g) * u,
        ExpertAct::SwigluClamped { limit } => {
            let l = limit as f64;
            silu(g.min(l)) * u.clamp(-l, l)
        }
        ExpertAct::GptOss { alpha, limit } => {
            let l = limit as f64;
            let (g, u) = (g.min(l), u.clamp(-l, l));
            (u + 1.0) * g / (1.0 + (-(alpha as f64) * g).exp())
        }
    }
}

/// Σ_kb scale[kb] · Σ_{k in kb} vals[k] · w[k], in f64.
fn block_dot(vals: &[f32], scales: &[f32], w: &[f32]) -> f64 {
    vals.chunks(32)
        .zip(w.chunks(32))
        .zip(scales)
        .map(|((v, w), &s)| {
            s as f64
                * v.iter()
                    .zip(w)
                    .map(|(&a, &b)| a as f64 * b as f64)
                    .sum::<f64>()
        })
        .sum()
}

struct Case<'a> {
    x: &'a [f32],
    ids: &'a [u32],
    weights: &'a [f32],
    k: usize,
    gate_up: &'a [f32],
    down: &'a [f32],
    gu_bias: Option<&'a [f32]>,
    dn_bias: Option<&'a [f32]>,
    act: ExpertAct,
    dt: DType,
}

/// The FP8 path on the host: `(y [N, D], slack [N, D])` (see the module docs). `gate_up`
/// `[E, 2F, D]` and `down` `[E, D, F]` are the exactly decoded low-bit weights (equal to e4m3
/// code · block scale).
fn reference(c: &Case, d: usize, f: usize) -> (Vec<f32>, Vec<f32>) {
    let n = c.x.len() / d;
    let mut y = vec![0f64; n * d];
    let mut slack = vec![0f64; n * d];
    let round_dt = |v: Vec<f32>| -> Vec<f32> {
        if c.dt == DType::F32 {
            v
        } else {
            HostTensor::from_f32_as(vec![v.len()], &v, c.dt)
                .expect("host tensor")
                .to_f32()
        }
    };
    let gpt = matches!(c.act, ExpertAct::GptOss { .. });
    for t in 0..n {
        let (xq, xs, _) = quantize_row(&c.x[t * d..(t + 1) * d], 0.0);
        for j in 0..c.k {
            let e = c.ids[t * c.k + j] as usize;
            let row = |r: usize| &c.gate_up[(e * 2 * f + r) * d..(e * 2 * f + r + 1) * d];
            let bias = |r: usize| c.gu_bias.map_or(0.0, |b| b[e * 2 * f + r] as f64);
            let h: Vec<f32> = (0..f)
                .map(|i| {
                    let (gr, ur) = if gpt { (2 * i, 2 * i + 1) } else { (i, f + i) };
                    let g = block_dot(&xq, &xs, row(gr)) + bias(gr);
                    let u = block_dot(&xq, &xs, row(ur)) + bias(ur);
                    act_value(c.act, g, u) as f32
                })
                .collect();
            let h = round_dt(h);
            // GPU h differs from this one by f32 rounding: 1e-4 of the block amax (448 after
            // scaling) covers it with a wide margin.
            let (hq, hs, amb) = quantize_row(&h, 448.0 * 1e-4);
            let w = c.weights[t * c.k + j] as f64;
            for o in 0..d {
                let wr = &c.down[(e * d + o) * f..(e * d + o + 1) * f];
                let v = block_dot(&hq, &hs, wr) + c.dn_bias.map_or(0.0, |b| b[e * d + o] as f64);
                y[t * d + o] += w * v;
                let s: f64 = amb
                    .iter()
                    .zip(wr)
                    .enumerate()
                    .map(|(i, (&a, &wv))| a as f64 * hs[i / 32] as f64 * (wv as f64).abs())
                    .sum();
                slack[t * d + o] += w.abs() * s;
            }
        }
    }
    (
        y.iter().map(|&v| v as f32).collect(),
        slack.iter().map(|&v| v as f32).collect(),
    )
}

/// `|got − want| ≤ tol · max |want| + slack` everywhere.
fn check(what: &str, got: &[f32], want: &[f32], slack: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    let mut worst = (0f32, 0usize);
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(slack).enumerate() {
        let excess = if g.is_nan() {
            f32::INFINITY
        } else {
            ((g - w).abs() - 1.01 * s).max(0.0) / scale
        };
        if excess > worst.0 {
            worst = (excess, i);
        }
    }
    assert!(
        worst.0 <= tol,
        "{what}: relative error {:.3e} > {tol:.0e} beyond the slack at {} (got {}, want {}, slack {}, max|ref| {scale})",
        worst.0,
        worst.1,
        got[worst.1],
        want[worst.1],
        slack[worst.1]
    );
}

#[test]
fn fp8_experts_match_the_emulated_reference() {
    if !dayone_cuda::is_available() {
        eprintln!("SKIPPED fp8_experts_match_the_emulated_reference: no CUDA device");
        return;
    }
    let b = CudaBackend::new(0).expect("CUDA backend");
    if !b.moe_fp8_available(QuantFormat::MXFP4) {
        eprintln!(
            "SKIPPED fp8_experts_match_the_emulated_reference: {} has no FP8 expert GEMM (sm_89+)",
            b.name()
        );
        return;
    }
    eprintln!("fp8_experts_match_the_emulated_reference: {}", b.name());
    let mut rng = Rng::new(811);
    // D = 160 and F = 96: K blocks of 5 and 3 (the last 64-wide stage half empty), output
    // widths that leave partial column tiles; 12 experts, 4 per token. INT4 with 64-wide groups
    // needs both K (D and F) multiples of 64: D = 192, F = 128 there.
    let (e, k) = (12usize, 4usize);
    let gpt_oss = ExpertAct::GptOss {
        alpha: 1.702,
        limit: 7.0,
    };
    for fmt in [
        QuantFormat::MXFP4,
        QuantFormat::int4(32, ScaleType::BF16),
        QuantFormat::int4(64, ScaleType::F16),
    ] {
        let (d, f) = if fmt.group % 64 == 0 {
            (192usize, 128usize)
        } else {
            (160, 96)
        };
        assert!(b.moe_fp8_available(fmt), "{}", fmt.name());
        let gu: QuantHost = rand_quant(&mut rng, fmt, [e, 2 * f, d]).unwrap();
        let dn: QuantHost = rand_quant(&mut rng, fmt, [e, d, f]).unwrap();
        let (gud, dnd) = (
            QuantTensor::upload(&b, &gu).unwrap(),
            QuantTensor::upload(&b, &dn).unwrap(),
        );
        let (guf, dnf) = (gu.dequantize(), dn.dequantize());
        for dt in [DType::F32, DType::BF16] {
            let gu_bias = rand_tensor(&mut rng, &[e, 2 * f], dt, 1.0).unwrap();
            let dn_bias = rand_tensor(&mut rng, &[e, d], dt, 1.0).unwrap();
            let (gbh, dbh) = (gu_bias.to_f32(), dn_bias.to_f32());
            let gu_ws = b.zeros(&[e, 2 * f, d], dt).unwrap();
            let dn_ws = b.zeros(&[e, d, f], dt).unwrap();
            for n in [1usize, 3, 70, 300] {
                let x = rand_tensor(&mut rng, &[n, d], dt, 3.0).unwrap();
                let xh = x.to_f32();
                let mut ids = Vec::with_capacity(n * k);
                for _ in 0..n {
                    let mut all: Vec<u32> = (0..e as u32).collect();
                    rng.shuffle(&mut all);
                    ids.extend_from_slice(&all[..k]);
                }
                let w: Vec<f32> = (0..n * k)
                    .map(|_| 0.1 + 0.4 * rng.uniform().abs())
                    .collect();
                let xd = b.upload(&x).unwrap();
                let wd = b
                    .upload(&HostTensor::from_f32(vec![n, k], &w).unwrap())
                    .unwrap();
                let (items, local) = expert_slots(&ids, e);
                let chosen = b
                    .upload(&HostTensor::from_u32(vec![items.len()], &items).unwrap())
                    .unwrap();
                let locald = b
                    .upload(&HostTensor::from_u32(vec![n, k], &local).unwrap())
                    .unwrap();
                // Biases in slot order (what moe_experts_decoded gathers).
                let mut rows = items.clone();
                rows.resize(e, items[0]);
                let slot_rows = |src: &[f32], width: usize| -> Vec<f32> {
                    rows.iter()
                        .flat_map(|&r| src[r as usize * width..(r as usize + 1) * width].to_vec())
                        .collect()
                };
                let gbs = b
                    .upload(
                        &HostTensor::from_f32_as(vec![e, 2 * f], &slot_rows(&gbh, 2 * f), dt)
                            .unwrap(),
                    )
                    .unwrap();
                let dbs = b
                    .upload(&HostTensor::from_f32_as(vec![e, d], &slot_rows(&dbh, d), dt).unwrap())
                    .unwrap();
                let (gbd, dbd) = (b.upload(&gu_bias).unwrap(), b.upload(&dn_bias).unwrap());
                for (act, biased) in [(ExpertAct::Swiglu, false), (gpt_oss, true)] {
                    let case = Case {
                        x: &xh,
                        ids: &ids,
                        weights: &w,
                        k,
                        gate_up: &guf,
                        down: &dnf,
                        gu_bias: biased.then_some(&gbh[..]),
                        dn_bias: biased.then_some(&dbh[..]),
                        act,
                        dt,
                    };
                    let (want, slack) = reference(&case, d, f);
                    let what = format!("{} {dt} {act:?} biases {biased} N {n}", fmt.name());
                    let opts = ExpertOptions {
                        act,
                        gate_up_bias: biased.then_some(&gbs),
                        down_bias: biased.then_some(&dbs),
                        fp8: true,
                    };
                    let got = b
                        .moe_experts_fp8(
                            &xd,
                            &locald,
                            &wd,
                            &gud,
                            &dnd,
                            &chosen,
                            &opts,
                            (&gu_ws, &dn_ws),
                        )
                        .unwrap()
                        .unwrap_or_else(|| panic!("{what}: the FP8 path declined"));
                    let got = b.download(&got).unwrap().to_f32();
                    check(&what, &got, &want, &slack, tol(dt));
                    // The engine's route: the generic decode helper with `fp8` set.
                    if n == 70 {
                        let opts = ExpertOptions {
                            act,
                            gate_up_bias: biased.then_some(&gbd),
                            down_bias: biased.then_some(&dbd),
                            fp8: true,
                        };
                        let via = moe_experts_decoded(
                            &b,
                            &xd,
                            &ids,
                            &wd,
                            &gud,
                            &dnd,
                            &opts,
                            (&gu_ws, &dn_ws),
                        )
                        .unwrap();
                        let via = b.download(&via).unwrap().to_f32();
                        check(
                            &format!("{what} via moe_experts_decoded"),
                            &via,
                            &want,
                            &slack,
                            tol(dt),
                        );
                    }
                }
            }
        }
    }
}

/// The host reference itself (no GPU): within the FP8 activation rounding (a few % of the
/// largest output) of the exact experts (`reference::moe_experts_ext` on the decoded weights),
/// and not equal to them (the rounding is really applied).
#[test]
fn emulated_reference_tracks_the_exact_experts() {
    let mut rng = Rng::new(5);
    let (e, d, f, k, n) = (5usize, 64usize, 64usize, 2usize, 6usize);
    let gpt_oss = ExpertAct::GptOss {
        alpha: 1.702,
        limit: 7.0,
    };
    for fmt in [QuantFormat::MXFP4, QuantFormat::int4(32, ScaleType::BF16)] {
        let gu = rand_quant(&mut rng, fmt, [e, 2 * f, d]).unwrap();
        let dn = rand_quant(&mut rng, fmt, [e, d, f]).unwrap();
        let (guf, dnf) = (gu.dequantize(), dn.dequantize());
        let x = rand_tensor(&mut rng, &[n, d], DType::F32, 3.0).unwrap();
        let xh = x.to_f32();
        let ids: Vec<u32> = (0..n * k).map(|i| ((i * 3 + i / k) % e) as u32).collect();
        let w: Vec<f32> = (0..n * k).map(|i| 0.2 + 0.1 * (i % 3) as f32).collect();
        let gb = rng.vec(e * 2 * f, 1.0);
        let db = rng.vec(e * d, 1.0);
        for (act, biased) in [(ExpertAct::Swiglu, false), (gpt_oss, true)] {
            let case = Case {
                x: &xh,
                ids: &ids,
                weights: &w,
                k,
                gate_up: &guf,
                down: &dnf,
                gu_bias: biased.then_some(&gb[..]),
                dn_bias: biased.then_some(&db[..]),
                act,
                dt: DType::F32,
            };
            let (emulated, _) = reference(&case, d, f);
            let host =
                |v: &[f32], shape: &[usize]| HostTensor::from_f32(shape.to_vec(), v).unwrap();
            let exact = dayone_backend::reference::moe_experts_ext(
                &x,
                &HostTensor::from_u32(vec![n, k], &ids).unwrap(),
                &host(&w, &[n, k]),
                &host(&guf, &[e, 2 * f, d]),
                &host(&dnf, &[e, d, f]),
                act,
                biased.then(|| host(&gb, &[e, 2 * f])).as_ref(),
                biased.then(|| host(&db, &[e, d])).as_ref(),
            )
            .unwrap()
            .to_f32();
            let scale = exact.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = emulated
                .iter()
                .zip(&exact)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
                / scale;
            let rms = |v: &[f32]| (v.iter().map(|a| a * a).sum::<f32>() / v.len() as f32).sqrt();
            let diff: Vec<f32> = emulated.iter().zip(&exact).map(|(a, b)| a - b).collect();
            let rel_rms = rms(&diff) / rms(&exact);
            // e4m3 rounds each value by ≈ 2.7 % RMS (3 mantissa bits); x and h are both rounded,
            // and SwiGLU multiplies two rounded projections: a few % in all (measured 3–5 %).
            // Without the rounding the two agree to 1e-7 (the structure is the same).
            assert!(
                err < 0.2 && (1e-2..8e-2).contains(&rel_rms),
                "{} {act:?}: emulated FP8 vs exact: max {err:.3e}, RMS {rel_rms:.3e}",
                fmt.name()
            );
        }
    }
}
