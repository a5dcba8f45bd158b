//! DeepSeek-V3 ops (head_linear, write_cache, paged_latent_attention, moe_route, moe_experts) on a
//! real GPU against `dayone_backend::reference`: the shared `check_mla_moe` suite (f32, bf16) plus
//! f16 and DeepSeek-V3-sized cases (128 heads, L 512 / R 64, long contexts that take the split-K
//! path, prefill chunks starting mid-sequence, MoE prefill on the tensor-core grouped GEMM with
//! n_group 1 and 8). Returns early (with a line on stderr) without a CUDA device.
//! `DAYONE_CUDA_BENCH=1` also times latent decode attention (batch 1 and 32, context 4096).

use dayone_backend::conformance::{self, compare, rand_tensor, tolerance, LatentCase, Rng};
use dayone_backend::{reference, Backend, DType, HostTensor, MoeRouting};
use dayone_cuda::CudaBackend;

mod common;
use common::backend;

#[test]
fn mla_moe_suite() {
    let Some(b) = backend("mla_moe_suite") else {
        return;
    };
    conformance::check_mla_moe(&b).unwrap();
    conformance::check_head_linear(&b, DType::F16).unwrap();
    conformance::check_write_cache(&b, DType::F16).unwrap();
    conformance::check_paged_latent_attention(&b, DType::F16).unwrap();
    conformance::check_moe_experts(&b, DType::F16).unwrap();
}

fn latent(b: &CudaBackend, case: &LatentCase, dt: DType, rng: &mut Rng) {
    let (meta, blocks) = case.meta(rng);
    let n = meta.num_tokens();
    let (h, l, r, bs) = (case.h, case.l, case.r, case.block_size);
    let q_lat = rand_tensor(rng, &[n, h, l], dt, 1.0).unwrap();
    let q_rope = rand_tensor(rng, &[n, h, r], dt, 1.0).unwrap();
    let cache = rand_tensor(rng, &[blocks, bs, l + r], dt, 1.0).unwrap();
    let scale = 1.0 / 192f32.sqrt() * 4.0;
    let want = reference::paged_latent_attention(&q_lat, &q_rope, &cache, &meta, scale).unwrap();
    let dmeta = b.upload_meta(meta.clone()).unwrap();
    let got = b
        .paged_latent_attention(
            &b.upload(&q_lat).unwrap(),
            &b.upload(&q_rope).unwrap(),
            &b.upload(&cache).unwrap(),
            &dmeta,
            scale,
        )
        .unwrap();
    compare(
        "paged_latent_attention",
        &format!("{dt} H {h} L {l} R {r} bs {bs} seqs {:?}", case.seqs),
        &b.download(&got).unwrap(),
        &want,
        tolerance(dt),
    )
    .unwrap();
}

/// DeepSeek-V3 widths with 128 heads: pure decode (several sequences, split-K + combine) and
/// prefill chunks starting mid-sequence and mid-block.
#[test]
fn latent_attention_deepseek_shapes() {
    let Some(b) = backend("latent_attention_deepseek_shapes") else {
        return;
    };
    let mut rng = Rng::new(31);
    let c = |h, l, r, block_size, seqs: &[(usize, usize)]| LatentCase {
        h,
        l,
        r,
        block_size,
        seqs: seqs.to_vec(),
    };
    let cases = [
        c(128, 512, 64, 64, &[(1500, 1), (3, 1), (700, 1)]),
        c(128, 512, 64, 16, &[(0, 1)]),
        c(128, 512, 64, 64, &[(37, 20), (0, 9)]),
        c(16, 512, 64, 16, &[(100, 1), (60, 30)]),
        c(40, 256, 32, 16, &[(200, 1), (33, 1)]),
    ];
    for dt in [DType::BF16, DType::F16] {
        for case in &cases {
            latent(&b, case, dt, &mut rng);
        }
    }
    latent(&b, &cases[0], DType::F32, &mut rng);
}

