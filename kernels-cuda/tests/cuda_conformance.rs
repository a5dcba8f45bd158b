//! The shared conformance suite and extra attention cases on a real GPU. Every test returns early
//! (with a line on stderr) when no CUDA driver or device is present, so CI without a GPU passes;
//! the GPU run is made explicitly on the GPU machine.

use dayone_backend::conformance::{self, compare, rand_tensor, tolerance, AttnCase, Rng};
use dayone_backend::{reference, Backend, DType, HostTensor};
use dayone_cuda::CudaBackend;

fn backend(test: &str) -> Option<CudaBackend> {
    if !dayone_cuda::is_available() {
        let why = match dayone_cuda::LibraryPresence::probe().check() {
            Err(e) => e.to_string(),
            Ok(()) => "no CUDA device".to_string(),
        };
        eprintln!("SKIPPED {test}: {why}");
        return None;
    }
    let b = CudaBackend::new(0).expect("CUDA backend");
    eprintln!("{test}: {}", b.name());
    Some(b)
}

#[test]
fn conformance_suite() {
    let Some(b) = backend("conformance_suite") else {
        return;
    };
    conformance::check_all(&b).unwrap();
    // Every decode fusion, the ones off by default included (the suite ran the defaults).
    for fusions in [dayone_cuda::ALL_DECODE_FUSIONS, &[]] {
        b.set_decode_fusions(fusions);
        for dt in conformance::activation_dtypes(&b) {
            conformance::check_rms_norm_linear(&b, dt).unwrap();
            conformance::check_linear_add_rms_norm(&b, dt).unwrap();
            conformance::check_rope_write_kv(&b, dt).unwrap();
            conformance::check_paged_attention(&b, dt).unwrap();
            conformance::check_moe_experts_shared(&b, dt).unwrap();
            conformance::check_short_conv_many(&b, dt).unwrap();
            conformance::check_moe_route(&b, dt).unwrap();
            conformance::check_rms_norm_moe_route(&b, dt).unwrap();
            conformance::check_gated_rms_norm_linear(&b, dt).unwrap();
            conformance::check_kda_from_projections(&b, dt).unwrap();
        }
    }
    // f16 activations too (the suite covers f32 and bf16).
    for check in [
        conformance::check_linear::<CudaBackend>,
        conformance::check_rms_norm,
        conformance::check_rope,
        conformance::check_silu_mul,
        conformance::check_add,
        conformance::check_write_kv,
        conformance::check_paged_attention,
        conformance::check_argmax,
        conformance::check_embedding,
        conformance::check_rms_norm_moe_route,
        conformance::check_gated_rms_norm_linear,
        conformance::check_linear_add_rms_norm,
        conformance::check_kda_from_projections,
    ] {
        check(&b, DType::F16).unwrap();
    }
}

/// Batch-invariant mode: every op still matches the reference, and rows computed in calls of
/// any size and composition are bit-identical (`conformance_invariance`).
#[test]
fn batch_invariant_mode() {
    let Some(b) = backend("batch_invariant_mode") else {
        return;
    };
    assert!(!b.batch_invariant(), "off by default");
    b.set_batch_invariant(true).unwrap();
    dayone_backend::conformance_invariance::check_batch_invariance(&b).unwrap();
    conformance::check_all(&b).unwrap();
    dayone_backend::conformance_ext::check_ext(&b).unwrap();
}

/// Low-bit routed experts read from their codes (MXFP4, INT4; `moe_q_*` in `kernels/quant.cu`)
/// at 1, 3 and 8 tokens, against the reference experts on the decoded weights.
#[test]
fn quantized_experts() {
    let Some(b) = backend("quantized_experts") else {
        return;
    };
    dayone_backend::conformance_quant::check_experts_quant(&b).unwrap();
}

#[test]
fn window_sinks_and_biased_experts() {
    let Some(b) = backend("window_sinks_and_biased_experts") else {
        return;
    };
    dayone_backend::conformance_ext::check_ext(&b).unwrap();
}

