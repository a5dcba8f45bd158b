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

/// `attention_varlen.wgsl` at the head dims models use: DeepSeek/Kimi MLA expanded (192/128),
/// MoonViT (72/72), glm5_next's NoPE MLA (256/256), glm5_next_vision (64/64).
#[test]
fn attention_varlen_model_head_dims() {
    ok(
        dayone_backend::conformance_varlen::check_attention_varlen_dims(
            &backend(KernelChoice::Auto),
            &[(192, 128), (72, 72), (256, 256), (64, 64)],
        ),
    );
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

/// Batch-invariant mode with either kernel family: rows computed in calls of any size are
/// bit-identical (`conformance_invariance`), and the ops still match the reference.
#[test]
fn batch_invariant_mode() {
    for kernels in [KernelChoice::Cpu, KernelChoice::Gpu] {
        let b = backend(kernels);
        assert!(!b.batch_invariant(), "off by default");
        b.set_batch_invariant(true).unwrap();
        ok(dayone_backend::conformance_invariance::check_batch_invariance(&b));
    }
}
