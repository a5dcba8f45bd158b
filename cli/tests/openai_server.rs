//! End-to-end tests of `dayone serve`: the real `openai` Python client against the server
//! (`tests/openai_client/*.py`), tool calls through scripted checkpoints (tiny llama weights
//! whose greedy output is a fixed list of tokens, so every parser sees real model output),
//! and Rust-only tests of auth, bad input, load with disconnects and SIGTERM.
//!
//! Every server listens on 127.0.0.1 with `--port 0` and the CPU backend (SmolLM2: WGSL, which
//! is several times faster on lavapipe). The Python suites are skipped (with a note) when
//! `import openai` fails, unless `DAYONE_REQUIRE_OPENAI=1` (CI).

use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures").join(name)
}

fn client_dir() -> PathBuf {
    repo().join("tests/openai_client")
}

// ---------------------------------------------------------------------------------------------
// The server process.

/// A running `dayone serve`; SIGTERM and a bounded wait on drop.
struct Server {
    child: Option<Child>,
    url: String,
    model: String,
    stderr: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `dayone serve --host 127.0.0.1 --port 0 ARGS` (`--backend cpu` unless ARGS name
    /// one) and waits for its ready line.
    fn start(args: &[&str]) -> Server {
        Self::start_within(args, Duration::from_secs(120))
    }

    fn start_within(args: &[&str], limit: Duration) -> Server {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_dayone"));
        cmd.args(["serve", "--host", "127.0.0.1", "--port", "0"]);
        if !args.contains(&"--backend") {
            cmd.args(["--backend", "cpu"]);
        }
        let mut child = cmd
            .args(args)
            .env_remove("DAYONE_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dayone serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        {
            let mut err = child.stderr.take().unwrap();
            let sink = stderr.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
        }
        let (tx, rx) = mpsc::channel::<String>();
        {
            let out = child.stdout.take().unwrap();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let deadline = Instant::now() + limit;
        let mut server = Server {
            child: Some(child),
            url: String::new(),
            model: String::new(),
            stderr,
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("dayone serve: ready at ") {
                        let (url, model) =
                            rest.split_once(' ').expect("ready line: url then model");
                        server.url = url.to_string();
                        server.model = model
                            .trim()
                            .trim_start_matches("(model `")
                            .trim_end_matches("`)")
                            .to_string();
                        return server;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!(
                        "dayone serve {args:?}: no ready line within {limit:?}; stderr:\n{}",
                        server.stderr()
                    )
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = server.child.as_mut().unwrap().wait();
                    // Give the stderr thread a moment to read the last words.
                    std::thread::sleep(Duration::from_millis(200));
                    panic!(
                        "dayone serve {args:?} exited ({status:?}) before it was ready; stderr:\n{}",
                        server.stderr()
                    )
                }
            }
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn sigterm(&self) {
        // SAFETY: signalling our own child by its pid.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
    }

    /// Waits up to `limit` for the process to exit; kills it after that.
    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.sigterm();
            self.wait_exit(Duration::from_secs(15));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Models.

fn write_json(path: &Path, v: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(v).unwrap()).unwrap();
}

fn added(id: usize, content: &str, special: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": special})
}

/// llama_tiny (random weights, vocab 256) with a word-level tokenizer whose decoder fuses the
/// pieces (so per-token texts join to the answer), a chat template and a 4096-token window.
fn word_model() -> tempfile::TempDir {
    word_model_of("llama_tiny")
}

/// [`word_model`] over the weights and config of the fixture `name` (vocabulary 256).
fn word_model_of(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture(name);
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["max_position_embeddings"] = 4096.into();
    write_json(&dir.path().join("config.json"), &cfg);
    let named = [
        "<unk>",
        "<s>",
        "</s>",
        "user",
        "assistant",
        "system",
        "hello",
        "world",
        "a",
        "b",
    ];
    let mut vocab = serde_json::Map::new();
    for i in 0..256usize {
        let word = named
            .get(i)
            .map(|s| s.to_string())
            .unwrap_or(format!("w{i}"));
        vocab.insert(word, i.into());
    }
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true)],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    write_json(&dir.path().join("tokenizer.json"), &tokenizer);
    write_json(
        &dir.path().join("tokenizer_config.json"),
        &json!({
            "chat_template": "{% for m in messages %}<s> {{ m.role }} {{ m.content }} </s> {% endfor %}{% if add_generation_prompt %}<s> assistant {% endif %}",
            "bos_token": "<s>",
            "eos_token": "</s>",
        }),
    );
    dir
}

/// One group of `tests/openai_client/scripts.json`.
struct Group {
    name: String,
    server_args: Vec<String>,
    special: Vec<String>,
    /// (trigger, pieces)
    scripts: Vec<(String, Vec<String>)>,
}

fn groups() -> Vec<Group> {
    let text = std::fs::read_to_string(client_dir().join("scripts.json")).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect()
    };
    doc["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| Group {
            name: g["name"].as_str().unwrap().to_string(),
            server_args: strings(&g["server_args"]),
            special: strings(&g["special"]),
            scripts: g["scripts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    (
                        s["trigger"].as_str().unwrap().to_string(),
                        strings(&s["pieces"]),
                    )
                })
                .collect(),
        })
        .collect()
}

