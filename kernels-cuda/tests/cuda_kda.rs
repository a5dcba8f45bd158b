//! Kimi-Linear KDA-layer ops (short_conv, kda, gated_rms_norm) on a real GPU against
//! `dayone_backend::reference`: the shared `check_kda_ops` suite (f32, bf16) with the KDA path
//! left automatic and forced to each of the two kernels; the chunked and the token-recurrent
//! kernel on the same inputs (Kimi-Linear-48B head size 128, 150-token prefills, continuing
//! state, scattered slots, both gates); a decode step after a chunked prefill against an
//! all-recurrent run. Returns early (with a line on stderr) without a CUDA device.
//! `DAYONE_CUDA_BENCH=1 … bench_kda_chunked --nocapture` times the chunked path (B 1, H 32,
//! K = V = 128, bf16, T 8192 and 32768).

use dayone_backend::conformance::{self, compare, rand_tensor, state_meta, tolerance, Rng};
use dayone_backend::{reference, Backend, DType, HostTensor, StepMeta};
use dayone_cuda::{CudaBackend, KdaPath};

mod common;
use common::backend;

#[test]
fn kda_ops_suite_every_path() {
    let Some(b) = backend("kda_ops_suite_every_path") else {
        return;
    };
    for path in [KdaPath::Auto, KdaPath::Chunked, KdaPath::Recurrent] {
        b.set_kda_path(path);
        conformance::check_kda_ops(&b).unwrap_or_else(|e| panic!("{path:?}: {e:#}"));
    }
}

/// One KDA layer's inputs for `n` tokens.
struct Inputs {
    q: HostTensor,
    k: HostTensor,
    v: HostTensor,
    a: HostTensor,
    beta: HostTensor,
    a_log: HostTensor,
    dtb: HostTensor,
}

fn inputs(rng: &mut Rng, n: usize, h: usize, k: usize, v: usize, dt: DType) -> Inputs {
    let a_log: Vec<f32> = (0..h).map(|_| (1.65 + 1.35 * rng.uniform()).ln()).collect();
    let dtb: Vec<f32> = rng.vec(h * k, 1.0).iter().map(|x| x - 1.0).collect();
    Inputs {
        q: rand_tensor(rng, &[n, h, k], dt, 1.0).unwrap(),
        k: rand_tensor(rng, &[n, h, k], dt, 1.0).unwrap(),
        v: rand_tensor(rng, &[n, h, v], dt, 1.0).unwrap(),
        a: rand_tensor(rng, &[n, h, k], dt, 1.0).unwrap(),
        beta: rand_tensor(rng, &[n, h], dt, 3.0).unwrap(),
        a_log: HostTensor::from_f32(vec![h], &a_log).unwrap(),
        dtb: HostTensor::from_f32(vec![h, k], &dtb).unwrap(),
    }
}

/// Runs `kda` on the GPU with `path`; returns (output, updated state).
fn gpu_kda(
    b: &CudaBackend,
    path: KdaPath,
    x: &Inputs,
    lb: Option<f32>,
    state: &HostTensor,
    meta: &StepMeta,
) -> (HostTensor, HostTensor) {
    b.set_kda_path(path);
    let sd = b.upload(state).unwrap();
    let dmeta = b.upload_meta(meta.clone()).unwrap();
    let u = |t: &HostTensor| b.upload(t).unwrap();
    let o = b
        .kda(
            &u(&x.q),
            &u(&x.k),
            &u(&x.v),
            &u(&x.a),
            &u(&x.beta),
            &u(&x.a_log),
            &u(&x.dtb),
            lb,
            &sd,
            &dmeta,
        )
        .unwrap();
    let out = (b.download(&o).unwrap(), b.download(&sd).unwrap());
    b.set_kda_path(KdaPath::Auto);
    out
}

