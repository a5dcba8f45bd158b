//! The shared conformance suite: every [`Backend`] op against [`crate::reference`].
//!
//! Each `check_<op>` builds deterministic random inputs, runs the op on the backend and on the
//! CPU reference, and fails with a message naming the op, the case (shapes) and the max relative
//! error (`max |got − want| / max |want|`) when it is past the tolerance: [`F32_TOL`] when the
//! activation dtype is f32, [`LOW_TOL`] for bf16/f16 activations. [`check_all`] runs them all
//! for `b.activation_dtype(F32)` and, if it differs, `b.activation_dtype(BF16)`.
//!
//! Use from a backend's tests:
//! ```ignore
//! dayone_backend::conformance::check_all(&MyBackend::new()?)?;
//! ```

use crate::{
    kda_from_projections_each, reference, rows, Backend, DType, HostTensor, KdaProjections,
    RopeArgs, RopeStyle, StepMeta, TensorInfo,
};
use anyhow::{bail, ensure, Context, Result};

/// Tolerance (relative to `max |ref|`) for f32 activations.
pub const F32_TOL: f32 = 1e-4;
/// Tolerance (relative to `max |ref|`) for bf16/f16 activations.
pub const LOW_TOL: f32 = 2e-2;

/// A small deterministic PRNG (SplitMix64, Steele et al. 2014), so that failures reproduce.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in `[-a, a)`.
    pub fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * a).collect()
    }

    /// Fisher–Yates shuffle.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Tolerance for activation dtype `dt`.
pub fn tolerance(dt: DType) -> f32 {
    if dt == DType::F32 {
        F32_TOL
    } else {
        LOW_TOL
    }
}

/// A random host tensor of `shape` in `dt`, values uniform in `[-a, a)`.
pub fn rand_tensor(rng: &mut Rng, shape: &[usize], dt: DType, a: f32) -> Result<HostTensor> {
    let n = shape.iter().product();
    HostTensor::from_f32_as(shape.to_vec(), &rng.vec(n, a), dt)
}

/// Compares a backend result with the reference: equal shapes, and
/// `max |got − want| / max(max |want|, 1e-30) <= tol`. The error names `op` and `case`.
pub fn compare(op: &str, case: &str, got: &HostTensor, want: &HostTensor, tol: f32) -> Result<()> {
    ensure!(
        got.shape == want.shape,
        "{op} [{case}]: output shape {:?}, expected {:?}",
        got.shape,
        want.shape
    );
    let (g, w) = (got.to_f32(), want.to_f32());
    let scale = w.iter().fold(0f32, |m, &x| m.max(x.abs())).max(1e-30);
    let mut worst = (0f32, 0usize);
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        // A NaN anywhere counts as an infinite error.
        let e = if a.is_nan() || b.is_nan() {
            f32::INFINITY
        } else {
            (a - b).abs()
        };
        if e > worst.0 {
            worst = (e, i);
        }
    }
    let rel = worst.0 / scale;
    if rel.is_nan() || rel > tol {
        bail!(
            "{op} [{case}]: max relative error {rel:.3e} > {tol:.0e} at flat index {} (got {}, want {}, max|ref| {scale})",
            worst.1,
            g[worst.1],
            w[worst.1]
        );
    }
    Ok(())
}

fn run<B: Backend>(b: &B, t: &B::Tensor) -> Result<HostTensor> {
    b.download(t)
}

/// The backend's f32 activation dtype and, if different, its bf16 one: the dtypes every check
/// runs in.
pub fn activation_dtypes<B: Backend>(b: &B) -> Vec<DType> {
    let mut dts = vec![b.activation_dtype(DType::F32)];
    let low = b.activation_dtype(DType::BF16);
    if low != dts[0] {
        dts.push(low);
    }
    dts
}

/// Runs every check for the backend's f32 activation dtype and, if different, its bf16 one
/// (the MLA and MoE ops through [`check_mla_moe`], the KDA-layer ops through [`check_kda_ops`],
/// the row copies through [`check_row_ops`] and [`check_many_row_ops`]).
pub fn check_all<B: Backend>(b: &B) -> Result<()> {
    let dts = activation_dtypes(b);
    check_upload_download(b)?;
    check_errors(b)?;
    for dt in dts {
        check_embedding(b, dt)?;
        check_linear(b, dt)?;
        check_linear_many(b, dt)?;
        check_linear_each(b, dt)?;
        check_linear_silu_mul(b, dt)?;
        check_rms_norm(b, dt)?;
        check_add_rms_norm(b, dt)?;
        check_rms_norm_linear(b, dt)?;
        check_linear_add_rms_norm(b, dt)?;
        check_rope(b, dt)?;
        check_silu_mul(b, dt)?;
        check_silu_mul_limit(b, dt)?;
        check_add(b, dt)?;
        check_stream_mix(b, dt)?;
        check_to_f32(b, dt)?;
        check_write_kv(b, dt)?;
        check_rope_write_kv(b, dt)?;
        check_paged_attention(b, dt)?;
        check_argmax(b, dt)?;
        check_token_logprob_rows(b, dt)?;
    }
    check_mla_moe(b)?;
    check_kda_ops(b)?;
    check_row_ops(b)?;
    check_many_row_ops(b)?;
    check_host_rows(b)?;
    crate::conformance_quant::check_quant(b)?;
    crate::conformance_varlen::check_attention_varlen(b)?;
    crate::conformance_vision::check_gelu(b)?;
    crate::conformance_invariance::check_batch_invariance(b)?;
    Ok(())
}

/// `upload`/`download`/`zeros`/`reshape`: f32, bf16, f16 and u32 round trips (floats may come
/// back widened to the backend's storage dtype, but with the same values).
pub fn check_upload_download<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(1);
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let h = rand_tensor(&mut rng, &[3, 5, 7], dt, 4.0)?;
        let t = b
            .upload(&h)
            .with_context(|| format!("upload {dt} [3,5,7]"))?;
        ensure!(
            t.shape() == [3, 5, 7],
            "upload {dt}: shape {:?}, expected [3, 5, 7]",
            t.shape()
        );
        let back = run(b, &t)?;
        compare("upload/download", &format!("{dt} [3,5,7]"), &back, &h, 0.0)?;
        let r = b.reshape(&t, &[15, 7])?;
        ensure!(
            r.shape() == [15, 7],
            "reshape: shape {:?}, expected [15, 7]",
            r.shape()
        );
        let back = run(b, &r)?;
        ensure!(back.to_f32() == h.to_f32(), "reshape {dt}: values changed");
    }
    let ids: Vec<u32> = (0..37).map(|i| i * 7919 + 3).collect();
    let h = HostTensor::from_u32(vec![37], &ids)?;
    let back = run(b, &b.upload(&h)?)?;
    ensure!(
        back.dtype == DType::U32,
        "download u32: got dtype {}",
        back.dtype
    );
    ensure!(back.to_u32()? == ids, "upload/download u32: values changed");
    let z = b.zeros(&[4, 9], DType::F32)?;
    let zh = run(b, &z)?;
    ensure!(
        zh.shape == [4, 9] && zh.to_f32().iter().all(|&x| x == 0.0),
        "zeros [4, 9]: not all zero"
    );
    let z = b.zeros(&[6], DType::U32)?;
    ensure!(
        run(b, &z)?.to_u32()? == vec![0; 6],
        "zeros u32 [6]: not all zero"
    );
    Ok(())
}

/// Bad shapes must come back as errors (not panics).
pub fn check_errors<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(2);
    let dt = b.activation_dtype(DType::F32);
    let x = b.upload(&rand_tensor(&mut rng, &[2, 8], dt, 1.0)?)?;
    let w = b.upload(&rand_tensor(&mut rng, &[4, 9], dt, 1.0)?)?;
    ensure!(
        b.linear(&x, &w, None).is_err(),
        "linear: K mismatch [2,8]·[4,9]ᵀ was accepted"
    );
    let y = b.upload(&rand_tensor(&mut rng, &[2, 9], dt, 1.0)?)?;
    ensure!(
        b.add(&x, &y).is_err(),
        "add: shapes [2,8] + [2,9] were accepted"
    );
    ensure!(
        b.silu_mul(&x, &y).is_err(),
        "silu_mul: shapes [2,8], [2,9] were accepted"
    );
    ensure!(
        b.reshape(&x, &[3, 5]).is_err(),
        "reshape: [2,8] -> [3,5] was accepted"
    );
    let nw = b.upload(&rand_tensor(&mut rng, &[9], dt, 1.0)?)?;
    ensure!(
        b.rms_norm(&x, &nw, 1e-5).is_err(),
        "rms_norm: x [2,8] with w [9] was accepted"
    );
    Ok(())
}

/// `embedding`: odd widths, repeated ids, first and last row.
pub fn check_embedding<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(10);
    for &(v, d, n) in &[
        (100usize, 37usize, 9usize),
        (1000, 576, 5),
        (7, 4, 1),
        (300, 130, 33),
    ] {
        let table = rand_tensor(&mut rng, &[v, d], dt, 1.0)?;
        let mut ids: Vec<u32> = (0..n).map(|_| rng.below(v) as u32).collect();
        ids[0] = (v - 1) as u32;
        if n > 2 {
            ids[1] = 0;
            ids[2] = ids[0];
        }
        let ids = HostTensor::from_u32(vec![n], &ids)?;
        let want = reference::embedding(&table, &ids)?;
        let got = b.embedding(&b.upload(&table)?, &b.upload(&ids)?)?;
        compare(
            "embedding",
            &format!("{dt} table [{v}, {d}] ids [{n}]"),
            &run(b, &got)?,
            &want,
            0.0,
        )?;
    }
    Ok(())
}

/// `linear`: M = 1 (decode), M ≥ 16 (prefill), odd sizes, with and without bias.
pub fn check_linear<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(11);
    let cases: &[(usize, usize, usize, bool)] = &[
        (1, 33, 17, false),
        (1, 576, 1536, false),
        (1, 1000, 129, true),
        (3, 5, 7, true),
        (7, 100, 45, false),
        (16, 256, 96, true),
        (33, 130, 257, false),
        (64, 576, 192, true),
        (17, 1024, 1, false),
        // Narrow reductions (a layer split over ranks: an expert's 16 channels over 2).
        (1, 8, 64, false),
        (3, 8, 64, false),
        (8, 8, 40, true),
        (5, 16, 2, false),
    ];
    for &(m, k, n, bias) in cases {
        let x = rand_tensor(&mut rng, &[m, k], dt, 1.0)?;
        let w = rand_tensor(&mut rng, &[n, k], dt, 0.5)?;
        let bt = if bias {
            Some(rand_tensor(&mut rng, &[n], dt, 1.0)?)
        } else {
            None
        };
        let want = reference::linear(&x, &w, bt.as_ref())?;
        let (xd, wd) = (b.upload(&x)?, b.upload(&w)?);
        let bd = match &bt {
            Some(t) => Some(b.upload(t)?),
            None => None,
        };
        let got = b.linear(&xd, &wd, bd.as_ref())?;
        let case = format!("{dt} x [{m}, {k}] w [{n}, {k}] bias {bias}");
        compare("linear", &case, &run(b, &got)?, &want, tolerance(dt))?;
    }
    Ok(())
}

/// `linear_many`: each output bit-equal to `linear` of its part on the same backend (and
/// within tolerance of the reference), for weights uploaded as weights (which CUDA reads ahead
/// of the previous kernel) and as plain tensors, with and without biases, K with and without a
/// remainder past the GEMV's unrolled steps, 1–8 parts (q/k/v, gate/up, KDA's six).
pub fn check_linear_many<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(21);
    let cases: &[(usize, usize, &[usize])] = &[
        (1, 2304, &[4096, 4096, 4096, 128, 32, 128]),
        (1, 4096, &[512, 128, 128]),
        (3, 1000, &[64, 200]),
        (2, 96, &[7, 1, 33, 5, 9, 2, 3, 4]),
        (9, 256, &[40, 24]),
    ];
    for &(m, k, ns) in cases {
        let x = rand_tensor(&mut rng, &[m, k], dt, 1.0)?;
        let xd = b.upload(&x)?;
        let mut host = Vec::new();
        let mut dev = Vec::new();
        for (i, &n) in ns.iter().enumerate() {
            let w = rand_tensor(&mut rng, &[n, k], dt, 0.5)?;
            let bias = if i % 2 == 1 {
                Some(rand_tensor(&mut rng, &[n], dt, 1.0)?)
            } else {
                None
            };
            let wd = if i % 3 == 2 {
                b.upload(&w)?
            } else {
                b.upload_weight(&w)?
            };
            let bd = bias.as_ref().map(|t| b.upload(t)).transpose()?;
            host.push((w, bias));
            dev.push((wd, bd));
        }
        let parts: Vec<_> = dev.iter().map(|(w, bias)| (w, bias.as_ref())).collect();
        let got = b.linear_many(&xd, &parts)?;
        ensure!(
            got.len() == ns.len(),
            "linear_many: {} outputs for {} parts",
            got.len(),
            ns.len()
        );
        for (i, ((w, bias), y)) in host.iter().zip(&got).enumerate() {
            let case = format!("{dt} x [{m}, {k}] part {i} of {ns:?}");
            let one = run(b, &b.linear(&xd, parts[i].0, parts[i].1)?)?;
            let many = run(b, y)?;
            ensure!(
                one.shape == many.shape && one.data == many.data,
                "linear_many {case}: not bit-equal to linear of the same part"
            );
            let want = reference::linear(&x, w, bias.as_ref())?;
            compare("linear_many", &case, &many, &want, tolerance(dt))?;
        }
    }
    Ok(())
}

/// `linear_each`: every output bit-equal to `linear` of its own input and weight on the same
/// backend and within tolerance of the reference; inputs of one shape (KDA's gate factors, CUDA's
/// one launch) and of different shapes (the fallback), weights uploaded as weights or not.
pub fn check_linear_each<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(22);
    // (rows and width of each input, rows of each weight)
    type Case = (&'static [(usize, usize)], &'static [usize]);
    let cases: &[Case] = &[
        (&[(1, 128), (1, 128)], &[4096, 4096]),
        (&[(3, 64), (3, 64), (3, 64)], &[40, 7, 96]),
        (&[(1, 96), (2, 96)], &[16, 16]),
        (&[(1, 32), (1, 48)], &[8, 8]),
    ];
    for &(xs, ns) in cases {
        let mut host = Vec::new();
        let mut dev = Vec::new();
        for (i, (&(m, k), &n)) in xs.iter().zip(ns).enumerate() {
            let x = rand_tensor(&mut rng, &[m, k], dt, 1.0)?;
            let w = rand_tensor(&mut rng, &[n, k], dt, 0.5)?;
            let wd = if i % 2 == 1 {
                b.upload(&w)?
            } else {
                b.upload_weight(&w)?
            };
            dev.push((b.upload(&x)?, wd));
            host.push((x, w));
        }
        let parts: Vec<_> = dev.iter().map(|(x, w)| (x, w)).collect();
        let got = b.linear_each(&parts)?;
        ensure!(
            got.len() == parts.len(),
            "linear_each: {} outputs for {} parts",
            got.len(),
            parts.len()
        );
        for (i, ((x, w), y)) in host.iter().zip(&got).enumerate() {
            let case = format!("{dt} part {i} of inputs {xs:?}, weight rows {ns:?}");
            let one = run(b, &b.linear(parts[i].0, parts[i].1, None)?)?;
            let each = run(b, y)?;
            ensure!(
                one.shape == each.shape && one.data == each.data,
                "linear_each {case}: not bit-equal to linear of the same part"
            );
            compare(
                "linear_each",
                &case,
                &each,
                &reference::linear(x, w, None)?,
                tolerance(dt),
            )?;
        }
    }
    Ok(())
}