fn experts(b: &CudaBackend, n: usize, d: usize, e: usize, f: usize, k: usize, dt: DType) {
    let mut rng = Rng::new((n * 31 + d) as u64);
    let x = rand_tensor(&mut rng, &[n, d], dt, 1.0).unwrap();
    let gate_up = rand_tensor(&mut rng, &[e, 2 * f, d], dt, 3.0 / (d as f32).sqrt()).unwrap();
    let down = rand_tensor(&mut rng, &[e, d, f], dt, 2.0 / (f as f32).sqrt()).unwrap();
    let mut ids = Vec::with_capacity(n * k);
    for _ in 0..n {
        let mut all: Vec<u32> = (0..e as u32).collect();
        rng.shuffle(&mut all);
        ids.extend_from_slice(&all[..k]);
    }
    let w: Vec<f32> = (0..n * k).map(|_| 0.2 + rng.uniform()).collect();
    let ids = HostTensor::from_u32(vec![n, k], &ids).unwrap();
    let w = HostTensor::from_f32(vec![n, k], &w).unwrap();
    let want = reference::moe_experts(&x, &ids, &w, &gate_up, &down).unwrap();
    let run = || {
        let got = b
            .moe_experts(
                &b.upload(&x).unwrap(),
                &b.upload(&ids).unwrap(),
                &b.upload(&w).unwrap(),
                &b.upload(&gate_up).unwrap(),
                &b.upload(&down).unwrap(),
            )
            .unwrap();
        b.download(&got).unwrap()
    };
    let got = run();
    compare(
        "moe_experts",
        &format!("{dt} N {n} D {d} E {e} F {f} k {k}"),
        &got,
        &want,
        tolerance(dt),
    )
    .unwrap();
    // Deterministic: a second run gives the same bits.
    assert_eq!(got.data, run().data, "moe_experts is not deterministic");
}

/// Grouped GEMM paths: GEMV (≤ 64 tokens), tensor-core (bf16/f16, more tokens), FMA (f32 and
/// widths that are not multiples of 8), one expert taking most tokens.
#[test]
fn moe_experts_paths() {
    let Some(b) = backend("moe_experts_paths") else {
        return;
    };
    for dt in [DType::BF16, DType::F32] {
        experts(&b, 1, 512, 64, 256, 8, dt);
        experts(&b, 64, 256, 16, 128, 4, dt);
        experts(&b, 200, 512, 32, 256, 8, dt);
        experts(&b, 150, 136, 8, 72, 2, dt);
        experts(&b, 70, 100, 4, 44, 3, dt);
    }
    experts(&b, 300, 256, 2, 96, 1, DType::BF16);
}

/// Decode-sized steps on the small-step paths (`moe_sort`'s stable rank for ≤ 64 pairs and its
/// block scan over 256 experts, the warp-per-row grouped GEMV with K = 2304 and 1024, i.e. not
/// multiples of 256 elements per warp pass, the column-split combine): 1, 2, 3 and 8 tokens,
/// top-8 of 256 experts (Kimi-Linear's gate_up K = 2304; its down K = 1024 on 16 experts to
/// keep the host reference small), bf16 and f32.
#[test]
fn moe_experts_decode_steps() {
    let Some(b) = backend("moe_experts_decode_steps") else {
        return;
    };
    for dt in [DType::BF16, DType::F32] {
        for n in [1, 2, 3, 8] {
            experts(&b, n, 2304, 256, 64, 8, dt);
            experts(&b, n, 264, 16, 1024, 8, dt);
        }
    }
}

/// A router's gate `[e, d]` (scale 6/√d) and score-correction bias `[e]` (scale 0.3), f32,
/// drawn from `rng` in that order.
fn router_weights(rng: &mut Rng, e: usize, d: usize) -> (HostTensor, HostTensor) {
    let gate = HostTensor::from_f32(vec![e, d], &rng.vec(e * d, 6.0 / (d as f32).sqrt())).unwrap();
    let bias = HostTensor::from_f32(vec![e], &rng.vec(e, 0.3)).unwrap();
    (gate, bias)
}

/// DeepSeek-V3's routing (top 8, normalised, scaled by 2.5) with `n_group` groups of which
/// `topk_group` are kept.
fn top8_routing(n_group: usize, topk_group: usize) -> MoeRouting {
    MoeRouting {
        top_k: 8,
        n_group,
        topk_group,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
    }
}

