//! Kernel sources, NVRTC compilation and the on-disk cubin/PTX cache.
//!
//! Each kernel family is one `.cu` file under `kernels/`, embedded with `include_str!` and
//! prefixed with `kernels/common.cuh`. At first use a family is compiled with NVRTC for the
//! device's architecture (`--gpu-architecture=sm_XY`, giving a cubin) and cached under
//! `$XDG_CACHE_HOME/dayone/cuda` (or `~/.cache/dayone/cuda`), keyed by a hash of the source,
//! the target and the NVRTC version.

use anyhow::{anyhow, bail, Context, Result};
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

/// Helpers prepended to every family (bf16/f16 conversion, 16-byte vector loads, warp reductions).
pub const COMMON_HEADER: &str = include_str!("../kernels/common.cuh");

/// Every kernel family: `(name, source without the common header)`. The `moe` and `moe_fp8`
/// sources start with `kernels/moe_common.cuh` (their shared tile map, activations, biases and
/// GEMM epilogue); `moe` ends with `kernels/moe_wgmma.cu` (the Hopper grouped GEMM) and
/// `kernels/moe_decode.cu` (the fused decode block, which
/// shares moe.cu's warp dot products); `gemv` ends with `kernels/gemv_tc.cu` (the tensor-core
/// product for 5–16 rows). `moe` and `gemv` both take `kernels/moe_topk.cuh` (the
/// router's top-k, run by `moe_topk` and by the router GEMV's last block).
pub const KERNEL_SOURCES: &[(&str, &str)] = &[
    ("embedding", include_str!("../kernels/embedding.cu")),
    ("norm", include_str!("../kernels/norm.cu")),
    ("rope", include_str!("../kernels/rope.cu")),
    ("elementwise", include_str!("../kernels/elementwise.cu")),
    (
        "gemv",
        concat!(
            include_str!("../kernels/moe_topk.cuh"),
            include_str!("../kernels/gemv.cu"),
            include_str!("../kernels/gemv_tc.cu")
        ),
    ),
    ("kv_cache", include_str!("../kernels/kv_cache.cu")),
    ("rows", include_str!("../kernels/rows.cu")),
    ("argmax", include_str!("../kernels/argmax.cu")),
    (
        "attention_paged",
        include_str!("../kernels/attention_paged.cu"),
    ),
    ("mla", include_str!("../kernels/mla.cu")),
    (
        "moe",
        concat!(
            include_str!("../kernels/moe_common.cuh"),
            include_str!("../kernels/moe_topk.cuh"),
            include_str!("../kernels/moe.cu"),
            include_str!("../kernels/moe_wgmma.cu"),
            include_str!("../kernels/moe_decode.cu")
        ),
    ),
    ("kda", include_str!("../kernels/kda.cu")),
    ("dsa", include_str!("../kernels/dsa.cu")),
    ("quant", include_str!("../kernels/quant.cu")),
    ("attention_ext", include_str!("../kernels/attention_ext.cu")),
    ("moe_ext", include_str!("../kernels/moe_ext.cu")),
    (
        "moe_fp8",
        concat!(
            include_str!("../kernels/moe_common.cuh"),
            include_str!("../kernels/moe_fp8.cu")
        ),
    ),
    ("gemm_inv", include_str!("../kernels/gemm_inv.cu")),
    ("flash_attn", include_str!("../kernels/flash_attn.cu")),
];

/// The full source NVRTC compiles for a family: the common header, then the family's file.
pub fn full_source(family_src: &str) -> String {
    let mut s = String::with_capacity(COMMON_HEADER.len() + family_src.len() + 1);
    s.push_str(COMMON_HEADER);
    s.push('\n');
    s.push_str(family_src);
    s
}

/// What NVRTC is asked to produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Machine code for `sm_{0}` (the device's own architecture, e.g. 90 for an H100/H200).
    Cubin(u32),
    /// PTX for `compute_{0}`, left to the driver to compile (a device newer than NVRTC knows).
    Ptx(u32),
    /// Machine code for `sm_{0}a`: the device's architecture with its architecture-specific
    /// instructions (Hopper's `wgmma`), runnable on that architecture only
    /// ([`Target::for_family`]).
    CubinArchSpecific(u32),
}

/// Families that use architecture-specific instructions where the device has them: `moe`'s
/// Hopper grouped GEMM (`kernels/moe_wgmma.cu`, `wgmma.mma_async`) needs `sm_90a`.
pub const ARCH_SPECIFIC_FAMILIES: &[&str] = &["moe"];

