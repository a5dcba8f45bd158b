//! `dayone bench-serve` against a mock OpenAI server (axum on 127.0.0.1:0 streaming a few SSE
//! chunks with small sleeps, a usage chunk and `[DONE]`), and its answers to bad input. Every
//! run is bounded (a few requests, a deadline on the child process). The mock's `/metrics`
//! carries dayone's gauges (requests running, KV blocks held: two per open stream, memory) for
//! the soak (`--duration-minutes`).

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the mock saw.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    bodies: Mutex<Vec<Value>>,
    auth: Mutex<Vec<String>>,
    /// Streams open now (a stream the client dropped closes when the mock next writes).
    running: AtomicUsize,
    /// A `leaky` request came: /metrics reports 7 KV blocks held for good.
    leaky: AtomicBool,
}

/// Counts an open stream until dropped.
struct Open(S);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

type S = Arc<Seen>;

const CHUNKS: usize = 4;

fn sse(s: &S, events: Vec<(u64, String)>) -> Response {
    s.running.fetch_add(1, Ordering::SeqCst);
    let open = Open(s.clone());
    let stream =
        futures_util::stream::unfold((events.into_iter(), open), |(mut it, open)| async move {
            let (sleep_ms, data) = it.next()?;
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            Some((Ok::<_, std::convert::Infallible>(data), (it, open)))
        });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Common to both endpoints: records the request, decides its fate by the model name
/// (`flaky`: every third request after the first gets HTTP 503, returned here).
fn record(s: &S, headers: &HeaderMap, body: &Value) -> Option<Response> {
    let n = s.requests.fetch_add(1, Ordering::SeqCst);
    s.bodies.lock().unwrap().push(body.clone());
    if let Some(a) = headers.get("authorization") {
        s.auth
            .lock()
            .unwrap()
            .push(a.to_str().unwrap_or("").to_string());
    }
    if body["model"] == "leaky" {
        s.leaky.store(true, Ordering::SeqCst);
    }
    if body["model"] == "flaky" && n % 3 == 2 {
        let err = json!({"error": {"message": "overloaded", "type": "ServiceUnavailable"}});
        return Some((StatusCode::SERVICE_UNAVAILABLE, Json(err)).into_response());
    }
    None
}

async fn completions(State(s): State<S>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    if let Some(r) = record(&s, &headers, &body) {
        return r;
    }
    if body["model"] == "slow" && s.requests.load(Ordering::SeqCst) > 1 {
        // Past the test request: stalls longer than the client's --timeout.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    let max = body["max_tokens"].as_u64().unwrap_or(1);
    let prompt_tokens = body["prompt"].as_array().map(|a| a.len()).unwrap_or(0);
    let mut ev = vec![(0, ": keep-alive\n\n".to_string())];
    for i in 0..CHUNKS {
        let c = json!({"object": "text_completion", "choices": [{"index": 0, "text": format!("t{i}"), "finish_reason": null}]});
        ev.push((15, format!("data: {c}\n\n")));
    }
    let usage =
        json!({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max}});
    ev.push((5, format!("data: {usage}\n\n")));
    ev.push((0, "data: [DONE]\n\n".into()));
    sse(&s, ev)
}

async fn chat(State(s): State<S>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    if let Some(r) = record(&s, &headers, &body) {
        return r;
    }
    let max = body["max_completion_tokens"].as_u64().unwrap_or(1);
    let words = body["messages"][0]["content"]
        .as_str()
        .map(|t| t.split_whitespace().count())
        .unwrap_or(0);
    let role = json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]});
    let mut ev = vec![(0, format!("data: {role}\n\n"))];
    for i in 0..CHUNKS {
        let c = json!({"choices": [{"index": 0, "delta": {"content": format!("w{i} ")}}]});
        ev.push((15, format!("data: {c}\n\n")));
    }
    let fin = json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
    ev.push((5, format!("data: {fin}\n\n")));
    // Usage arrives well after the last content chunk: it must not extend E2EL.
    let usage =
        json!({"choices": [], "usage": {"prompt_tokens": words + 5, "completion_tokens": max}});
    ev.push((200, format!("data: {usage}\n\n")));
    ev.push((0, "data: [DONE]\n\n".into()));
    sse(&s, ev)
}