const EOS: usize = 2;
/// Ids 0.. of a scripted checkpoint's vocabulary, before the triggers and pieces.
const BASE_WORDS: &[&str] = &[
    "<unk>",
    "<s>",
    "</s>",
    "user",
    "assistant",
    "system",
    "tool",
];

/// A scripted llama checkpoint: one layer, hidden size = vocabulary size V, embeddings the
/// identity, every attention and MLP projection zero (so the residual stream stays the token's
/// one-hot), norms one, and `lm_head[next(i)][i] = 1`: greedy decoding after token i is
/// next(i). next(trigger) = the script's first piece, next(piece k) = piece k+1, next(last) =
/// `</s>`, everything else → `</s>`. The word-level tokenizer has one token per piece (the
/// group's `special` pieces as special added tokens) and a Fuse decoder; the chat template
/// ends with the last message's content, so a user message `trigger` starts its script.
/// Returns the directory and the vocabulary (word → id).
fn scripted_model(g: &Group) -> (tempfile::TempDir, BTreeMap<String, usize>) {
    let mut words: Vec<String> = BASE_WORDS.iter().map(|s| s.to_string()).collect();
    for (t, _) in &g.scripts {
        words.push(t.clone());
    }
    for (_, pieces) in &g.scripts {
        words.extend(pieces.iter().cloned());
    }
    let unique: HashSet<&String> = words.iter().collect();
    assert_eq!(
        unique.len(),
        words.len(),
        "{}: pieces and triggers must be unique",
        g.name
    );
    for s in &g.special {
        assert!(words.contains(s), "{}: special {s:?} is no piece", g.name);
    }
    let v = words.len().div_ceil(16).max(2) * 16;
    while words.len() < v {
        words.push(format!("<pad{}>", words.len()));
    }
    let id: BTreeMap<String, usize> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.clone(), i))
        .collect();
    let mut next = vec![EOS; v];
    for (t, pieces) in &g.scripts {
        let mut prev = id[t];
        for p in pieces {
            next[prev] = id[p];
            prev = id[p];
        }
        next[prev] = EOS;
    }
    let dir = tempfile::tempdir().unwrap();
    let heads = v / 16;
    let inter = 16;
    let config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": v,
        "intermediate_size": inter,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": 16,
        "vocab_size": v,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "float32",
    });
    write_json(&dir.path().join("config.json"), &config);
    write_json(
        &dir.path().join("generation_config.json"),
        &json!({"bos_token_id": 1, "eos_token_id": 2}),
    );
    // f32 tensors, row-major.
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut eye = vec![0f32; v * v];
    let mut head = vec![0f32; v * v];
    for i in 0..v {
        eye[i * v + i] = 1.0;
        head[next[i] * v + i] = 1.0;
    }
    tensors.push(("model.embed_tokens.weight".into(), vec![v, v], eye));
    tensors.push(("lm_head.weight".into(), vec![v, v], head));
    tensors.push(("model.norm.weight".into(), vec![v], vec![1.0; v]));
    let l = "model.layers.0";
    for n in ["input_layernorm", "post_attention_layernorm"] {
        tensors.push((format!("{l}.{n}.weight"), vec![v], vec![1.0; v]));
    }
    for n in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        tensors.push((
            format!("{l}.self_attn.{n}.weight"),
            vec![v, v],
            vec![0.0; v * v],
        ));
    }
    for (n, shape) in [
        ("gate_proj", [inter, v]),
        ("up_proj", [inter, v]),
        ("down_proj", [v, inter]),
    ] {
        tensors.push((
            format!("{l}.mlp.{n}.weight"),
            shape.to_vec(),
            vec![0.0; inter * v],
        ));
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, d)| (n, s, d.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &dir.path().join("model.safetensors"))
        .unwrap();
    let mut vocab = serde_json::Map::new();
    for (w, i) in &id {
        vocab.insert(w.clone(), (*i).into());
    }
    let mut added_tokens = vec![
        added(0, "<unk>", true),
        added(1, "<s>", true),
        added(2, "</s>", true),
    ];
    for s in &g.special {
        added_tokens.push(added(id[s], s, true));
    }
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added_tokens,
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    write_json(&dir.path().join("tokenizer.json"), &tokenizer);
    write_json(
        &dir.path().join("tokenizer_config.json"),
        &json!({
            "chat_template": "{% for m in messages %}{{ m.role }} {{ m.content }} {% endfor %}",
            "bos_token": "<s>",
            "eos_token": "</s>",
        }),
    );
    (dir, id)
}

