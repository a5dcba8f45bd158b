//! `--tensor-parallel-size` from the command line on the CPU backend: dayone starting its own
//! ranks, a torchrun-style launch (one process per rank from `RANK`/`WORLD_SIZE`), two "nodes"
//! over loopback (`--nnodes 2 --node-rank i`), `serve` split over two ranks, and the failures
//! (a split that does not divide, a rank that never joins, a rank that dies) as one clear
//! error. Every process here talks only to 127.0.0.1 and is bounded in time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn dayone() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dayone"));
    // A launcher's variables from the environment the tests run in must not leak in.
    for k in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_PROCID",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
    ] {
        c.env_remove(k);
    }
    c.env("DAYONE_DIST_JOIN_TIMEOUT_S", "60")
        .env("DAYONE_DIST_TIMEOUT_S", "60");
    c
}

/// `generate` arguments on `model` (no tokenizer: ids in, ids out).
fn gen_args(model: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "generate",
        "--backend",
        "cpu",
        "-m",
        fixture(model).to_str().unwrap(),
        "--prompt-ids",
        "5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21",
        "--max-tokens",
        "8",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Waits for `c` at most `limit`; kills it past that.
fn wait_output(c: Child, limit: Duration) -> Output {
    let pid = c.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.expect("wait"),
        Err(_) => {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("dayone (pid {pid}) did not finish within {limit:?}");
        }
    }
}

