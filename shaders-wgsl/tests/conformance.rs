//! The shared conformance suite (`dayone_backend::conformance`) on the WGSL backend, with the
//! adapter's default kernels and with each `linear` kernel family forced.
//! Needs a Vulkan/Metal/DX12 adapter (CI installs Mesa lavapipe); without one these tests fail.

use dayone_backend::{conformance, Backend};
use dayone_wgsl::{KernelChoice, Options, WgslBackend};

fn backend(kernels: KernelChoice) -> WgslBackend {
    match WgslBackend::with_options(Options {
        kernels,
        ..Default::default()
    }) {
        Ok(b) => {
            eprintln!("backend: {} ({kernels:?} kernels)", b.name());
            b
        }
        Err(e) => panic!("WGSL backend unavailable: {e:#}"),
    }
}

fn ok(r: anyhow::Result<()>) {
    if let Err(e) = r {
        panic!("{e:#}");
    }
}

#[test]
fn conformance_all() {
    ok(conformance::check_all(&backend(KernelChoice::Auto)));
}

#[test]
fn conformance_cpu_kernels() {
    ok(conformance::check_all(&backend(KernelChoice::Cpu)));
}

#[test]
fn conformance_gpu_kernels() {
    ok(conformance::check_all(&backend(KernelChoice::Gpu)));
}

#[test]
fn quantized_weights() {
    ok(dayone_backend::conformance_quant::check_quant(&backend(
        KernelChoice::Auto,
    )));
}

#[test]
fn sliding_window_sinks_and_biased_experts() {
    ok(dayone_backend::conformance_ext::check_ext(&backend(
        KernelChoice::Cpu,
    )));
    ok(dayone_backend::conformance_ext::check_ext(&backend(
        KernelChoice::Gpu,
    )));
}
