//! `moe-bench` on the CPU backend with a small shape: every `--quant-path` runs on the same
//! input (so the same routing) at each token count, and bad flag values are usage errors
//! (exit 2) naming the flag. Timings are not checked.

use serde_json::Value;
use std::process::{Command, Output};

fn moe_bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moe-bench"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run moe-bench")
}

/// A small DeepSeek-style shape (D 64, 8 experts of F 32, top-2 of 2 groups) on the CPU, with
/// `extra`'s flag/value pairs replacing or adding to it.
fn small(extra: &[&str]) -> Vec<String> {
    let mut flags: Vec<(String, String)> = [
        ("--backend", "cpu"),
        ("--hidden", "64"),
        ("--experts", "8"),
        ("--expert-dim", "32"),
        ("--top-k", "2"),
        ("--groups", "2"),
        ("--topk-group", "1"),
    ]
    .iter()
    .map(|(f, v)| (f.to_string(), v.to_string()))
    .collect();
    for pair in extra.chunks(2) {
        let (f, v) = (pair[0].to_string(), pair.get(1).unwrap_or(&"").to_string());
        match flags.iter_mut().find(|(g, _)| *g == f) {
            Some(slot) => slot.1 = v,
            None => flags.push((f, v)),
        }
    }
    flags
        .into_iter()
        .flat_map(|(f, v)| [f, v])
        .filter(|a| !a.is_empty())
        .collect()
}

fn usage_error(extra: &[&str]) -> String {
    let args = small(extra);
    let out = moe_bench(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{extra:?}: {stderr}");
    stderr
}

#[test]
fn every_quant_path_sees_the_same_routing() {
    for format in ["mxfp4", "int4"] {
        let args = small(&[
            "--experts-format",
            format,
            "--quant-path",
            "auto,direct,decode",
            "--tokens",
            "1,4,8",
            "--json",
        ]);
        let out = moe_bench(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let rows: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(rows.len(), 9, "{rows:?}");
        for t in [1, 4, 8] {
            let at: Vec<&Value> = rows.iter().filter(|r| r["tokens"] == t).collect();
            let paths: Vec<&str> = at.iter().map(|r| r["path"].as_str().unwrap()).collect();
            assert_eq!(paths, ["auto", "direct", "decode"], "{format} {t}");
            let used: Vec<u64> = at
                .iter()
                .map(|r| r["experts_used"].as_u64().unwrap())
                .collect();
            assert!(
                used.iter().all(|&u| u == used[0]) && used[0] >= 2,
                "{format}, {t} tokens: experts used per path {used:?}"
            );
        }
    }
}

#[test]
fn bad_flag_values_are_usage_errors_naming_the_flag() {
    let err = usage_error(&["--experts-format", "mxfp4", "--quant-path", "auto,fast"]);
    assert!(
        err.contains("--quant-path") && err.contains("auto, direct, decode"),
        "{err}"
    );
    // Also with bf16 experts, where the paths themselves are ignored.
    let err = usage_error(&["--quant-path", "bogus"]);
    assert!(err.contains("--quant-path"), "{err}");
    let err = usage_error(&["--experts-format", "fp8"]);
    assert!(
        err.contains("--experts-format") && err.contains("mxfp4"),
        "{err}"
    );
    let err = usage_error(&["--tokens", "1,0"]);
    assert!(err.contains("--tokens"), "{err}");
    let err = usage_error(&["--experts-format", "int4", "--hidden", "48"]);
    assert!(
        err.contains("--hidden 48") && err.contains("multiples of 32"),
        "{err}"
    );
    let err = usage_error(&["--top-k", "9"]);
    assert!(
        err.contains("--top-k 9") && err.contains("--experts (8)"),
        "{err}"
    );
    let err = usage_error(&["--groups", "3"]);
    assert!(err.contains("--groups 3"), "{err}");
    let err = usage_error(&["--topk-group", "3"]);
    assert!(err.contains("--topk-group 3"), "{err}");
}

/// With its stdout closed (`moe-bench … | head` after head exits) the bench ends quietly,
/// killed by SIGPIPE like other Unix tools, instead of panicking in `println!`.
#[cfg(unix)]
#[test]
fn closed_stdout_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_moe-bench"))
        .args(small(&["--tokens", "1,2"]))
        .env("XDG_RUNTIME_DIR", "/tmp")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run moe-bench");
    drop(child.stdout.take()); // no reader: the first write hits a closed pipe
    let out = child.wait_with_output().expect("wait for moe-bench");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "moe-bench panicked: {err}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "moe-bench ended with {:?}: {err}",
        out.status
    );
}
