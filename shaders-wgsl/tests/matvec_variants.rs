//! Every decode matvec variant (`dayone_wgsl::matvec_variants`, packed-bf16 weights, M ≤ 16 on
//! the GPU kernel family) against the shared `linear` conformance checks, long reductions that
//! reach the unrolled loop of the widest workgroups, and row results that do not depend on M.
//! Forces [`KernelChoice::Gpu`]: lavapipe would otherwise take the CPU kernels, which never
//! run these variants. Needs a Vulkan/Metal/DX12 adapter (CI installs Mesa lavapipe).

use dayone_backend::conformance::{self, rand_tensor, Rng};
use dayone_backend::{reference, Backend, DType, HostTensor};
use dayone_wgsl::{matvec_variants, KernelChoice, Options, WgslBackend};

fn backend() -> WgslBackend {
    match WgslBackend::with_options(Options {
        kernels: KernelChoice::Gpu,
        ..Default::default()
    }) {
        Ok(b) => b,
        Err(e) => panic!("WGSL backend unavailable: {e:#}"),
    }
}

fn ok(variant: &str, r: anyhow::Result<()>) {
    if let Err(e) = r {
        panic!("matvec variant {variant}: {e:#}");
    }
}

/// `linear` of bf16 `x [m, k]`, `w [n, k]` on the device, compared with the host reference.
fn check_case(b: &WgslBackend, rng: &mut Rng, m: usize, k: usize, n: usize) -> anyhow::Result<()> {
    let x = rand_tensor(rng, &[m, k], DType::BF16, 1.0)?;
    let w = rand_tensor(rng, &[n, k], DType::BF16, 0.5)?;
    let want = reference::linear(&x, &w, None)?;
    let got = b.download(&b.linear(&b.upload(&x)?, &b.upload(&w)?, None)?)?;
    // The reference sums in another order; scale the tolerance with the reduction length.
    let tol = conformance::tolerance(DType::BF16) * (k as f32 / 1024.0).max(1.0);
    conformance::compare(
        "linear",
        &format!("x [{m}, {k}] w [{n}, {k}]"),
        &got,
        &want,
        tol,
    )
}

/// Each row of a 7-token call equals, byte for byte, the same row computed alone.
fn check_rows_independent_of_m(b: &WgslBackend, rng: &mut Rng) -> anyhow::Result<()> {
    let (m, k, n) = (7, 2056, 37);
    let x = rand_tensor(rng, &[m, k], DType::F32, 1.0)?;
    let w = b.upload(&rand_tensor(rng, &[n, k], DType::BF16, 0.5)?)?;
    let all = b.download(&b.linear(&b.upload(&x)?, &w, None)?)?;
    let xs = x.to_f32();
    let row_bytes = n * 4;
    for r in 0..m {
        let xr = HostTensor::from_f32(vec![1, k], &xs[r * k..(r + 1) * k])?;
        let one = b.download(&b.linear(&b.upload(&xr)?, &w, None)?)?;
        anyhow::ensure!(
            one.data == all.data[r * row_bytes..(r + 1) * row_bytes],
            "row {r} of an M = {m} call differs from the row computed alone"
        );
    }
    Ok(())
}

#[test]
fn every_matvec_variant_conforms() {
    let b = backend();
    eprintln!("backend: {} (subgroups: {})", b.name(), b.has_subgroups());
    for v in matvec_variants() {
        let ran = b.set_matvec(v).expect("known variant");
        assert_eq!(b.matvec(), ran);
        eprintln!("variant {v} (runs {ran})");
        ok(v, conformance::check_linear(&b, DType::BF16));
        ok(v, conformance::check_linear_many(&b, DType::BF16));
        ok(v, conformance::check_linear_silu_mul(&b, DType::BF16));
        let mut rng = Rng::new(5);
        // K past 2·256·8 (the unrolled loop of 256-invocation workgroups) with a remainder;
        // N not a multiple of 8 (clamped tail rows); M = 1, a partial and a full token tile.
        for &(m, k, n) in &[(1, 4104, 37), (3, 4104, 13), (16, 8200, 9), (1, 8, 3)] {
            ok(v, check_case(&b, &mut rng, m, k, n));
        }
        ok(v, check_rows_independent_of_m(&b, &mut rng));
    }
}

#[test]
fn unknown_matvec_variant_is_refused() {
    let b = backend();
    assert!(b.set_matvec("nope").is_err());
    assert!(WgslBackend::with_options(Options {
        matvec: Some("nope".into()),
        ..Default::default()
    })
    .is_err());
}

/// The decode projections are fused into one dispatch per group of up to 4 parts
/// (`linear_many`) and one per `linear_silu_mul` on every generated variant; `wg64` (no
/// generated form) runs them unfused.
#[test]
fn fused_projections_dispatch_once() {
    let b = backend();
    let mut rng = Rng::new(9);
    let up = |t: HostTensor| b.upload(&t).expect("upload");
    let x = up(rand_tensor(&mut rng, &[2, 256], DType::F32, 1.0).unwrap());
    let ws: Vec<_> = (0..6)
        .map(|_| up(rand_tensor(&mut rng, &[48, 256], DType::BF16, 0.5).unwrap()))
        .collect();
    let bias = up(rand_tensor(&mut rng, &[48], DType::F32, 1.0).unwrap());
    for v in matvec_variants() {
        b.set_matvec(v).expect("known variant");
        let fused = v != "wg64";
        let count = |f: &dyn Fn() -> anyhow::Result<()>| {
            let before = b.dispatch_count();
            f().expect("op");
            b.dispatch_count() - before
        };
        let qkv = [(&ws[0], None), (&ws[1], Some(&bias)), (&ws[2], None)];
        let n = count(&|| b.linear_many(&x, &qkv).map(drop));
        assert_eq!(n, if fused { 1 } else { 3 }, "{v}: linear_many of 3 parts");
        let six: Vec<_> = ws.iter().map(|w| (w, None)).collect();
        let n = count(&|| b.linear_many(&x, &six).map(drop));
        assert_eq!(n, if fused { 2 } else { 6 }, "{v}: linear_many of 6 parts");
        let n = count(&|| b.linear_silu_mul(&x, &ws[0], &ws[1]).map(drop));
        assert_eq!(n, if fused { 1 } else { 3 }, "{v}: linear_silu_mul");
    }
}
