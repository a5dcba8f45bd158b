//! WGSL-specific checks of the MLA and MoE ops beyond the shared suite: weights stored as packed
//! bf16 under f32 activations (what `--dtype bf16` gives on this backend), on both kernel
//! families, and the error for expert weights larger than one storage binding.

use dayone_backend::{conformance, reference, Backend, DType, HostTensor, TensorInfo};
use dayone_wgsl::{KernelChoice, Options, WgslBackend};

fn backend(kernels: KernelChoice, max_chunk_bytes: Option<u64>) -> WgslBackend {
    WgslBackend::with_options(Options {
        kernels,
        max_chunk_bytes,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"))
}

/// `head_linear` and `moe_experts` with packed-bf16 weights (rows a multiple of 8) and f32 x.
#[test]
fn packed_bf16_weights() -> anyhow::Result<()> {
    for kernels in [KernelChoice::Cpu, KernelChoice::Gpu] {
        let b = backend(kernels, None);
        let mut rng = conformance::Rng::new(31);
        for &(n, h, k, o) in &[(1usize, 4usize, 16usize, 32usize), (7, 3, 128, 40)] {
            let x = conformance::rand_tensor(&mut rng, &[n, h, k], DType::F32, 1.0)?;
            let w = conformance::rand_tensor(&mut rng, &[h, o, k], DType::BF16, 0.3)?;
            let wd = b.upload(&w)?;
            assert_eq!(wd.dtype(), DType::BF16, "w was not kept packed");
            let got = b.download(&b.head_linear(&b.upload(&x)?, &wd)?)?;
            let want = reference::head_linear(&x, &w)?;
            conformance::compare(
                "head_linear (bf16 w)",
                &format!("{kernels:?}"),
                &got,
                &want,
                1e-4,
            )?;
        }
        for &(n, d, e, f, k) in &[
            (1usize, 64usize, 16usize, 32usize, 4usize),
            (9, 96, 8, 24, 3),
        ] {
            let x = conformance::rand_tensor(&mut rng, &[n, d], DType::F32, 1.0)?;
            let gu = conformance::rand_tensor(&mut rng, &[e, 2 * f, d], DType::BF16, 0.3)?;
            let dn = conformance::rand_tensor(&mut rng, &[e, d, f], DType::BF16, 0.3)?;
            let ids: Vec<u32> = (0..n * k).map(|i| ((i * 5 + i / k) % e) as u32).collect();
            let ids = HostTensor::from_u32(vec![n, k], &ids)?;
            let wts = HostTensor::from_f32(vec![n, k], &rng.vec(n * k, 1.0))?;
            let (gud, dnd) = (b.upload(&gu)?, b.upload(&dn)?);
            assert_eq!((gud.dtype(), dnd.dtype()), (DType::BF16, DType::BF16));
            let got = b.moe_experts(
                &b.upload(&x)?,
                &b.upload(&ids)?,
                &b.upload(&wts)?,
                &gud,
                &dnd,
            )?;
            let want = reference::moe_experts(&x, &ids, &wts, &gu, &dn)?;
            conformance::compare(
                "moe_experts (bf16 weights)",
                &format!("{kernels:?} x [{n}, {d}] E {e} F {f} k {k}"),
                &b.download(&got)?,
                &want,
                1e-4,
            )?;
        }
    }
    Ok(())
}

/// Stacked experts that do not fit one storage binding are refused with a clear error (on
/// lavapipe the limit is 128 MiB; here the chunk size is forced down to 4 KiB).
#[test]
fn oversized_experts_are_refused() -> anyhow::Result<()> {
    let b = backend(KernelChoice::Auto, Some(4096));
    let mut rng = conformance::Rng::new(32);
    let (n, d, e, f) = (2usize, 32usize, 8usize, 16usize);
    let x = b.upload(&conformance::rand_tensor(
        &mut rng,
        &[n, d],
        DType::F32,
        1.0,
    )?)?;
    let gu = b.upload(&conformance::rand_tensor(
        &mut rng,
        &[e, 2 * f, d],
        DType::F32,
        1.0,
    )?)?;
    let dn = b.upload(&conformance::rand_tensor(
        &mut rng,
        &[e, d, f],
        DType::F32,
        1.0,
    )?)?;
    assert!(gu.num_chunks() > 1, "gate_up was not split");
    let ids = b.upload(&HostTensor::from_u32(vec![n, 1], &[0, 7])?)?;
    let w = b.upload(&HostTensor::from_f32(vec![n, 1], &[1.0, 1.0])?)?;
    let err = match b.moe_experts(&x, &ids, &w, &gu, &dn) {
        Ok(_) => panic!("split gate_up was accepted"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("moe_experts") && err.contains("gate_up") && err.contains("storage binding"),
        "unclear error: {err}"
    );
    Ok(())
}