fn attn_case(
    h: usize,
    hkv: usize,
    hd_k: usize,
    hd_v: usize,
    bs: usize,
    seqs: &[(usize, usize)],
) -> AttnCase {
    AttnCase {
        h,
        hkv,
        hd_k,
        hd_v,
        block_size: bs,
        seqs: seqs.to_vec(),
        spare_blocks: 2,
    }
}

fn run_attention(b: &CudaBackend, case: &AttnCase, dt: DType, rng: &mut Rng) {
    let (meta, blocks) = case.meta(rng);
    let n = meta.num_tokens();
    let q = rand_tensor(rng, &[n, case.h, case.hd_k], dt, 3.0).unwrap();
    let kc = rand_tensor(
        rng,
        &[blocks, case.block_size, case.hkv, case.hd_k],
        dt,
        1.0,
    )
    .unwrap();
    let vc = rand_tensor(
        rng,
        &[blocks, case.block_size, case.hkv, case.hd_v],
        dt,
        1.0,
    )
    .unwrap();
    let scale = 1.0 / (case.hd_k as f32).sqrt();
    let want = reference::paged_attention(&q, &kc, &vc, &meta, scale).unwrap();
    let dmeta = b.upload_meta(meta.clone()).unwrap();
    let got = b
        .paged_attention(
            &b.upload(&q).unwrap(),
            &b.upload(&kc).unwrap(),
            &b.upload(&vc).unwrap(),
            &dmeta,
            scale,
        )
        .unwrap();
    let desc = format!(
        "{dt} H {} Hkv {} hd {}/{} bs {} seqs {:?}",
        case.h, case.hkv, case.hd_k, case.hd_v, case.block_size, case.seqs
    );
    compare(
        "paged_attention",
        &desc,
        &b.download(&got).unwrap(),
        &want,
        tolerance(dt),
    )
    .unwrap();
}

/// Pure decode steps (one query token per sequence) take the split-K decode kernel, which the
/// shared suite (mixed steps) does not reach: GQA 1/3/4/8/16, head dims 32..256, hd_k ≠ hd_v,
/// short and long contexts (one and many splits), block sizes 16 and 32.
#[test]
fn decode_attention() {
    let Some(b) = backend("decode_attention") else {
        return;
    };
    let mut rng = Rng::new(99);
    let cases = [
        attn_case(32, 8, 128, 128, 16, &[(1023, 1)]),
        attn_case(32, 8, 128, 128, 16, &[(0, 1), (5, 1), (300, 1), (2047, 1)]),
        attn_case(4, 4, 64, 64, 16, &[(37, 1), (0, 1), (129, 1)]),
        attn_case(9, 3, 64, 64, 32, &[(500, 1), (17, 1)]),
        attn_case(16, 1, 128, 128, 16, &[(700, 1)]),
        attn_case(16, 2, 256, 256, 16, &[(100, 1), (3000, 1)]),
        attn_case(8, 2, 192, 128, 16, &[(64, 1), (65, 1)]),
        attn_case(4, 2, 32, 32, 16, &[(10, 1), (90, 1)]),
        attn_case(2, 1, 64, 64, 16, &[(5000, 1)]),
    ];
    for dt in [DType::F32, DType::BF16, DType::F16] {
        for c in &cases {
            run_attention(&b, c, dt, &mut rng);
        }
    }
}

/// Prefill-shaped steps on the tiled kernel: long prompts, odd head dims (not a multiple of 8),
/// hd above 256.
#[test]
fn prefill_attention() {
    let Some(b) = backend("prefill_attention") else {
        return;
    };
    let mut rng = Rng::new(7);
    let cases = [
        attn_case(32, 8, 128, 128, 16, &[(0, 300)]),
        attn_case(8, 8, 64, 64, 16, &[(0, 77), (40, 33), (3, 1)]),
        attn_case(6, 3, 40, 24, 16, &[(0, 20), (9, 1)]),
        attn_case(4, 4, 6, 6, 16, &[(0, 5), (3, 1)]),
        attn_case(4, 1, 576, 512, 16, &[(0, 40), (30, 1)]),
    ];
    for dt in [DType::F32, DType::BF16] {
        for c in &cases {
            run_attention(&b, c, dt, &mut rng);
        }
    }
}

