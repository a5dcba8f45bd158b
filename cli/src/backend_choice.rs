//! `--backend wgsl|cuda|cpu|auto` and dispatch of generic code to the chosen backend.

use anyhow::{bail, Result};
use clap::ValueEnum;
use std::sync::atomic::{AtomicBool, Ordering};

/// A backend as named on the command line (`auto` not yet resolved).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// wgpu + WGSL (Vulkan, Metal, DX12; lavapipe on CPU).
    Wgsl,
    /// cudarc + NVRTC kernels + cuBLAS.
    Cuda,
    /// The CPU reference backend (slow, f32; for debugging and as a second implementation).
    Cpu,
    /// CUDA when a driver and a device exist, else WGSL, else (no adapter) the CPU backend.
    Auto,
}

/// A backend the engine can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// wgpu + WGSL (Vulkan, Metal, DX12; lavapipe on CPU).
    Wgsl,
    /// cudarc + NVRTC kernels + cuBLAS.
    Cuda,
    /// `dayone_backend::cpu::CpuBackend`, the reference implementation.
    Cpu,
}

impl BackendArg {
    /// Resolves `auto` (CUDA when a driver and device exist, else WGSL).
    pub fn resolve(self) -> BackendKind {
        match self {
            BackendArg::Wgsl => BackendKind::Wgsl,
            BackendArg::Cuda => BackendKind::Cuda,
            BackendArg::Cpu => BackendKind::Cpu,
            BackendArg::Auto => {
                if dayone_cuda::is_available() {
                    BackendKind::Cuda
                } else {
                    AUTO_CHOSE_WGSL.store(true, Ordering::Relaxed);
                    BackendKind::Wgsl
                }
            }
        }
    }
}

/// Set when `auto` resolved to WGSL: then a machine without any Vulkan/Metal/DX12 adapter falls
/// back to the CPU backend (with a one-line note) instead of failing; an explicit `wgsl` fails.
static AUTO_CHOSE_WGSL: AtomicBool = AtomicBool::new(false);

/// Opens the WGSL backend, or — when `--backend auto` chose WGSL and no adapter opens — the CPU
/// backend, saying so in one line on stderr.
pub fn wgsl_or_cpu_fallback(
) -> Result<Result<dayone_wgsl::WgslBackend, dayone_backend::cpu::CpuBackend>> {
    match dayone_wgsl::WgslBackend::new() {
        Ok(b) => Ok(Ok(b)),
        Err(e) if AUTO_CHOSE_WGSL.load(Ordering::Relaxed) => {
            eprintln!("note: --backend auto: no CUDA device and WGSL failed ({e:#}): using the CPU backend (slow)");
            Ok(Err(dayone_backend::cpu::CpuBackend))
        }
        Err(e) => Err(e),
    }
}

impl BackendKind {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Wgsl => "wgsl",
            BackendKind::Cuda => "cuda",
            BackendKind::Cpu => "cpu",
        }
    }
}

/// Resolves `--backends`: each entry once (after resolving `auto`).
pub fn resolve_list(args: &[BackendArg]) -> Result<Vec<BackendKind>> {
    let mut kinds: Vec<BackendKind> = Vec::new();
    for a in args {
        let k = a.resolve();
        if kinds.contains(&k) {
            bail!(
                "--backends names {} twice (after resolving auto): list each backend once",
                k.name()
            );
        }
        kinds.push(k);
    }
    if kinds.is_empty() {
        bail!("--backends is empty: give e.g. wgsl,cpu");
    }
    Ok(kinds)
}

/// Runs `$body` with `$b` bound to a freshly created backend of kind `$kind`.
#[macro_export]
macro_rules! with_backend {
    ($kind:expr, |$b:ident| $body:expr) => {
        match $kind {
            $crate::backend_choice::BackendKind::Wgsl => {
                match $crate::backend_choice::wgsl_or_cpu_fallback()? {
                    Ok($b) => $body,
                    Err($b) => $body,
                }
            }
            $crate::backend_choice::BackendKind::Cuda => {
                let $b = dayone_cuda::CudaBackend::new(0)?;
                $body
            }
            $crate::backend_choice::BackendKind::Cpu => {
                let $b = dayone_backend::cpu::CpuBackend;
                $body
            }
        }
    };
}
