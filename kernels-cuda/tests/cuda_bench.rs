//! GPU measurements (run explicitly on the GPU machine with `DAYONE_CUDA_BENCH=1`; skipped
//! otherwise). Prints the conditions, the bytes or FLOPs counted and the achieved rate:
//! device copy bandwidth (the roofline), cuBLAS bf16 GEMV/GEMM on Llama-3.1-8B projection
//! shapes, decode and prefill paged attention, and a synthetic Llama-3.1-8B decode step built
//! from the trait's ops (random bf16 weights) at batch 1 and 64.

use dayone_backend::{Backend, DType, HostTensor, RopeStyle, StepMeta, TensorInfo};
use dayone_cuda::{CudaBackend, CudaTensor};
use std::time::Instant;

struct Gen(u64);
impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Random bf16 values with magnitudes in about [2^-8, 2) and random signs (never zero or NaN).
fn rand_bf16(shape: &[usize], seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut g = Gen(seed);
    let mut data = Vec::with_capacity(n * 2);
    let mut i = 0;
    while i < n {
        let r = g.next();
        for j in 0..4 {
            if i >= n {
                break;
            }
            let b = (r >> (16 * j)) as u16;
            let sign = b & 0x8000;
            let exp = 119 + ((b >> 7) & 7); // 2^-8 .. 2^0
            let bits = sign | (exp << 7) | (b & 0x7f);
            data.extend_from_slice(&bits.to_le_bytes());
            i += 1;
        }
    }
    HostTensor::new(shape.to_vec(), DType::BF16, data).unwrap()
}

fn gbs(bytes: f64, ms: f32) -> f64 {
    bytes / (ms as f64 * 1e-3) / 1e9
}

fn decode_meta(batch: usize, ctx: usize, bs: usize) -> StepMeta {
    let per = (ctx + 1).div_ceil(bs);
    let mut m = StepMeta {
        max_blocks: per,
        block_size: bs,
        ..Default::default()
    };
    m.query_start.push(0);
    for s in 0..batch {
        for j in 0..per {
            m.block_tables.push((s * per + j) as u32);
        }
        m.positions.push(ctx as u32);
        m.token_seq.push(s as u32);
        m.slot_mapping
            .push(((s * per + ctx / bs) * bs + ctx % bs) as u32);
        m.seq_lens.push(ctx as u32 + 1);
        m.query_start.push(s as u32 + 1);
        m.logit_rows.push(s as u32);
    }
    m.max_seq_len = ctx + 1;
    m
}