// ---------------------------------------------------------------------------------------------
// HTTP.

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// Status and JSON body (`Value::Null` when the body is no JSON).
async fn send(req: reqwest::RequestBuilder) -> (u16, Value) {
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap_or_default();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn post_json(
    c: &reqwest::Client,
    url: &str,
    body: &Value,
    key: Option<&str>,
) -> (u16, Value) {
    let mut req = c.post(url).json(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    send(req).await
}

/// Asserts an OpenAI-shaped error `{"error": {"message", "type", "param", "code"}}` with this
/// status; returns the error object.
fn assert_error(what: &str, got: &(u16, Value), status: u16) -> Value {
    assert_eq!(got.0, status, "{what}: status; body {}", got.1);
    let e = &got.1["error"];
    assert!(
        e["message"].is_string(),
        "{what}: error.message; body {}",
        got.1
    );
    for k in ["type", "param", "code"] {
        assert!(
            e.get(k).is_some(),
            "{what}: error.{k} missing; body {}",
            got.1
        );
    }
    e.clone()
}

/// Reads an SSE response: the `data:` payloads in order (`[DONE]` included), stopping after
/// `limit` events (then the response is dropped: a client that goes away).
async fn sse(resp: reqwest::Response, limit: usize) -> Result<Vec<String>, String> {
    let mut events = Vec::new();
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| format!("{e:#} after {} events", events.len()))?;
        buf.push_str(std::str::from_utf8(&chunk).map_err(|e| e.to_string())?);
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for line in event.lines() {
                if let Some(d) = line
                    .strip_prefix("data: ")
                    .or_else(|| line.strip_prefix("data:"))
                {
                    events.push(d.trim().to_string());
                    if events.len() >= limit {
                        return Ok(events);
                    }
                }
            }
        }
    }
    Ok(events)
}

/// The text of a streamed completions answer (choice 0), checking the stream ends with `[DONE]`.
fn stream_text(events: &[String]) -> (String, Vec<u64>, Option<String>) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "stream end: {events:?}"
    );
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut finish = None;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        assert!(v.get("error").is_none(), "error event {v}");
        for c in v["choices"].as_array().unwrap() {
            text.push_str(c["text"].as_str().unwrap_or(""));
            if let Some(t) = c["token_ids"].as_array() {
                ids.extend(t.iter().map(|x| x.as_u64().unwrap()));
            }
            if let Some(f) = c["finish_reason"].as_str() {
                finish = Some(f.to_string());
            }
        }
    }
    (text, ids, finish)
}

/// A gauge or counter of `/metrics` (summed over series whose labels contain `label`).
async fn metric(c: &reqwest::Client, base: &str, name: &str, label: &str) -> Option<f64> {
    let text = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let mut sum = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let rest = rest.strip_prefix("_total").unwrap_or(rest);
        if !(rest.starts_with('{') || rest.starts_with(' ')) || !rest.contains(label) {
            continue;
        }
        let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
        sum = Some(sum.unwrap_or(0.0) + v);
    }
    sum
}

/// Polls until nothing runs and no KV block is in use (up to ~10 s); returns the last readings.
async fn wait_idle(c: &reqwest::Client, base: &str) -> (f64, f64) {
    let mut last = (f64::NAN, f64::NAN);
    for _ in 0..100 {
        let running = metric(c, base, "dayone:num_requests_running", "")
            .await
            .unwrap_or(f64::NAN);
        let used = metric(c, base, "dayone:kv_blocks_used", "")
            .await
            .unwrap_or(f64::NAN);
        last = (running, used);
        if running == 0.0 && used == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

// ---------------------------------------------------------------------------------------------
// Python.

/// Whether the Python suites can run; panics when they must (`DAYONE_REQUIRE_OPENAI=1`).
fn have_openai() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import openai"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var("DAYONE_REQUIRE_OPENAI").as_deref() == Ok("1") {
            panic!("DAYONE_REQUIRE_OPENAI=1 but `python3 -c 'import openai'` fails: pip install -r tests/openai_client/requirements.txt");
        }
        eprintln!("skipping: the Python `openai` package is not installed (pip install -r tests/openai_client/requirements.txt)");
    }
    ok
}

/// Runs `python3 tests/openai_client/FILE` against `server`; asserts it exits 0.
fn python(file: &str, args: &[&str], server: &Server, env: &[(&str, String)]) {
    let out = Command::new("python3")
        .arg(client_dir().join(file))
        .args(args)
        .env("DAYONE_URL", &server.url)
        .env("DAYONE_MODEL", &server.model)
        .env("PYTHONUNBUFFERED", "1")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "python3 {file} failed ({}):\n{text}\n--- server stderr (tail) ---\n{}",
        out.status,
        tail(&server.stderr(), 4000)
    );
    eprintln!("{text}");
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// The `openai` client against tiny llama: chat and completions, streams (role chunk, one id,
/// finish, usage with `choices: []`, `[DONE]`, no empty delta), n=2, logprobs, stop strings,
/// seeds, max_completion_tokens, return_token_ids == `dayone generate`, streamed ==
/// non-stream, cached_tokens on a repeat, /tokenize, errors.
#[test]
fn openai_client_basic() {
    basic_suite(&[], false);
}