/// Larger linear shapes (Llama-3.1-8B projections) against the reference.
#[test]
fn large_linear() {
    let Some(b) = backend("large_linear") else {
        return;
    };
    let mut rng = Rng::new(5);
    for &(m, k, n) in &[
        (1usize, 4096usize, 1024usize),
        (5, 1024, 3000),
        (64, 512, 640),
        (2, 4096, 1000),
        (8, 2048, 333),
        (4, 8, 5),
        (3, 14336, 77),
        (1, 2056, 4099),
        (6, 1544, 9000),
    ] {
        for dt in [DType::F32, DType::BF16] {
            let x = rand_tensor(&mut rng, &[m, k], dt, 1.0).unwrap();
            let w = rand_tensor(&mut rng, &[n, k], dt, 0.05).unwrap();
            let want = reference::linear(&x, &w, None).unwrap();
            let got = b
                .linear(&b.upload(&x).unwrap(), &b.upload(&w).unwrap(), None)
                .unwrap();
            compare(
                "linear",
                &format!("{dt} [{m},{k}]x[{n},{k}]"),
                &b.download(&got).unwrap(),
                &want,
                tolerance(dt),
            )
            .unwrap();
        }
    }
}

/// The tensor-core skinny product (`gemv_tc_*`, 5–16 rows of x) against the reference: one and
/// two token tiles, one and two 16-row weight tiles per block, N not a multiple of 16, K not a
/// multiple of 32 (a step's tail loads zeros), with and without a bias, bf16 and f16.
#[test]
fn skinny_tensor_core_product() {
    let Some(b) = backend("skinny_tensor_core_product") else {
        return;
    };
    b.set_gemv_tc(true);
    let mut rng = Rng::new(11);
    let sms = b.device_info().sms;
    for &(m, k, n) in &[
        (5usize, 1024usize, 3000usize),
        (8, 4096, 1000),
        (8, 2056, 5000),
        (9, 136, 33),
        (12, 14336, 77),
        (13, 4096, 4099),
        (16, 1032, 9000),
        (7, 8, 5),
    ] {
        // The case reaches the kernel (and the plans cover NT 1 and 2, RG 1 and 2 on a
        // 132-SM card), not a fallback.
        assert!(
            dayone_cuda::gemv_tc_plan(m, n, k, sms).is_some(),
            "[{m},{k}]x[{n},{k}] does not take the tensor-core product"
        );
        for dt in [DType::BF16, DType::F16] {
            let x = rand_tensor(&mut rng, &[m, k], dt, 1.0).unwrap();
            let w = rand_tensor(&mut rng, &[n, k], dt, 0.05).unwrap();
            let bias = rand_tensor(&mut rng, &[n], dt, 1.0).unwrap();
            let (xd, wd, bd) = (
                b.upload(&x).unwrap(),
                b.upload_weight(&w).unwrap(),
                b.upload(&bias).unwrap(),
            );
            for with_bias in [false, true] {
                let bh = with_bias.then_some(&bias);
                let want = reference::linear(&x, &w, bh).unwrap();
                let got = b.linear(&xd, &wd, with_bias.then_some(&bd)).unwrap();
                compare(
                    "linear (tensor-core skinny product)",
                    &format!("{dt} [{m},{k}]x[{n},{k}] bias {with_bias}"),
                    &b.download(&got).unwrap(),
                    &want,
                    tolerance(dt),
                )
                .unwrap();
            }
        }
    }
    b.set_gemv_tc(false);
}