async fn metrics(State(s): State<S>) -> String {
    let n = s.requests.load(Ordering::SeqCst);
    let running = s.running.load(Ordering::SeqCst);
    let blocks = 2 * running + if s.leaky.load(Ordering::SeqCst) { 7 } else { 0 };
    format!(
        "# TYPE dayone:prefix_cache_hits counter\n\
         dayone:prefix_cache_hits_total{{model_name=\"m\"}} {}\n\
         dayone:prefix_cache_queries_total{{model_name=\"m\"}} {}\n\
         dayone:num_requests_running{{model_name=\"m\"}} {running}\n\
         dayone:num_requests_waiting{{model_name=\"m\"}} 0\n\
         dayone:kv_blocks_used{{model_name=\"m\"}} {blocks}\n\
         dayone:kv_cache_usage_perc{{model_name=\"m\"}} 0.0\n\
         dayone:device_memory_bytes{{model_name=\"m\",kind=\"weights\"}} 1048576\n\
         dayone:device_memory_bytes{{model_name=\"m\",kind=\"kv_cache\"}} 2097152\n\
         process_resident_memory_bytes 5242880\n# EOF\n",
        10 * n,
        20 * n
    )
}

/// Starts the mock on 127.0.0.1:0 in a background runtime; returns its base URL and state.
fn mock() -> (String, S) {
    let seen: S = Arc::default();
    let app = Router::new()
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object": "list", "data": [{"id": "mock-model"}]})) }),
        )
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/metrics", get(metrics))
        .with_state(seen.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    (format!("http://{addr}"), seen)
}

/// Runs `dayone bench-serve ARGS` with a 60 s deadline.
fn bench(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dayone"));
    cmd.arg("bench-serve")
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("bench-serve {args:?} ran past 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The value column of the row labelled `label`.
fn row<'a>(stdout: &'a str, label: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} row in\n{stdout}"))[40..]
        .trim()
}

#[test]
fn bench_serve_completions_against_mock() {
    let (url, seen) = mock();
    let dir = tempfile::tempdir().unwrap();
    let dir_s = dir.path().to_str().unwrap();
    let out = bench(
        &[
            "--url",
            &url,
            "--random-vocab-size",
            "50",
            "--num-prompts",
            "12",
            "--random-input-len",
            "8",
            "--random-output-len",
            "5",
            "--max-concurrency",
            "4",
            "--request-rate",
            "200",
            "--num-warmups",
            "2",
            "--ignore-eos",
            "--percentile-metrics",
            "ttft,tpot,itl,e2el",
            "--metric-percentiles",
            "50,99",
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            dir_s,
            "--result-filename",
            "r.json",
        ],
        &[("OPENAI_API_KEY", "sekret")],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    // Shown with --nocapture.
    println!("{stderr}{stdout}");
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.starts_with("============ Serving Benchmark Result ============\n"),
        "{stdout}"
    );
    assert_eq!(row(&stdout, "Successful requests:"), "12");
    assert_eq!(row(&stdout, "Failed requests:"), "0");
    assert_eq!(row(&stdout, "Maximum request concurrency:"), "4");
    assert_eq!(row(&stdout, "Request rate configured (RPS):"), "200.00");
    assert_eq!(row(&stdout, "Total input tokens:"), "96");
    assert_eq!(
        row(&stdout, "Total generated tokens:"),
        "60",
        "from usage, not the 4 chunks"
    );
    assert_eq!(row(&stdout, "Prefix cache hit rate (%):"), "50.00");
    for header in [
        "Time to First Token",
        "Inter-token Latency",
        "End-to-end Latency",
    ] {
        assert!(stdout.contains(header), "{header}");
    }
    assert!(stdout.contains("P90 TTFT (ms):") && stdout.contains("Concurrency:"));
    // 1 test request + 2 warm-ups + 12.
    assert_eq!(seen.requests.load(Ordering::SeqCst), 15);
    assert!(seen
        .auth
        .lock()
        .unwrap()
        .iter()
        .all(|a| a == "Bearer sekret"));
    assert_eq!(seen.auth.lock().unwrap().len(), 15);
    for b in seen.bodies.lock().unwrap().iter() {
        assert_eq!(b["model"], "mock-model", "model from /v1/models");
        assert_eq!(b["stream"], true);
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["max_tokens"], 5);
        assert_eq!(b["prompt"].as_array().unwrap().len(), 8);
    }

    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("r.json")).unwrap()).unwrap();
    for k in [
        "date",
        "backend",
        "endpoint",
        "model_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "max_output_tokens_per_s",
        "max_concurrent_requests",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "latencies",
        "start_times",
        "errors",
        "mean_ttft_ms",
        "median_ttft_ms",
        "std_ttft_ms",
        "p99_ttft_ms",
        "p50_tpot_ms",
        "mean_itl_ms",
        "p99_e2el_ms",
    ] {
        assert!(j.get(k).is_some(), "missing {k}");
    }
    assert_eq!(j["completed"], 12);
    assert_eq!(j["backend"], "openai");
    assert_eq!(j["model_id"], "mock-model");
    assert_eq!(j["total_output_tokens"], 60);
    assert_eq!(j["max_concurrency"], 4);
    assert!(j["output_lens"].as_array().unwrap().iter().all(|v| v == 5));
    let ttfts = j["ttfts"].as_array().unwrap();
    let lats = j["latencies"].as_array().unwrap();
    for (t, l) in ttfts.iter().zip(lats) {
        let (t, l) = (t.as_f64().unwrap(), l.as_f64().unwrap());
        assert!(t > 0.0 && t <= l, "TTFT {t} ≤ E2EL {l}");
        // Four chunks 15 ms apart: E2EL − TTFT ≈ 45 ms (less when a busy machine delivers
        // chunks together), well under 1 s.
        assert!(l - t < 1.0, "{t} {l}");
    }
    assert!(j["itls"]
        .as_array()
        .unwrap()
        .iter()
        .all(|v| v.as_array().unwrap().len() == CHUNKS - 1));
    assert!(j["errors"].as_array().unwrap().iter().all(|e| e == ""));
    let tpot = j["mean_tpot_ms"].as_f64().unwrap();
    assert!(tpot > 5.0 && tpot < 250.0, "TPOT {tpot} ms = (E2EL−TTFT)/4");
}

