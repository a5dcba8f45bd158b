//! Compiles every kernel family with NVRTC (no GPU needed), so a kernel syntax error fails CI.
//! Skips, saying so, when no NVRTC library can be found (`pip install nvidia-cuda-nvrtc`, or set
//! `DAYONE_NVRTC_DIR` to a directory holding `libnvrtc.so*`).

mod common;

use dayone_cuda::nvrtc_cache::{self, Target, KERNEL_SOURCES};

#[test]
fn every_kernel_family_compiles() {
    let Some(from) = common::ensure_nvrtc() else {
        // CI installs pip's NVRTC and sets DAYONE_REQUIRE_NVRTC, so a lost library fails there.
        assert!(
            std::env::var_os("DAYONE_REQUIRE_NVRTC").is_none(),
            "DAYONE_REQUIRE_NVRTC is set but no NVRTC library was found"
        );
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
    // The H100/H200 architecture for every family (one dtype per module, as the backend
    // compiles them; `moe` as sm_90a, its wgmma kernels included), and PTX for sm_80 of the small families, to catch architecture-specific
    // syntax. Jobs run on all cores: the attention family takes ~6 s per dtype on one core.
    let mut jobs: Vec<(&str, &str, Target, Option<String>)> = Vec::new();
    for (family, src) in KERNEL_SOURCES {
        let dtypes: &[Option<&str>] = if matches!(*family, "embedding" | "kv_cache" | "rows") {
            &[None]
        } else {
            &[Some("f32"), Some("bf16"), Some("f16")]
        };
        for dt in dtypes {
            let define = dt.map(nvrtc_cache::dtype_define);
            jobs.push((
                family,
                src,
                Target::Cubin(90).for_family(family),
                define.clone(),
            ));
            if *family != "attention_paged" {
                jobs.push((family, src, Target::Ptx(80), define));
            }
        }
    }
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((family, src, t, define)) = jobs.get(i) else {
                    break;
                };
                let full = nvrtc_cache::full_source(src);
                let defines: Vec<&str> = define.iter().map(|d| d.as_str()).collect();
                let start = std::time::Instant::now();
                match nvrtc_cache::compile(family, &full, t, &defines) {
                    Ok(bytes) => {
                        assert!(!bytes.is_empty(), "{family} {t:?}: empty output");
                        eprintln!(
                            "  {family:16} {:11} {:18} {:>8} bytes {:>6.0} ms",
                            t.arch_flag(),
                            define.as_deref().unwrap_or("all dtypes"),
                            bytes.len(),
                            start.elapsed().as_secs_f64() * 1e3
                        );
                    }
                    Err(e) => failures
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{family} {} {define:?}: {e}", t.arch_flag())),
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
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
