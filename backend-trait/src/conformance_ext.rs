//! Conformance of the gpt-oss extras: [`Backend::paged_attention_ext`] (sliding window,
//! attention sinks) and [`Backend::moe_experts_ext`] (biases, the interleaved clamped GLU),
//! against [`crate::reference`]. A backend that refuses the extras (the default impls) fails
//! here; [`check_ext`] is therefore run only by the backends that implement them.

use crate::conformance::{attention_cases, compare, rand_tensor, tolerance, Rng};
use crate::{reference, AttentionOptions, Backend, DType, ExpertAct, ExpertOptions, HostTensor};
use anyhow::Result;

/// Both checks for the backend's f32 activation dtype and, if different, its bf16 one.
pub fn check_ext<B: Backend>(b: &B) -> Result<()> {
    let dts = crate::conformance::activation_dtypes(b);
    for dt in dts {
        check_attention_ext(b, dt)?;
        check_experts_ext(b, dt)?;
        check_linear_f32(b, dt)?;
    }
    Ok(())
}

/// `linear_f32`: the output is f32 and not rounded to the activation dtype (judged at the f32
/// tolerance even for bf16 inputs, which f32 holds exactly).
pub fn check_linear_f32<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(33);
    for &(m, k, n) in &[(1, 64, 8), (5, 2880, 32), (37, 96, 128)] {
        let x = rand_tensor(&mut rng, &[m, k], dt, 1.0)?;
        let w = rand_tensor(&mut rng, &[n, k], dt, 0.5)?;
        let f = |t: &HostTensor| HostTensor::from_f32(t.shape.clone(), &t.to_f32());
        let want = reference::linear(&f(&x)?, &f(&w)?, None)?;
        let got = b.download(&b.linear_f32(&b.upload(&x)?, &b.upload(&w)?)?)?;
        anyhow::ensure!(
            got.dtype == DType::F32,
            "linear_f32 [{dt} x [{m}, {k}]]: output dtype {}, expected f32",
            got.dtype
        );
        compare(
            "linear_f32",
            &format!("{dt} x [{m}, {k}] w [{n}, {k}]"),
            &got,
            &want,
            crate::conformance::F32_TOL,
        )?;
    }
    Ok(())
}

/// Windows shorter than, equal to and longer than the contexts (1, 8, 16, 1000), with and
/// without sinks (including large ones that take most of the mass), over the attention
/// scenarios of [`attention_cases`].
pub fn check_attention_ext<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(31);
    for case in attention_cases() {
        let (meta, blocks) = case.meta(&mut rng);
        let n = meta.num_tokens();
        let (h, hkv, bs) = (case.h, case.hkv, case.block_size);
        let q = rand_tensor(&mut rng, &[n, h, case.hd_k], dt, 3.0)?;
        let kc = rand_tensor(&mut rng, &[blocks, bs, hkv, case.hd_k], dt, 1.0)?;
        let vc = rand_tensor(&mut rng, &[blocks, bs, hkv, case.hd_v], dt, 1.0)?;
        let sinks = HostTensor::from_f32(vec![h], &rng.vec(h, 4.0))?;
        let scale = 1.0 / (case.hd_k as f32).sqrt();
        let dmeta = b.upload_meta(meta.clone())?;
        let (qd, kd, vd, sd) = (
            b.upload(&q)?,
            b.upload(&kc)?,
            b.upload(&vc)?,
            b.upload(&sinks)?,
        );
        for window in [None, Some(1), Some(8), Some(16), Some(1000)] {
            for with_sinks in [false, true] {
                if window.is_none() && !with_sinks {
                    continue;
                }
                let s = with_sinks.then_some(&sinks);
                let want = reference::paged_attention_ext(&q, &kc, &vc, &meta, scale, window, s)?;
                let opts = AttentionOptions {
                    window,
                    sinks: with_sinks.then_some(&sd),
                };
                let got = b.paged_attention_ext(&qd, &kd, &vd, &dmeta, scale, &opts)?;
                compare(
                    "paged_attention_ext",
                    &format!("{dt} window {window:?} sinks {with_sinks} {:?}", case.seqs),
                    &b.download(&got)?,
                    &want,
                    tolerance(dt),
                )?;
            }
        }
    }
    Ok(())
}

/// The gpt-oss activation (gate and up past the clamp), SwiGLU and the clamped SwiGLU of
/// glm5_next, each with and without biases, at one and many tokens.
pub fn check_experts_ext<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(32);
    let gpt_oss = ExpertAct::GptOss {
        alpha: 1.702,
        limit: 7.0,
    };
    // (N, D, E, F, k)
    // Token counts that reach each grouped kernel on CUDA (GEMV, tensor-core tiles over several
    // tiles of one expert, FMA for widths that are not multiples of 8).
    let cases: &[(usize, usize, usize, usize, usize)] = &[
        (1, 64, 8, 32, 4),
        (9, 64, 8, 32, 4),
        (5, 96, 6, 16, 2),
        (70, 64, 6, 40, 2),
        (11, 36, 5, 12, 3),
    ];
    for &(n, d, e, f, k) in cases {
        let x = rand_tensor(&mut rng, &[n, d], dt, 1.0)?;
        // Large enough that |g|, |u| pass the clamp of 7 for some outputs.
        let gate_up = rand_tensor(&mut rng, &[e, 2 * f, d], dt, 20.0 / (d as f32).sqrt())?;
        let down = rand_tensor(&mut rng, &[e, d, f], dt, 0.5 / (f as f32).sqrt())?;
        let gu_bias = rand_tensor(&mut rng, &[e, 2 * f], dt, 1.0)?;
        let dn_bias = rand_tensor(&mut rng, &[e, d], dt, 1.0)?;
        let mut ids = Vec::with_capacity(n * k);
        for _ in 0..n {
            let mut all: Vec<u32> = (0..e as u32).collect();
            rng.shuffle(&mut all);
            ids.extend_from_slice(&all[..k]);
        }
        let weights: Vec<f32> = (0..n * k)
            .map(|_| 0.1 + 0.4 * rng.uniform().abs())
            .collect();
        let ids = HostTensor::from_u32(vec![n, k], &ids)?;
        let weights = HostTensor::from_f32(vec![n, k], &weights)?;
        let up = |t: &HostTensor| b.upload(t);
        let (xd, idd, wd, gud, dnd) =
            (up(&x)?, up(&ids)?, up(&weights)?, up(&gate_up)?, up(&down)?);
        let (gbd, dbd) = (up(&gu_bias)?, up(&dn_bias)?);
        let glm = ExpertAct::SwigluClamped { limit: 7.0 };
        for act in [gpt_oss, ExpertAct::Swiglu, glm] {
            for biased in [true, false] {
                if act == ExpertAct::Swiglu && !biased {
                    continue;
                }
                let (gb, db) = if biased {
                    (Some(&gu_bias), Some(&dn_bias))
                } else {
                    (None, None)
                };
                let want =
                    reference::moe_experts_ext(&x, &ids, &weights, &gate_up, &down, act, gb, db)?;
                let opts = ExpertOptions {
                    act,
                    gate_up_bias: biased.then_some(&gbd),
                    down_bias: biased.then_some(&dbd),
                    fp8: false,
                };
                let got = b.moe_experts_ext(&xd, &idd, &wd, &gud, &dnd, &opts)?;
                compare(
                    "moe_experts_ext",
                    &format!("{dt} {act:?} biases {biased} x [{n}, {d}] E {e} F {f} k {k}"),
                    &b.download(&got)?,
                    &want,
                    tolerance(dt),
                )?;
            }
        }
    }
    Ok(())
}