/// The seed cases of basic.py: the same seed must give the same sampled text in two requests.
#[test]
fn openai_client_seed() {
    basic_suite(&["-k", "Seeds"], true);
}

fn basic_suite(args: &[&str], known_bugs: bool) {
    if !have_openai() {
        return;
    }
    let model = word_model();
    let dir = model.path().to_str().unwrap().to_string();
    let server = Server::start(&[
        "--model",
        &dir,
        "--served-model-name",
        "tiny",
        "--api-key",
        "sk-test",
        "--kv-cache-tokens",
        "16384",
    ]);
    python(
        "basic.py",
        args,
        &server,
        &[
            ("DAYONE_API_KEY", "sk-test".into()),
            ("DAYONE_BIN", env!("CARGO_BIN_EXE_dayone").into()),
            ("DAYONE_MODEL_DIR", dir.clone()),
            (
                "DAYONE_RUN_KNOWN_BUGS",
                if known_bugs { "1" } else { "0" }.into(),
            ),
        ],
    );
}

/// The `openai` client against SmolLM2-135M-Instruct (the default model, fetched on first use):
/// its chat template, a short answer, /tokenize with messages == usage.prompt_tokens.
#[test]
fn openai_client_smollm2() {
    if !have_openai() {
        return;
    }
    let server = Server::start_within(&["--backend", "wgsl"], Duration::from_secs(600));
    python("smollm2.py", &[], &server, &[]);
}