fn run(args: &[String], env: &[(&str, String)]) -> Output {
    let c = dayone()
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.clone())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start dayone");
    wait_output(c, Duration::from_secs(120))
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The generated ids (stdout) of a successful run.
fn ids(o: &Output, what: &str) -> String {
    let (out, err) = text(o);
    assert!(o.status.success(), "{what} failed: {err}");
    assert!(
        !out.trim().is_empty(),
        "{what}: nothing generated; stderr {err}"
    );
    out
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn dayone_starts_its_own_ranks() {
    for (model, split) in [
        ("kimi_linear_tp", &["-tp", "2"][..]),
        ("kimi_linear_tp", &["-tp", "4"][..]),
        ("deepseek_v3_tiny", &["-tp", "2", "-ep", "2"][..]),
        ("qwen3_tiny", &["--tensor-parallel-size", "2"][..]),
    ] {
        let one = ids(&run(&gen_args(model, &[]), &[]), model);
        let many = ids(
            &run(&gen_args(model, split), &[]),
            &format!("{model} {split:?}"),
        );
        assert_eq!(many, one, "{model} {split:?}");
    }
}

#[test]
fn a_launcher_starts_one_process_per_rank() {
    let model = "llama_tiny";
    let one = ids(&run(&gen_args(model, &[]), &[]), "one rank");
    let port = free_port().to_string();
    let spawn = |rank: usize| {
        dayone()
            .args(gen_args(model, &["-tp", "2"]))
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", "2")
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", &port)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (r1, r0) = (spawn(1), spawn(0));
    let o0 = wait_output(r0, Duration::from_secs(120));
    let o1 = wait_output(r1, Duration::from_secs(120));
    assert_eq!(ids(&o0, "rank 0"), one);
    let (out1, err1) = text(&o1);
    assert!(o1.status.success(), "rank 1: {err1}");
    assert!(
        out1.is_empty(),
        "rank 1 printed {out1:?}: only rank 0 writes results"
    );
}

#[test]
fn two_nodes_meet_over_loopback() {
    let model = "deepseek_v32_tiny";
    let one = ids(&run(&gen_args(model, &[]), &[]), "one rank");
    let port = free_port().to_string();
    let node = |i: &str| {
        dayone()
            .args(gen_args(
                model,
                &[
                    "-tp",
                    "4",
                    "-ep",
                    "2",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    i,
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    &port,
                ],
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (n1, n0) = (node("1"), node("0"));
    let o0 = wait_output(n0, Duration::from_secs(120));
    let o1 = wait_output(n1, Duration::from_secs(120));
    assert_eq!(ids(&o0, "node 0"), one);
    let (out1, err1) = text(&o1);
    assert!(
        o1.status.success() && out1.is_empty(),
        "node 1: {out1} {err1}"
    );
}

/// One `error:` line on stderr containing each of `want`, and a failed exit.
fn fails_with(o: &Output, want: &[&str]) {
    let (_, err) = text(o);
    assert!(!o.status.success(), "should fail: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "expected one error line: {err}");
    for w in want {
        assert!(lines[0].contains(w), "{:?} should mention {w:?}", lines[0]);
    }
}

#[test]
fn a_split_that_does_not_divide_fails_before_launch() {
    let o = run(&gen_args("llama_tiny", &["-tp", "3"]), &[]);
    fails_with(&o, &["4 attention heads", "tensor_parallel_size 3"]);
    let o = run(
        &gen_args("deepseek_v3_tiny", &["-tp", "4", "-ep", "3"]),
        &[],
    );
    let (_, err) = text(&o);
    assert!(
        !o.status.success() && err.contains("--expert-parallel-size: 3 must divide"),
        "{err}"
    );
    let o = run(
        &gen_args("llama_tiny", &["-tp", "2"]),
        &[("RANK", "0".into()), ("WORLD_SIZE", "4".into())],
    );
    fails_with(&o, &["started 4 processes", "--tensor-parallel-size is 2"]);
}

#[test]
fn a_rank_that_never_joins_is_named() {
    let port = free_port().to_string();
    let o = run(
        &gen_args("llama_tiny", &["-tp", "2"]),
        &[
            ("RANK", "0".into()),
            ("WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("MASTER_PORT", port),
            ("DAYONE_DIST_JOIN_TIMEOUT_S", "2".into()),
        ],
    );
    fails_with(&o, &["ranks [1] did not join"]);
}

/// llama_tiny with a word-level tokenizer (`w0` … `w255`): `serve` needs one.
fn with_tokenizer() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["model.safetensors", "generation_config.json", "config.json"] {
        std::fs::copy(fixture("llama_tiny").join(f), dir.path().join(f)).unwrap();
    }
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..256usize).map(|i| (format!("w{i}"), i.into())).collect();
    let tok = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tok.to_string()).unwrap();
    dir
}

/// `serve` split over two "nodes": requests are answered as on one rank; when node 1 dies,
/// node 0 stops with an error naming rank 1 instead of hanging.
#[test]
fn serve_over_two_ranks_and_a_rank_that_dies() {
    let dir = with_tokenizer();
    let model = dir.path().to_path_buf();
    let port = free_port().to_string();
    let node = |i: &str| {
        dayone()
            .args([
                "serve",
                "--backend",
                "cpu",
                "-m",
                model.to_str().unwrap(),
                "--port",
                "0",
                "-tp",
                "2",
                "--nnodes",
                "2",
                "--node-rank",
                i,
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                &port,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut n1 = node("1");
    let mut n0 = node("0");
    // The ready line carries the address.
    let mut out = BufReader::new(n0.stdout.take().unwrap());
    let t0 = Instant::now();
    let (addr, name) = loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 || t0.elapsed() > Duration::from_secs(60) {
            let _ = n0.kill();
            let _ = n1.kill();
            panic!("no ready line: {line}");
        }
        if let Some(rest) = line.trim().strip_prefix("dayone serve: ready at ") {
            let (url, model) = rest.split_once(' ').expect("url then model");
            let model = model.trim_start_matches("(model `").trim_end_matches("`)");
            break (
                url.trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_string(),
                model.to_string(),
            );
        }
    };
    let body = format!(
        r#"{{"model":"{name}","prompt":[5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21],"max_tokens":8,"temperature":0,"return_token_ids":true}}"#
    );
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    let one = ids(&run(&gen_args("llama_tiny", &[]), &[]), "one rank");
    let want: Vec<&str> = one.split_whitespace().collect();
    let json = resp.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    let got: Vec<String> = v["choices"][0]["token_ids"]
        .as_array()
        .map(|a| a.iter().map(|t| t.to_string()).collect())
        .unwrap_or_default();
    assert_eq!(got, want, "{resp}");
    // Node 1 dies: node 0 must end by itself, naming it.
    n1.kill().unwrap();
    let _ = n1.wait();
    let mut err = String::new();
    let o = wait_output(n0, Duration::from_secs(60));
    err.push_str(&String::from_utf8_lossy(&o.stderr));
    assert!(
        !o.status.success(),
        "node 0 kept running after rank 1 died: {err}"
    );
    assert!(err.contains("rank 1 exited"), "{err}");
}

/// The other ranks never read the command's input: a prompt piped on stdin reaches rank 0 only
/// (the ranks dayone starts have no stdin), and `config` under a launcher just prints.
#[test]
fn only_rank_0_reads_the_commands_input() {
    let dir = with_tokenizer();
    let m = dir.path().to_str().unwrap().to_string();
    let gen = |tp: &str| {
        let mut c = dayone()
            .args([
                "generate",
                "--backend",
                "cpu",
                "-m",
                &m,
                "--max-tokens",
                "6",
                "-tp",
                tp,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(b"w5 w6 w7 w8").unwrap();
        wait_output(c, Duration::from_secs(120))
    };
    let (one, two) = (gen("1"), gen("2"));
    assert_eq!(
        ids(&two, "stdin prompt, tp 2"),
        ids(&one, "stdin prompt, tp 1")
    );
    let o = run(
        &[
            "config".into(),
            "-tp".into(),
            "2".into(),
            "--backend".into(),
            "cpu".into(),
        ],
        &[("RANK", "1".into()), ("WORLD_SIZE", "2".into())],
    );
    let (out, err) = text(&o);
    assert!(
        o.status.success() && out.contains("tensor_parallel_size: 2"),
        "{out} {err}"
    );
}
