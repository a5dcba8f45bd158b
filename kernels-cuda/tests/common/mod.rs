//! Test helpers: finding an NVRTC library on machines without the CUDA toolkit.

use std::path::PathBuf;
use std::process::Command;

/// Makes NVRTC loadable if it is not already: `DAYONE_NVRTC_DIR`, else pip's
/// `nvidia-cuda-nvrtc` wheel found through `python3` (`<site-packages>/nvidia/cu13/lib` or
/// `nvidia/cuda_nvrtc/lib`). Returns a description of where it came from, or `None`.
#[allow(dead_code)]
pub fn ensure_nvrtc() -> Option<String> {
    if dayone_cuda::nvrtc_cache::nvrtc_present() {
        return Some("system library path".into());
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("DAYONE_NVRTC_DIR") {
        dirs.push(PathBuf::from(d));
    }
    let script = r#"
import importlib, os
for m in ("nvidia.cu13", "nvidia.cuda_nvrtc", "nvidia.cu12"):
    try:
        mod = importlib.import_module(m)
    except Exception:
        continue
    for p in mod.__path__:
        print(os.path.join(p, "lib"))
"#;
    if let Ok(out) = Command::new("python3").arg("-c").arg(script).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            dirs.push(PathBuf::from(line.trim()));
        }
    }
    for d in dirs {
        if let Ok(lib) = dayone_cuda::nvrtc_cache::preload_nvrtc(Some(&d)) {
            if dayone_cuda::nvrtc_cache::nvrtc_present() {
                return Some(lib.display().to_string());
            }
        }
    }
    None
}

/// The CUDA backend on device 0, or `None` (with a `SKIPPED {test}: …` line on stderr) when no
/// CUDA driver or device is present, so CI machines without a GPU pass; the device's name goes
/// to stderr.
#[allow(dead_code)]
pub fn backend(test: &str) -> Option<dayone_cuda::CudaBackend> {
    use dayone_backend::Backend;
    if !dayone_cuda::is_available() {
        eprintln!("SKIPPED {test}: no CUDA driver or device");
        return None;
    }
    let b = dayone_cuda::CudaBackend::new(0).expect("CUDA backend");
    eprintln!("{test}: {}", b.name());
    Some(b)
}