#[test]
fn bench() {
    if std::env::var("DAYONE_CUDA_BENCH").ok().as_deref() != Some("1") {
        eprintln!("SKIPPED bench: set DAYONE_CUDA_BENCH=1 to run the GPU measurements");
        return;
    }
    if !dayone_cuda::is_available() {
        eprintln!("SKIPPED bench: no CUDA device");
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    let info = b.device_info().clone();
    println!(
        "# {} | NVRTC {:?} target {:?}",
        b.name(),
        info.nvrtc_version,
        info.target
    );
    let t0 = Instant::now();
    b.precompile(DType::BF16).unwrap();
    println!(
        "precompile bf16 (NVRTC or disk cache): {:.2} s",
        t0.elapsed().as_secs_f64()
    );

    // 1. Copy bandwidth (read + write counted).
    let big = b.zeros(&[1 << 30], DType::BF16).unwrap(); // 2 GiB
    let ms = b
        .time_ms(2, 10, || b.copy_slice(&big, 0, &[1 << 30]).map(|_| ()))
        .unwrap();
    let copy_bw = gbs(2.0 * (1u64 << 31) as f64, ms);
    println!("device copy 2 GiB: {ms:.3} ms = {copy_bw:.0} GB/s (read+write)");
    drop(big);

    // 2. cuBLAS GEMV / GEMM, bf16, 4 weight copies rotated (> L2).
    let src = b.upload(&rand_bf16(&[128256 * 4096 + 8192], 1)).unwrap();
    for &(n, k) in &[
        (14336usize, 4096usize),
        (4096, 14336),
        (4096, 4096),
        (1024, 4096),
        (128256, 4096),
    ] {
        let ws: Vec<CudaTensor> = (0..4)
            .map(|i| b.copy_slice(&src, (i * 7919) % 1000, &[n, k]).unwrap())
            .collect();
        for &m in &[1usize, 64] {
            let x = b.copy_slice(&src, 12345, &[m, k]).unwrap();
            let mut i = 0;
            let ms = b
                .time_ms(3, 40, || {
                    i += 1;
                    b.linear(&x, &ws[i % 4], None).map(|_| ())
                })
                .unwrap();
            let bytes = ((n * k) + m * k + m * n) as f64 * 2.0;
            let tflops = 2.0 * (m * n * k) as f64 / (ms as f64 * 1e-3) / 1e12;
            println!(
                "linear bf16 M={m:3} N={n:6} K={k:5}: {:8.1} us  {:6.0} GB/s ({:4.1}% of copy)  {tflops:6.1} TFLOP/s",
                ms * 1e3,
                gbs(bytes, ms),
                100.0 * gbs(bytes, ms) / copy_bw
            );
            if m == 1 {
                let ms = b
                    .time_ms(3, 40, || {
                        i += 1;
                        b.linear_cublas(&x, &ws[i % 4], None).map(|_| ())
                    })
                    .unwrap();
                println!(
                    "  (cuBLAS GemmEx, same shape:   {:8.1} us  {:6.0} GB/s ({:4.1}% of copy))",
                    ms * 1e3,
                    gbs(bytes, ms),
                    100.0 * gbs(bytes, ms) / copy_bw
                );
            }
        }
    }

    // Host cost per op: many tiny adds, enqueue time only.
    {
        let a = b.copy_slice(&src, 0, &[1, 4096]).unwrap();
        b.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..2000 {
            b.add(&a, &a).unwrap();
        }
        let host_us = t.elapsed().as_secs_f64() * 1e6 / 2000.0;
        b.synchronize().unwrap();
        let ms = b.time_ms(10, 2000, || b.add(&a, &a).map(|_| ())).unwrap();
        println!(
            "tiny add [1,4096]: host enqueue {host_us:.2} us/op, device {:.2} us/op",
            ms * 1e3
        );
    }

    // 3. Decode attention, Llama-3.1-8B shape (H 32, Hkv 8, hd 128), bf16, block size 16.
    let (h, hkv, hd, bs) = (32usize, 8usize, 128usize, 16usize);
    for &(batch, ctx) in &[
        (1usize, 1024usize),
        (1, 4096),
        (1, 32768),
        (64, 1024),
        (64, 4096),
    ] {
        let meta = decode_meta(batch, ctx, bs);
        let blocks = batch * meta.max_blocks;
        let kc = b.copy_slice(&src, 0, &[blocks, bs, hkv, hd]).unwrap();
        let vc = b.copy_slice(&src, 77, &[blocks, bs, hkv, hd]).unwrap();
        let q = b.copy_slice(&src, 999, &[batch, h, hd]).unwrap();
        let dm = b.upload_meta(meta).unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        let ms = b
            .time_ms(3, 50, || {
                b.paged_attention(&q, &kc, &vc, &dm, scale).map(|_| ())
            })
            .unwrap();
        let bytes = (batch * (ctx + 1) * hkv * hd * 2 * 2) as f64;
        println!(
            "decode attention bf16 batch {batch:2} ctx {ctx:5}: {:8.1} us  {:6.0} GB/s of KV ({:4.1}% of copy)",
            ms * 1e3,
            gbs(bytes, ms),
            100.0 * gbs(bytes, ms) / copy_bw
        );
    }

    // 4. Prefill attention: one sequence of 2048 tokens, causal.
    prefill(&b, &src);
    drop(src);

    // 5. Synthetic Llama-3.1-8B decode step through the trait's ops, with and without
    // programmatic dependent launch.
    llama_decode(&b, copy_bw);
    b.trim_memory().unwrap();
    drop(b);
    std::env::set_var("DAYONE_CUDA_PDL", "0");
    std::env::set_var("DAYONE_CUDA_MMA_ATTN", "0");
    let b = CudaBackend::new(0).unwrap();
    println!("-- without programmatic dependent launch and tensor-core prefill attention:");
    let src = b.upload(&rand_bf16(&[1 << 26], 9)).unwrap();
    prefill(&b, &src);
    drop(src);
    llama_decode(&b, copy_bw);
}

fn prefill(b: &CudaBackend, src: &CudaTensor) {
    let (h, hkv, hd, bs) = (32usize, 8usize, 128usize, 16usize);
    let src = src.clone();

    let n = 2048usize;
    let per = n.div_ceil(bs);
    let mut m = StepMeta {
        max_blocks: per,
        block_size: bs,
        ..Default::default()
    };
    m.block_tables = (0..per as u32).collect();
    m.positions = (0..n as u32).collect();
    m.token_seq = vec![0; n];
    m.slot_mapping = (0..n as u32).collect();
    m.seq_lens = vec![n as u32];
    m.query_start = vec![0, n as u32];
    m.logit_rows = vec![n as u32 - 1];
    m.max_seq_len = n;
    let kc = b.copy_slice(&src, 0, &[per, bs, hkv, hd]).unwrap();
    let vc = b.copy_slice(&src, 5, &[per, bs, hkv, hd]).unwrap();
    let q = b.copy_slice(&src, 9, &[n, h, hd]).unwrap();
    let dm = b.upload_meta(m).unwrap();
    let ms = b
        .time_ms(1, 5, || {
            b.paged_attention(&q, &kc, &vc, &dm, 0.088).map(|_| ())
        })
        .unwrap();
    let flops = 4.0 * h as f64 * hd as f64 * (n * (n + 1) / 2) as f64;
    println!(
        "prefill attention bf16 2048 tokens: {:.2} ms  {:.1} TFLOP/s",
        ms,
        flops / (ms as f64 * 1e-3) / 1e12
    );
}

struct Layer {
    n1: CudaTensor,
    n2: CudaTensor,
    wq: CudaTensor,
    wk: CudaTensor,
    wv: CudaTensor,
    wo: CudaTensor,
    wg: CudaTensor,
    wu: CudaTensor,
    wd: CudaTensor,
    kc: CudaTensor,
    vc: CudaTensor,
}

fn llama_decode(b: &CudaBackend, copy_bw: f64) {
    let (d, f, h, hkv, hd, vocab, nl, bs) = (
        4096usize,
        14336usize,
        32usize,
        8usize,
        128usize,
        128256usize,
        32usize,
        16usize,
    );
    let src = b.upload(&rand_bf16(&[vocab * d + 8192], 3)).unwrap();
    let w = |n: usize, k: usize, off: usize| b.copy_slice(&src, off % 4096, &[n, k]).unwrap();
    let max_batch = 64usize;
    let ctx = 512usize;
    let per = (ctx + 1).div_ceil(bs);
    let blocks = max_batch * per;
    let norm_w = b
        .upload(&HostTensor::from_f32_as(vec![d], &vec![1.0; d], DType::BF16).unwrap())
        .unwrap();
    let layers: Vec<Layer> = (0..nl)
        .map(|l| Layer {
            n1: norm_w.clone(),
            n2: norm_w.clone(),
            wq: w(h * hd, d, l),
            wk: w(hkv * hd, d, l + 1),
            wv: w(hkv * hd, d, l + 2),
            wo: w(d, h * hd, l + 3),
            wg: w(f, d, l + 4),
            wu: w(f, d, l + 5),
            wd: w(d, f, l + 6),
            kc: b.copy_slice(&src, l, &[blocks, bs, hkv, hd]).unwrap(),
            vc: b.copy_slice(&src, l + 9, &[blocks, bs, hkv, hd]).unwrap(),
        })
        .collect();
    let embed = w(vocab, d, 11);
    let lm_head = w(vocab, d, 13);
    drop(src);
    let inv: Vec<f32> = (0..hd / 2)
        .map(|i| 500000f32.powf(-((2 * i) as f32) / hd as f32))
        .collect();
    let inv = b
        .upload(&HostTensor::from_f32(vec![hd / 2], &inv).unwrap())
        .unwrap();
    let weight_bytes: usize = layers
        .iter()
        .map(|l| {
            [&l.wq, &l.wk, &l.wv, &l.wo, &l.wg, &l.wu, &l.wd]
                .iter()
                .map(|t| t.numel() * 2)
                .sum::<usize>()
        })
        .sum::<usize>()
        + lm_head.numel() * 2;
    println!(
        "llama-3.1-8B synthetic: {nl} layers, weights read per step {:.2} GB, ctx {ctx}, block size {bs}",
        weight_bytes as f64 / 1e9
    );
    for &batch in &[1usize, 64] {
        let ids: Vec<u32> = (0..batch as u32).map(|i| i * 101 + 7).collect();
        let ids = b
            .upload(&HostTensor::from_u32(vec![batch], &ids).unwrap())
            .unwrap();
        let meta = decode_meta(batch, ctx, bs);
        let step = || -> anyhow::Result<CudaTensor> {
            let dm = b.upload_meta(meta.clone())?;
            let mut x = b.embedding(&embed, &ids)?;
            for l in &layers {
                let hn = b.rms_norm(&x, &l.n1, 1e-5)?;
                let q = b.reshape(&b.linear(&hn, &l.wq, None)?, &[batch, h, hd])?;
                let k = b.reshape(&b.linear(&hn, &l.wk, None)?, &[batch, hkv, hd])?;
                let v = b.reshape(&b.linear(&hn, &l.wv, None)?, &[batch, hkv, hd])?;
                let q = b.rope(&q, &dm.positions, &inv, hd, RopeStyle::HalfSplit, 1.0)?;
                let k = b.rope(&k, &dm.positions, &inv, hd, RopeStyle::HalfSplit, 1.0)?;
                b.write_kv(&k, &v, &l.kc, &l.vc, &dm)?;
                let a = b.paged_attention(&q, &l.kc, &l.vc, &dm, 0.088)?;
                let o = b.linear(&b.reshape(&a, &[batch, h * hd])?, &l.wo, None)?;
                x = b.add(&x, &o)?;
                let hn = b.rms_norm(&x, &l.n2, 1e-5)?;
                let g = b.linear(&hn, &l.wg, None)?;
                let u = b.linear(&hn, &l.wu, None)?;
                let m = b.linear(&b.silu_mul(&g, &u)?, &l.wd, None)?;
                x = b.add(&x, &m)?;
            }
            let hn = b.rms_norm(&x, &norm_w, 1e-5)?;
            let logits = b.linear(&hn, &lm_head, None)?;
            b.argmax(&logits)
        };
        let ms = b.time_ms(3, 20, || step().map(|_| ())).unwrap();
        // Host enqueue time alone (the GPU may still be running when the loop ends).
        b.synchronize().unwrap();
        let t = Instant::now();
        for _ in 0..20 {
            step().unwrap();
        }
        let host_ms = t.elapsed().as_secs_f64() * 1e3 / 20.0;
        b.synchronize().unwrap();
        let kv_bytes = (nl * batch * (ctx + 1) * hkv * hd * 2 * 2) as f64;
        let bytes = weight_bytes as f64 + kv_bytes;
        let achieved = gbs(bytes, ms);
        println!(
            "llama-3.1-8B decode batch {batch:2}: {ms:.3} ms/step (host enqueue {host_ms:.3} ms)  {:.0} tok/s  {achieved:.0} GB/s = {:.1}% of copy roofline",
            batch as f64 / (ms as f64 * 1e-3),
            100.0 * achieved / copy_bw
        );
    }
}