#[test]
fn bench_serve_chat_sharegpt_with_failures() {
    let (url, seen) = mock();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("sg.json");
    let convs: Vec<Value> = (0..5)
        .map(|i| {
            json!({"id": i, "conversations": [
            {"from": "human", "value": format!("question number {i} about something long enough")},
            {"from": "gpt", "value": "an answer that is long enough too"}]})
        })
        .collect();
    std::fs::write(&data, Value::Array(convs).to_string()).unwrap();
    let res = dir.path().join("res");
    let out = bench(
        &[
            "--url",
            &format!("{url}/v1"),
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            "flaky",
            "--dataset-name",
            "sharegpt",
            "--dataset-path",
            data.to_str().unwrap(),
            "--sharegpt-output-len",
            "3",
            "--num-prompts",
            "9",
            "--percentile-metrics",
            "ttft,e2el",
            "--result-dir",
            res.to_str().unwrap(),
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    // Requests 0 (the test request) .. 9; those with n % 3 == 2 fail: n = 2, 5, 8.
    assert_eq!(row(&stdout, "Successful requests:"), "6");
    assert_eq!(row(&stdout, "Failed requests:"), "3");
    assert_eq!(row(&stdout, "Total generated tokens:"), "18");
    assert!(!stdout.contains("Maximum request concurrency:"));
    assert!(!stdout.contains("Request rate configured"));
    assert!(seen
        .bodies
        .lock()
        .unwrap()
        .iter()
        .all(|b| b["max_completion_tokens"] == 3
            && b["max_tokens"] == 3
            && b["messages"][0]["role"] == "user"
            && b.get("ignore_eos").is_none()));
    let files: Vec<_> = std::fs::read_dir(&res)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1);
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    assert!(
        name.starts_with("openai-chat-infqps-flaky-") && name.ends_with(".json"),
        "{name}"
    );
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(j["request_rate"], "inf");
    assert_eq!(j["failed"], 3);
    let errors: Vec<&str> = j["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert_eq!(
        errors
            .iter()
            .filter(|e| e.contains("503") && e.contains("overloaded"))
            .count(),
        3,
        "{errors:?}"
    );
    // The usage chunk comes 200 ms after the last content chunk and must not count.
    for (t, l) in j["ttfts"]
        .as_array()
        .unwrap()
        .iter()
        .zip(j["latencies"].as_array().unwrap())
    {
        let (t, l) = (t.as_f64().unwrap(), l.as_f64().unwrap());
        if l > 0.0 {
            assert!(t <= l && l - t < 0.15, "TTFT {t} E2EL {l}");
        }
    }
    assert!(j.get("mean_e2el_ms").is_some() && j.get("mean_tpot_ms").is_none());
}

/// A word-level tokenizer.json: `<s>` (special, id 0) and a..e.
fn tiny_tokenizer(dir: &std::path::Path) -> std::path::PathBuf {
    let t = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 0, "content": "<s>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": {"<s>": 0, "a": 1, "b": 2, "c": 3, "d": 4, "e": 5},
                  "unk_token": "<s>"}
    });
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, t.to_string()).unwrap();
    p
}

