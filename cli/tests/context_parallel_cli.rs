//! `--context-parallel-size` from the command line on the CPU backend: dayone starts its own
//! ranks (processes talking over 127.0.0.1), splits the prompt's prefill over them and prints
//! the ids one process prints; combined with `-tp` it is refused before anything starts.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// `dayone generate` on `model` (ids in, ids out) with `extra` flags, bounded in time.
fn generate(model: &str, extra: &[&str]) -> Output {
    let prompt: Vec<String> = (0..37).map(|i| ((i * 29 + 3) % 256).to_string()).collect();
    let mut c = Command::new(env!("CARGO_BIN_EXE_dayone"));
    for k in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ] {
        c.env_remove(k);
    }
    let child = c
        .env("DAYONE_DIST_JOIN_TIMEOUT_S", "60")
        .env("DAYONE_DIST_TIMEOUT_S", "60")
        .args(["generate", "--backend", "cpu", "-m"])
        .arg(fixture(model))
        .args(["--prompt-ids", &prompt.join(","), "--max-tokens", "6"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dayone");
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(o) => o.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("dayone (pid {pid}) did not finish within 120 s");
        }
    }
}

fn ids(o: &Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what} failed: {err}");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(!out.trim().is_empty(), "{what}: nothing generated; {err}");
    out
}

#[test]
fn dayone_splits_the_prompt_over_its_own_ranks() {
    for (model, split) in [
        ("kimi_linear_tiny", &["-cp", "2"][..]),
        ("deepseek_v32_tiny", &["--context-parallel-size", "3"][..]),
    ] {
        let one = ids(&generate(model, &[]), model);
        let mut flags = split.to_vec();
        flags.extend(["--context-parallel-min-tokens", "2"]);
        let many = ids(&generate(model, &flags), &format!("{model} {flags:?}"));
        assert_eq!(many, one, "{model} {flags:?}");
    }
}

#[test]
fn context_and_tensor_parallel_together_are_refused() {
    let o = generate("llama_tiny", &["-cp", "2", "-tp", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--context-parallel-size") && !err.contains("panicked"),
        "{err}"
    );
}