/// `linear_silu_mul`: bit-equal to `linear` of both weights then `silu_mul` on the same backend
/// (and within tolerance of the reference), weights uploaded as weights or not, 1–8 rows, widths
/// with and without a remainder past the GEMV's unrolled steps.
pub fn check_linear_silu_mul<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(23);
    for &(m, k, f, as_weight) in &[
        (1usize, 2304usize, 1024usize, true),
        (1, 4096, 3000, false),
        (3, 1000, 64, true),
        (8, 256, 33, true),
        (9, 96, 40, false),
    ] {
        let x = rand_tensor(&mut rng, &[m, k], dt, 1.0)?;
        let wg = rand_tensor(&mut rng, &[f, k], dt, 0.5)?;
        let wu = rand_tensor(&mut rng, &[f, k], dt, 0.5)?;
        let up = |t: &HostTensor| {
            if as_weight {
                b.upload_weight(t)
            } else {
                b.upload(t)
            }
        };
        let (xd, gd, ud) = (b.upload(&x)?, up(&wg)?, up(&wu)?);
        let case = format!("{dt} x [{m}, {k}] w [{f}, {k}] weights {as_weight}");
        let got = run(b, &b.linear_silu_mul(&xd, &gd, &ud)?)?;
        let two = run(
            b,
            &b.silu_mul(&b.linear(&xd, &gd, None)?, &b.linear(&xd, &ud, None)?)?,
        )?;
        ensure!(
            got.data == two.data,
            "linear_silu_mul {case}: not bit-equal to linear, linear, silu_mul"
        );
        let want = reference::silu_mul(
            &reference::linear(&x, &wg, None)?,
            &reference::linear(&x, &wu, None)?,
        )?;
        compare("linear_silu_mul", &case, &got, &want, tolerance(dt))?;
    }
    Ok(())
}

/// `linear_add_rms_norm`: the sum and the normed rows bit-equal to `linear` then
/// `add_rms_norm` on the same backend. Output widths below 2 048 (the norm kernel's 256
/// threads) and from 2 048 (512), with an odd count of 8-value chunks per 2 048-wide step,
/// rows per block that do not divide the width; 1–9 rows (past the decode GEMV); with and
/// without a bias; weights uploaded as weights or not.
pub fn check_linear_add_rms_norm<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(31);
    let cases: &[(usize, usize, usize, bool)] = &[
        (1, 4096, 4096, false),
        (1, 1024, 2304, true),
        (2, 512, 3000, false),
        (3, 2048, 6144, true),
        (5, 264, 1000, false),
        (8, 1024, 4096, true),
        (9, 256, 512, false),
    ];
    for &(m, k, n, with_bias) in cases {
        let x = b.upload(&rand_tensor(&mut rng, &[m, k], dt, 2.0)?)?;
        let h = b.upload(&rand_tensor(&mut rng, &[m, n], dt, 2.0)?)?;
        let g = b.upload(&rand_tensor(&mut rng, &[n], dt, 1.5)?)?;
        let w = rand_tensor(&mut rng, &[n, k], dt, 0.5)?;
        let w = if with_bias {
            b.upload(&w)?
        } else {
            b.upload_weight(&w)?
        };
        let bias = with_bias
            .then(|| rand_tensor(&mut rng, &[n], dt, 1.0).and_then(|t| b.upload(&t)))
            .transpose()?;
        let case = format!("{dt} x [{m}, {k}], w [{n}, {k}], bias {with_bias}");
        let (sum, xn) = b.linear_add_rms_norm(&x, &w, bias.as_ref(), &h, &g, 1e-5)?;
        let y = b.linear(&x, &w, bias.as_ref())?;
        let (want_sum, want_xn) = b.add_rms_norm(&h, &y, &g, 1e-5)?;
        for (what, got, want) in [("sum", &sum, &want_sum), ("normed rows", &xn, &want_xn)] {
            let (got, want) = (run(b, got)?, run(b, want)?);
            ensure!(
                got.shape == want.shape && got.data == want.data,
                "linear_add_rms_norm {case}: the {what} are not bit-equal to linear then \
                 add_rms_norm's"
            );
        }
    }
    Ok(())
}

/// `rms_norm_linear_many` and `rms_norm_linear_silu_mul`: the sum and every output bit-equal
/// to `add_rms_norm` (or `rms_norm`) then `linear_many` / `linear_silu_mul` on the same backend.
/// Widths below 2 048 (the norm kernel's 256 threads), from 2 048 (512 threads: the fused CUDA
/// GEMV regroups its partial sums) with an even and an odd number of 2 048-wide steps and with
/// a remainder; 1–9 rows (past the decode GEMV, and rows that overflow its shared memory);
/// with and without the residual add, biases, weights uploaded as weights or not.
pub fn check_rms_norm_linear<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(24);
    let cases: &[(usize, usize, &[usize], bool)] = &[
        (1, 4096, &[512, 128, 128], true),
        (1, 2304, &[1024, 64], false),
        (2, 1000, &[64, 200], true),
        (3, 6144, &[96], true),
        (5, 4096, &[40, 24], false),
        (8, 512, &[33, 7], true),
        (9, 256, &[16, 8], true),
    ];
    for &(m, k, ns, add) in cases {
        let a = b.upload(&rand_tensor(&mut rng, &[m, k], dt, 2.0)?)?;
        let r = b.upload(&rand_tensor(&mut rng, &[m, k], dt, 2.0)?)?;
        let r = add.then_some(&r);
        let g = b.upload(&rand_tensor(&mut rng, &[k], dt, 1.5)?)?;
        let mut dev = Vec::new();
        for (i, &n) in ns.iter().enumerate() {
            let w = rand_tensor(&mut rng, &[n, k], dt, 0.5)?;
            let bias = (i % 2 == 1)
                .then(|| rand_tensor(&mut rng, &[n], dt, 1.0))
                .transpose()?;
            let wd = if i % 3 == 2 {
                b.upload(&w)?
            } else {
                b.upload_weight(&w)?
            };
            dev.push((wd, bias.as_ref().map(|t| b.upload(t)).transpose()?));
        }
        let parts: Vec<_> = dev.iter().map(|(w, bias)| (w, bias.as_ref())).collect();
        let case = format!("{dt} a [{m}, {k}], add {add}, parts {ns:?}");
        let (sum, x) = match r {
            Some(r) => {
                let (s, x) = b.add_rms_norm(&a, r, &g, 1e-5)?;
                (Some(s), x)
            }
            None => (None, b.rms_norm(&a, &g, 1e-5)?),
        };
        let same_sum = |fused: &Option<B::Tensor>, what: &str| -> Result<()> {
            ensure!(
                fused.is_some() == add,
                "{what} {case}: a sum returned {} the residual",
                if add { "without" } else { "with" }
            );
            if let (Some(f), Some(s)) = (fused, &sum) {
                ensure!(
                    run(b, f)?.data == run(b, s)?.data,
                    "{what} {case}: the sum is not bit-equal to add_rms_norm's"
                );
            }
            Ok(())
        };
        let (fsum, ys) = b.rms_norm_linear_many(&a, r, &g, 1e-5, &parts)?;
        same_sum(&fsum, "rms_norm_linear_many")?;
        let want = b.linear_many(&x, &parts)?;
        ensure!(
            ys.len() == ns.len(),
            "rms_norm_linear_many {case}: {} outputs",
            ys.len()
        );
        for (i, (y, w)) in ys.iter().zip(&want).enumerate() {
            let (y, w) = (run(b, y)?, run(b, w)?);
            ensure!(
                y.shape == w.shape && y.data == w.data,
                "rms_norm_linear_many {case} part {i}: not bit-equal to the norm then linear_many"
            );
        }
        let f = ns[0];
        let (wg, wu) = (
            b.upload_weight(&rand_tensor(&mut rng, &[f, k], dt, 0.5)?)?,
            b.upload_weight(&rand_tensor(&mut rng, &[f, k], dt, 0.5)?)?,
        );
        let (fsum, y) = b.rms_norm_linear_silu_mul(&a, r, &g, 1e-5, &wg, &wu)?;
        same_sum(&fsum, "rms_norm_linear_silu_mul")?;
        let (y, w) = (run(b, &y)?, run(b, &b.linear_silu_mul(&x, &wg, &wu)?)?);
        ensure!(
            y.shape == w.shape && y.data == w.data,
            "rms_norm_linear_silu_mul {case}: not bit-equal to the norm then linear_silu_mul"
        );
    }
    Ok(())
}

/// `add_rms_norm`: both outputs bit-equal to `add` then `rms_norm` on the same backend (and the
/// norm within tolerance of the reference), widths with and without a multiple of 8, one and
/// many rows, widths above and below 2 048.
pub fn check_add_rms_norm<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(22);
    for &(r, d) in &[
        (1usize, 4096usize),
        (3, 1000),
        (7, 33),
        (2, 2304),
        (64, 576),
    ] {
        let x = rand_tensor(&mut rng, &[r, d], dt, 2.0)?;
        let a = rand_tensor(&mut rng, &[r, d], dt, 2.0)?;
        let w = rand_tensor(&mut rng, &[d], dt, 1.5)?;
        let (xd, ad, wd) = (b.upload(&x)?, b.upload(&a)?, b.upload(&w)?);
        let (s, y) = b.add_rms_norm(&xd, &ad, &wd, 1e-5)?;
        let s2 = b.add(&xd, &ad)?;
        let y2 = b.rms_norm(&s2, &wd, 1e-5)?;
        let case = format!("{dt} [{r}, {d}]");
        let (s, y, s2, y2) = (run(b, &s)?, run(b, &y)?, run(b, &s2)?, run(b, &y2)?);
        ensure!(
            s.data == s2.data && y.data == y2.data,
            "add_rms_norm {case}: not bit-equal to add then rms_norm"
        );
        let want = reference::rms_norm(&s2, &w, 1e-5)?;
        compare("add_rms_norm", &case, &y, &want, tolerance(dt))?;
    }
    Ok(())
}

