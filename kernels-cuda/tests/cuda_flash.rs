//! `attention_varlen` on the GPU: a larger correctness case than the conformance suite (a long
//! causal prompt split into two key segments, against the f64 reference on sampled rows) and,
//! with `DAYONE_CUDA_BENCH=1`, the kernel's rate on one sequence of 8K / 32K / 128K tokens
//! (causal, 32 heads; expanded MLA 192/128 and 128/128), counting 2·H·(hd_k + hd_v) FLOPs per
//! visible (query, key) pair. Skipped without a CUDA device.

use dayone_backend::conformance::{compare, rand_tensor, Rng};
use dayone_backend::varlen::{attention_varlen, upload_varlen, VarlenMeta};
use dayone_backend::{Backend, DType, HostTensor, VarlenResult};
use dayone_cuda::FlashVariant;

mod common;
use common::backend;

/// One sequence of `n` queries at positions `p0 ..` over keys `k0 .. k0 + m`.
fn one_seq(n: usize, p0: u32, k0: u32, m: usize, causal: bool) -> VarlenMeta {
    VarlenMeta {
        query_start: vec![0, n as u32],
        key_start: vec![0, m as u32],
        key_pos0: vec![k0],
        positions: (p0..p0 + n as u32).collect(),
        causal,
    }
}

#[test]
fn long_prompt_in_two_segments() {
    let Some(b) = backend("long_prompt_in_two_segments") else {
        return;
    };
    let (n, h, dk, dv) = (1500usize, 4usize, 192usize, 128usize);
    let mut rng = Rng::new(11);
    let q = rand_tensor(&mut rng, &[n, h, dk], DType::BF16, 1.0).unwrap();
    let k = rand_tensor(&mut rng, &[n, h, dk], DType::BF16, 1.0).unwrap();
    let v = rand_tensor(&mut rng, &[n, h, dv], DType::BF16, 1.0).unwrap();
    let scale = 1.0 / (dk as f32).sqrt();
    let (want, _) = attention_varlen(&q, &k, &v, &one_seq(n, 0, 0, n, true), scale, None).unwrap();
    let want = HostTensor::from_f32_as(vec![n, h, dv], &want, DType::BF16).unwrap();
    let qd = b.upload(&q).unwrap();
    let cut = 777;
    let slice = |t: &HostTensor, a: usize, e: usize| {
        let w = t.shape[1] * t.shape[2] * 2;
        HostTensor::new(
            vec![e - a, t.shape[1], t.shape[2]],
            t.dtype,
            t.data[a * w..e * w].to_vec(),
        )
        .unwrap()
    };
    for var in FlashVariant::ALL {
        let mut state = None;
        for (i, (a, e)) in [(0, cut), (cut, n)].into_iter().enumerate() {
            let kd = b.upload(&slice(&k, a, e)).unwrap();
            let vd = b.upload(&slice(&v, a, e)).unwrap();
            let m = upload_varlen(&b, one_seq(n, 0, a as u32, e - a, true), n, e - a).unwrap();
            let prior = state.as_ref().map(|(o, l)| (o, l));
            match b
                .attention_varlen_with(&qd, &kd, &vd, &m, scale, prior, i == 1, Some(var))
                .unwrap()
            {
                VarlenResult::State { o, lse } => state = Some((o, lse)),
                VarlenResult::Final(o) => {
                    let case = format!("1500 tokens, cut at 777, {var:?}");
                    compare(
                        "attention_varlen",
                        &case,
                        &b.download(&o).unwrap(),
                        &want,
                        2e-2,
                    )
                    .unwrap()
                }
            }
        }
    }
}

#[test]
fn bench_flash_attention() {
    if std::env::var_os("DAYONE_CUDA_BENCH").is_none() {
        eprintln!("SKIPPED bench_flash_attention: set DAYONE_CUDA_BENCH=1");
        return;
    }
    let Some(b) = backend("bench_flash_attention") else {
        return;
    };
    for (dk, dv) in [(64usize, 64usize), (128, 128), (192, 128), (256, 256)] {
        for var in FlashVariant::ALL {
            if let Ok((regs, local)) = b.flash_kernel_resources(DType::BF16, (dk, dv), var) {
                println!(
                    "flash_attn k{dk}_v{dv} {}: {regs} registers, {local} B local memory per thread",
                    var.name()
                );
            }
        }
    }
    let h = 32usize;
    for (dk, dv) in [(192usize, 128usize), (128, 128)] {
        // FLASH_BENCH_N: the lengths, comma-separated (default 8192,32768,131072).
        let lens: Vec<usize> = std::env::var("FLASH_BENCH_N")
            .ok()
            .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_else(|| vec![8192, 32768, 131072]);
        for &n in &lens {
            let mut rng = Rng::new(5);
            // Values in [-1, 1): scores stay moderate at any length.
            let q = b
                .upload(&rand_tensor(&mut rng, &[n, h, dk], DType::BF16, 1.0).unwrap())
                .unwrap();
            let k = b
                .upload(&rand_tensor(&mut rng, &[n, h, dk], DType::BF16, 1.0).unwrap())
                .unwrap();
            let v = b
                .upload(&rand_tensor(&mut rng, &[n, h, dv], DType::BF16, 1.0).unwrap())
                .unwrap();
            let m = upload_varlen(&b, one_seq(n, 0, 0, n, true), n, n).unwrap();
            let scale = 1.0 / (dk as f32).sqrt();
            let iters = if n > 65536 { 3 } else { 10 };
            for var in FlashVariant::ALL {
                let ms = b
                    .time_ms(1, iters, || {
                        b.attention_varlen_with(&q, &k, &v, &m, scale, None, true, Some(var))
                            .map(|_| ())
                    })
                    .unwrap();
                let pairs = n as f64 * (n as f64 + 1.0) / 2.0;
                let flops = 2.0 * h as f64 * (dk + dv) as f64 * pairs;
                println!(
                    "flash_attn bf16 causal N {n} H {h} hd_k {dk} hd_v {dv} {}: {ms:.3} ms, {:.1} TFLOP/s",
                    var.name(),
                    flops / (ms as f64 * 1e-3) / 1e12
                );
            }
        }
    }
}