impl Target {
    /// The `--gpu-architecture` value, e.g. `sm_90` or `compute_90`.
    pub fn arch_flag(&self) -> String {
        match self {
            Target::Cubin(a) => format!("sm_{a}"),
            Target::Ptx(a) => format!("compute_{a}"),
            Target::CubinArchSpecific(a) => format!("sm_{a}a"),
        }
    }

    /// The target `family` compiles for: on an sm_90 device a family of
    /// [`ARCH_SPECIFIC_FAMILIES`] compiles for `sm_90a` (the cubin runs on the device it was
    /// compiled for, so nothing is lost), every other family and device as `self`.
    pub fn for_family(&self, family: &str) -> Target {
        match self {
            Target::Cubin(90) if ARCH_SPECIFIC_FAMILIES.contains(&family) => {
                Target::CubinArchSpecific(90)
            }
            t => t.clone(),
        }
    }

    /// Whether `family`'s kernels for this target include Hopper's `wgmma` paths.
    pub fn has_wgmma(&self, family: &str) -> bool {
        self.for_family(family) == Target::CubinArchSpecific(90)
    }

    /// File extension of the cached artifact.
    pub fn extension(&self) -> &'static str {
        match self {
            Target::Cubin(_) | Target::CubinArchSpecific(_) => "cubin",
            Target::Ptx(_) => "ptx",
        }
    }
}

/// Architecture number from a compute capability: `(9, 0)` → 90, `(8, 6)` → 86.
pub fn arch_number(major: i32, minor: i32) -> u32 {
    (major.max(0) as u32) * 10 + minor.max(0) as u32
}

/// Chooses the NVRTC target for a device of architecture `device_arch` given the architectures
/// this NVRTC supports: a cubin when NVRTC knows the device, else PTX for the newest supported
/// architecture not above the device's (the driver compiles it), else an error.
pub fn pick_target(device_arch: u32, supported: &[u32]) -> Result<Target> {
    if supported.is_empty() || supported.contains(&device_arch) {
        return Ok(Target::Cubin(device_arch));
    }
    match supported.iter().copied().filter(|&a| a <= device_arch).max() {
        Some(a) => Ok(Target::Ptx(a)),
        None => bail!(
            "NVRTC supports architectures {supported:?}, none at or below the device's sm_{device_arch}"
        ),
    }
}

/// 64-bit FNV-1a hash (stable across runs and Rust versions, unlike `DefaultHasher`).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Cache file name for a family: `{family}-{arch}-{hash}.{ext}`, the hash covering the full
/// source, the target, the compile options (defines included) and the NVRTC version.
pub fn cache_file_name(
    family: &str,
    full_src: &str,
    target: &Target,
    defines: &[&str],
    nvrtc: (i32, i32),
) -> String {
    let mut key = Vec::with_capacity(full_src.len() + 64);
    key.extend_from_slice(full_src.as_bytes());
    key.extend_from_slice(target.arch_flag().as_bytes());
    key.extend_from_slice(compile_options(target, defines).join(" ").as_bytes());
    key.extend_from_slice(format!("nvrtc{}.{}", nvrtc.0, nvrtc.1).as_bytes());
    format!(
        "{family}-{}-{:016x}.{}",
        target.arch_flag(),
        fnv1a64(&key),
        target.extension()
    )
}

/// The cache directory: `$XDG_CACHE_HOME/dayone/cuda`, else `$HOME/.cache/dayone/cuda`.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(
        std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    )
}

/// [`cache_dir`] from explicit values (for tests).
pub fn cache_dir_from(xdg: Option<PathBuf>, home: Option<PathBuf>) -> Option<PathBuf> {
    match (xdg, home) {
        (Some(x), _) if !x.as_os_str().is_empty() => Some(x.join("dayone").join("cuda")),
        (_, Some(h)) if !h.as_os_str().is_empty() => {
            Some(h.join(".cache").join("dayone").join("cuda"))
        }
        _ => None,
    }
}

/// NVRTC options used for every family, plus `-D` for each of `defines`.
pub fn compile_options(target: &Target, defines: &[&str]) -> Vec<String> {
    let mut v = vec![
        format!("--gpu-architecture={}", target.arch_flag()),
        "--std=c++17".to_string(),
        "--fmad=true".to_string(),
    ];
    v.extend(defines.iter().map(|d| format!("-D{d}")));
    v
}

/// The define that limits a module to one dtype's kernels (`DAYONE_ONLY_BF16`, ...).
pub fn dtype_define(suffix: &str) -> String {
    format!("DAYONE_ONLY_{}", suffix.to_ascii_uppercase())
}