/// Bad inputs come back as errors naming the op, not panics.
#[test]
fn bad_inputs_are_errors() {
    let Some(b) = backend("bad_inputs_are_errors") else {
        return;
    };
    let x = b
        .upload(&HostTensor::from_f32(vec![2, 3], &[0.0; 6]).unwrap())
        .unwrap();
    let ids = b
        .upload(&HostTensor::from_u32(vec![2], &[0, 1]).unwrap())
        .unwrap();
    let e = b.linear(&x, &ids, None).unwrap_err().to_string();
    assert!(e.starts_with("linear"), "{e}");
    let e = b.embedding(&ids, &ids).unwrap_err().to_string();
    assert!(e.starts_with("embedding"), "{e}");
    let e = b.argmax(&ids).unwrap_err().to_string();
    assert!(e.starts_with("argmax"), "{e}");
    let e = b.rms_norm(&x, &x, 1e-5).unwrap_err().to_string();
    assert!(e.starts_with("rms_norm"), "{e}");
}

/// Every tile variant of the tensor-core grouped expert GEMM (`moe_mma{16,32,128,128w}_*` and the
/// 64-row `moe_mma_*`, forced through [`CudaBackend::set_moe_tile`], i.e. the same
/// `launch::moe_plan` selection `DAYONE_MOE_TILE` feeds) against the reference experts, bf16 and
/// f16: 5 tokens (tiles of ≤ 16 rows), 70 (ragged tiles of every size), 300 and 1100 (full
/// tiles and a ragged tail per expert), output widths that are not multiples of a block's
/// columns, reductions that are not multiples of BK, an odd output width (down of D = 37, the
/// gate_up then on the FMA kernel), with SwiGLU, gpt-oss's GLU with biases and the clamped
/// SwiGLU with and without biases.
#[test]
fn grouped_expert_tiles() {
    use dayone_backend::{ExpertAct, ExpertOptions};
    use dayone_cuda::MoeTile;
    let Some(b) = backend("grouped_expert_tiles") else {
        return;
    };
    let mut rng = Rng::new(77);
    // (N, D, E, F, k)
    let cases: &[(usize, usize, usize, usize, usize)] = &[
        (5, 200, 8, 72, 2),
        (70, 200, 32, 72, 4),
        (70, 136, 6, 40, 2),
        (300, 200, 8, 72, 2),
        (1100, 136, 8, 136, 2),
        (90, 37, 4, 64, 2),
    ];
    let acts = [
        (ExpertAct::Swiglu, false),
        (
            ExpertAct::GptOss {
                alpha: 1.702,
                limit: 7.0,
            },
            true,
        ),
        (ExpertAct::SwigluClamped { limit: 7.0 }, true),
        (ExpertAct::SwigluClamped { limit: 7.0 }, false),
    ];
    let tiles = [
        MoeTile::Rows16,
        MoeTile::Rows32,
        MoeTile::Rows64,
        MoeTile::Rows128,
        MoeTile::Rows128Wide,
        MoeTile::Rows128K64,
        MoeTile::Rows128Warps8,
        MoeTile::Rows64Wide,
        MoeTile::Rows128Raster,
        MoeTile::Rows128Warps8Raster,
        MoeTile::Wgmma256,
        MoeTile::Wgmma128,
    ];
    for dt in [DType::BF16, DType::F16] {
        for &(n, d, e, f, k) in cases {
            let x = rand_tensor(&mut rng, &[n, d], dt, 1.0).unwrap();
            // Large enough that |g|, |u| pass the clamp of 7 for some outputs.
            let gate_up =
                rand_tensor(&mut rng, &[e, 2 * f, d], dt, 20.0 / (d as f32).sqrt()).unwrap();
            let down = rand_tensor(&mut rng, &[e, d, f], dt, 0.5 / (f as f32).sqrt()).unwrap();
            let gu_bias = rand_tensor(&mut rng, &[e, 2 * f], dt, 1.0).unwrap();
            let dn_bias = rand_tensor(&mut rng, &[e, d], dt, 1.0).unwrap();
            // Expert 0 in every token's choices (its tiles run full), the rest random.
            let mut ids = Vec::with_capacity(n * k);
            for _ in 0..n {
                let mut all: Vec<u32> = (1..e as u32).collect();
                rng.shuffle(&mut all);
                ids.push(0);
                ids.extend_from_slice(&all[..k - 1]);
            }
            let weights: Vec<f32> = (0..n * k)
                .map(|_| 0.1 + 0.4 * rng.uniform().abs())
                .collect();
            let ids = HostTensor::from_u32(vec![n, k], &ids).unwrap();
            let weights = HostTensor::from_f32(vec![n, k], &weights).unwrap();
            let up = |t: &HostTensor| b.upload(t).unwrap();
            let (xd, idd, wd, gud, dnd) = (up(&x), up(&ids), up(&weights), up(&gate_up), up(&down));
            let (gbd, dbd) = (up(&gu_bias), up(&dn_bias));
            for (act, biased) in acts {
                let (gb, db) = if biased {
                    (Some(&gu_bias), Some(&dn_bias))
                } else {
                    (None, None)
                };
                let want =
                    reference::moe_experts_ext(&x, &ids, &weights, &gate_up, &down, act, gb, db)
                        .unwrap();
                let opts = ExpertOptions {
                    act,
                    gate_up_bias: biased.then_some(&gbd),
                    down_bias: biased.then_some(&dbd),
                    fp8: false,
                };
                for tile in tiles {
                    b.set_moe_tile(tile);
                    let got = b
                        .moe_experts_ext(&xd, &idd, &wd, &gud, &dnd, &opts)
                        .unwrap();
                    compare(
                        "moe_experts_ext",
                        &format!(
                            "{dt} {tile:?} {act:?} biases {biased} x [{n}, {d}] E {e} F {f} k {k}"
                        ),
                        &b.download(&got).unwrap(),
                        &want,
                        tolerance(dt),
                    )
                    .unwrap();
                }
            }
        }
    }
    b.set_moe_tile(MoeTile::Auto);
}