/// Chunked and recurrent kernels agree with each other and with the reference (head size 128,
/// fresh and continuing 150/70-token prefills next to 1–3-token chunks), then a decode step
/// after a chunked prefill equals the all-recurrent run.
#[test]
fn kda_chunked_equals_recurrent() {
    let Some(b) = backend("kda_chunked_equals_recurrent") else {
        return;
    };
    let mut rng = Rng::new(77);
    let (h, k, v, slots) = (4, 128, 128, 6);
    let seqs = [(0usize, 150usize), (20, 3), (9, 70), (4, 1), (0, 2)];
    for dt in [DType::F32, DType::BF16] {
        for lb in [None, Some(-5.0f32)] {
            let tol = tolerance(dt);
            let meta = state_meta(&mut rng, &seqs, slots);
            let n = meta.num_tokens();
            let x = inputs(&mut rng, n, h, k, v, dt);
            let st0 = rand_tensor(&mut rng, &[slots, h, k, v], DType::F32, 0.5).unwrap();
            let (oc, sc) = gpu_kda(&b, KdaPath::Chunked, &x, lb, &st0, &meta);
            let (or, sr) = gpu_kda(&b, KdaPath::Recurrent, &x, lb, &st0, &meta);
            let mut want_st = st0.clone();
            let want = reference::kda(
                &x.q,
                &x.k,
                &x.v,
                &x.a,
                &x.beta,
                &x.a_log,
                &x.dtb,
                lb,
                &mut want_st,
                &meta,
            )
            .unwrap();
            let case = format!("{dt} lb {lb:?} seqs {seqs:?}");
            compare("kda chunked vs recurrent", &case, &oc, &or, tol).unwrap();
            compare("kda chunked vs recurrent (state)", &case, &sc, &sr, tol).unwrap();
            compare("kda chunked", &case, &oc, &want, tol).unwrap();
            compare("kda recurrent", &case, &or, &want, tol).unwrap();
            compare("kda chunked (state)", &case, &sc, &want_st, tol).unwrap();
            // Decode step: every sequence continues by one token from its prefilled state.
            let next: Vec<(usize, usize)> = seqs.iter().map(|&(c, t)| (c + t, 1)).collect();
            let mut dmeta = state_meta(&mut rng, &next, slots);
            dmeta.state_slots = meta.state_slots.clone();
            let xd = inputs(&mut rng, next.len(), h, k, v, dt);
            let xd = Inputs {
                a_log: x.a_log.clone(),
                dtb: x.dtb.clone(),
                ..xd
            };
            let (od_c, sd_c) = gpu_kda(&b, KdaPath::Auto, &xd, lb, &sc, &dmeta);
            let (od_r, sd_r) = gpu_kda(&b, KdaPath::Recurrent, &xd, lb, &sr, &dmeta);
            compare("kda decode after chunked", &case, &od_c, &od_r, tol).unwrap();
            compare("kda decode after chunked (state)", &case, &sd_c, &sd_r, tol).unwrap();
            let want_d = reference::kda(
                &xd.q,
                &xd.k,
                &xd.v,
                &xd.a,
                &xd.beta,
                &xd.a_log,
                &xd.dtb,
                lb,
                &mut want_st,
                &dmeta,
            )
            .unwrap();
            compare("kda decode vs reference", &case, &od_c, &want_d, tol).unwrap();
        }
    }
}

/// Chunked KDA prefill, B 1, H 32, K = V = 128, bf16 q/k/v/a/b, f32 gate parameters and state
/// (the fla `chunk_kda` comparison shapes). Times the whole op (descriptor upload, scratch,
/// both kernels).
#[test]
fn bench_kda_chunked() {
    if std::env::var("DAYONE_CUDA_BENCH").as_deref() != Ok("1") {
        eprintln!("SKIPPED bench_kda_chunked: set DAYONE_CUDA_BENCH=1");
        return;
    }
    let Some(b) = backend("bench_kda_chunked") else {
        return;
    };
    let (h, k, v) = (32, 128, 128);
    let mut rng = Rng::new(5);
    for t in [8192usize, 32768] {
        let meta = state_meta(&mut rng, &[(0, t)], 1);
        let x = inputs(&mut rng, t, h, k, v, DType::BF16);
        let u = |t: &HostTensor| b.upload(t).unwrap();
        let (q, kk, vv, a, beta, a_log, dtb) = (
            u(&x.q),
            u(&x.k),
            u(&x.v),
            u(&x.a),
            u(&x.beta),
            u(&x.a_log),
            u(&x.dtb),
        );
        let st = b.zeros(&[1, h, k, v], DType::F32).unwrap();
        let dmeta = b.upload_meta(meta).unwrap();
        // DAYONE_KDA_BENCH_FAST=1: the chunked path only.
        let paths: &[KdaPath] = if std::env::var("DAYONE_KDA_BENCH_FAST").as_deref() == Ok("1") {
            &[KdaPath::Chunked]
        } else {
            &[KdaPath::Chunked, KdaPath::Recurrent]
        };
        for &path in paths {
            b.set_kda_path(path);
            let iters = if path == KdaPath::Chunked { 10 } else { 2 };
            let ms = b
                .time_ms(1, iters, || {
                    b.kda(&q, &kk, &vv, &a, &beta, &a_log, &dtb, None, &st, &dmeta)
                        .map(|_| ())
                })
                .unwrap();
            println!(
                "kda {path:?} bf16 B 1 T {t} H {h} K {k} V {v}: {ms:.3} ms ({:.1} Mtok/s)",
                t as f32 / ms / 1e3
            );
            if path == KdaPath::Chunked {
                b.set_kda_profile(true);
                for _ in 0..2 {
                    b.kda(&q, &kk, &vv, &a, &beta, &a_log, &dtb, None, &st, &dmeta)
                        .unwrap();
                }
                b.set_kda_profile(false);
                let (prep, scan) = b.kda_last_split_ms();
                println!("  chunked split T {t}: prep {prep:.3} ms, scan {scan:.3} ms");
            }
        }
        b.set_kda_path(KdaPath::Auto);
    }
}