#[test]
fn bench_serve_chat_random_with_tokenizer() {
    let (url, seen) = mock();
    let dir = tempfile::tempdir().unwrap();
    tiny_tokenizer(dir.path());
    let out = bench(
        &[
            "--url",
            &url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            "m",
            "--tokenizer",
            dir.path().to_str().unwrap(),
            "--num-prompts",
            "3",
            "--random-input-len",
            "6",
            "--random-output-len",
            "2",
            "--random-prefix-len",
            "2",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(row(&stdout, "Successful requests:"), "3");
    assert_eq!(
        row(&stdout, "Total input tokens:"),
        "24",
        "tokenizer-counted, template not included"
    );
    assert!(stderr.contains("approximate"), "{stderr}");
    for b in seen.bodies.lock().unwrap().iter() {
        let c = b["messages"][0]["content"].as_str().unwrap();
        assert_eq!(c.split_whitespace().count(), 8, "{c:?}");
        assert!(
            !c.contains("<s>"),
            "no special tokens in random prompts: {c:?}"
        );
    }
}

#[test]
fn bench_serve_unreachable_server_names_the_url() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    for extra in [&["--model", "x"][..], &[][..]] {
        let mut args = vec![
            "--url",
            &url,
            "--random-vocab-size",
            "10",
            "--num-prompts",
            "2",
        ];
        args.extend_from_slice(extra);
        let out = bench(&args, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let err: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(err.len(), 1, "{stderr}");
        assert!(err[0].contains(&format!("127.0.0.1:{port}")), "{stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("internal error"),
            "{stderr}"
        );
    }
}

#[test]
fn bench_serve_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    // Usage errors: exit 2, before any network traffic (nothing listens on port 9).
    for args in [
        &["--request-rate", "0"][..],
        &["--random-range-ratio", "1.5"],
        &["--endpoint", "/v1/embeddings", "--random-vocab-size", "5"],
        &["--dataset-name", "nope"],
        &["--percentile-metrics", "ttft,goodput"],
        &["--metric-percentiles", "abc"],
        &["--num-prompts", "0"],
        &[],
        &["--dataset-name", "sharegpt"],
        &[
            "--endpoint",
            "/v1/chat/completions",
            "--random-vocab-size",
            "5",
        ],
        &["--url", "https://example.com", "--random-vocab-size", "5"],
        &["--random-vocab-size", "5", "--abort-fraction", "0.5"],
        &["--random-vocab-size", "5", "--server-pid", "1"],
        &["--random-vocab-size", "5", "--duration-minutes", "1"],
        &[
            "--random-vocab-size",
            "5",
            "--duration-minutes",
            "1",
            "--max-concurrency",
            "2",
            "--abort-fraction",
            "1.5",
        ],
        &["--random-vocab-size", "5", "--duration-minutes", "0"],
    ] {
        let mut a = vec!["--url", "http://127.0.0.1:9"];
        a.extend_from_slice(args);
        let out = bench(&a, &[]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // Dataset files: missing, not ShareGPT-shaped.
    let missing = dir.path().join("missing.json");
    let wrong = dir.path().join("wrong.json");
    std::fs::write(&wrong, "{\"data\": []}").unwrap();
    let notok = dir.path().join("tok.json");
    std::fs::write(&notok, "not a tokenizer").unwrap();
    for (args, want) in [
        (
            vec![
                "--dataset-name",
                "sharegpt",
                "--dataset-path",
                missing.to_str().unwrap(),
            ],
            vec!["missing.json"],
        ),
        (
            vec![
                "--dataset-name",
                "sharegpt",
                "--dataset-path",
                wrong.to_str().unwrap(),
            ],
            vec!["wrong.json", "conversations"],
        ),
        (
            vec!["--tokenizer", notok.to_str().unwrap()],
            vec!["tok.json"],
        ),
    ] {
        let mut a = vec!["--url", "http://127.0.0.1:9"];
        a.extend(args.iter().copied());
        let out = bench(&a, &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{a:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        for w in want {
            assert!(stderr.contains(w), "{a:?}: {stderr}");
        }
    }
}

#[test]
fn bench_serve_timeouts_are_failures() {
    let (url, _) = mock();
    let t = Instant::now();
    let out = bench(
        &[
            "--url",
            &url,
            "--model",
            "slow",
            "--random-vocab-size",
            "10",
            "--num-prompts",
            "2",
            "--random-input-len",
            "4",
            "--random-output-len",
            "2",
            "--timeout",
            "0.5",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(row(&stdout, "Successful requests:"), "0");
    assert_eq!(row(&stdout, "Failed requests:"), "2");
    assert!(stderr.contains("timed out after 0.5 s"), "{stderr}");
    assert!(t.elapsed() < Duration::from_secs(3), "bounded by --timeout");
}

#[test]
fn bench_serve_soak_with_aborts() {
    let (url, seen) = mock();
    let dir = tempfile::tempdir().unwrap();
    let pid = std::process::id().to_string();
    let t = Instant::now();
    let out = bench(
        &[
            "--url",
            &url,
            "--random-vocab-size",
            "1000",
            "--num-prompts",
            "7",
            "--random-input-len",
            "8",
            "--random-output-len",
            "5",
            "--max-concurrency",
            "4",
            "--duration-minutes",
            "0.05",
            "--abort-fraction",
            "0.5",
            "--soak-minute-s",
            "1",
            "--server-pid",
            &pid,
            "--disable-tqdm",
            "--result-dir",
            dir.path().to_str().unwrap(),
            "--result-filename",
            "soak.json",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    println!("{stderr}{stdout}");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // 3 s of sending, then the last streams (≈ 80 ms each) and the idle check.
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(stdout.starts_with("============ Serving Benchmark Result ============\n"));
    assert!(stdout.contains(&format!("{:=^50}\n", " Soak Result ")));
    assert_eq!(
        row(&stdout, "Failed requests:"),
        "0",
        "aborts are not failures"
    );
    assert_eq!(row(&stdout, "Requests failed:"), "0");
    assert_eq!(row(&stdout, "KV blocks used (leaked):"), "0");
    assert_eq!(row(&stdout, "Server RSS start (MiB):"), "5.0");
    assert_eq!(row(&stdout, "Device memory end (MiB):"), "3.0");
    assert_eq!(row(&stdout, "Soak verdict:"), "pass");
    assert!(
        row(&stdout, "TTFT P99 drift:").parse::<f64>().is_ok(),
        "{stdout}"
    );

    let j: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("soak.json")).unwrap())
            .unwrap();
    let soak = &j["soak"];
    for k in [
        "duration_minutes",
        "abort_fraction",
        "bucket_seconds",
        "send_seconds",
        "elapsed_seconds",
        "interrupted",
        "sent",
        "completed",
        "aborted",
        "failed",
        "minutes",
        "p99_drift",
        "leaked_blocks",
        "server_start",
        "server_end",
        "passed",
        "failures",
    ] {
        assert!(soak.get(k).is_some(), "soak.{k} missing: {soak}");
    }
    let n = |k: &str| soak[k].as_u64().unwrap();
    assert!(n("aborted") > 0, "{soak}");
    assert!(n("completed") > 0, "{soak}");
    assert_eq!(n("failed"), 0, "{soak}");
    assert_eq!(n("sent"), n("completed") + n("aborted"));
    // Half aborted, give or take (aborts after 5 chunks complete: the mock sends 4).
    let share = n("aborted") as f64 / n("sent") as f64;
    assert!(share > 0.15 && share < 0.65, "aborted share {share}");
    assert_eq!(soak["passed"], true);
    assert_eq!(soak["leaked_blocks"], 0.0);
    assert_eq!(soak["server_end"]["num_requests_running"], 0.0);
    assert_eq!(soak["server_end"]["device_memory_bytes"], 3145728.0);
    assert_eq!(soak["server_start"]["resident_memory_bytes"], 5242880.0);
    assert!(soak["server_end"]["pid_rss_bytes"].as_u64().unwrap() > 0);
    let minutes = soak["minutes"].as_array().unwrap();
    assert!(minutes.len() >= 3, "{minutes:?}");
    for m in minutes {
        for k in [
            "minute",
            "full",
            "completed",
            "aborted",
            "failed",
            "p99_ttft_ms",
            "p99_itl_ms",
            "output_throughput",
        ] {
            assert!(m.get(k).is_some(), "{k} missing: {m}");
        }
    }
    assert_eq!(
        minutes.iter().filter(|m| m["full"] == true).count(),
        3,
        "{minutes:?}"
    );
    let total: u64 = minutes
        .iter()
        .map(|m| m["completed"].as_u64().unwrap())
        .sum();
    assert_eq!(total, n("completed"));
    let d = &soak["p99_drift"];
    assert_eq!(
        (d["first_minute"].as_u64(), d["last_minute"].as_u64()),
        (Some(0), Some(2))
    );
    assert!(d["ttft"].as_f64().unwrap() > 0.0 && d["itl"].as_f64().unwrap() > 0.0);
    // The usual block counts the landed requests without the aborted ones.
    assert_eq!(j["completed"].as_u64(), Some(n("completed")));
    assert_eq!(j["num_prompts"].as_u64(), Some(n("sent")));
    // Fresh random prompts past the pool of 7 (1 test request + the soak's).
    let bodies = seen.bodies.lock().unwrap();
    assert_eq!(bodies.len() as u64, 1 + n("sent"));
    let distinct: std::collections::HashSet<String> =
        bodies.iter().map(|b| b["prompt"].to_string()).collect();
    assert!(distinct.len() > 7, "{} distinct prompts", distinct.len());
    assert_eq!(seen.running.load(Ordering::SeqCst), 0);
}

#[test]
fn bench_serve_soak_fails_on_leaked_blocks() {
    let (url, _) = mock();
    let out = bench(
        &[
            "--url",
            &url,
            "--model",
            "leaky",
            "--random-vocab-size",
            "50",
            "--num-prompts",
            "3",
            "--random-input-len",
            "4",
            "--random-output-len",
            "2",
            "--max-concurrency",
            "2",
            "--duration-minutes",
            "0.01",
            "--disable-tqdm",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(row(&stdout, "KV blocks used (leaked):"), "7");
    assert_eq!(row(&stdout, "Soak verdict:"), "FAIL");
    assert_eq!(row(&stdout, "Requests aborted (by the client):"), "0");
    let err: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(err.len(), 1, "{stderr}");
    assert!(
        err[0].contains("soak failed")
            && err[0].contains("7 KV blocks")
            && err[0].contains("leaked"),
        "{stderr}"
    );
}

#[test]
fn bench_serve_soak_fails_on_failed_requests() {
    let (url, _) = mock();
    let out = bench(
        &[
            "--url",
            &url,
            "--model",
            "flaky",
            "--random-vocab-size",
            "50",
            "--num-prompts",
            "3",
            "--random-input-len",
            "4",
            "--random-output-len",
            "2",
            "--max-concurrency",
            "2",
            "--duration-minutes",
            "0.01",
            "--disable-tqdm",
        ],
        &[],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_ne!(row(&stdout, "Requests failed:"), "0");
    let err: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(err.len(), 1, "{stderr}");
    assert!(
        err[0].contains("requests failed") && err[0].contains("503"),
        "{stderr}"
    );
}