/// True when an NVRTC library can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen candidate library names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        bail!("NVRTC library (libnvrtc.so) not found");
    }
    let (mut a, mut b) = (0i32, 0i32);
    // SAFETY: the library is present; the pointers are valid for the call.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) }
        .result()
        .map_err(|e| anyhow!("nvrtcVersion failed: {e:?}"))?;
    Ok((a, b))
}

/// Architectures this NVRTC can compile for (e.g. `[75, 80, ..., 90, 100, 120]`).
pub fn nvrtc_supported_archs() -> Result<Vec<u32>> {
    if !nvrtc_present() {
        bail!("NVRTC library (libnvrtc.so) not found");
    }
    let mut n = 0i32;
    // SAFETY: the library is present; buffers are sized from NVRTC's answer.
    unsafe {
        cudarc::nvrtc::sys::nvrtcGetNumSupportedArchs(&mut n)
            .result()
            .map_err(|e| anyhow!("nvrtcGetNumSupportedArchs: {e:?}"))?;
        let mut v = vec![0i32; n.max(0) as usize];
        cudarc::nvrtc::sys::nvrtcGetSupportedArchs(v.as_mut_ptr())
            .result()
            .map_err(|e| anyhow!("nvrtcGetSupportedArchs: {e:?}"))?;
        Ok(v.into_iter().map(|a| a as u32).collect())
    }
}

