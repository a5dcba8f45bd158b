//! Compiles every kernel family with NVRTC (no GPU needed), so a kernel syntax error fails CI.
//! Skips, saying so, when no NVRTC library can be found (`pip install nvidia-cuda-nvrtc`, or set
//! `DAYONE_NVRTC_DIR` to a directory holding `libnvrtc.so*`).

mod common;

use dayone_cuda::nvrtc_cache::{self, Target, KERNEL_SOURCES};

#[test]
fn every_kernel_family_compiles() {
    let Some(from) = common::ensure_nvrtc() else {
        eprintln!(
            "SKIPPED every_kernel_family_compiles: no NVRTC library found (set DAYONE_NVRTC_DIR or \
             `pip install nvidia-cuda-nvrtc`)"
        );
        return;
    };
    let version = nvrtc_cache::nvrtc_version().expect("NVRTC version");
    let archs = nvrtc_cache::nvrtc_supported_archs().expect("NVRTC architectures");
    eprintln!(
        "NVRTC {}.{} from {from}; architectures {archs:?}",
        version.0, version.1
    );
    // Every dtype at once for the H100/H200 architecture; the small families also as PTX and
    // for sm_80, to catch architecture-specific syntax.
    let targets = [Target::Cubin(90), Target::Ptx(80)];
    let mut failures = Vec::new();
    for (family, src) in KERNEL_SOURCES {
        let full = nvrtc_cache::full_source(src);
        for t in &targets {
            if *family == "attention_paged" && *t != Target::Cubin(90) {
                continue; // the slow one (~15 s on 2 cores): sm_90 only
            }
            let start = std::time::Instant::now();
            match nvrtc_cache::compile(family, &full, t, &[]) {
                Ok(bytes) => {
                    assert!(!bytes.is_empty(), "{family} {t:?}: empty output");
                    eprintln!(
                        "  {family:16} {:11} {:>8} bytes  {:>6.0} ms",
                        t.arch_flag(),
                        bytes.len(),
                        start.elapsed().as_secs_f64() * 1e3
                    );
                }
                Err(e) => failures.push(format!("{family} {}: {e}", t.arch_flag())),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "NVRTC failures:\n{}",
        failures.join("\n")
    );
}

#[test]
fn disk_cache_round_trip() {
    if common::ensure_nvrtc().is_none() {
        eprintln!("SKIPPED disk_cache_round_trip: no NVRTC library found");
        return;
    }
    let dir = std::env::temp_dir().join(format!("dayone-cuda-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (family, src) = KERNEL_SOURCES[0];
    let t = Target::Cubin(90);
    let a = nvrtc_cache::load_or_compile(family, src, &t, &[], Some(&dir)).unwrap();
    let files: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(files.len(), 1, "one cached file expected");
    let b = nvrtc_cache::load_or_compile(family, src, &t, &[], Some(&dir)).unwrap();
    assert_eq!(a, b);
    let _ = std::fs::remove_dir_all(&dir);
}