/// Tool calls end to end: for each group of scripts.json, a scripted checkpoint served with
/// that group's parser flags. First the chain itself is checked through /v1/completions (the
/// exact pieces, then `</s>`), then `tool_calls.py` checks stream and non-stream answers.
#[test]
fn tool_calls_scripted() {
    let python_ok = have_openai();
    let rt = runtime();
    let c = http();
    for g in groups() {
        let (model, vocab) = scripted_model(&g);
        let mut args: Vec<&str> = vec!["--model", model.path().to_str().unwrap()];
        args.extend(["--served-model-name", "scripted", "--max-num-seqs", "16"]);
        args.extend(g.server_args.iter().map(String::as_str));
        let server = Server::start(&args);
        for (trigger, pieces) in &g.scripts {
            let body = json!({"model": "scripted", "prompt": trigger, "max_tokens": 64,
                "temperature": 0, "skip_special_tokens": false, "return_token_ids": true});
            let (status, v) = rt.block_on(post_json(
                &c,
                &format!("{}/v1/completions", server.url),
                &body,
                None,
            ));
            assert_eq!(status, 200, "{}: {v}", g.name);
            let want_ids: Vec<u64> = pieces
                .iter()
                .map(|p| vocab[p] as u64)
                .chain([EOS as u64])
                .collect();
            let got_ids: Vec<u64> = v["choices"][0]["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect();
            assert_eq!(got_ids, want_ids, "{} `{trigger}`: the chain", g.name);
            assert_eq!(
                v["choices"][0]["text"].as_str().unwrap(),
                pieces.concat(),
                "{} `{trigger}`: the decoded text is the pieces fused",
                g.name
            );
            assert_eq!(v["choices"][0]["finish_reason"], "stop");
        }
        if python_ok {
            python(
                "tool_calls.py",
                &[],
                &server,
                &[("DAYONE_GROUP", g.name.clone())],
            );
        }
    }
}

/// `dayone:device_memory_bytes{kind="weights"}` is what the engine holds (as `bench` reports it):
/// gpt-oss's MXFP4 experts in their blocks, its bf16 weights 2 bytes on WGSL — not every
/// stored element at the dtype's size (that overstated a Q4 GGUF about 6×).
#[test]
fn metrics_report_the_weights_as_the_backend_holds_them() {
    let model = word_model_of("gpt_oss_tiny");
    let path = model.path().to_str().unwrap();
    let bench = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(["bench", "-m", path, "--backend", "wgsl", "--batch", "1"])
        .args(["--prompt-len", "4", "--gen-len", "2", "--json"])
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone bench");
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let report: Value = serde_json::from_slice(&bench.stdout).expect("one JSON object");
    let resident = report["weight_resident_bytes"].as_f64().unwrap();
    let server = Server::start(&["--model", path, "--backend", "wgsl"]);
    let (c, base) = (http(), server.url.clone());
    let weights = runtime()
        .block_on(metric(&c, &base, "dayone:device_memory_bytes", "weights"))
        .expect("a weights gauge");
    assert_eq!(weights, resident, "{report}");
}

/// Auth and bad input: 401 on every /v1 path without the right key (/health and /metrics
/// open), 413, deep nesting, invalid UTF-8, NaN, out-of-range and wrongly typed fields, a
/// prompt past the window, an unknown model; afterwards a normal request still works.
#[test]
fn auth_and_bad_input() {
    let model = word_model();
    let server = Server::start(&[
        "--model",
        model.path().to_str().unwrap(),
        "--served-model-name",
        "tiny",
        "--api-key",
        "K",
        "--max-model-len",
        "64",
    ]);
    let rt = runtime();
    let c = http();
    let base = server.url.clone();
    let key = Some("K");
    rt.block_on(async {
        let chat_url = format!("{base}/v1/chat/completions");
        let cmpl_url = format!("{base}/v1/completions");
        let chat = json!({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2});
        let cmpl = json!({"model": "tiny", "prompt": "hello world", "max_tokens": 2});
        // 401: missing, wrong, wrong scheme.
        for (what, auth) in [
            ("no key", None),
            ("wrong key", Some("Bearer wrong")),
            ("prefix of the key", Some("Bearer ")),
            ("basic auth", Some("Basic Szo=")),
        ] {
            let with = |r: reqwest::RequestBuilder| match auth {
                Some(a) => r.header("authorization", a),
                None => r,
            };
            let got = send(with(c.post(&chat_url).json(&chat))).await;
            assert_error(&format!("chat, {what}"), &got, 401);
            let got = send(with(c.post(&cmpl_url).json(&cmpl))).await;
            assert_error(&format!("completions, {what}"), &got, 401);
            let got = send(with(c.get(format!("{base}/v1/models")))).await;
            assert_error(&format!("models, {what}"), &got, 401);
        }
        let health = c.get(format!("{base}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200, "/health needs no key");
        let metrics = c.get(format!("{base}/metrics")).send().await.unwrap();
        assert_eq!(metrics.status(), 200, "/metrics needs no key");
        assert!(metrics.text().await.unwrap().contains("dayone:num_requests_running"));
        let (s, v) = send(c.get(format!("{base}/v1/models")).bearer_auth("K")).await;
        assert_eq!((s, v["data"][0]["id"].as_str()), (200, Some("tiny")), "{v}");

        // 413: a 10 MB body (limit 8 MiB).
        let big = format!(r#"{{"model":"tiny","prompt":"{}","max_tokens":1}}"#, "a ".repeat(5 << 20));
        let got = send(c.post(&cmpl_url).bearer_auth("K").header("content-type", "application/json").body(big)).await;
        assert_error("10 MB body", &got, 413);

        let raw = |body: Vec<u8>, url: String| {
            c.post(url)
                .bearer_auth("K")
                .header("content-type", "application/json")
                .body(body)
        };
        // Deep nesting, invalid UTF-8, NaN (not JSON), not an object.
        let deep = format!(r#"{{"model":"tiny","prompt":{}1{}}}"#, "[".repeat(10000), "]".repeat(10000));
        assert_error("10000 nested [", &send(raw(deep.into_bytes(), cmpl_url.clone())).await, 400);
        let deep = format!(r#"{{"messages":{}}}"#, "{\"a\":".repeat(10000) + "1" + &"}".repeat(10000));
        assert_error("10000 nested {", &send(raw(deep.into_bytes(), chat_url.clone())).await, 400);
        let mut bad_utf8 = br#"{"model":"tiny","prompt":"hello "#.to_vec();
        bad_utf8.extend([0xff, 0xfe, 0xc3]);
        bad_utf8.extend(br#"","max_tokens":1}"#);
        assert_error("invalid UTF-8", &send(raw(bad_utf8, cmpl_url.clone())).await, 400);
        let nan = br#"{"model":"tiny","prompt":"hello","temperature":NaN}"#.to_vec();
        assert_error("temperature NaN", &send(raw(nan, cmpl_url.clone())).await, 400);
        assert_error("a JSON array body", &send(raw(b"[1,2]".to_vec(), cmpl_url.clone())).await, 400);
        assert_error("an empty body", &send(raw(Vec::new(), chat_url.clone())).await, 400);

        // Field values and types: 400 naming the field.
        let field_cases: Vec<(&str, &str, Value, &str)> = vec![
            ("negative temperature", "c", json!({"temperature": -0.5}), "temperature"),
            ("temperature 1e300", "c", json!({"temperature": 1e300}), "temperature"),
            ("n = 1000000", "c", json!({"n": 1_000_000}), "n"),
            ("n = 0", "m", json!({"n": 0}), "n"),
            ("max_tokens = 10^12", "c", json!({"max_tokens": 1_000_000_000_000u64}), "max_tokens"),
            ("max_tokens = -1", "c", json!({"max_tokens": -1}), "max_tokens"),
            ("max_tokens = \"x\"", "c", json!({"max_tokens": "x"}), "max_tokens"),
            ("max_completion_tokens = 10^12", "m", json!({"max_completion_tokens": 1_000_000_000_000u64}), "max_completion_tokens"),
            ("messages as a string", "m", json!({"messages": "hello"}), "messages"),
            ("a user message without content", "m", json!({"messages": [{"role": "user"}]}), "messages[0].content"),
            ("a user message with null content", "m", json!({"messages": [{"role": "user", "content": null}]}), "messages[0].content"),
            ("top_p = 0", "c", json!({"top_p": 0}), "top_p"),
            ("stop as a number", "c", json!({"stop": 5}), "stop"),
            ("top_logprobs 100", "m", json!({"logprobs": true, "top_logprobs": 100}), "top_logprobs"),
            ("prompt id outside the vocabulary", "c", json!({"prompt": [1, 999999]}), "prompt"),
            ("prompt as an object", "c", json!({"prompt": {"a": 1}}), "prompt"),
        ];
        for (what, which, patch, param) in field_cases {
            let (url, mut body) = match which {
                "c" => (&cmpl_url, cmpl.clone()),
                _ => (&chat_url, chat.clone()),
            };
            for (k, v) in patch.as_object().unwrap() {
                body[k] = v.clone();
            }
            let got = post_json(&c, url, &body, key).await;
            let e = assert_error(what, &got, 400);
            let p = e["param"].as_str().unwrap_or_default();
            assert!(p.trim_start_matches('.').starts_with(param), "{what}: param {p:?}, want {param}: {e}");
            if what.starts_with("max_tokens = 10") {
                assert!(e["message"].as_str().unwrap().contains("max_tokens"), "{e}");
            }
        }

        // A prompt past the 64-token window: both numbers in the message.
        let long = json!({"model": "tiny", "prompt": vec![5; 100], "max_tokens": 1});
        let e = assert_error("100-token prompt, window 64", &post_json(&c, &cmpl_url, &long, key).await, 400);
        let msg = e["message"].as_str().unwrap();
        assert!(msg.contains("64") && msg.contains("100"), "{msg}");
        let words = "hello ".repeat(80);
        let long_chat = json!({"model": "tiny", "messages": [{"role": "user", "content": words}]});
        let e = assert_error("long chat, window 64", &post_json(&c, &chat_url, &long_chat, key).await, 400);
        assert!(e["message"].as_str().unwrap().contains("64"), "{e}");

        // Unknown model: 404.
        let mut other = cmpl.clone();
        other["model"] = json!("gpt-4");
        assert_error("unknown model", &post_json(&c, &cmpl_url, &other, key).await, 404);
        let mut other = chat.clone();
        other["model"] = json!("gpt-4");
        assert_error("unknown model (chat)", &post_json(&c, &chat_url, &other, key).await, 404);
        // Unknown route, wrong method.
        assert_error("unknown route", &send(c.get(format!("{base}/v1/nothing")).bearer_auth("K")).await, 404);
        assert_error("GET on a POST route", &send(c.get(&chat_url).bearer_auth("K")).await, 405);

        // Still serving.
        let (s, v) = post_json(&c, &chat_url, &chat, key).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["usage"]["completion_tokens"].as_u64().map(|n| n >= 1), Some(true), "{v}");
        let (s, v) = post_json(&c, &cmpl_url, &cmpl, key).await;
        assert_eq!(s, 200, "{v}");
        assert!(c.get(format!("{base}/health")).send().await.unwrap().status().is_success());
    });
}

/// 64 concurrent streams (greedy, 8 distinct prompts), each answer equal to the same request
/// alone; every tenth client goes away after 3 chunks, and one while its prompt prefills;
/// afterwards nothing runs and no KV block is held, and the aborts were counted.
#[test]
fn load_64_streams_with_disconnects() {
    let model = word_model();
    let server = Server::start(&[
        "--model",
        model.path().to_str().unwrap(),
        "--max-num-seqs",
        "64",
        "--kv-cache-tokens",
        "65536",
        "--chunked-prefill-size",
        "256",
    ]);
    let rt = runtime();
    let c = http();
    let base = server.url.clone();
    let url = format!("{base}/v1/completions");
    let prompt = |k: usize| -> Vec<u32> {
        (0..12)
            .map(|j| (10 + 7 * k + 3 * j) as u32 % 250 + 3)
            .collect()
    };
    let body = |k: usize, max: usize| {
        json!({"prompt": prompt(k), "max_tokens": max, "temperature": 0, "ignore_eos": true,
            "stream": true, "return_token_ids": true})
    };
    rt.block_on(async {
        // References, one at a time.
        let mut alone = Vec::new();
        for k in 0..8 {
            let mut b = body(k, 24);
            b["stream"] = json!(false);
            let (s, v) = post_json(&c, &url, &b, None).await;
            assert_eq!(s, 200, "{v}");
            alone.push(v["choices"][0]["text"].as_str().unwrap().to_string());
        }
        let aborts_before = metric(&c, &base, "dayone:request_success", "abort")
            .await
            .unwrap_or(0.0);
        let mut tasks = Vec::new();
        for i in 0..64usize {
            let c = c.clone();
            let url = url.clone();
            let leaves = i % 10 == 3;
            let b = if leaves {
                body(i % 8, 3000)
            } else {
                body(i % 8, 24)
            };
            tasks.push(tokio::spawn(async move {
                let resp = c
                    .post(&url)
                    .json(&b)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                if resp.status() != 200 {
                    return Err(format!("status {}", resp.status()));
                }
                let limit = if leaves { 3 } else { usize::MAX };
                sse(resp, limit).await.map(|e| (i, leaves, e))
            }));
        }
        // One more goes away before the first token of a long prompt (3000 tokens, 12 steps).
        let long = json!({"prompt": (0..3000).map(|j| (j % 250 + 3) as u32).collect::<Vec<_>>(),
            "max_tokens": 1000, "ignore_eos": true, "stream": true});
        let resp = c.post(&url).json(&long).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        drop(resp);
        let mut left = 1;
        for t in tasks {
            let (i, leaves, events) = t.await.unwrap().unwrap_or_else(|e| panic!("stream: {e}"));
            if leaves {
                left += 1;
                assert_eq!(events.len(), 3, "client {i}");
                continue;
            }
            let (text, ids, finish) = stream_text(&events);
            assert_eq!(text, alone[i % 8], "client {i}: concurrent answer == alone");
            assert!(ids.len() <= 24, "client {i}");
            assert_eq!(finish.as_deref(), Some("length"), "client {i}");
        }
        let (running, used) = wait_idle(&c, &base).await;
        assert_eq!(
            (running, used),
            (0.0, 0.0),
            "num_requests_running, kv_blocks_used after the load"
        );
        let aborts = metric(&c, &base, "dayone:request_success", "abort")
            .await
            .unwrap_or(0.0);
        assert_eq!(
            aborts - aborts_before,
            left as f64,
            "aborted requests (clients that went away)"
        );
        // Still serving.
        let mut b = body(0, 24);
        b["stream"] = json!(false);
        let (s, v) = post_json(&c, &url, &b, None).await;
        assert_eq!(
            (s, v["choices"][0]["text"].as_str()),
            (200, Some(alone[0].as_str()))
        );
    });
}

/// With `return_token_ids`, the streamed `token_ids` are the non-stream ones: also the ids of
/// tokens whose text is empty (a special token dropped by skip_special_tokens, the EOS).
#[test]
fn stream_token_ids_keep_tokens_without_text() {
    let model = word_model();
    let server = Server::start(&["--model", model.path().to_str().unwrap()]);
    let rt = runtime();
    let c = http();
    let url = format!("{}/v1/completions", server.url);
    rt.block_on(async {
        // Greedy, this prompt's answer holds token 0 (`<unk>`, special: no text).
        let prompt: Vec<u32> = (0..12).map(|j| (10 + 3 * j) % 250 + 3).collect();
        let mut b = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0,
            "ignore_eos": true, "return_token_ids": true});
        let (s, v) = post_json(&c, &url, &b, None).await;
        assert_eq!(s, 200, "{v}");
        let want: Vec<u64> = v["choices"][0]["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(want.len(), 24);
        assert!(
            want.contains(&0),
            "the case needs a token without text: {want:?}"
        );
        b["stream"] = json!(true);
        let resp = c.post(&url).json(&b).send().await.unwrap();
        let (_, got, _) = stream_text(&sse(resp, usize::MAX).await.unwrap());
        assert_eq!(got, want, "streamed token_ids == non-stream token_ids");
        // Chat too.
        let chat = json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 24,
            "temperature": 0, "ignore_eos": true, "return_token_ids": true});
        let curl = url.replace("/v1/completions", "/v1/chat/completions");
        let (_, v) = post_json(&c, &curl, &chat, None).await;
        let want = v["choices"][0]["token_ids"].as_array().unwrap().len();
        let mut chat = chat;
        chat["stream"] = json!(true);
        let resp = c.post(&curl).json(&chat).send().await.unwrap();
        let events = sse(resp, usize::MAX).await.unwrap();
        let got: usize = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str::<Value>(e).unwrap())
            .flat_map(|v| v["choices"].as_array().cloned().unwrap_or_default())
            .map(|c| c["token_ids"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(got, want, "chat: streamed token_ids count == non-stream");
    });
}

/// A tokenizer without a post-processor whose `tokenizer_config.json` asks for BOS
/// (`add_bos_token`): `/tokenize` of a text prompt counts the BOS that generation adds, so its
/// ids equal the prompt `/v1/completions` runs; `add_special_tokens: false` leaves it out.
#[test]
fn tokenize_counts_the_bos_generation_adds() {
    let model = word_model();
    let cfg_path = model.path().join("tokenizer_config.json");
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["add_bos_token"] = json!(true);
    write_json(&cfg_path, &cfg);
    let server = Server::start(&["--model", model.path().to_str().unwrap()]);
    let rt = runtime();
    let c = http();
    rt.block_on(async {
        let prompt = "hello world a b";
        let (s, t) = post_json(
            &c,
            &format!("{}/tokenize", server.url),
            &json!({"prompt": prompt}),
            None,
        )
        .await;
        assert_eq!(s, 200, "{t}");
        let body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
        let (s, v) = post_json(&c, &format!("{}/v1/completions", server.url), &body, None).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(
            t["count"], v["usage"]["prompt_tokens"],
            "/tokenize {t} vs usage {v}"
        );
        assert_eq!(t["tokens"], json!([1, 6, 7, 8, 9]), "BOS (<s> = 1) first");
        let (s, raw) = post_json(
            &c,
            &format!("{}/tokenize", server.url),
            &json!({"prompt": prompt, "add_special_tokens": false}),
            None,
        )
        .await;
        assert_eq!(s, 200, "{raw}");
        assert_eq!(raw["tokens"], json!([6, 7, 8, 9]));
        // Messages are checked as /v1/chat/completions checks them.
        let (s, e) = post_json(
            &c,
            &format!("{}/tokenize", server.url),
            &json!({"messages": [{"role": "user"}]}),
            None,
        )
        .await;
        assert_eq!(s, 400, "{e}");
        assert_eq!(e["error"]["param"], "messages[0].content", "{e}");
    });
}

/// SIGTERM while a stream is in flight: the stream finishes (`[DONE]`) or ends cleanly, and
/// the server exits 0.
#[test]
fn sigterm_drains_a_stream() {
    let model = word_model();
    let mut server = Server::start(&[
        "--model",
        model.path().to_str().unwrap(),
        // A grace long enough for 4000 tokens when the suite's other servers share 2 cores.
        "--shutdown-timeout",
        "60",
    ]);
    let rt = runtime();
    let c = http();
    let url = format!("{}/v1/completions", server.url);
    let events = rt.block_on(async {
        let b =
            json!({"prompt": [1, 5, 6], "max_tokens": 4000, "ignore_eos": true, "stream": true});
        let resp = c.post(&url).json(&b).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        // The first chunk, then SIGTERM, then the rest.
        let first = body.next().await.unwrap().unwrap();
        server.sigterm();
        let mut all = String::from_utf8_lossy(&first).into_owned();
        let mut clean = true;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(b) => all.push_str(&String::from_utf8_lossy(&b)),
                Err(_) => {
                    clean = false;
                    break;
                }
            }
        }
        (all, clean)
    });
    let status = server.wait_exit(Duration::from_secs(90));
    let (all, clean) = events;
    assert!(clean, "the stream broke off; got:\n{}", tail(&all, 2000));
    assert!(
        all.trim_end().ends_with("data: [DONE]"),
        "stream end:\n{}",
        tail(&all, 2000)
    );
    assert!(
        all.contains(r#""finish_reason":"length""#),
        "the stream ran to its end within the grace:\n{}",
        tail(&all, 2000)
    );
    let err = server.stderr();
    assert!(err.contains("draining"), "SIGTERM was seen: {err}");
    assert!(
        status.is_some_and(|s| s.success()),
        "exit status {status:?}; stderr:\n{}",
        server.stderr()
    );
}

/// Clients that close their socket while the server is still writing a short stream (the
/// last chunks and `[DONE]` hit a closed connection): each write fails with EPIPE, which must
/// cost that request only. Regression: the process once died of SIGPIPE here.
#[test]
fn closed_sockets_do_not_kill_the_server() {
    use std::io::{Read, Write};
    let model = word_model();
    let mut server = Server::start(&["--model", model.path().to_str().unwrap()]);
    let addr = server.url.trim_start_matches("http://").to_string();
    for round in 0..200u64 {
        let body = format!(
            r#"{{"prompt":"hello","max_tokens":{},"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#,
            [1, 2, 3, 5, 8][round as usize % 5]
        );
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut buf = [0u8; 300];
        let _ = s.read(&mut buf);
        drop(s); // closed with the rest of the stream unread
        assert!(
            std::net::TcpStream::connect(&addr).is_ok(),
            "round {round}: the server is gone"
        );
    }
    let rt = runtime();
    let c = http();
    let got = rt.block_on(post_json(
        &c,
        &format!("{}/v1/completions", server.url),
        &json!({"prompt": "hello", "max_tokens": 2}),
        None,
    ));
    assert_eq!(got.0, 200, "the server stopped answering: {}", got.1);
    let (running, used) = rt.block_on(wait_idle(&c, &server.url));
    assert_eq!(
        (running, used),
        (0.0, 0.0),
        "requests or blocks left after the closed sockets"
    );
    server.sigterm();
    let status = server.wait_exit(Duration::from_secs(30));
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit status {status:?}"
    );
}