/// Compiles one family's full source with NVRTC (with `-D` for each of `defines`); returns the
/// cubin (or NUL-terminated PTX). Errors carry NVRTC's log.
pub fn compile(family: &str, full_src: &str, target: &Target, defines: &[&str]) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_present() {
        bail!("cannot compile CUDA kernels '{family}': NVRTC library (libnvrtc.so) not found");
    }
    let src = CString::new(full_src).context("kernel source contains a NUL byte")?;
    let name = CString::new(format!("{family}.cu")).expect("no NUL in family name");
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| anyhow!("nvrtcCreateProgram({family}): {e:?}"))?;
    let opts = compile_options(target, defines);
    // SAFETY: `prog` is a live program until destroyed below.
    let out = unsafe {
        let compiled = result::compile_program(prog, &opts);
        let log = result::get_program_log(prog)
            .map(|l| {
                CStr::from_ptr(l.as_ptr())
                    .to_string_lossy()
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        let out = match compiled {
            Err(e) => Err(anyhow!(
                "NVRTC failed to compile kernels '{family}' for {}: {e:?}\n{log}",
                target.arch_flag()
            )),
            Ok(()) => match target {
                Target::Ptx(_) => result::get_ptx(prog)
                    .map(|v| v.into_iter().map(|c| c as u8).collect())
                    .map_err(|e| anyhow!("nvrtcGetPTX({family}): {e:?}")),
                Target::Cubin(_) | Target::CubinArchSpecific(_) => {
                    let mut size = 0usize;
                    sys::nvrtcGetCUBINSize(prog, &mut size)
                        .result()
                        .map_err(|e| anyhow!("nvrtcGetCUBINSize({family}): {e:?}"))?;
                    let mut buf = vec![0u8; size];
                    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                        .result()
                        .map_err(|e| anyhow!("nvrtcGetCUBIN({family}): {e:?}"))?;
                    Ok(buf)
                }
            },
        };
        let _ = result::destroy_program(prog);
        out
    };
    out
}

/// Returns the compiled family, from the disk cache when present, else compiling and storing it
/// (the cache is best effort: an unwritable directory only costs a recompile next time).
pub fn load_or_compile(
    family: &str,
    family_src: &str,
    target: &Target,
    defines: &[&str],
    dir: Option<&Path>,
) -> Result<Vec<u8>> {
    let src = full_source(family_src);
    let version = nvrtc_version().unwrap_or((0, 0));
    let path = dir.map(|d| d.join(cache_file_name(family, &src, target, defines, version)));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let bytes = compile(family, &src, target, defines)?;
    if let (Some(p), Some(d)) = (&path, dir) {
        if std::fs::create_dir_all(d).is_ok() {
            let tmp = p.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, p).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }
    Ok(bytes)
}

/// Makes a pip-installed NVRTC (`nvidia-cuda-nvrtc`, libs in `<site-packages>/nvidia/cu13/lib`)
/// or any directory holding `libnvrtc.so*` visible to cudarc's loader: loads the library by
/// absolute path and keeps it loaded, so that cudarc's later `dlopen` by soname finds it.
/// Returns the path loaded. `dir` = `None` reads `DAYONE_NVRTC_DIR`.
pub fn preload_nvrtc(dir: Option<&Path>) -> Result<PathBuf> {
    let dir: PathBuf = match dir {
        Some(d) => d.to_path_buf(),
        None => std::env::var_os("DAYONE_NVRTC_DIR")
            .map(PathBuf::from)
            .ok_or_else(|| anyhow!("DAYONE_NVRTC_DIR is not set"))?,
    };
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading NVRTC directory {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc.so"))
        })
        .collect();
    names.sort();
    let lib = names
        .first()
        .ok_or_else(|| anyhow!("no libnvrtc.so* in {}", dir.display()))?
        .clone();
    // SAFETY: loading NVRTC runs its initialisers only; the handle is leaked on purpose so the
    // library stays loaded for the life of the process.
    let handle = unsafe { libloading::Library::new(&lib) }
        .with_context(|| format!("loading {}", lib.display()))?;
    std::mem::forget(handle);
    Ok(lib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_numbers() {
        assert_eq!(arch_number(9, 0), 90);
        assert_eq!(arch_number(8, 6), 86);
        assert_eq!(arch_number(12, 0), 120);
        assert_eq!(Target::Cubin(90).arch_flag(), "sm_90");
        assert_eq!(Target::Ptx(90).arch_flag(), "compute_90");
        assert_eq!(Target::Cubin(90).for_family("moe").arch_flag(), "sm_90a");
        assert_eq!(Target::Cubin(90).for_family("gemv"), Target::Cubin(90));
        assert_eq!(Target::Cubin(100).for_family("moe"), Target::Cubin(100));
        assert_eq!(Target::Ptx(90).for_family("moe"), Target::Ptx(90));
        assert!(Target::Cubin(90).has_wgmma("moe") && !Target::Cubin(80).has_wgmma("moe"));
    }

    #[test]
    fn target_choice() {
        let sup = [75, 80, 86, 89, 90];
        assert_eq!(pick_target(90, &sup).unwrap(), Target::Cubin(90));
        assert_eq!(pick_target(100, &sup).unwrap(), Target::Ptx(90));
        assert_eq!(pick_target(87, &sup).unwrap(), Target::Ptx(86));
        assert!(pick_target(70, &sup).is_err());
        assert_eq!(pick_target(90, &[]).unwrap(), Target::Cubin(90));
    }

    #[test]
    fn cache_key_depends_on_everything() {
        let t = Target::Cubin(90);
        let a = cache_file_name("norm", "src", &t, &[], (13, 0));
        assert!(a.starts_with("norm-sm_90-") && a.ends_with(".cubin"), "{a}");
        assert_eq!(a, cache_file_name("norm", "src", &t, &[], (13, 0)));
        assert_ne!(a, cache_file_name("norm", "src2", &t, &[], (13, 0)));
        assert_ne!(
            a,
            cache_file_name("norm", "src", &Target::Cubin(80), &[], (13, 0))
        );
        assert_ne!(a, cache_file_name("norm", "src", &t, &[], (13, 5)));
        assert_ne!(
            a,
            cache_file_name("norm", "src", &t, &["DAYONE_ONLY_BF16"], (13, 0))
        );
        assert!(cache_file_name("norm", "src", &Target::Ptx(90), &[], (13, 0)).ends_with(".ptx"));
        assert_eq!(dtype_define("bf16"), "DAYONE_ONLY_BF16");
    }

    #[test]
    fn fnv_known_values() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
    }

    #[test]
    fn cache_dir_rules() {
        let x = cache_dir_from(Some("/x".into()), Some("/h".into())).unwrap();
        assert_eq!(x, PathBuf::from("/x/dayone/cuda"));
        let h = cache_dir_from(None, Some("/h".into())).unwrap();
        assert_eq!(h, PathBuf::from("/h/.cache/dayone/cuda"));
        let e = cache_dir_from(Some("".into()), Some("/h".into())).unwrap();
        assert_eq!(e, PathBuf::from("/h/.cache/dayone/cuda"));
        assert!(cache_dir_from(None, None).is_none());
    }

    #[test]
    fn every_family_is_listed_once() {
        let mut names: Vec<_> = KERNEL_SOURCES.iter().map(|(n, _)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), KERNEL_SOURCES.len());
        for (n, src) in KERNEL_SOURCES {
            assert!(src.contains("extern \"C\""), "{n} has no entry point");
        }
    }
}