/// `rms_norm`: odd widths, one and many rows, per-head shape.
pub fn check_rms_norm<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(12);
    for &(r, d, eps) in &[
        (1usize, 576usize, 1e-5f32),
        (7, 1000, 1e-6),
        (36, 64, 1e-6),
        (3, 33, 1e-5),
        (2, 4096, 1e-5),
    ] {
        let x = rand_tensor(&mut rng, &[r, d], dt, 2.0)?;
        let w = rand_tensor(&mut rng, &[d], dt, 1.5)?;
        let want = reference::rms_norm(&x, &w, eps)?;
        let got = b.rms_norm(&b.upload(&x)?, &b.upload(&w)?, eps)?;
        compare(
            "rms_norm",
            &format!("{dt} x [{r}, {d}] eps {eps}"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// `rope`: both styles, `rot_dim < hd`, `mscale ≠ 1`, positions up to a few thousand.
pub fn check_rope<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(13);
    let cases: &[(usize, usize, usize, usize, RopeStyle, f32)] = &[
        (5, 4, 64, 64, RopeStyle::HalfSplit, 1.0),
        (5, 4, 64, 64, RopeStyle::Interleaved, 1.0),
        (3, 2, 128, 64, RopeStyle::HalfSplit, 1.0),
        (7, 3, 192, 64, RopeStyle::Interleaved, 1.2),
        (4, 5, 128, 32, RopeStyle::HalfSplit, 0.7),
        (9, 1, 64, 16, RopeStyle::Interleaved, 1.0),
    ];
    for &(n, h, hd, rot, style, mscale) in cases {
        let x = rand_tensor(&mut rng, &[n, h, hd], dt, 1.0)?;
        let pos: Vec<u32> = (0..n)
            .map(|i| if i == 0 { 0 } else { rng.below(4096) as u32 })
            .collect();
        let pos = HostTensor::from_u32(vec![n], &pos)?;
        let base = 10000f32;
        let inv: Vec<f32> = (0..rot / 2)
            .map(|i| base.powf(-((2 * i) as f32) / rot as f32))
            .collect();
        let inv = HostTensor::from_f32(vec![rot / 2], &inv)?;
        let want = reference::rope(&x, &pos, &inv, rot, style, mscale)?;
        let got = b.rope(
            &b.upload(&x)?,
            &b.upload(&pos)?,
            &b.upload(&inv)?,
            rot,
            style,
            mscale,
        )?;
        let case = format!("{dt} x [{n}, {h}, {hd}] rot_dim {rot} {style:?} mscale {mscale}");
        compare("rope", &case, &run(b, &got)?, &want, tolerance(dt))?;
        // rope_pair with keys of fewer heads (GQA): each output bit-equal to its own rope.
        let hk = h.div_ceil(2);
        let k = rand_tensor(&mut rng, &[n, hk, hd], dt, 1.0)?;
        let (pd, id) = (b.upload(&pos)?, b.upload(&inv)?);
        let (q2, k2) = b.rope_pair(&b.upload(&x)?, &b.upload(&k)?, &pd, &id, rot, style, mscale)?;
        let k1 = b.rope(&b.upload(&k)?, &pd, &id, rot, style, mscale)?;
        ensure!(
            run(b, &q2)?.data == run(b, &got)?.data && run(b, &k2)?.data == run(b, &k1)?.data,
            "rope_pair {case} (keys [{n}, {hk}, {hd}]): not bit-equal to rope of each"
        );
    }
    Ok(())
}

/// `silu_mul`: odd sizes, large |gate| (saturation of the sigmoid).
pub fn check_silu_mul<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(14);
    for &(m, f) in &[(1usize, 1536usize), (5, 1001), (16, 37)] {
        let g = rand_tensor(&mut rng, &[m, f], dt, 12.0)?;
        let u = rand_tensor(&mut rng, &[m, f], dt, 2.0)?;
        let want = reference::silu_mul(&g, &u)?;
        let got = b.silu_mul(&b.upload(&g)?, &b.upload(&u)?)?;
        compare(
            "silu_mul",
            &format!("{dt} [{m}, {f}]"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// `silu_mul_limit`: both clamps active (|gate|, |up| well past the limit), odd sizes.
pub fn check_silu_mul_limit<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(15);
    let limit = 7.0f32;
    for &(m, f) in &[(1usize, 1536usize), (5, 1001)] {
        let g = rand_tensor(&mut rng, &[m, f], dt, 12.0)?;
        let u = rand_tensor(&mut rng, &[m, f], dt, 12.0)?;
        let want = reference::silu_mul_limit(&g, &u, limit)?;
        let got = b.silu_mul_limit(&b.upload(&g)?, &b.upload(&u)?, limit)?;
        compare(
            "silu_mul_limit",
            &format!("{dt} [{m}, {f}]"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// `add`: odd sizes, rank 2 and 3.
pub fn check_add<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(15);
    for shape in [vec![1usize, 576usize], vec![5, 1001], vec![3, 4, 7]] {
        let x = rand_tensor(&mut rng, &shape, dt, 3.0)?;
        let y = rand_tensor(&mut rng, &shape, dt, 3.0)?;
        let want = reference::add(&x, &y)?;
        let got = b.add(&b.upload(&x)?, &b.upload(&y)?)?;
        compare(
            "add",
            &format!("{dt} {shape:?}"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// `to_f32`: every value of a `dt` tensor arrives in f32 unchanged (the widening is exact), in
/// the same shape, including a size that is not a multiple of the vector width.
pub fn check_to_f32<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(17);
    for shape in [vec![3, 1001], vec![1, 7], vec![2, 4, 64]] {
        let x = rand_tensor(&mut rng, &shape, dt, 5.0)?;
        let got = b.download(&b.to_f32(&b.upload(&x)?)?)?;
        ensure!(
            got.dtype == DType::F32 && got.shape == shape,
            "to_f32: {dt} {shape:?} gave {} {:?}",
            got.dtype,
            got.shape
        );
        ensure!(
            got.to_f32() == x.to_f32(),
            "to_f32: {dt} {shape:?}: values changed in the widening"
        );
    }
    Ok(())
}

/// `stream_mix`: odd sizes (D not a multiple of 8, one stream, one output, more outputs than
/// inputs), the hyper-connection shapes (4 → 1, 4 → 4, 1 → 4), and `x` reached through
/// `reshape` of an `[N, S·D]` tensor as the hyper-connections use it.
pub fn check_stream_mix<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(16);
    // (N, S, D, M)
    let cases: &[(usize, usize, usize, usize)] = &[
        (1, 4, 1001, 1),
        (3, 4, 37, 4),
        (5, 1, 257, 4),
        (2, 5, 9, 3),
        (7, 4, 512, 4),
        (4, 2, 1, 6),
    ];
    for &(n, s, d, m) in cases {
        let x = rand_tensor(&mut rng, &[n, s * d], dt, 3.0)?;
        let w = rand_tensor(&mut rng, &[n, s, m], DType::F32, 2.0)?;
        let x3 = HostTensor::from_f32_as(vec![n, s, d], &x.to_f32(), dt)?;
        let want = reference::stream_mix(&x3, &w)?;
        let xd = b.reshape(&b.upload(&x)?, &[n, s, d])?;
        let got = b.stream_mix(&xd, &b.upload(&w)?)?;
        compare(
            "stream_mix",
            &format!("{dt} x [{n}, {s}, {d}] w [{n}, {s}, {m}]"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    // Bad shapes are errors, not panics.
    let x = b.upload(&rand_tensor(&mut rng, &[2, 3, 5], dt, 1.0)?)?;
    let w = b.upload(&rand_tensor(&mut rng, &[2, 4, 1], DType::F32, 1.0)?)?;
    ensure!(
        b.stream_mix(&x, &w).is_err(),
        "stream_mix: w [2, 4, 1] for x [2, 3, 5] must be refused"
    );
    Ok(())
}

/// A paged-attention scenario: heads, head dims, block size and per-sequence
/// `(tokens already cached, new tokens this step)`.
#[derive(Clone, Debug)]
pub struct AttnCase {
    /// Query heads.
    pub h: usize,
    /// KV heads.
    pub hkv: usize,
    /// Key (and query) head width.
    pub hd_k: usize,
    /// Value head width.
    pub hd_v: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// `(context already in the cache, new tokens)` per sequence.
    pub seqs: Vec<(usize, usize)>,
    /// Extra unused blocks in the pool (filled with junk the kernel must not read).
    pub spare_blocks: usize,
}

impl AttnCase {
    /// Builds the step metadata with scattered (shuffled) block ids; returns it and the number
    /// of blocks in the pool.
    pub fn meta(&self, rng: &mut Rng) -> (StepMeta, usize) {
        let bs = self.block_size;
        let need: Vec<usize> = self
            .seqs
            .iter()
            .map(|&(c, n)| (c + n).div_ceil(bs))
            .collect();
        let total = need.iter().sum::<usize>() + self.spare_blocks;
        let mut ids: Vec<u32> = (0..total as u32).collect();
        rng.shuffle(&mut ids);
        let max_blocks = need.iter().copied().max().unwrap_or(1).max(1);
        let mut m = StepMeta {
            max_blocks,
            block_size: bs,
            ..Default::default()
        };
        m.block_tables = vec![0; self.seqs.len() * max_blocks];
        let mut next = 0;
        m.query_start.push(0);
        for (s, &(ctx, new)) in self.seqs.iter().enumerate() {
            for j in 0..need[s] {
                m.block_tables[s * max_blocks + j] = ids[next];
                next += 1;
            }
            for p in ctx..ctx + new {
                m.positions.push(p as u32);
                m.token_seq.push(s as u32);
                let blk = m.block_tables[s * max_blocks + p / bs];
                m.slot_mapping.push(blk * bs as u32 + (p % bs) as u32);
            }
            m.seq_lens.push((ctx + new) as u32);
            m.query_start.push(m.positions.len() as u32);
            m.logit_rows.push(m.positions.len() as u32 - 1);
            m.max_seq_len = m.max_seq_len.max(ctx + new);
        }
        (m, total)
    }

    fn describe(&self) -> String {
        format!(
            "H {} Hkv {} hd_k {} hd_v {} bs {} seqs (ctx,new) {:?}",
            self.h, self.hkv, self.hd_k, self.hd_v, self.block_size, self.seqs
        )
    }
}

/// The scenarios used by [`check_write_kv`] and [`check_paged_attention`]: GQA ratios 1/3/4,
/// mixed decode and (chunked) prefill sequences of different lengths in one step, a prefill chunk
/// starting mid-sequence, block size 16, head dims 64/128 and `hd_k ≠ hd_v`.
pub fn attention_cases() -> Vec<AttnCase> {
    let c = |h, hkv, hd_k, hd_v, seqs: &[(usize, usize)]| AttnCase {
        h,
        hkv,
        hd_k,
        hd_v,
        block_size: 16,
        seqs: seqs.to_vec(),
        spare_blocks: 3,
    };
    vec![
        c(4, 4, 64, 64, &[(37, 1), (20, 13), (0, 9), (0, 1), (130, 1)]),
        c(6, 2, 128, 128, &[(5, 1), (16, 16), (47, 3)]),
        c(8, 2, 64, 64, &[(0, 17), (100, 1), (31, 2)]),
        c(4, 2, 128, 64, &[(3, 5), (64, 1)]),
        c(4, 4, 192, 128, &[(0, 3), (15, 1)]),
        c(9, 3, 64, 64, &[(300, 1), (250, 20)]),
    ]
}

/// `write_kv`: scatter into caches pre-filled with random values; everything else unchanged.
pub fn check_write_kv<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(16);
    for case in attention_cases() {
        let (meta, blocks) = case.meta(&mut rng);
        let n = meta.num_tokens();
        let (hkv, bs) = (case.hkv, case.block_size);
        let k = rand_tensor(&mut rng, &[n, hkv, case.hd_k], dt, 1.0)?;
        let v = rand_tensor(&mut rng, &[n, hkv, case.hd_v], dt, 1.0)?;
        let mut kc = rand_tensor(&mut rng, &[blocks, bs, hkv, case.hd_k], dt, 1.0)?;
        let mut vc = rand_tensor(&mut rng, &[blocks, bs, hkv, case.hd_v], dt, 1.0)?;
        let (kcd, vcd) = (b.upload(&kc)?, b.upload(&vc)?);
        let dmeta = b.upload_meta(meta.clone())?;
        b.write_kv(&b.upload(&k)?, &b.upload(&v)?, &kcd, &vcd, &dmeta)?;
        reference::write_kv(&k, &v, &mut kc, &mut vc, &meta)?;
        let case_s = format!("{dt} {}", case.describe());
        compare("write_kv (k_cache)", &case_s, &run(b, &kcd)?, &kc, 0.0)?;
        compare("write_kv (v_cache)", &case_s, &run(b, &vcd)?, &vc, 0.0)?;
    }
    Ok(())
}

/// `rope_write_kv`: the rotated queries and both caches bit-equal to `rope_pair` then
/// `write_kv` on the same backend, over the attention cases (padding tokens included), both
/// pairing styles, whole and partial rotation.
pub fn check_rope_write_kv<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(25);
    for (i, case) in attention_cases().into_iter().enumerate() {
        let (meta, blocks) = case.meta(&mut rng);
        let n = meta.num_tokens();
        let (h, hkv, hd, bs) = (case.h, case.hkv, case.hd_k, case.block_size);
        let (style, rot) = if i % 2 == 0 {
            (RopeStyle::HalfSplit, hd & !1)
        } else {
            (RopeStyle::Interleaved, (hd / 2) & !1)
        };
        let inv: Vec<f32> = (0..rot / 2)
            .map(|j| 10000f32.powf(-((2 * j) as f32) / rot.max(1) as f32))
            .collect();
        let inv = b.upload(&HostTensor::from_f32(vec![rot / 2], &inv)?)?;
        let q = b.upload(&rand_tensor(&mut rng, &[n, h, hd], dt, 1.0)?)?;
        let k = b.upload(&rand_tensor(&mut rng, &[n, hkv, hd], dt, 1.0)?)?;
        let v = b.upload(&rand_tensor(&mut rng, &[n, hkv, case.hd_v], dt, 1.0)?)?;
        let kc = rand_tensor(&mut rng, &[blocks, bs, hkv, hd], dt, 1.0)?;
        let vc = rand_tensor(&mut rng, &[blocks, bs, hkv, case.hd_v], dt, 1.0)?;
        let (kc1, vc1, kc2, vc2) = (
            b.upload(&kc)?,
            b.upload(&vc)?,
            b.upload(&kc)?,
            b.upload(&vc)?,
        );
        let dmeta = b.upload_meta(meta.clone())?;
        let (mscale, pos) = (1.0, &dmeta.positions);
        let (q1, k1) = b.rope_pair(&q, &k, pos, &inv, rot, style, mscale)?;
        b.write_kv(&k1, &v, &kc1, &vc1, &dmeta)?;
        let args = RopeArgs {
            inv_freq: &inv,
            rot_dim: rot,
            style,
            mscale,
        };
        let q2 = b.rope_write_kv(&q, &k, &v, args, &kc2, &vc2, &dmeta)?;
        let what = format!(
            "rope_write_kv {dt} {} rot_dim {rot} {style:?}",
            case.describe()
        );
        ensure!(
            run(b, &q1)?.data == run(b, &q2)?.data,
            "{what}: queries not bit-equal to rope_pair's"
        );
        ensure!(
            run(b, &kc1)?.data == run(b, &kc2)?.data && run(b, &vc1)?.data == run(b, &vc2)?.data,
            "{what}: caches not bit-equal to rope_pair then write_kv"
        );
    }
    Ok(())
}

/// `paged_attention`: caches with random history plus this step's keys; unused slots hold junk.
pub fn check_paged_attention<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(17);
    for case in attention_cases() {
        let (meta, blocks) = case.meta(&mut rng);
        let n = meta.num_tokens();
        let (h, hkv, bs) = (case.h, case.hkv, case.block_size);
        // Larger q makes the softmax peaky, which exercises the online-softmax rescaling.
        let q = rand_tensor(&mut rng, &[n, h, case.hd_k], dt, 3.0)?;
        let kc = rand_tensor(&mut rng, &[blocks, bs, hkv, case.hd_k], dt, 1.0)?;
        let vc = rand_tensor(&mut rng, &[blocks, bs, hkv, case.hd_v], dt, 1.0)?;
        let scale = 1.0 / (case.hd_k as f32).sqrt();
        let want = reference::paged_attention(&q, &kc, &vc, &meta, scale)?;
        let dmeta = b.upload_meta(meta.clone())?;
        let got = b.paged_attention(
            &b.upload(&q)?,
            &b.upload(&kc)?,
            &b.upload(&vc)?,
            &dmeta,
            scale,
        )?;
        compare(
            "paged_attention",
            &format!("{dt} {}", case.describe()),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// `token_logprob_rows`: vocabulary-sized and odd rows, a target at the maximum, at the first
/// and last column, rows of large magnitude (the log-sum-exp must be taken about the maximum).
pub fn check_token_logprob_rows<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(19);
    for &(r, v, scale, shift) in &[
        (1usize, 49152usize, 4.0f32, 0.0f32),
        (5, 1001, 2.0, 30.0),
        (3, 7, 1.0, -80.0),
        (2, 128256, 8.0, 0.0),
    ] {
        let vals: Vec<f32> = rng.vec(r * v, scale).iter().map(|x| x + shift).collect();
        let x = HostTensor::from_f32_as(vec![r, v], &vals, dt)?;
        let xs = x.to_f32();
        let t: Vec<u32> = (0..r)
            .map(|i| match i % 4 {
                0 => 0,
                1 => v as u32 - 1,
                2 => {
                    let row = &xs[i * v..(i + 1) * v];
                    (0..v)
                        .max_by(|&a, &c| row[a].total_cmp(&row[c]))
                        .unwrap_or(0) as u32
                }
                _ => rng.below(v) as u32,
            })
            .collect();
        let targets = HostTensor::from_u32(vec![r], &t)?;
        let want = reference::token_logprob_rows(&x, &targets)?;
        let got = run(
            b,
            &b.token_logprob_rows(&b.upload(&x)?, &b.upload(&targets)?)?,
        )?;
        // Log-probabilities near 0 make a relative test meaningless: absolute, in f32.
        let (g, w) = (got.to_f32(), want.to_f32());
        ensure!(
            got.shape == want.shape,
            "token_logprob_rows: shape {:?}, want {:?}",
            got.shape,
            want.shape
        );
        for (i, (a, c)) in g.iter().zip(&w).enumerate() {
            ensure!(
                (a - c).abs() <= 1e-4 * (1.0 + c.abs()),
                "token_logprob_rows ({dt} [{r}, {v}]) row {i}: got {a}, want {c}"
            );
        }
    }
    Ok(())
}

/// `argmax`: ties (first index wins), odd and vocabulary-sized rows, negative rows.
pub fn check_argmax<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(18);
    for &(r, v) in &[
        (1usize, 49152usize),
        (4, 1001),
        (3, 7),
        (2, 128256),
        (5, 64),
    ] {
        // Values from a small integer set so that ties are frequent (exact in bf16 too).
        let mut vals: Vec<f32> = (0..r * v).map(|_| (rng.below(9) as f32) - 20.0).collect();
        for i in 0..r {
            // Plant a tied maximum at two places, earlier one first; row 0 keeps only ties.
            let a = rng.below(v);
            let c = rng.below(v);
            if i > 0 {
                vals[i * v + a] = 3.0;
                vals[i * v + c] = 3.0;
            }
        }
        let x = HostTensor::from_f32_as(vec![r, v], &vals, dt)?;
        let want = reference::argmax(&x)?;
        let got = run(b, &b.argmax(&b.upload(&x)?)?)?;
        ensure!(
            got.dtype == DType::U32,
            "argmax [{r}, {v}]: output dtype {}, expected u32",
            got.dtype
        );
        ensure!(
            got.shape == want.shape && got.to_u32()? == want.to_u32()?,
            "argmax ({dt} [{r}, {v}]): got {:?}, want {:?}",
            got.to_u32()?,
            want.to_u32()?
        );
    }
    Ok(())
}

/// Runs the MLA and MoE checks ([`check_head_linear`], [`check_write_cache`],
/// [`check_paged_latent_attention`], [`check_moe_route`], [`check_rms_norm_moe_route`],
/// [`check_moe_experts`], [`check_moe_experts_shared`]) for the
/// backend's f32 activation dtype and, if different, its bf16 one.
pub fn check_mla_moe<B: Backend>(b: &B) -> Result<()> {
    let mut dts = vec![b.activation_dtype(DType::F32)];
    let low = b.activation_dtype(DType::BF16);
    if low != dts[0] {
        dts.push(low);
    }
    for dt in dts {
        check_head_linear(b, dt)?;
        check_write_cache(b, dt)?;
        check_paged_latent_attention(b, dt)?;
        check_moe_route(b, dt)?;
        check_rms_norm_moe_route(b, dt)?;
        check_moe_experts(b, dt)?;
        check_moe_experts_shared(b, dt)?;
    }
    Ok(())
}

/// `rms_norm_moe_route`: the sum, the normed rows, the ids and the weights bit-equal to
/// `rms_norm_of` then `moe_route`, with and without a residual, at decode sizes (where CUDA runs
/// one launch for 16-bit activations) and above them; the shapes of Kimi-Linear (D 2304, 256 experts, top-8, one
/// group), DeepSeek-V3's grouping and Kimi-K2's 384 experts with D cut down.
pub fn check_rms_norm_moe_route<B: Backend>(b: &B, dt: DType) -> Result<()> {
    use crate::MoeRouting;
    let mut rng = Rng::new(31);
    let rt = |top_k, n_group, topk_group| MoeRouting {
        top_k,
        n_group,
        topk_group,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
    };
    // (N, D, E, routing, residual, bias)
    let cases = [
        (1usize, 2304usize, 256usize, rt(8, 1, 1), true, true),
        (1, 2304, 256, rt(8, 1, 1), false, true),
        (3, 1024, 256, rt(8, 8, 4), true, true),
        (8, 512, 384, rt(8, 1, 1), true, false),
        (2, 1000, 64, rt(6, 8, 3), true, true),
        (12, 256, 16, rt(4, 4, 2), true, true),
    ];
    for (n, d, e, routing, add, has_bias) in cases {
        let a = b.upload(&rand_tensor(&mut rng, &[n, d], dt, 2.0)?)?;
        let r = b.upload(&rand_tensor(&mut rng, &[n, d], dt, 2.0)?)?;
        let r = add.then_some(&r);
        let g = b.upload(&rand_tensor(&mut rng, &[d], dt, 1.5)?)?;
        let gate_w = rand_tensor(&mut rng, &[e, d], DType::F32, 4.5 / (d as f32).sqrt())?;
        let gate_w = b.upload_weight(&gate_w)?;
        let bias = rand_tensor(&mut rng, &[e], DType::F32, 0.3)?;
        let bias = has_bias.then(|| b.upload(&bias)).transpose()?;
        let case = format!("{dt} a [{n}, {d}], add {add}, E {e}, {routing:?}");
        let fused = b.rms_norm_moe_route(&a, r, &g, 1e-5, &gate_w, bias.as_ref(), &routing)?;
        let (sum, x) = b.rms_norm_of(&a, r, &g, 1e-5)?;
        let (ids, w) = b.moe_route(&x, &gate_w, bias.as_ref(), &routing)?;
        ensure!(
            fused.sum.is_some() == add,
            "rms_norm_moe_route {case}: a sum returned {} the residual",
            if add { "without" } else { "with" }
        );
        if let (Some(f), Some(s)) = (&fused.sum, &sum) {
            ensure!(
                run(b, f)?.data == run(b, s)?.data,
                "rms_norm_moe_route {case}: the sum is not bit-equal to add_rms_norm's"
            );
        }
        for (what, got, want) in [
            ("the normed rows", &fused.x, &x),
            ("the ids", &fused.ids, &ids),
            ("the weights", &fused.weights, &w),
        ] {
            let (got, want) = (run(b, got)?, run(b, want)?);
            ensure!(
                got.shape == want.shape && got.data == want.data,
                "rms_norm_moe_route {case}: {what} are not bit-equal to the norm then moe_route"
            );
        }
    }
    Ok(())
}

/// `head_linear`: decode and prefill token counts, odd K and O, the shapes MLA uses
/// (`W_UKᵀ` `[H, L, dn]`, `W_UV` `[H, dv, L]` of the tiny test model and of DeepSeek-V3 with
/// fewer heads), O = 1.
pub fn check_head_linear<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(20);
    // (N, H, K, O)
    let cases: &[(usize, usize, usize, usize)] = &[
        (1, 4, 16, 32),
        (13, 4, 32, 16),
        (5, 3, 33, 7),
        (1, 8, 128, 512),
        (3, 8, 512, 128),
        (17, 2, 40, 1),
        (2, 5, 8, 9),
    ];
    for &(n, h, k, o) in cases {
        let x = rand_tensor(&mut rng, &[n, h, k], dt, 1.0)?;
        let w = rand_tensor(&mut rng, &[h, o, k], dt, 2.0 / (k as f32).sqrt())?;
        let want = reference::head_linear(&x, &w)?;
        let got = b.head_linear(&b.upload(&x)?, &b.upload(&w)?)?;
        compare(
            "head_linear",
            &format!("{dt} x [{n}, {h}, {k}] w [{h}, {o}, {k}]"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// An MLA attention scenario: heads, latent width `L`, rotary width `R`, block size and
/// per-sequence `(tokens already cached, new tokens this step)`.
#[derive(Clone, Debug)]
pub struct LatentCase {
    /// Query heads `H`.
    pub h: usize,
    /// Latent (`kv_lora_rank`) width `L`.
    pub l: usize,
    /// Rotary width `R`.
    pub r: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// `(context already in the cache, new tokens)` per sequence.
    pub seqs: Vec<(usize, usize)>,
}

impl LatentCase {
    /// Step metadata with scattered block ids (as [`AttnCase::meta`], 3 spare junk blocks) and
    /// the number of blocks in the pool.
    pub fn meta(&self, rng: &mut Rng) -> (StepMeta, usize) {
        AttnCase {
            h: self.h,
            hkv: 1,
            hd_k: self.l + self.r,
            hd_v: self.l,
            block_size: self.block_size,
            seqs: self.seqs.clone(),
            spare_blocks: 3,
        }
        .meta(rng)
    }

    fn describe(&self) -> String {
        format!(
            "H {} L {} R {} bs {} seqs (ctx,new) {:?}",
            self.h, self.l, self.r, self.block_size, self.seqs
        )
    }
}

/// The scenarios of [`check_write_cache`] and [`check_paged_latent_attention`]: the tiny test
/// model's widths (L 32, R 8), DeepSeek-V3's (L 512, R 64), widths that are not multiples of 4,
/// block sizes 16, 4 and 1, mixed decode and (chunked) prefill sequences of different lengths in
/// one step, chunks starting mid-sequence and mid-block.
pub fn latent_cases() -> Vec<LatentCase> {
    let c = |h, l, r, block_size, seqs: &[(usize, usize)]| LatentCase {
        h,
        l,
        r,
        block_size,
        seqs: seqs.to_vec(),
    };
    vec![
        c(4, 32, 8, 16, &[(37, 1), (20, 13), (0, 9), (0, 1), (130, 1)]),
        c(16, 512, 64, 16, &[(5, 1), (47, 3)]),
        c(3, 36, 12, 4, &[(0, 17), (9, 2), (3, 1)]),
        c(2, 30, 6, 16, &[(15, 2), (0, 5)]),
        c(8, 128, 32, 1, &[(6, 3), (0, 1)]),
        c(5, 64, 16, 16, &[(300, 1), (250, 20)]),
    ]
}

/// `write_cache`: the two column ranges MLA writes (`[c_kv | k_pe]`) into a cache pre-filled with
/// random values, plus an odd column range; everything else must stay unchanged (exact compare).
pub fn check_write_cache<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(21);
    for case in latent_cases() {
        let (meta, blocks) = case.meta(&mut rng);
        let n = meta.num_tokens();
        let (l, r, bs) = (case.l, case.r, case.block_size);
        let w = l + r;
        let mut cache = rand_tensor(&mut rng, &[blocks, bs, w], dt, 1.0)?;
        let cd = b.upload(&cache)?;
        let dmeta = b.upload_meta(meta.clone())?;
        // [c_kv | k_pe], then an odd range straddling both (col 3, width L − 1).
        for (col, width) in [(0, l), (l, r), (3, l - 1)] {
            let x = rand_tensor(&mut rng, &[n, width], dt, 1.0)?;
            b.write_cache(&b.upload(&x)?, &cd, col, &dmeta)?;
            reference::write_cache(&x, &mut cache, col, &meta)?;
        }
        compare(
            "write_cache",
            &format!("{dt} {}", case.describe()),
            &run(b, &cd)?,
            &cache,
            0.0,
        )?;
    }
    Ok(())
}

/// `paged_latent_attention`: caches with random history plus this step's rows; unused slots hold
/// junk; q scaled up so that the softmax is peaky (exercises online-softmax rescaling).
pub fn check_paged_latent_attention<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(22);
    for case in latent_cases() {
        let (meta, blocks) = case.meta(&mut rng);
        let n = meta.num_tokens();
        let (h, l, r, bs) = (case.h, case.l, case.r, case.block_size);
        let q_lat = rand_tensor(&mut rng, &[n, h, l], dt, 2.0)?;
        let q_rope = rand_tensor(&mut rng, &[n, h, r], dt, 2.0)?;
        let cache = rand_tensor(&mut rng, &[blocks, bs, l + r], dt, 1.0)?;
        let scale = 1.0 / ((l / 4 + r) as f32).sqrt();
        let want = reference::paged_latent_attention(&q_lat, &q_rope, &cache, &meta, scale)?;
        let dmeta = b.upload_meta(meta.clone())?;
        let got = b.paged_latent_attention(
            &b.upload(&q_lat)?,
            &b.upload(&q_rope)?,
            &b.upload(&cache)?,
            &dmeta,
            scale,
        )?;
        compare(
            "paged_latent_attention",
            &format!("{dt} {}", case.describe()),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// Smallest gap between choice scores that decides a routing (f64 estimate from the inputs as the
/// backend sees them): between the `topk_group`-th and next group score, and between consecutive
/// entries of the top `k + 1` choice scores after group masking (masked entries excluded: they tie
/// at −∞ and are ordered by index).
fn route_margin(choice: &[f64], r: &crate::MoeRouting) -> f64 {
    let e = choice.len();
    let g = r.n_group.max(1);
    let per = e / g;
    let mut margin = f64::INFINITY;
    let mut c = choice.to_vec();
    if g > 1 {
        let mut gs: Vec<(usize, f64)> = (0..g)
            .map(|gi| {
                let mut v = c[gi * per..(gi + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                (gi, v.iter().take(2).sum())
            })
            .collect();
        gs.sort_by(|a, b| b.1.total_cmp(&a.1));
        if r.topk_group < g {
            margin = margin.min(gs[r.topk_group - 1].1 - gs[r.topk_group].1);
        }
        let keep: Vec<usize> = gs[..r.topk_group].iter().map(|x| x.0).collect();
        for (i, v) in c.iter_mut().enumerate() {
            if !keep.contains(&(i / per)) {
                *v = f64::NEG_INFINITY;
            }
        }
    }
    c.sort_by(|a, b| b.total_cmp(a));
    for i in 0..r.top_k.min(e - 1) {
        if c[i + 1].is_finite() {
            margin = margin.min(c[i] - c[i + 1]);
        }
    }
    margin
}

/// `moe_route`: `n_group` 1 and > 1, `topk_group < n_group` and `= n_group`, with and without
/// bias, `norm_topk_prob` on and off, `routed_scaling_factor` ≠ 1, odd `D`, DeepSeek-V3's
/// 256 experts / 8 groups / top-8. Ids must match exactly and in order (descending choice score,
/// ties by lower index); weights within the tolerance.
///
/// Random rows are resampled until every decision has a margin of at least 2e-3 in choice score
/// (see `route_margin`), so that float rounding (a different summation order in `x · gate_wᵀ`,
/// a different `exp`) cannot flip a choice. One more case builds exact ties on purpose: one-hot
/// `x` rows make the logits exactly the chosen `gate_w` entries (no rounding in the dot product),
/// with equal logits within groups and equal group scores, so the tie-breaking is checked too.
pub fn check_moe_route<B: Backend>(b: &B, dt: DType) -> Result<()> {
    use crate::MoeRouting;
    let mut rng = Rng::new(23);
    let rt = |top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor| MoeRouting {
        top_k,
        n_group,
        topk_group,
        norm_topk_prob,
        routed_scaling_factor,
    };
    // (N, D, E, routing, bias)
    let cases: Vec<(usize, usize, usize, MoeRouting, bool)> = vec![
        (5, 37, 16, rt(4, 4, 2, true, 2.5), true),
        (13, 64, 16, rt(4, 4, 2, true, 2.5), true),
        (3, 64, 8, rt(2, 1, 1, false, 1.0), false),
        (7, 129, 64, rt(6, 8, 3, true, 2.5), true),
        (1, 256, 256, rt(8, 8, 4, true, 2.5), true),
        (4, 33, 32, rt(8, 4, 1, false, 1.5), true),
        (9, 20, 12, rt(3, 1, 1, true, 1.0), true),
        (2, 48, 60, rt(1, 6, 6, true, 1.0), false),
        (6, 16, 24, rt(5, 3, 2, false, 0.5), false),
    ];
    const MARGIN: f64 = 2e-3;
    for (n, d, e, routing, has_bias) in cases {
        let gate = HostTensor::from_f32(vec![e, d], &rng.vec(e * d, 4.5 / (d as f32).sqrt()))?;
        let bias_v = rng.vec(e, 0.3);
        let bias = if has_bias {
            Some(HostTensor::from_f32(vec![e], &bias_v)?)
        } else {
            None
        };
        let gv = gate.to_f32();
        let mut rows = Vec::with_capacity(n * d);
        for t in 0..n {
            let mut tries = 0;
            loop {
                // Round through the activation dtype: the margin must hold for what the backend sees.
                let row = HostTensor::from_f32_as(vec![d], &rng.vec(d, 1.0), dt)?.to_f32();
                let choice: Vec<f64> = (0..e)
                    .map(|i| {
                        let l: f64 = row
                            .iter()
                            .zip(&gv[i * d..(i + 1) * d])
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum();
                        let s = 1.0 / (1.0 + (-l).exp());
                        s + if has_bias { bias_v[i] as f64 } else { 0.0 }
                    })
                    .collect();
                if route_margin(&choice, &routing) >= MARGIN {
                    rows.extend_from_slice(&row);
                    break;
                }
                tries += 1;
                ensure!(
                    tries < 10_000,
                    "check_moe_route: could not draw row {t} with a clear margin"
                );
            }
        }
        let x = HostTensor::from_f32_as(vec![n, d], &rows, dt)?;
        let case = format!("{dt} x [{n}, {d}] E {e} {routing:?} bias {has_bias}");
        compare_route(b, &case, &x, &gate, bias.as_ref(), &routing)?;
    }

    // Exact ties: E 16 in 4 groups of 4, one-hot rows (token t reads column t of gate_w), whose
    // logits are the groups below rotated by t groups. Group top-2 sums: three groups tie at
    // 2σ(2) for two places (lower group index wins), one group holds the largest logit 3 but
    // scores σ(3) + σ(−2) and is dropped; within the kept groups four experts tie at σ(2).
    let base: [f32; 16] = [
        1.0, 2.0, 2.0, -1.0, // top-2 2σ(2)
        2.0, -1.0, 2.0, 0.0, // top-2 2σ(2)
        2.0, 2.0, 0.0, 0.0, // top-2 2σ(2)
        3.0, -2.0, -2.0, -2.0, // top-2 σ(3) + σ(−2), dropped
    ];
    let (n, d, e) = (4usize, 5usize, 16usize);
    let mut gv = vec![0f32; e * d];
    let mut xv = vec![0f32; n * d];
    for t in 0..n {
        xv[t * d + t] = 1.0;
        for i in 0..e {
            gv[i * d + t] = base[(i + 4 * t) % e];
        }
    }
    let gate = HostTensor::from_f32(vec![e, d], &gv)?;
    let x = HostTensor::from_f32_as(vec![n, d], &xv, dt)?;
    for routing in [rt(5, 4, 2, true, 2.5), rt(7, 4, 2, false, 1.0)] {
        let case = format!("{dt} exact ties, one-hot x [{n}, {d}] E {e} {routing:?}");
        compare_route(b, &case, &x, &gate, None, &routing)?;
    }
    Ok(())
}

/// Runs `moe_route` on the backend and the reference; ids exactly, weights within tolerance.
fn compare_route<B: Backend>(
    b: &B,
    case: &str,
    x: &HostTensor,
    gate: &HostTensor,
    bias: Option<&HostTensor>,
    routing: &crate::MoeRouting,
) -> Result<()> {
    let (want_ids, want_w) = reference::moe_route(x, gate, bias, routing)?;
    let bd = match bias {
        Some(t) => Some(b.upload(t)?),
        None => None,
    };
    let (ids, w) = b.moe_route(&b.upload(x)?, &b.upload(gate)?, bd.as_ref(), routing)?;
    let (ids, w) = (run(b, &ids)?, run(b, &w)?);
    ensure!(
        ids.dtype == DType::U32 && ids.shape == want_ids.shape,
        "moe_route [{case}]: ids {} {:?}, expected u32 {:?}",
        ids.dtype,
        ids.shape,
        want_ids.shape
    );
    let (got, want) = (ids.to_u32()?, want_ids.to_u32()?);
    if got != want {
        let k = routing.top_k;
        let row = (0..got.len()).find(|&i| got[i] != want[i]).unwrap_or(0) / k;
        bail!(
            "moe_route [{case}]: ids of token {row} are {:?}, expected {:?}",
            &got[row * k..(row + 1) * k],
            &want[row * k..(row + 1) * k]
        );
    }
    compare("moe_route (weights)", case, &w, &want_w, tolerance(x.dtype))
}

/// `moe_experts`: decode and prefill token counts, odd `D` and `F`, `k` from 1 to `E`
/// (every expert), experts shared by several tokens, the first and last expert used.
pub fn check_moe_experts<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(24);
    // (N, D, E, F, k)
    let cases: &[(usize, usize, usize, usize, usize)] = &[
        (1, 64, 16, 32, 4),
        (13, 64, 16, 32, 4),
        (5, 37, 8, 13, 2),
        (7, 128, 64, 48, 6),
        (3, 256, 4, 100, 4),
        (2, 40, 6, 8, 1),
        (33, 96, 32, 64, 8),
        (1, 64, 4, 8, 2),
        (6, 64, 4, 8, 2),
    ];
    for &(n, d, e, f, k) in cases {
        let x = rand_tensor(&mut rng, &[n, d], dt, 1.0)?;
        let gate_up = rand_tensor(&mut rng, &[e, 2 * f, d], dt, 3.0 / (d as f32).sqrt())?;
        let down = rand_tensor(&mut rng, &[e, d, f], dt, 2.0 / (f as f32).sqrt())?;
        let mut ids = Vec::with_capacity(n * k);
        for t in 0..n {
            let mut all: Vec<u32> = (0..e as u32).collect();
            rng.shuffle(&mut all);
            if t == 0 {
                // The first and the last expert.
                let (a, z) = (
                    all.iter().position(|&v| v == 0).unwrap_or(0),
                    all.iter().position(|&v| v == e as u32 - 1).unwrap_or(0),
                );
                all.swap(0, a);
                if k > 1 {
                    let z = if z == 0 { a } else { z };
                    all.swap(1, z);
                }
            }
            ids.extend_from_slice(&all[..k]);
        }
        let weights: Vec<f32> = (0..n * k).map(|_| 0.8 + 0.7 * rng.uniform()).collect();
        let ids = HostTensor::from_u32(vec![n, k], &ids)?;
        let weights = HostTensor::from_f32(vec![n, k], &weights)?;
        let want = reference::moe_experts(&x, &ids, &weights, &gate_up, &down)?;
        let got = b.moe_experts(
            &b.upload(&x)?,
            &b.upload(&ids)?,
            &b.upload(&weights)?,
            &b.upload(&gate_up)?,
            &b.upload(&down)?,
        )?;
        compare(
            "moe_experts",
            &format!("{dt} x [{n}, {d}] E {e} F {f} k {k}"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// `moe_experts_shared`: against the reference (routed experts, then the shared SwiGLU MLP,
/// then the add, each rounded to `dt`) and, within the dtype's rounding, against the backend's
/// own separate ops ([`crate::moe_experts_then_shared`]); token counts on both sides of CUDA's
/// fused decode bound (32 pairs), a shared expert narrower and wider than the routed ones, widths
/// outside 8ℤ (the fallback).
pub fn check_moe_experts_shared<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(27);
    // (N, D, E, F, Fs, k)
    let cases: &[(usize, usize, usize, usize, usize, usize)] = &[
        (1, 64, 16, 32, 32, 4),
        (1, 256, 64, 48, 96, 8),
        (1, 128, 32, 64, 16, 8),
        (3, 64, 8, 16, 16, 2),
        (4, 128, 32, 64, 64, 8),
        (5, 64, 16, 32, 32, 8),
        (2, 37, 8, 13, 13, 2),
    ];
    for &(n, d, e, f, fs, k) in cases {
        let x = rand_tensor(&mut rng, &[n, d], dt, 1.0)?;
        let wa = 3.0 / (d as f32).sqrt();
        let gate_up = rand_tensor(&mut rng, &[e, 2 * f, d], dt, wa)?;
        let down = rand_tensor(&mut rng, &[e, d, f], dt, 2.0 / (f as f32).sqrt())?;
        let gate_s = rand_tensor(&mut rng, &[fs, d], dt, wa)?;
        let up_s = rand_tensor(&mut rng, &[fs, d], dt, wa)?;
        let down_s = rand_tensor(&mut rng, &[d, fs], dt, 2.0 / (fs as f32).sqrt())?;
        let mut ids = Vec::with_capacity(n * k);
        for _ in 0..n {
            let mut all: Vec<u32> = (0..e as u32).collect();
            rng.shuffle(&mut all);
            ids.extend_from_slice(&all[..k]);
        }
        let weights: Vec<f32> = (0..n * k).map(|_| 0.1 + 0.3 * rng.uniform()).collect();
        let ids = HostTensor::from_u32(vec![n, k], &ids)?;
        let weights = HostTensor::from_f32(vec![n, k], &weights)?;
        let routed = reference::moe_experts(&x, &ids, &weights, &gate_up, &down)?;
        let act = reference::silu_mul(
            &reference::linear(&x, &gate_s, None)?,
            &reference::linear(&x, &up_s, None)?,
        )?;
        let want = reference::add(&routed, &reference::linear(&act, &down_s, None)?)?;
        let dev = [&x, &ids, &weights, &gate_up, &down, &gate_s, &up_s, &down_s]
            .map(|t| b.upload(t))
            .into_iter()
            .collect::<Result<Vec<_>>>()?;
        let shared = [&dev[5], &dev[6], &dev[7]];
        let got = b.moe_experts_shared(&dev[0], &dev[1], &dev[2], &dev[3], &dev[4], shared)?;
        let case = format!("{dt} x [{n}, {d}] E {e} F {f} Fs {fs} k {k}");
        let got = run(b, &got)?;
        compare("moe_experts_shared", &case, &got, &want, tolerance(dt))?;
        let separate =
            crate::moe_experts_then_shared(b, &dev[0], &dev[1], &dev[2], &dev[3], &dev[4], shared)?;
        compare(
            "moe_experts_shared vs the separate ops",
            &case,
            &got,
            &run(b, &separate)?,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// Runs the Kimi-Linear KDA-layer checks ([`check_short_conv`], [`check_short_conv_many`], [`check_kda`],
/// [`check_gated_rms_norm`], [`check_gated_rms_norm_linear`]) for the backend's f32 activation dtype and, if different, its bf16
/// one.
pub fn check_kda_ops<B: Backend>(b: &B) -> Result<()> {
    let mut dts = vec![b.activation_dtype(DType::F32)];
    let low = b.activation_dtype(DType::BF16);
    if low != dts[0] {
        dts.push(low);
    }
    for dt in dts {
        check_short_conv(b, dt)?;
        check_short_conv_many(b, dt)?;
        check_kda(b, dt)?;
        check_gated_rms_norm(b, dt)?;
        check_gated_rms_norm_linear(b, dt)?;
        check_kda_from_projections(b, dt)?;
    }
    Ok(())
}

/// `kda_from_projections`: the output, the output gate, the three updated convolution
/// histories and the updated recurrent state bit-equal to [`kda_from_projections_each`] (the
/// separate ops) on the same backend. Decode steps of fresh and continuing sequences in
/// scattered slots, head widths 32, 64, 96 and 128 (Kimi-Linear-48B), gate ranks equal to the
/// head width and not, convolution widths 4 and 2, both forget gates; one prefill step, and a
/// decode step of nine sequences.
pub fn check_kda_from_projections<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(43);
    // (H, K, R, W, lower bound, slots, seqs (ctx, new))
    type Case = (usize, usize, usize, usize, Option<f32>, usize, Seqs);
    let cases: &[Case] = &[
        (4, 128, 128, 4, None, 5, &[(7, 1), (0, 1), (30, 1)]),
        (2, 64, 32, 4, Some(-5.0), 4, &[(0, 1), (3, 1)]),
        (3, 32, 64, 2, None, 3, &[(1, 1), (12, 1), (0, 1)]),
        (2, 96, 96, 4, None, 2, &[(5, 1)]),
        (2, 64, 64, 4, None, 4, &[(0, 5), (9, 1), (4, 3)]),
        // More sequences than the decode GEMV takes (CUDA: the separate ops).
        (
            2,
            32,
            32,
            4,
            None,
            10,
            &[
                (1, 1),
                (0, 1),
                (2, 1),
                (3, 1),
                (4, 1),
                (5, 1),
                (6, 1),
                (7, 1),
                (8, 1),
            ],
        ),
    ];
    for &(h, k, r, w, lb, slots, seqs) in cases {
        let meta = state_meta(&mut rng, seqs, slots);
        let n = meta.num_tokens();
        let dmeta = b.upload_meta(meta.clone())?;
        let c = h * k;
        let mut up = |shape: &[usize], dtype: DType, scale: f32| -> Result<B::Tensor> {
            b.upload(&rand_tensor(&mut rng, shape, dtype, scale)?)
        };
        let qkv = [
            up(&[n, c], dt, 2.0)?,
            up(&[n, c], dt, 2.0)?,
            up(&[n, c], dt, 2.0)?,
        ];
        let conv_w = [
            up(&[c, w], DType::F32, 0.8)?,
            up(&[c, w], DType::F32, 0.8)?,
            up(&[c, w], DType::F32, 0.8)?,
        ];
        let (f, g) = (up(&[n, r], dt, 1.0)?, up(&[n, r], dt, 1.0)?);
        let (w_fb, w_gb) = (up(&[c, r], dt, 0.3)?, up(&[c, r], dt, 0.3)?);
        let beta = up(&[n, h], dt, 2.0)?;
        let a_log = up(&[h], DType::F32, 1.0)?;
        let dt_bias = up(&[h, k], DType::F32, 1.0)?;
        let conv0: Vec<HostTensor> = (0..3)
            .map(|_| rand_tensor(&mut rng, &[slots, c, w - 1], DType::F32, 2.0))
            .collect::<Result<_>>()?;
        let state0 = rand_tensor(&mut rng, &[slots, h, k, k], DType::F32, 0.5)?;
        let run_one = |fused: bool| -> Result<Vec<HostTensor>> {
            let cs = conv0
                .iter()
                .map(|t| b.upload(t))
                .collect::<Result<Vec<_>>>()?;
            let state = b.upload(&state0)?;
            let p = KdaProjections {
                qkv: [&qkv[0], &qkv[1], &qkv[2]],
                conv_w: [&conv_w[0], &conv_w[1], &conv_w[2]],
                conv_state: [&cs[0], &cs[1], &cs[2]],
                f: &f,
                w_fb: &w_fb,
                g: &g,
                w_gb: &w_gb,
                beta: &beta,
                a_log: &a_log,
                dt_bias: &dt_bias,
                lower_bound: lb,
                state: &state,
                heads: h,
                head_dim: k,
            };
            let (o, gate) = if fused {
                b.kda_from_projections(&p, &dmeta)?
            } else {
                kda_from_projections_each(b, &p, &dmeta)?
            };
            [&o, &gate, &cs[0], &cs[1], &cs[2], &state]
                .iter()
                .map(|t| run(b, t))
                .collect()
        };
        let (got, want) = (run_one(true)?, run_one(false)?);
        let case = format!("{dt} H {h} K {k} R {r} W {w} lb {lb:?} seqs {seqs:?}");
        for (i, what) in ["o", "gate", "q history", "k history", "v history", "state"]
            .iter()
            .enumerate()
        {
            ensure!(
                got[i].shape == want[i].shape && got[i].data == want[i].data,
                "kda_from_projections {case}: the {what} is not bit-equal to the separate ops'"
            );
        }
    }
    Ok(())
}

/// Per-sequence `(tokens before this step, tokens in it)` of a state-slot scenario.
type Seqs = &'static [(usize, usize)];

/// Step metadata for the state-slot ops: per sequence `(tokens before this step, tokens in it)`,
/// each sequence in its own slot of `slots`, the slot ids scattered (shuffled). A sequence with
/// 0 tokens before the step starts fresh (position 0); the others continue from their slot's
/// state. Paged-cache fields are filled consistently but unused by these ops.
pub fn state_meta(rng: &mut Rng, seqs: &[(usize, usize)], slots: usize) -> StepMeta {
    let mut ids: Vec<u32> = (0..slots as u32).collect();
    rng.shuffle(&mut ids);
    let mut m = StepMeta {
        block_size: 1 << 20,
        max_blocks: 1,
        ..Default::default()
    };
    m.query_start.push(0);
    for (s, &(ctx, new)) in seqs.iter().enumerate() {
        for p in ctx..ctx + new {
            m.positions.push(p as u32);
            m.token_seq.push(s as u32);
            m.slot_mapping.push(p as u32);
        }
        m.block_tables.push(0);
        m.seq_lens.push((ctx + new) as u32);
        m.query_start.push(m.positions.len() as u32);
        m.logit_rows
            .push(m.positions.len().saturating_sub(1) as u32);
        m.state_slots.push(ids[s]);
        m.max_seq_len = m.max_seq_len.max(ctx + new);
    }
    m
}

/// `short_conv`: widths 4 (Kimi), 3 and 2; in one step fresh and continuing sequences, chunks of
/// 1, 2 and 3 tokens (shorter than the width) continuing from history, a continuation from
/// position 1 (partial history), a 150-token prefill, decode steps of one row per sequence;
/// scattered slots pre-filled with random
/// history that fresh sequences must ignore and untouched slots must keep. Outputs and the
/// updated state are compared (the state exactly: it only holds copies of inputs).
pub fn check_short_conv<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(40);
    // (C, W, slots, seqs (ctx, new))
    let cases: &[(usize, usize, usize, Seqs)] = &[
        (
            32,
            4,
            9,
            &[(0, 5), (7, 1), (3, 2), (10, 3), (0, 1), (1, 2), (20, 150)],
        ),
        (40, 3, 4, &[(2, 1), (0, 70), (5, 2)]),
        (24, 2, 3, &[(0, 2), (9, 1), (4, 6)]),
        (96, 4, 2, &[(33, 1)]),
        // Decode steps (one row per sequence: CUDA's fused conv + history update), fresh and
        // partial histories among them.
        (32, 4, 6, &[(5, 1), (0, 1), (12, 1), (1, 1)]),
        (24, 3, 4, &[(2, 1), (0, 1), (7, 1)]),
    ];
    for &(c, w, slots, seqs) in cases {
        let meta = state_meta(&mut rng, seqs, slots);
        let n = meta.num_tokens();
        let x = rand_tensor(&mut rng, &[n, c], dt, 2.0)?;
        let wt = rand_tensor(&mut rng, &[c, w], DType::F32, 0.8)?;
        let mut st = rand_tensor(&mut rng, &[slots, c, w - 1], DType::F32, 2.0)?;
        let sd = b.upload(&st)?;
        let dmeta = b.upload_meta(meta.clone())?;
        let got = b.short_conv(&b.upload(&x)?, &b.upload(&wt)?, &sd, &dmeta)?;
        let want = reference::short_conv(&x, &wt, &mut st, &meta)?;
        let case = format!("{dt} C {c} W {w} slots {slots} seqs (ctx,new) {seqs:?}");
        compare("short_conv", &case, &run(b, &got)?, &want, tolerance(dt))?;
        compare("short_conv (state)", &case, &run(b, &sd)?, &st, 0.0)?;
    }
    Ok(())
}

/// `short_conv_many`: three parts of different widths (q, k, v of KDA heads) at decode and at a
/// mixed prefill step, each output and updated state bit-equal to its own `short_conv` on the
/// same backend (from the same starting state).
pub fn check_short_conv_many<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(42);
    let cases: &[(usize, usize, Seqs)] = &[
        (4, 6, &[(5, 1), (0, 1), (12, 1), (1, 1)]),
        (3, 4, &[(2, 1), (0, 1), (7, 1)]),
        (4, 5, &[(0, 5), (7, 1), (3, 2)]),
    ];
    for &(w, slots, seqs) in cases {
        let meta = state_meta(&mut rng, seqs, slots);
        let n = meta.num_tokens();
        let dmeta = b.upload_meta(meta.clone())?;
        let widths = [32usize, 32, 48];
        let mut xs = Vec::new();
        let mut ws = Vec::new();
        let mut sts = Vec::new();
        for c in widths {
            xs.push(b.upload(&rand_tensor(&mut rng, &[n, c], dt, 2.0)?)?);
            ws.push(b.upload(&rand_tensor(&mut rng, &[c, w], DType::F32, 0.8)?)?);
            sts.push(rand_tensor(&mut rng, &[slots, c, w - 1], DType::F32, 2.0)?);
        }
        let fused_states = sts
            .iter()
            .map(|s| b.upload(s))
            .collect::<Result<Vec<_>>>()?;
        let got = b.short_conv_many(
            &xs.iter().collect::<Vec<_>>(),
            &ws.iter().collect::<Vec<_>>(),
            &fused_states.iter().collect::<Vec<_>>(),
            &dmeta,
        )?;
        ensure!(
            got.len() == 3,
            "short_conv_many: {} outputs for 3 parts",
            got.len()
        );
        let case = format!("{dt} W {w} slots {slots} seqs (ctx,new) {seqs:?}");
        for i in 0..3 {
            let st = b.upload(&sts[i])?;
            let want = b.short_conv(&xs[i], &ws[i], &st, &dmeta)?;
            let part = format!("{case} part {i}");
            compare(
                "short_conv_many",
                &part,
                &run(b, &got[i])?,
                &run(b, &want)?,
                0.0,
            )?;
            compare(
                "short_conv_many (state)",
                &part,
                &run(b, &fused_states[i])?,
                &run(b, &st)?,
                0.0,
            )?;
        }
    }
    Ok(())
}

/// `kda`: both gates (softplus, and the lower-bounded one with `lb = −5`); in one step fresh and
/// continuing sequences (nonzero state) of 1–7 tokens next to 65-, 70- and 150-token prefills
/// (more than two chunks of 64, fresh and continuing); scattered slots pre-filled with random
/// state that fresh sequences must ignore and untouched slots must keep; head widths 16 (tiny
/// Kimi), 32×24, 64 and 128 (Kimi-Linear-48B). Outputs and the updated state are compared.
pub fn check_kda<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(41);
    // (H, K, V, slots, seqs (ctx, new))
    let cases: &[(usize, usize, usize, usize, Seqs)] = &[
        (2, 16, 16, 7, &[(0, 5), (9, 1), (4, 3), (0, 1), (30, 2)]),
        (3, 32, 24, 5, &[(0, 150), (12, 7), (5, 1)]),
        (2, 64, 64, 3, &[(40, 150), (0, 70)]),
        (1, 128, 128, 4, &[(3, 1), (0, 65), (17, 2)]),
        // Narrow heads through the chunked path (a Kimi shard: 2 of 4 heads of width 16).
        (2, 16, 16, 4, &[(0, 71), (0, 20), (8, 40)]),
        (4, 16, 16, 3, &[(0, 71), (16, 33)]),
    ];
    for &(h, k, v, slots, seqs) in cases {
        for lb in [None, Some(-5.0f32)] {
            let meta = state_meta(&mut rng, seqs, slots);
            let n = meta.num_tokens();
            let q = rand_tensor(&mut rng, &[n, h, k], dt, 1.0)?;
            let kk = rand_tensor(&mut rng, &[n, h, k], dt, 1.0)?;
            let vv = rand_tensor(&mut rng, &[n, h, v], dt, 1.0)?;
            let a = rand_tensor(&mut rng, &[n, h, k], dt, 1.0)?;
            let beta = rand_tensor(&mut rng, &[n, h], dt, 3.0)?;
            // A_log = ln(rate), rate in (0.3, 3); dt_bias around −1.
            let a_log: Vec<f32> = (0..h).map(|_| (1.65 + 1.35 * rng.uniform()).ln()).collect();
            let a_log = HostTensor::from_f32(vec![h], &a_log)?;
            let dtb: Vec<f32> = rng.vec(h * k, 1.0).iter().map(|x| x - 1.0).collect();
            let dtb = HostTensor::from_f32(vec![h, k], &dtb)?;
            let mut st = rand_tensor(&mut rng, &[slots, h, k, v], DType::F32, 0.5)?;
            let sd = b.upload(&st)?;
            let dmeta = b.upload_meta(meta.clone())?;
            let got = b.kda(
                &b.upload(&q)?,
                &b.upload(&kk)?,
                &b.upload(&vv)?,
                &b.upload(&a)?,
                &b.upload(&beta)?,
                &b.upload(&a_log)?,
                &b.upload(&dtb)?,
                lb,
                &sd,
                &dmeta,
            )?;
            let want = reference::kda(&q, &kk, &vv, &a, &beta, &a_log, &dtb, lb, &mut st, &meta)?;
            let case = format!(
                "{dt} H {h} K {k} V {v} lower_bound {lb:?} slots {slots} seqs (ctx,new) {seqs:?}"
            );
            compare("kda", &case, &run(b, &got)?, &want, tolerance(dt))?;
            compare("kda (state)", &case, &run(b, &sd)?, &st, tolerance(dt))?;
        }
    }
    Ok(())
}

/// `gated_rms_norm`: the per-head shapes KDA uses (`[N·H, V]` with V 16 and 128), a wide row and
/// an odd width; gates large enough to saturate the sigmoid.
pub fn check_gated_rms_norm<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(42);
    for &(r, d) in &[(1usize, 16usize), (10, 16), (6, 128), (3, 1000), (7, 33)] {
        let x = rand_tensor(&mut rng, &[r, d], dt, 2.0)?;
        let gate = rand_tensor(&mut rng, &[r, d], dt, 12.0)?;
        let w = rand_tensor(&mut rng, &[d], dt, 1.5)?;
        let eps = 1e-5;
        let want = reference::gated_rms_norm(&x, &gate, &w, eps)?;
        let got = b.gated_rms_norm(&b.upload(&x)?, &b.upload(&gate)?, &b.upload(&w)?, eps)?;
        compare(
            "gated_rms_norm",
            &format!("{dt} [{r}, {d}]"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// `gated_rms_norm_linear`: bit-equal to `gated_rms_norm` of the heads then `linear`, at decode
/// sizes (where CUDA normalises inside the GEMV) and above; head widths 32–256 (Kimi-Linear's
/// 32 × 128 into 2304), a norm weight in f32 and in the activation dtype, with and without a
/// bias, a K that is not a multiple of 256 (the unfused path).
pub fn check_gated_rms_norm_linear<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(43);
    // (N, heads, head_dim, O, f32 norm weight, bias)
    let cases = [
        (1usize, 32usize, 128usize, 2304usize, false, false),
        (3, 16, 64, 500, true, true),
        (8, 8, 256, 256, false, true),
        (2, 64, 32, 96, true, false),
        (1, 3, 64, 40, false, false),
        (12, 4, 128, 64, false, false),
    ];
    for (n, h, hd, o, w_f32, has_bias) in cases {
        let k = h * hd;
        let x = b.upload(&rand_tensor(&mut rng, &[n, k], dt, 2.0)?)?;
        let gate = b.upload(&rand_tensor(&mut rng, &[n, k], dt, 6.0)?)?;
        let nw = rand_tensor(&mut rng, &[hd], if w_f32 { DType::F32 } else { dt }, 1.5)?;
        let nw = b.upload(&nw)?;
        let w = b.upload_weight(&rand_tensor(&mut rng, &[o, k], dt, 0.5)?)?;
        let bias = rand_tensor(&mut rng, &[o], dt, 1.0)?;
        let bias = has_bias.then(|| b.upload(&bias)).transpose()?;
        let got = b.gated_rms_norm_linear(&x, &gate, &nw, 1e-6, hd, &w, bias.as_ref())?;
        let rows = [n * h, hd];
        let y = b.gated_rms_norm(&b.reshape(&x, &rows)?, &b.reshape(&gate, &rows)?, &nw, 1e-6)?;
        let want = b.linear(&b.reshape(&y, &[n, k])?, &w, bias.as_ref())?;
        let (got, want) = (run(b, &got)?, run(b, &want)?);
        ensure!(
            got.shape == want.shape && got.data == want.data,
            "gated_rms_norm_linear {dt} x [{n}, {h}×{hd}] → {o} (f32 norm weight {w_f32}, bias \
             {has_bias}): not bit-equal to gated_rms_norm then linear"
        );
    }
    Ok(())
}

/// Runs the DeepSeek-V3.2 sparse-attention (DSA) checks ([`check_layer_norm`], [`check_dsa_topk`],
/// [`check_sparse_latent_attention`]) for the backend's f32 activation dtype and, if different,
/// its bf16 one. Not part of [`check_all`]: backends opt in.
pub fn check_dsa_ops<B: Backend>(b: &B) -> Result<()> {
    let mut dts = vec![b.activation_dtype(DType::F32)];
    let low = b.activation_dtype(DType::BF16);
    if low != dts[0] {
        dts.push(low);
    }
    for dt in dts {
        check_layer_norm(b, dt)?;
        check_dsa_topk(b, dt)?;
        check_sparse_latent_attention(b, dt)?;
    }
    Ok(())
}

/// `layer_norm`: the DSA indexer's key width (128), a wide row, odd widths, rows with a large
/// mean (so that the variance is not `mean(x²)`), and a constant row (variance 0, eps only).
pub fn check_layer_norm<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(50);
    for &(r, d, offset) in &[
        (1usize, 16usize, 0.0f32),
        (10, 128, 3.0),
        (6, 128, -20.0),
        (3, 1000, 1.0),
        (7, 33, 0.5),
        (2, 7168, 0.0),
        (5, 1, 2.0),
    ] {
        let xv: Vec<f32> = rng.vec(r * d, 2.0).iter().map(|v| v + offset).collect();
        let x = HostTensor::from_f32_as(vec![r, d], &xv, dt)?;
        let w = rand_tensor(&mut rng, &[d], dt, 1.5)?;
        let bias = rand_tensor(&mut rng, &[d], dt, 0.5)?;
        let eps = 1e-6;
        let want = reference::layer_norm(&x, &w, &bias, eps)?;
        let got = b.layer_norm(&b.upload(&x)?, &b.upload(&w)?, &b.upload(&bias)?, eps)?;
        compare(
            "layer_norm",
            &format!("{dt} [{r}, {d}] mean offset {offset}"),
            &run(b, &got)?,
            &want,
            tolerance(dt),
        )?;
    }
    Ok(())
}

/// A `dsa_topk` scenario.
struct DsaCase {
    h: usize,
    d: usize,
    block_size: usize,
    seqs: Vec<(usize, usize)>,
    topk: usize,
    /// Keys `a_t·u + noise` with distinct geometric `a_t` (clear margins for many keys) instead
    /// of plain random keys.
    planted: bool,
    /// Fraction of keys that are exactly zero (score exactly 0: ties broken by position).
    zero_frac: f32,
}

/// Per-key indexer scores of token `t` in f64 from the inputs as the backend sees them, with a
/// magnitude (Σ of |terms|, the scale of f32 rounding) and whether the key is "clearly zero"
/// (every head's `scale·q·k` clearly ≤ 0, so that the score is exactly 0 in any precision).
#[allow(clippy::too_many_arguments)]
fn dsa_scores(
    qv: &[f32],
    wv: &[f32],
    kv: &[f32],
    slots: &[usize],
    t: usize,
    h: usize,
    d: usize,
    scale: f32,
) -> Vec<(f64, f64, bool)> {
    let hs = 1.0 / (h as f64).sqrt();
    slots
        .iter()
        .map(|&slot| {
            let k = &kv[slot * d..(slot + 1) * d];
            let (mut s, mut mag, mut zero) = (0f64, 0f64, true);
            for hh in 0..h {
                let q = &qv[(t * h + hh) * d..(t * h + hh + 1) * d];
                let dot: f64 = q.iter().zip(k).map(|(a, b)| *a as f64 * *b as f64).sum();
                let l1: f64 = q
                    .iter()
                    .zip(k)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let wh = wv[t * h + hh] as f64 * hs * scale as f64;
                s += wh * dot.max(0.0);
                mag += wh.abs() * l1;
                if !(dot < -1e-4 * l1 || l1 == 0.0) {
                    zero = false;
                }
            }
            (s, mag, zero)
        })
        .collect()
}

/// Whether every decision of token `t`'s top-k (each adjacent pair among the first `k + 1`
/// scores in order) has a clear margin: `≥ 1e-3` relative to the larger score and `≥ 1e-5`
/// relative to the rounding scale, or is an exact tie of two clearly-zero keys.
fn dsa_margin_ok(sc: &[(f64, f64, bool)], topk: usize) -> bool {
    let mut v: Vec<(f64, f64, bool)> = sc.to_vec();
    v.sort_by(|a, b| b.0.total_cmp(&a.0));
    for i in 0..topk.min(v.len().saturating_sub(1)) {
        let (a, b) = (v[i], v[i + 1]);
        if a.2 && b.2 {
            continue;
        }
        let gap = a.0 - b.0;
        if gap < 1e-3 * a.0.abs().max(b.0.abs()) || gap < 1e-5 * a.1.max(b.1) || gap <= 0.0 {
            return false;
        }
    }
    true
}

/// Builds `dsa_topk` inputs for `case` (q, w, k_cache) with clear margins for every token (q and
/// w of a token are resampled until they hold); errors if that fails.
fn dsa_inputs(
    rng: &mut Rng,
    case: &DsaCase,
    meta: &StepMeta,
    blocks: usize,
    dt: DType,
    scale: f32,
) -> Result<(HostTensor, HostTensor, HostTensor)> {
    let (h, d, bs) = (case.h, case.d, case.block_size);
    let n = meta.num_tokens();
    let u: Vec<f32> = rng.vec(d, 1.0);
    // Junk everywhere (unused slots must not be read), then the sequences' keys.
    let mut kv = rng.vec(blocks * bs * d, 1.0);
    for s in 0..meta.num_seqs() {
        let len = meta.seq_lens[s] as usize;
        let mut order: Vec<usize> = (0..len).collect();
        rng.shuffle(&mut order);
        for (p, &rank) in order.iter().enumerate() {
            let slot = meta.block_tables[s * meta.max_blocks + p / bs] as usize * bs + p % bs;
            let row = &mut kv[slot * d..(slot + 1) * d];
            if (rng.below(1 << 20) as f32) < case.zero_frac * (1 << 20) as f32 {
                row.fill(0.0);
            } else if case.planted {
                let a = 1.003f32.powi(rank as i32);
                for (i, x) in row.iter_mut().enumerate() {
                    *x = a * u[i] + 1e-3 * rng.uniform();
                }
            } else {
                for x in row.iter_mut() {
                    *x = rng.uniform();
                }
            }
        }
    }
    let k_cache = HostTensor::from_f32_as(vec![blocks, bs, d], &kv, dt)?;
    let kv = k_cache.to_f32();
    let mut qv = vec![0f32; n * h * d];
    let mut wv = vec![0f32; n * h];
    for t in 0..n {
        let slots: Vec<usize> = {
            let s = meta.token_seq[t] as usize;
            let table = &meta.block_tables[s * meta.max_blocks..(s + 1) * meta.max_blocks];
            (0..=meta.positions[t] as usize)
                .map(|j| table[j / bs] as usize * bs + j % bs)
                .collect()
        };
        let mut tries = 0;
        loop {
            for hh in 0..h {
                // Planted: heads aligned with u (c > 0) or against it (relu zero), w mostly > 0.
                let c = if case.planted {
                    if hh % 3 == 2 {
                        -1.0
                    } else {
                        0.5 + rng.uniform().abs()
                    }
                } else {
                    0.0
                };
                for i in 0..d {
                    qv[(t * h + hh) * d + i] = c * u[i] + rng.uniform();
                }
                wv[t * h + hh] = if case.planted {
                    0.2 + rng.uniform().abs()
                } else {
                    rng.uniform()
                };
            }
            // Round to the dtype the backend sees.
            let qr = HostTensor::from_f32_as(vec![h * d], &qv[t * h * d..(t + 1) * h * d], dt)?;
            qv[t * h * d..(t + 1) * h * d].copy_from_slice(&qr.to_f32());
            let wr = HostTensor::from_f32_as(vec![h], &wv[t * h..(t + 1) * h], dt)?;
            wv[t * h..(t + 1) * h].copy_from_slice(&wr.to_f32());
            let sc = dsa_scores(&qv, &wv, &kv, &slots, t, h, d, scale);
            if dsa_margin_ok(&sc, case.topk) {
                break;
            }
            tries += 1;
            ensure!(
                tries < 500,
                "dsa_topk check: could not build inputs with clear margins (token {t}, H {h} d {d} \
                 topk {} seqs {:?})",
                case.topk,
                case.seqs
            );
        }
    }
    Ok((
        HostTensor::from_f32_as(vec![n, h, d], &qv, dt)?,
        HostTensor::from_f32_as(vec![n, h], &wv, dt)?,
        k_cache,
    ))
}

fn dsa_cases() -> Vec<DsaCase> {
    let c = |h, d, block_size, seqs: &[(usize, usize)], topk, planted, zero_frac| DsaCase {
        h,
        d,
        block_size,
        seqs: seqs.to_vec(),
        topk,
        planted,
        zero_frac,
    };
    vec![
        // Decode and chunked prefill; topk below, at and above the causal key count.
        c(
            4,
            32,
            16,
            &[(37, 1), (20, 13), (0, 9), (0, 1)],
            8,
            false,
            0.0,
        ),
        c(2, 16, 4, &[(0, 17), (9, 2), (3, 1)], 16, false, 0.2),
        c(1, 8, 16, &[(31, 1), (10, 3)], 32, false, 0.0),
        c(4, 128, 1, &[(6, 3), (0, 1)], 4, false, 0.1),
        // Many keys: DeepSeek-V3.2's topk 2048 with more and with fewer causal keys.
        c(
            8,
            64,
            16,
            &[(2100, 1), (300, 2), (2040, 12)],
            2048,
            true,
            0.02,
        ),
        // Exact ties at 0 (zero keys) inside the top-k; chunk straddling topk.
        c(16, 128, 16, &[(250, 20), (600, 1)], 256, true, 0.15),
        c(3, 20, 16, &[(0, 70), (100, 5)], 64, true, 0.3),
    ]
}

/// `dsa_topk`: several sequences of different lengths, chunks starting mid-sequence, scattered
/// blocks with junk in unused slots, block sizes 16, 4 and 1, topk smaller than, equal to and
/// larger than the number of causal keys (`u32::MAX` padding), DeepSeek-V3.2's topk 2048 over
/// more than 2048 keys, and exact score ties at 0 (all-zero keys, ties to the lower position).
/// Inputs are resampled until every decision has a clear margin (see `dsa_margin_ok`), so that
/// rounding cannot flip a selection; each row must hold exactly the reference's positions (in any
/// order, the order being the backend's choice) followed by the same count of `u32::MAX`.
pub fn check_dsa_topk<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(51);
    for case in dsa_cases() {
        let (meta, blocks) = AttnCase {
            h: case.h,
            hkv: 1,
            hd_k: case.d,
            hd_v: case.d,
            block_size: case.block_size,
            seqs: case.seqs.clone(),
            spare_blocks: 3,
        }
        .meta(&mut rng);
        let scale = 1.0 / (case.d as f32).sqrt();
        let (q, w, k_cache) = dsa_inputs(&mut rng, &case, &meta, blocks, dt, scale)?;
        let want = reference::dsa_topk(&q, &w, &k_cache, &meta, scale, case.topk)?;
        let dmeta = b.upload_meta(meta.clone())?;
        let got = b.dsa_topk(
            &b.upload(&q)?,
            &b.upload(&w)?,
            &b.upload(&k_cache)?,
            &dmeta,
            scale,
            case.topk,
        )?;
        let got = run(b, &got)?;
        let desc = format!(
            "{dt} H {} d {} bs {} topk {} seqs (ctx,new) {:?}",
            case.h, case.d, case.block_size, case.topk, case.seqs
        );
        ensure!(
            got.dtype == DType::U32 && got.shape == want.shape,
            "dsa_topk [{desc}]: got {} {:?}, want u32 {:?}",
            got.dtype,
            got.shape,
            want.shape
        );
        let (g, w) = (got.to_u32()?, want.to_u32()?);
        for t in 0..meta.num_tokens() {
            let row = t * case.topk..(t + 1) * case.topk;
            let real = w[row.clone()]
                .iter()
                .take_while(|&&p| p != u32::MAX)
                .count();
            ensure!(
                g[row.start + real..row.end].iter().all(|&p| p == u32::MAX),
                "dsa_topk [{desc}]: token {t} (position {}): entries after the first {real} must be \
                 u32::MAX padding, got {:?}",
                meta.positions[t],
                &g[row.start + real..row.end]
            );
            let (mut gs, mut ws) = (
                g[row.start..row.start + real].to_vec(),
                w[row.start..row.start + real].to_vec(),
            );
            gs.sort_unstable();
            ws.sort_unstable();
            if gs != ws {
                let missing: Vec<u32> = ws.iter().filter(|p| !gs.contains(p)).copied().collect();
                let extra: Vec<u32> = gs.iter().filter(|p| !ws.contains(p)).copied().collect();
                bail!(
                    "dsa_topk [{desc}]: token {t} (position {}): selection differs; missing {missing:?}, extra {extra:?}",
                    meta.positions[t]
                );
            }
        }
    }
    Ok(())
}

/// `sparse_latent_attention`: the latent scenarios of [`latent_cases`] with selections from the
/// reference `dsa_topk` (decreasing-score order) and random subsets of the causal positions in
/// random order with `u32::MAX` padding mixed in; plus, with every causal position selected, it
/// must equal `paged_latent_attention` on the backend.
pub fn check_sparse_latent_attention<B: Backend>(b: &B, dt: DType) -> Result<()> {
    let mut rng = Rng::new(52);
    for case in latent_cases() {
        let (meta, blocks) = case.meta(&mut rng);
        let n = meta.num_tokens();
        let (h, l, r, bs) = (case.h, case.l, case.r, case.block_size);
        let q_lat = rand_tensor(&mut rng, &[n, h, l], dt, 2.0)?;
        let q_rope = rand_tensor(&mut rng, &[n, h, r], dt, 2.0)?;
        let cache = rand_tensor(&mut rng, &[blocks, bs, l + r], dt, 1.0)?;
        let scale = 1.0 / ((l / 4 + r) as f32).sqrt();
        let dmeta = b.upload_meta(meta.clone())?;
        let (ql, qr, cd) = (b.upload(&q_lat)?, b.upload(&q_rope)?, b.upload(&cache)?);
        let max_keys = meta
            .positions
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap_or(1);

        // 1. The reference indexer's choice over a random indexer (topk 7: padding for short ones).
        let (hi, di) = (2, 16);
        let iq = rand_tensor(&mut rng, &[n, hi, di], dt, 1.0)?;
        let iw = rand_tensor(&mut rng, &[n, hi], dt, 1.0)?;
        let ik = rand_tensor(&mut rng, &[blocks, bs, di], dt, 1.0)?;
        let sel_topk = reference::dsa_topk(&iq, &iw, &ik, &meta, 0.25, 7)?;

        // 2. Random subsets in random order with padding anywhere (at least one real entry).
        let k2 = (max_keys / 2).max(3);
        let mut sel = vec![u32::MAX; n * k2];
        for t in 0..n {
            let p = meta.positions[t] as usize;
            let mut all: Vec<u32> = (0..=p as u32).collect();
            rng.shuffle(&mut all);
            let take = 1 + rng.below(all.len().min(k2));
            let row = &mut sel[t * k2..(t + 1) * k2];
            row[..take].copy_from_slice(&all[..take]);
            rng.shuffle(row);
        }
        let sel_rand = HostTensor::from_u32(vec![n, k2], &sel)?;

        // 3. Every causal position (descending order, padded).
        let mut sel = vec![u32::MAX; n * max_keys];
        for t in 0..n {
            for (j, p) in (0..=meta.positions[t]).rev().enumerate() {
                sel[t * max_keys + j] = p;
            }
        }
        let sel_all = HostTensor::from_u32(vec![n, max_keys], &sel)?;

        for (what, s) in [
            ("dsa_topk selection", &sel_topk),
            ("random subsets", &sel_rand),
            ("all causal positions", &sel_all),
        ] {
            let want =
                reference::sparse_latent_attention(&q_lat, &q_rope, &cache, &meta, scale, s)?;
            let got = b.sparse_latent_attention(&ql, &qr, &cd, &dmeta, scale, &b.upload(s)?)?;
            compare(
                "sparse_latent_attention",
                &format!("{dt} {} selection: {what}", case.describe()),
                &run(b, &got)?,
                &want,
                tolerance(dt),
            )?;
            if what == "all causal positions" {
                let dense = b.paged_latent_attention(&ql, &qr, &cd, &dmeta, scale)?;
                compare(
                    "sparse_latent_attention vs paged_latent_attention",
                    &format!("{dt} {} all causal positions selected", case.describe()),
                    &run(b, &got)?,
                    &run(b, &dense)?,
                    tolerance(dt),
                )?;
            }
        }
    }
    Ok(())
}

/// The bytes of `t` after `copy_rows(pairs)` on rows of `t.shape[0]`, written straight from
/// the semantics (`t'[dst] = t[src]`, every read before any write), independently of
/// [`crate::rows`].
fn copied_bytes(t: &HostTensor, pairs: &[(u32, u32)]) -> Vec<u8> {
    let rb = t.data.len() / t.shape[0].max(1);
    let mut out = t.data.clone();
    for &(s, d) in pairs {
        let (s, d) = (s as usize * rb, d as usize * rb);
        out[d..d + rb].copy_from_slice(&t.data[s..s + rb]);
    }
    out
}

/// Row `i` of `t` (dim 0) as bytes.
fn row_bytes_of(t: &HostTensor, i: usize) -> &[u8] {
    let rb = t.data.len() / t.shape[0].max(1);
    &t.data[i * rb..(i + 1) * rb]
}

/// Fails with `op [case]` and the first differing row unless `got` has `want`'s shape, dtype
/// and bytes.
pub(crate) fn same_bytes(op: &str, case: &str, got: &HostTensor, want: &HostTensor) -> Result<()> {
    ensure!(
        got.shape == want.shape && got.dtype == want.dtype,
        "{op} [{case}]: got {:?} {}, expected {:?} {}",
        got.shape,
        got.dtype,
        want.shape,
        want.dtype
    );
    if got.data != want.data {
        let row = (0..want.shape[0])
            .find(|&i| row_bytes_of(got, i) != row_bytes_of(want, i))
            .unwrap_or(0);
        bail!("{op} [{case}]: bytes differ, first in row {row}");
    }
    Ok(())
}

/// `copy_rows`, `read_rows` and `write_rows` (whole rows of dim 0, bytes verbatim) on f32, bf16
/// (`[5, 3, 4]`; and `[5, 2, 8]`, which the WGSL backend keeps packed) and f16 tensors, plus a
/// u32 round trip and the error cases ([`check_row_errors`]). Expected bytes come from the
/// tensor as downloaded before the op, so they hold for any storage dtype.
pub fn check_row_ops<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(23);
    let cases: [(DType, &[usize]); 4] = [
        (DType::F32, &[5, 3, 4]),
        (DType::BF16, &[5, 3, 4]),
        (DType::BF16, &[5, 2, 8]),
        (DType::F16, &[5, 3, 4]),
    ];
    for (dt, shape) in cases {
        let h = rand_tensor(&mut rng, shape, dt, 2.0)?;
        check_copy_rows(b, &h)?;
        check_read_write_rows(b, &h, &mut rng)?;
    }
    let ids: Vec<u32> = (0..30).map(|_| rng.next_u64() as u32).collect();
    check_read_write_rows(b, &HostTensor::from_u32(vec![6, 5], &ids)?, &mut rng)?;
    check_row_errors(b)
}

/// The many-row cases: 300 scattered rows ([`check_many_rows`]) of 256-byte rows and of rows
/// of 28 and 30 bytes (not multiples of 16 or of 4) — the host KV tier's block traffic, which
/// backends may move with batched gather/scatter kernels. Separate from [`check_row_ops`] so
/// that suites forcing tiny device buffers (smaller than these rows) can still run that one.
pub fn check_many_row_ops<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(31);
    let many: [(DType, &[usize]); 3] = [
        (DType::BF16, &[1024, 8, 16]),
        (DType::F32, &[1024, 7]),
        (DType::BF16, &[1024, 3, 5]),
    ];
    for (dt, shape) in many {
        check_many_rows(b, &rand_tensor(&mut rng, shape, dt, 2.0)?, &mut rng)?;
    }
    Ok(())
}

/// `rows_to_host` / `rows_from_host` (the host-memory tier's copies): rows out of one tensor
/// equal `read_rows`' bytes; written into other rows of a second tensor (scattered, in another
/// order) they read back the same and leave the other rows alone; a 300-row scatter; bad
/// arguments are errors.
pub fn check_host_rows<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(37);
    let cases: [(DType, &[usize]); 4] = [
        (DType::F32, &[6, 3, 4]),
        (DType::BF16, &[6, 2, 8]),
        (DType::BF16, &[7, 16, 2, 8]),
        (DType::F32, &[512, 5]),
    ];
    for (dt, shape) in cases {
        let case = format!("{dt} {shape:?}");
        let a = b.upload(&rand_tensor(&mut rng, shape, dt, 2.0)?)?;
        let z = b.upload(&rand_tensor(&mut rng, shape, dt, 2.0)?)?;
        let (sa, sz) = (run(b, &a)?, run(b, &z)?);
        let r = shape[0] as u32;
        let from: Vec<u32> = if r >= 300 {
            (0..300).map(|i| (37 * i + 5) % r).collect()
        } else {
            vec![3, 0, r - 1]
        };
        let to: Vec<u32> = from.iter().map(|&i| (i + 1) % r).rev().collect();
        let rows = b
            .rows_to_host(&a, &from)
            .with_context(|| format!("rows_to_host [{case}]"))?;
        ensure!(
            rows.len() == from.len(),
            "rows_to_host [{case}]: {} rows for {} indices",
            rows.len(),
            from.len()
        );
        for (k, &i) in from.iter().enumerate() {
            ensure!(
                rows[k].bytes() == row_bytes_of(&sa, i as usize),
                "rows_to_host [{case}]: row {i} differs from the tensor's bytes"
            );
        }
        // Row from[k] goes to to[n - 1 - k]: reversed order, shifted rows.
        let src: Vec<&crate::HostRow> = rows.iter().rev().collect();
        b.rows_from_host(&z, &to, &src)
            .with_context(|| format!("rows_from_host [{case}]"))?;
        let mut want = sz.clone();
        let rb = sz.data.len() / shape[0];
        for (k, &i) in to.iter().enumerate() {
            let i = i as usize;
            want.data[i * rb..(i + 1) * rb].copy_from_slice(src[k].bytes());
        }
        same_bytes("rows_from_host", &case, &run(b, &z)?, &want)?;
        ensure!(
            b.rows_from_host(&z, &[0, 0], &[&rows[0], &rows[1]])
                .is_err(),
            "rows_from_host [{case}]: a repeated row must be an error"
        );
        ensure!(
            b.rows_from_host(&z, &[0], &[&rows[0], &rows[1]]).is_err(),
            "rows_from_host [{case}]: more host rows than indices must be an error"
        );
        ensure!(
            b.rows_to_host(&a, &[r]).is_err(),
            "rows_to_host [{case}]: row {r} is out of range"
        );
    }
    Ok(())
}

/// `read_rows` and `write_rows` of 300 distinct, non-contiguous rows of `h` (`h.shape[0]` a
/// power of two ≥ 300; rows `(37·i + 5) mod R`, in that order): the gather matches the
/// uploaded bytes, the scatter leaves every other row alone, and reading back gives `src`.
pub fn check_many_rows<B: Backend>(b: &B, h: &HostTensor, rng: &mut Rng) -> Result<()> {
    let case = format!("{} {:?}, 300 scattered rows", h.dtype, h.shape);
    let r = h.shape[0];
    ensure!(
        r.is_power_of_two() && r >= 300,
        "check_many_rows: needs a power-of-two row count ≥ 300, got shape {:?}",
        h.shape
    );
    // 37 is odd, so i ↦ 37·i + 5 is a bijection mod a power of two: distinct rows, no two
    // consecutive.
    let rows: Vec<u32> = (0..300).map(|i| ((37 * i + 5) % r) as u32).collect();
    let t = b.upload(h)?;
    let stored = run(b, &t)?;
    let got = b
        .read_rows(&t, &rows)
        .with_context(|| format!("read_rows [{case}]"))?;
    let mut bytes = Vec::new();
    for &i in &rows {
        bytes.extend_from_slice(row_bytes_of(&stored, i as usize));
    }
    let want = HostTensor::new(rows::rows_shape(&h.shape, rows.len()), stored.dtype, bytes)?;
    same_bytes("read_rows", &case, &got, &want)?;
    let n = want.data.len();
    let noise: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
    let src = HostTensor::new(want.shape.clone(), stored.dtype, noise)?;
    b.write_rows(&t, &rows, &src)
        .with_context(|| format!("write_rows [{case}]"))?;
    let mut want = stored.clone();
    let rb = n / rows.len();
    for (k, &i) in rows.iter().enumerate() {
        let i = i as usize;
        want.data[i * rb..(i + 1) * rb].copy_from_slice(&src.data[k * rb..(k + 1) * rb]);
    }
    same_bytes("write_rows", &case, &run(b, &t)?, &want)?;
    same_bytes(
        "write_rows then read_rows",
        &case,
        &b.read_rows(&t, &rows)?,
        &src,
    )
}

/// `copy_rows` on fresh uploads of `h`: chains, a cycle, a swap, overlapping shifted runs,
/// disjoint runs, no-ops, nothing; and rows of a finer view (`[R·S1, ...]`) of the same memory.
pub fn check_copy_rows<B: Backend>(b: &B, h: &HostTensor) -> Result<()> {
    let cases: [(&str, &[(u32, u32)]); 7] = [
        (
            "chain through rows 3 and 0, a no-op",
            &[(0, 3), (3, 1), (4, 4), (2, 0)],
        ),
        ("cycle 0→1→2→0", &[(0, 1), (1, 2), (2, 0)]),
        ("swap 1 and 4", &[(1, 4), (4, 1)]),
        (
            "run 0..3 shifted to 1..4 (overlapping)",
            &[(0, 1), (1, 2), (2, 3)],
        ),
        ("run 3..5 to 0..2 (disjoint)", &[(3, 0), (4, 1)]),
        ("scattered, descending", &[(4, 2), (0, 3), (1, 0)]),
        ("no pairs", &[]),
    ];
    for (case, pairs) in cases {
        let t = b.upload(h)?;
        let before = run(b, &t)?;
        b.copy_rows(&t, pairs)
            .with_context(|| format!("copy_rows {} {:?} [{case}]", h.dtype, h.shape))?;
        let want = HostTensor::new(
            before.shape.clone(),
            before.dtype,
            copied_bytes(&before, pairs),
        )?;
        same_bytes(
            "copy_rows",
            &format!("{} {:?}: {case}", h.dtype, h.shape),
            &run(b, &t)?,
            &want,
        )?;
    }
    // A finer view: rows of `[R·S1, rest]` address parts of the original rows.
    let t = b.upload(h)?;
    let fine = rows::rows_shape(&h.shape[1..], h.shape[0] * h.shape[1]);
    let v = b.reshape(&t, &fine)?;
    let before = run(b, &v)?;
    let last = fine[0] as u32 - 1;
    let pairs = [(last, 0), (0, last), (1, 2)];
    b.copy_rows(&v, &pairs)?;
    let want = HostTensor::new(fine.clone(), before.dtype, copied_bytes(&before, &pairs))?;
    same_bytes(
        "copy_rows",
        &format!("{} view {fine:?} of {:?}", h.dtype, h.shape),
        &run(b, &v)?,
        &want,
    )
}

/// `read_rows` gathers the named rows verbatim (repeats allowed, none at all); `write_rows`
/// stores arbitrary bit patterns (NaN payloads included) byte for byte, leaves other rows
/// alone, and a read from one tensor written into another restores the bytes exactly.
pub fn check_read_write_rows<B: Backend>(b: &B, h: &HostTensor, rng: &mut Rng) -> Result<()> {
    let case = format!("{} {:?}", h.dtype, h.shape);
    let t = b.upload(h)?;
    let stored = run(b, &t)?;
    let (dt, rest) = (stored.dtype, &h.shape[1..]);
    ensure!(
        t.dtype() == dt,
        "read_rows [{case}]: tensor reports dtype {}, downloads as {dt}",
        t.dtype()
    );
    // Gather with a repeat.
    let rows = [4u32, 0, 1, 1];
    let got = b
        .read_rows(&t, &rows)
        .with_context(|| format!("read_rows [{case}]"))?;
    let mut bytes = Vec::new();
    for &r in &rows {
        bytes.extend_from_slice(row_bytes_of(&stored, r as usize));
    }
    let want = HostTensor::new(rows::rows_shape(&h.shape, rows.len()), dt, bytes)?;
    same_bytes("read_rows", &format!("{case} rows {rows:?}"), &got, &want)?;
    let none = b.read_rows(&t, &[])?;
    ensure!(
        none.shape == rows::rows_shape(&h.shape, 0) && none.data.is_empty(),
        "read_rows [{case}, no rows]: got shape {:?} with {} bytes",
        none.shape,
        none.data.len()
    );
    // Arbitrary bit patterns into rows 3 and 1, then back.
    let n = 2 * rest.iter().product::<usize>() * dt.size();
    let noise: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
    let src = HostTensor::new(rows::rows_shape(&h.shape, 2), dt, noise)?;
    b.write_rows(&t, &[3, 1], &src)
        .with_context(|| format!("write_rows [{case}]"))?;
    let mut want = stored.clone();
    let rb = src.data.len() / 2;
    want.data[3 * rb..4 * rb].copy_from_slice(&src.data[..rb]);
    want.data[rb..2 * rb].copy_from_slice(&src.data[rb..]);
    same_bytes(
        "write_rows",
        &format!("{case} rows [3, 1]"),
        &run(b, &t)?,
        &want,
    )?;
    let back = b.read_rows(&t, &[3, 1])?;
    same_bytes("write_rows then read_rows", &case, &back, &src)?;
    // Device → host → another device tensor, as a host cache tier stores and restores blocks.
    let saved = b.read_rows(&t, &[2, 3, 4])?;
    let other = b.upload(h)?;
    b.write_rows(&other, &[0, 1, 2], &saved)?;
    same_bytes(
        "read_rows then write_rows into another tensor",
        &case,
        &b.read_rows(&other, &[0, 1, 2])?,
        &saved,
    )?;
    let mut want = stored.clone();
    want.data[..saved.data.len()].copy_from_slice(&saved.data);
    same_bytes(
        "write_rows into another tensor (rows 3, 4 untouched)",
        &case,
        &run(b, &other)?,
        &want,
    )
}

/// Bad indices, a repeated destination, a mismatched `src` and a 0-d tensor are errors naming
/// the index and the row count (or both shapes); a failed call changes nothing.
pub fn check_row_errors<B: Backend>(b: &B) -> Result<()> {
    let mut rng = Rng::new(29);
    let h = rand_tensor(&mut rng, &[5, 3, 4], DType::F32, 1.0)?;
    let t = b.upload(&h)?;
    let before = run(b, &t)?;
    let expect_err = |what: &str, r: Result<()>, needles: &[&str]| -> Result<()> {
        let Err(e) = r else {
            bail!("{what}: accepted, expected an error");
        };
        let msg = format!("{e:#}");
        for n in needles {
            ensure!(
                msg.contains(n),
                "{what}: error '{msg}' does not mention '{n}'"
            );
        }
        Ok(())
    };
    expect_err(
        "copy_rows src 7 of 5 rows",
        b.copy_rows(&t, &[(0, 1), (7, 2)]),
        &["row 7", "5 rows"],
    )?;
    expect_err(
        "copy_rows dst 5 of 5 rows",
        b.copy_rows(&t, &[(0, 1), (2, 5)]),
        &["row 5", "5 rows"],
    )?;
    expect_err(
        "copy_rows dst 2 twice",
        b.copy_rows(&t, &[(0, 2), (1, 3), (4, 2)]),
        &["row 2", "more than once"],
    )?;
    expect_err(
        "copy_rows dst 2 twice (once as a no-op)",
        b.copy_rows(&t, &[(2, 2), (4, 2)]),
        &["row 2", "more than once"],
    )?;
    expect_err(
        "read_rows row 9 of 5 rows",
        b.read_rows(&t, &[1, 9]).map(|_| ()),
        &["row 9", "5 rows"],
    )?;
    let two = HostTensor::from_f32(vec![2, 3, 4], &[0.5; 24])?;
    expect_err(
        "write_rows 2 rows of src for 1 index",
        b.write_rows(&t, &[0], &two),
        &["[2, 3, 4]", "[1, 3, 4]"],
    )?;
    let transposed = HostTensor::from_f32(vec![2, 4, 3], &[0.5; 24])?;
    expect_err(
        "write_rows src [2, 4, 3]",
        b.write_rows(&t, &[0, 1], &transposed),
        &["[2, 4, 3]", "[2, 3, 4]"],
    )?;
    let ints = HostTensor::from_u32(vec![2, 3, 4], &[1; 24])?;
    expect_err(
        "write_rows u32 src into an f32 tensor",
        b.write_rows(&t, &[0, 1], &ints),
        &["u32", "f32"],
    )?;
    expect_err(
        "write_rows row 6 of 5 rows",
        b.write_rows(&t, &[0, 6], &two),
        &["row 6", "5 rows"],
    )?;
    expect_err(
        "write_rows row 3 twice",
        b.write_rows(&t, &[3, 3], &two),
        &["row 3", "more than once"],
    )?;
    same_bytes(
        "rows ops after rejected calls",
        "tensor unchanged",
        &run(b, &t)?,
        &before,
    )?;
    let scalar = b.upload(&HostTensor::from_f32(vec![], &[1.0])?)?;
    expect_err(
        "copy_rows on a 0-d tensor",
        b.copy_rows(&scalar, &[]),
        &["at least one dimension"],
    )?;
    Ok(())
}