/// The decode fusions that claim the same bits as the ops they join: the router GEMV with its
/// top-k in one launch (`router_topk`) and KDA's three convolutions in one launch (`conv3`,
/// also checked against `short_conv` in `conformance_suite`) give exactly the ids and weights
/// of the separate launches, Kimi-Linear-48B's and DeepSeek-V3's router shapes among them.
#[test]
fn router_topk_fusion_is_bit_equal() {
    let Some(b) = backend("router_topk_fusion_is_bit_equal") else {
        return;
    };
    let mut rng = Rng::new(5);
    // (N, D, E, top_k, groups, topk_group)
    for &(n, d, e, k, g, tg) in &[
        (1, 2304, 256, 8, 1, 1),
        (1, 7168, 256, 8, 8, 4),
        (3, 7168, 256, 8, 8, 4),
        (8, 64, 64, 6, 1, 1),
    ] {
        let routing = dayone_backend::MoeRouting {
            top_k: k,
            n_group: g,
            topk_group: tg,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
        };
        let x = b
            .upload(&rand_tensor(&mut rng, &[n, d], DType::BF16, 1.0).unwrap())
            .unwrap();
        let gate = b
            .upload(&rand_tensor(&mut rng, &[e, d], DType::F32, 0.05).unwrap())
            .unwrap();
        let bias = b
            .upload(&rand_tensor(&mut rng, &[e], DType::F32, 0.1).unwrap())
            .unwrap();
        let mut outs = Vec::new();
        for fusions in [&[dayone_cuda::DecodeFusion::RouterTopk][..], &[]] {
            b.set_decode_fusions(fusions);
            let (ids, w) = b.moe_route(&x, &gate, Some(&bias), &routing).unwrap();
            outs.push((b.download(&ids).unwrap().data, b.download(&w).unwrap().data));
        }
        assert_eq!(
            outs[0], outs[1],
            "router top-k fused vs separate: N {n} D {d} E {e}"
        );
    }
    b.set_decode_fusions(dayone_cuda::DEFAULT_DECODE_FUSIONS);
}
