//! Tensors larger than the largest storage binding are split by rows: force a tiny chunk size
//! and check `linear` and `embedding` against the reference (and upload/download round trips).

use dayone_backend::{conformance, reference, Backend, DType, HostTensor};
use dayone_wgsl::{Options, WgslBackend};

fn small_chunks(bytes: u64) -> WgslBackend {
    WgslBackend::with_options(Options {
        max_chunk_bytes: Some(bytes),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"))
}

#[test]
fn split_linear_and_embedding() -> anyhow::Result<()> {
    // 1000 bytes per buffer: a [N, 36] f32 weight holds 6 rows per chunk.
    let b = small_chunks(1000);
    let mut rng = conformance::Rng::new(7);
    for &(m, k, n, bias) in &[
        (1usize, 36usize, 50usize, false),
        (5, 36, 23, true),
        (6, 36, 9, false),
        (2, 17, 30, true),
    ] {
        let x = conformance::rand_tensor(&mut rng, &[m, k], DType::F32, 1.0)?;
        let w = conformance::rand_tensor(&mut rng, &[n, k], DType::F32, 1.0)?;
        let bt = conformance::rand_tensor(&mut rng, &[n], DType::F32, 1.0)?;
        let wd = b.upload(&w)?;
        assert!(wd.num_chunks() > 1, "weight [{n}, {k}] was not split");
        let bd = b.upload(&bt)?;
        let got = b.linear(&b.upload(&x)?, &wd, if bias { Some(&bd) } else { None })?;
        let want = reference::linear(&x, &w, if bias { Some(&bt) } else { None })?;
        conformance::compare(
            "linear (split w)",
            &format!("[{m},{k}]x[{n},{k}]"),
            &b.download(&got)?,
            &want,
            1e-4,
        )?;
        conformance::compare(
            "upload/download (split)",
            &format!("[{n},{k}]"),
            &b.download(&wd)?,
            &w,
            0.0,
        )?;
    }
    let table = conformance::rand_tensor(&mut rng, &[97, 20], DType::F32, 1.0)?;
    let ids = HostTensor::from_u32(vec![8], &[96, 0, 13, 12, 50, 96, 1, 40])?;
    let td = b.upload(&table)?;
    assert!(td.num_chunks() > 5, "table was not split");
    let got = b.embedding(&td, &b.upload(&ids)?)?;
    conformance::compare(
        "embedding (split table)",
        "[97,20]",
        &b.download(&got)?,
        &reference::embedding(&table, &ids)?,
        0.0,
    )?;
    Ok(())
}

#[test]
fn split_by_env_var() -> anyhow::Result<()> {
    std::env::set_var(dayone_wgsl::CHUNK_ENV, "4096");
    let b = WgslBackend::new().unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"));
    std::env::remove_var(dayone_wgsl::CHUNK_ENV);
    assert_eq!(b.max_chunk_bytes(), 4096);
    let mut rng = conformance::Rng::new(8);
    let w = conformance::rand_tensor(&mut rng, &[100, 64], DType::BF16, 1.0)?;
    let x = conformance::rand_tensor(&mut rng, &[3, 64], DType::F32, 1.0)?;
    let wd = b.upload(&w)?;
    assert!(wd.num_chunks() > 1, "weight was not split");
    let got = b.linear(&b.upload(&x)?, &wd, None)?;
    conformance::compare(
        "linear (env split, bf16 w)",
        "[3,64]x[100,64]",
        &b.download(&got)?,
        &reference::linear(&x, &w, None)?,
        1e-4,
    )?;
    Ok(())
}

/// bf16 weights and tables stay packed on the device (rows of a multiple of 8 values); linear,
/// embedding and the other ops (through a device-side widening) give the reference results.
#[test]
fn packed_bf16_weights() -> anyhow::Result<()> {
    use dayone_backend::TensorInfo;
    for kernels in [
        dayone_wgsl::KernelChoice::Cpu,
        dayone_wgsl::KernelChoice::Gpu,
    ] {
        let b = WgslBackend::with_options(Options {
            kernels,
            max_chunk_bytes: Some(2048),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"));
        let mut rng = conformance::Rng::new(9);
        for &(m, k, n, bias) in &[
            (1usize, 64usize, 37usize, false),
            (2, 32, 100, true),
            (5, 64, 33, true),
            (9, 40, 21, false),
            (4, 16, 120, false),
            // GPU kernels: 4 tokens per workgroup up to 16 tokens (a partial last tile, the
            // limit), the tiled matmul above it.
            (7, 64, 30, true),
            (16, 24, 13, false),
            (17, 24, 9, true),
        ] {
            let x = conformance::rand_tensor(&mut rng, &[m, k], DType::F32, 1.0)?;
            let w = conformance::rand_tensor(&mut rng, &[n, k], DType::BF16, 1.0)?;
            let bt = conformance::rand_tensor(&mut rng, &[n], DType::F32, 1.0)?;
            let wd = b.upload(&w)?;
            assert_eq!(wd.dtype(), DType::BF16);
            let bd = b.upload(&bt)?;
            let got = b.linear(&b.upload(&x)?, &wd, if bias { Some(&bd) } else { None })?;
            let want = reference::linear(&x, &w, if bias { Some(&bt) } else { None })?;
            let case = format!(
                "{kernels:?} [{m},{k}]x[{n},{k}] bias {bias} chunks {}",
                wd.num_chunks()
            );
            conformance::compare("linear (bf16 w)", &case, &b.download(&got)?, &want, 1e-4)?;
            conformance::compare("upload/download (bf16)", &case, &b.download(&wd)?, &w, 0.0)?;
        }
        // Long rows in one buffer: each invocation of a K-splitting workgroup sums several steps.
        let whole = WgslBackend::with_options(Options {
            kernels,
            ..Default::default()
        })?;
        for &(m, k, n) in &[(1usize, 1040usize, 12usize), (6, 1040, 9), (3, 2048, 5)] {
            let x = conformance::rand_tensor(&mut rng, &[m, k], DType::F32, 1.0)?;
            let w = conformance::rand_tensor(&mut rng, &[n, k], DType::BF16, 1.0)?;
            let got = whole.linear(&whole.upload(&x)?, &whole.upload(&w)?, None)?;
            conformance::compare(
                "linear (bf16 w, long rows)",
                &format!("{kernels:?} [{m},{k}]x[{n},{k}]"),
                &whole.download(&got)?,
                &reference::linear(&x, &w, None)?,
                1e-4,
            )?;
        }
        let table = conformance::rand_tensor(&mut rng, &[50, 24], DType::BF16, 1.0)?;
        let ids = HostTensor::from_u32(vec![6], &[49, 0, 7, 7, 30, 1])?;
        let got = b.embedding(&b.upload(&table)?, &b.upload(&ids)?)?;
        conformance::compare(
            "embedding (bf16 table)",
            "[50,24]",
            &b.download(&got)?,
            &reference::embedding(&table, &ids)?,
            0.0,
        )?;
        // A bf16 norm weight (a vector: widened to f32 at upload).
        let x = conformance::rand_tensor(&mut rng, &[3, 16], DType::F32, 1.0)?;
        let nw = conformance::rand_tensor(&mut rng, &[16], DType::BF16, 1.0)?;
        let nwd = b.upload(&nw)?;
        assert_eq!(
            nwd.dtype(),
            DType::F32,
            "a bf16 vector is widened at upload"
        );
        let got = b.rms_norm(&b.upload(&x)?, &nwd, 1e-6)?;
        conformance::compare(
            "rms_norm (bf16 w)",
            "[3,16]",
            &b.download(&got)?,
            &reference::rms_norm(&x, &nw, 1e-6)?,
            1e-4,
        )?;
        // A packed bf16 matrix read by an op without a packed kernel is widened on the device.
        let pm = conformance::rand_tensor(&mut rng, &[3, 16], DType::BF16, 1.0)?;
        let pmd = b.upload(&pm)?;
        assert_eq!(pmd.dtype(), DType::BF16);
        let got = b.add(&pmd, &b.upload(&x)?)?;
        conformance::compare(
            "add (packed bf16 a)",
            "[3,16]",
            &b.download(&got)?,
            // The reference adds in f32 (it would round a bf16 sum to bf16).
            &reference::add(&HostTensor::from_f32(pm.shape.clone(), &pm.to_f32())?, &x)?,
            1e-6,
        )?;
    }
    Ok(())
}

/// The fused decode projections (`linear_many`, `linear_silu_mul`: GPU kernels, bf16 weights,
/// M ≤ 16) fall back to the unfused calls when a weight (or an output) is split: the results
/// stay bit-equal to `linear` (and `silu_mul`) of the same parts, mixed with unsplit parts.
#[test]
fn split_weights_in_fused_projections() -> anyhow::Result<()> {
    // 1000 bytes per buffer: a [N, 64] bf16 weight holds 7 rows per chunk.
    let b = WgslBackend::with_options(Options {
        max_chunk_bytes: Some(1000),
        kernels: dayone_wgsl::KernelChoice::Gpu,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"));
    let mut rng = conformance::Rng::new(8);
    let k = 64;
    for &(m, ns) in &[
        (1usize, &[5usize, 40, 3][..]),
        (3, &[6, 2][..]),
        (2, &[30, 30][..]),
    ] {
        let x = b.upload(&conformance::rand_tensor(
            &mut rng,
            &[m, k],
            DType::F32,
            1.0,
        )?)?;
        let ws = ns
            .iter()
            .map(|&n| {
                b.upload(&conformance::rand_tensor(
                    &mut rng,
                    &[n, k],
                    DType::BF16,
                    0.5,
                )?)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let parts: Vec<_> = ws.iter().map(|w| (w, None)).collect();
        let many = b.linear_many(&x, &parts)?;
        for (i, w) in ws.iter().enumerate() {
            let one = b.download(&b.linear(&x, w, None)?)?;
            anyhow::ensure!(
                b.download(&many[i])?.data == one.data,
                "linear_many part {i} of {ns:?} (M = {m}, {} chunks) differs from linear",
                w.num_chunks()
            );
        }
        if ns[0] == ns[1] {
            let got = b.download(&b.linear_silu_mul(&x, &ws[0], &ws[1])?)?;
            let two = b.silu_mul(&b.linear(&x, &ws[0], None)?, &b.linear(&x, &ws[1], None)?)?;
            anyhow::ensure!(
                got.data == b.download(&two)?.data,
                "linear_silu_mul of split weights differs from linear, linear, silu_mul"
            );
        }
    }
    Ok(())
}
