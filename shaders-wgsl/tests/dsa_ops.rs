//! The DeepSeek-V3.2 sparse-attention ops (`layer_norm`, `dsa_topk`, `sparse_latent_attention`)
//! of the shared conformance suite ([`conformance::check_dsa_ops`], not part of `check_all`) on
//! the WGSL backend, on both kernel families.

use dayone_backend::conformance;
use dayone_wgsl::{KernelChoice, Options, WgslBackend};

fn backend(kernels: KernelChoice) -> WgslBackend {
    WgslBackend::with_options(Options {
        kernels,
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("WGSL backend unavailable: {e:#}"))
}

fn ok(r: anyhow::Result<()>) {
    if let Err(e) = r {
        panic!("{e:#}");
    }
}

#[test]
fn dsa_ops_auto() {
    ok(conformance::check_dsa_ops(&backend(KernelChoice::Auto)));
}

#[test]
fn dsa_ops_gpu_kernels() {
    ok(conformance::check_dsa_ops(&backend(KernelChoice::Gpu)));
}