/// Routing with DeepSeek-V3's 256 experts at n_group 1 and 8, many tokens (cuBLAS logits) and
/// few (GEMV logits): ids exactly (on rows with a clear margin), weights within tolerance.
#[test]
fn moe_route_deepseek() {
    let Some(b) = backend("moe_route_deepseek") else {
        return;
    };
    let (e, d) = (256usize, 1024usize);
    let mut rng = Rng::new(77);
    let (gate, bias) = router_weights(&mut rng, e, d);
    for (n, groups, kg) in [(1usize, 8usize, 4usize), (5, 1, 1), (300, 8, 4), (64, 1, 1)] {
        let routing = top8_routing(groups, kg);
        for dt in [DType::F32, DType::BF16] {
            let x = rand_tensor(&mut rng, &[n, d], dt, 1.0).unwrap();
            let (wi, ww) = reference::moe_route(&x, &gate, Some(&bias), &routing).unwrap();
            let (gi, gw) = b
                .moe_route(
                    &b.upload(&x).unwrap(),
                    &b.upload(&gate).unwrap(),
                    Some(&b.upload(&bias).unwrap()),
                    &routing,
                )
                .unwrap();
            let (gi, gw) = (
                b.download(&gi).unwrap().to_u32().unwrap(),
                b.download(&gw).unwrap().to_f32(),
            );
            let (wi, wwv) = (wi.to_u32().unwrap(), ww.to_f32());
            // Random rows may have near-ties; allow a handful of rows to differ, but only then.
            let bad = (0..n)
                .filter(|&t| gi[t * 8..t * 8 + 8] != wi[t * 8..t * 8 + 8])
                .count();
            assert!(
                bad * 50 <= n,
                "{dt} n {n} groups {groups}: {bad} rows differ"
            );
            for t in 0..n {
                if gi[t * 8..t * 8 + 8] == wi[t * 8..t * 8 + 8] {
                    for j in 0..8 {
                        let (a, c) = (gw[t * 8 + j], wwv[t * 8 + j]);
                        assert!(
                            (a - c).abs() <= 1e-3 * c.abs().max(1.0),
                            "{dt} weight {a} vs {c}"
                        );
                    }
                }
            }
        }
    }
}

/// The decode router widens bf16/f16 x inside its GEMV (`gemv_x*_f32`); its ids and weights
/// must equal, bit for bit, routing the same x widened first (`to_f32`, the f32 GEMV path), at
/// every GEMV token count, with n_group 1 and 8.
#[test]
fn moe_route_fused_cast_exact() {
    let Some(b) = backend("moe_route_fused_cast_exact") else {
        return;
    };
    let (e, d) = (256usize, 2304usize);
    let mut rng = Rng::new(91);
    let (gate, bias) = router_weights(&mut rng, e, d);
    let (gate, bias) = (b.upload(&gate).unwrap(), b.upload(&bias).unwrap());
    for (groups, kg) in [(1usize, 1usize), (8, 4)] {
        let routing = top8_routing(groups, kg);
        for n in [1usize, 2, 3, 8] {
            for dt in [DType::BF16, DType::F16] {
                let x = b
                    .upload(&rand_tensor(&mut rng, &[n, d], dt, 1.0).unwrap())
                    .unwrap();
                let xf = b.to_f32(&x).unwrap();
                let (gi, gw) = b.moe_route(&x, &gate, Some(&bias), &routing).unwrap();
                let (wi, ww) = b.moe_route(&xf, &gate, Some(&bias), &routing).unwrap();
                let what = format!("{dt} n {n} groups {groups}");
                assert_eq!(
                    b.download(&gi).unwrap().data,
                    b.download(&wi).unwrap().data,
                    "{what}: ids"
                );
                assert_eq!(
                    b.download(&gw).unwrap().data,
                    b.download(&ww).unwrap().data,
                    "{what}: weights"
                );
            }
        }
    }
}

