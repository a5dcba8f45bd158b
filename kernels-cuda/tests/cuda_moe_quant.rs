//! The direct low-bit expert kernels (`moe_q_*` in `kernels/quant.cu`) at gpt-oss-like widths
//! on a real GPU: reduction widths over one 1024-column chunk and not a multiple of it (m8's
//! shared-memory staging), an expert with more than 8 pairs (two tiles, the second partial),
//! against the host reference on the decoded weights; and each token of a multi-token call
//! (m8 tiles) against the same token alone (m1), which reads the same codes in the same order.
//! Returns early (with a line on stderr) when no CUDA driver or device is present.

use anyhow::Result;
use dayone_backend::conformance::{activation_dtypes, compare, rand_tensor, tolerance, Rng};
use dayone_backend::conformance_quant::rand_quant;
use dayone_backend::quant::ScaleType;
use dayone_backend::{
    reference, Backend, DType, ExpertAct, ExpertOptions, HostTensor, QuantFormat, QuantTensor,
};
use dayone_cuda::CudaBackend;

mod common;
use common::backend;

/// The token rows `t` of `y` [N, D] (f32 view) as an f32 [1, D] tensor.
fn row(y: &HostTensor, t: usize) -> Result<HostTensor> {
    let d = y.shape[1];
    HostTensor::from_f32(vec![1, d], &y.to_f32()[t * d..(t + 1) * d])
}

fn check_wide(b: &CudaBackend) -> Result<()> {
    let mut rng = Rng::new(2880);
    // gate_up reduces over d = 2880 (chunks of 1024, 1024, 832), down over f = 1088 (1024, 64).
    let (e, d, f) = (3usize, 2880usize, 1088usize);
    let gpt_oss = ExpertAct::GptOss {
        alpha: 1.702,
        limit: 7.0,
    };
    for fmt in [QuantFormat::MXFP4, QuantFormat::int4(32, ScaleType::BF16)] {
        let gu = rand_quant(&mut rng, fmt, [e, 2 * f, d])?;
        let dn = rand_quant(&mut rng, fmt, [e, d, f])?;
        let (gud, dnd) = (QuantTensor::upload(b, &gu)?, QuantTensor::upload(b, &dn)?);
        let (guf, dnf) = (gu.to_host(DType::F32)?, dn.to_host(DType::F32)?);
        for dt in activation_dtypes(b) {
            let gu_bias = rand_tensor(&mut rng, &[e, 2 * f], dt, 1.0)?;
            let dn_bias = rand_tensor(&mut rng, &[e, d], dt, 1.0)?;
            let (gbd, dbd) = (b.upload(&gu_bias)?, b.upload(&dn_bias)?);
            // 12 tokens, top 2 over 3 experts: expert 0 in every token (12 pairs: tiles of 8
            // and 4), experts 1 and 2 in 6 each.
            let (n, k) = (12usize, 2usize);
            let ids: Vec<u32> = (0..n as u32).flat_map(|t| [0, 1 + t % 2]).collect();
            let x = rand_tensor(&mut rng, &[n, d], dt, 1.0)?;
            let w: Vec<f32> = (0..n * k)
                .map(|_| 0.1 + 0.4 * rng.uniform().abs())
                .collect();
            let idh = HostTensor::from_u32(vec![n, k], &ids)?;
            let wh = HostTensor::from_f32(vec![n, k], &w)?;
            let (xd, idd, wd) = (b.upload(&x)?, b.upload(&idh)?, b.upload(&wh)?);
            for (act, biased) in [(ExpertAct::Swiglu, false), (gpt_oss, true)] {
                let case = format!("{} {dt} {act:?} biases {biased}", fmt.name());
                let (gb, db) = if biased {
                    (Some(&gu_bias), Some(&dn_bias))
                } else {
                    (None, None)
                };
                let want = reference::moe_experts_ext(&x, &idh, &wh, &guf, &dnf, act, gb, db)?;
                let opts = ExpertOptions {
                    act,
                    gate_up_bias: biased.then_some(&gbd),
                    down_bias: biased.then_some(&dbd),
                    fp8: false,
                };
                let got = b.download(&b.moe_experts_quant(&xd, &idd, &wd, &gud, &dnd, &opts)?)?;
                compare("moe_experts_quant m8", &case, &got, &want, tolerance(dt))?;
                // One token alone (the m1 kernels) against its row of the batch (m8).
                for t in [0, 5, n - 1] {
                    let xt =
                        HostTensor::from_f32_as(vec![1, d], &x.to_f32()[t * d..(t + 1) * d], dt)?;
                    let it = HostTensor::from_u32(vec![1, k], &ids[t * k..(t + 1) * k])?;
                    let wt = HostTensor::from_f32(vec![1, k], &w[t * k..(t + 1) * k])?;
                    let (xtd, itd, wtd) = (b.upload(&xt)?, b.upload(&it)?, b.upload(&wt)?);
                    let one =
                        b.download(&b.moe_experts_quant(&xtd, &itd, &wtd, &gud, &dnd, &opts)?)?;
                    compare(
                        "moe_experts_quant m1 vs m8",
                        &format!("{case} token {t}"),
                        &HostTensor::from_f32(vec![1, d], &one.to_f32())?,
                        &row(&got, t)?,
                        1e-6,
                    )?;
                }
            }
        }
    }
    Ok(())
}

#[test]
fn moe_quant_wide_tiles() {
    let Some(b) = backend("moe_quant_wide_tiles") else {
        return;
    };
    check_wide(&b).unwrap();
}
