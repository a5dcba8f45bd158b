//! `--backend wgsl|cuda|auto` and dispatch of generic code to the chosen backend.

use anyhow::{bail, Result};

/// A backend the user can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// wgpu + WGSL (Vulkan, Metal, DX12; lavapipe on CPU).
    Wgsl,
    /// cudarc + NVRTC kernels + cuBLAS.
    Cuda,
}

impl BackendKind {
    /// Parses `wgsl`, `cuda` or `auto` (CUDA when a driver and device exist, else WGSL).
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "wgsl" => BackendKind::Wgsl,
            "cuda" => BackendKind::Cuda,
            "auto" => {
                if dayone_cuda::is_available() {
                    BackendKind::Cuda
                } else {
                    BackendKind::Wgsl
                }
            }
            other => bail!("--backend must be wgsl, cuda or auto, got '{other}'"),
        })
    }
}

/// Runs `$body` with `$b` bound to a freshly created backend of kind `$kind`.
#[macro_export]
macro_rules! with_backend {
    ($kind:expr, |$b:ident| $body:expr) => {
        match $kind {
            $crate::backend_choice::BackendKind::Wgsl => {
                let $b = dayone_wgsl::WgslBackend::new()?;
                $body
            }
            $crate::backend_choice::BackendKind::Cuda => {
                let $b = dayone_cuda::CudaBackend::new(0)?;
                $body
            }
        }
    };
}