/// `DAYONE_CUDA_BENCH=1`: latent decode attention, 128 heads, L 512 + R 64, bf16, context 4096.
#[test]
fn bench_latent_decode() {
    if std::env::var("DAYONE_CUDA_BENCH").map_or(true, |v| v != "1") {
        eprintln!("SKIPPED bench_latent_decode: set DAYONE_CUDA_BENCH=1");
        return;
    }
    let Some(b) = backend("bench_latent_decode") else {
        return;
    };
    let mut rng = Rng::new(3);
    let (h, l, r, bs, ctx) = (128usize, 512usize, 64usize, 64usize, 4096usize);
    for batch in [1usize, 32, 64] {
        let case = LatentCase {
            h,
            l,
            r,
            block_size: bs,
            seqs: vec![(ctx - 1, 1); batch],
        };
        let (meta, blocks) = case.meta(&mut rng);
        let dt = DType::BF16;
        let q_lat = b
            .upload(&rand_tensor(&mut rng, &[batch, h, l], dt, 1.0).unwrap())
            .unwrap();
        let q_rope = b
            .upload(&rand_tensor(&mut rng, &[batch, h, r], dt, 1.0).unwrap())
            .unwrap();
        let cache = b
            .upload(&rand_tensor(&mut rng, &[blocks, bs, l + r], dt, 1.0).unwrap())
            .unwrap();
        let dmeta = b.upload_meta(meta).unwrap();
        let ms = b
            .time_ms(3, 20, || {
                b.paged_latent_attention(&q_lat, &q_rope, &cache, &dmeta, 0.07)
                    .map(|_| ())
            })
            .unwrap();
        let bytes = (batch * ctx * (l + r) * 2) as f64;
        let flops = (batch * h * ctx * (2 * l + r) * 2) as f64;
        println!(
            "latent decode bf16 H {h} L {l}+{r} ctx {ctx} batch {batch}: {:.1} µs, {:.0} GB/s of latent rows, {:.1} TFLOP/s",
            ms * 1e3,
            bytes / (ms as f64 * 1e-3) / 1e9,
            flops / (ms as f64 * 1e-3) / 1e12
        );
    }
}

/// DeepSeek-V3.2 DSA ops (`layer_norm`, `dsa_topk`, `sparse_latent_attention`) against the
/// reference: the shared suite (f32, bf16) plus f16.
#[test]
fn dsa_suite() {
    let Some(b) = backend("dsa_suite") else {
        return;
    };
    conformance::check_dsa_ops(&b).unwrap();
    conformance::check_layer_norm(&b, DType::F16).unwrap();
    conformance::check_dsa_topk(&b, DType::F16).unwrap();
    conformance::check_sparse_latent_attention(&b, DType::F16).unwrap();
}

/// `dsa_topk` over a prefill step split into many query groups (a tiny score budget) selects
/// exactly what one group does, on both scoring kernels (f32: FMA, bf16: tensor cores).
#[test]
fn dsa_topk_query_groups() {
    use dayone_backend::conformance::AttnCase;
    let Some(b) = backend("dsa_topk_query_groups") else {
        return;
    };
    let mut rng = Rng::new(9);
    for dt in [DType::F32, DType::BF16] {
        let (meta, blocks) = AttnCase {
            h: 8,
            hkv: 1,
            hd_k: 64,
            hd_v: 64,
            block_size: 16,
            seqs: vec![(0, 300), (500, 200), (40, 1)],
            spare_blocks: 2,
        }
        .meta(&mut rng);
        let n = meta.num_tokens();
        let q = b
            .upload(&rand_tensor(&mut rng, &[n, 8, 64], dt, 1.0).unwrap())
            .unwrap();
        let w = b
            .upload(&rand_tensor(&mut rng, &[n, 8], dt, 1.0).unwrap())
            .unwrap();
        let k = b
            .upload(&rand_tensor(&mut rng, &[blocks, 16, 64], dt, 1.0).unwrap())
            .unwrap();
        let stride = meta
            .positions
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap();
        let dmeta = b.upload_meta(meta).unwrap();
        let mut runs = Vec::new();
        for budget in [1 << 30, stride.next_multiple_of(4) * 4 * 7] {
            b.set_dsa_score_bytes(budget);
            let sel = b.dsa_topk(&q, &w, &k, &dmeta, 0.125, 64).unwrap();
            let mut rows = b.download(&sel).unwrap().to_u32().unwrap();
            for row in rows.chunks_mut(64) {
                row.sort_unstable();
            }
            runs.push(rows);
        }
        b.set_dsa_score_bytes(dayone_cuda::DSA_SCORE_BYTES);
        assert!(
            runs[0] == runs[1],
            "{dt}: groups of 7 queries select differently from one group"
        );
    }
}
