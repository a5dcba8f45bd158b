//! `dayone serve` with images: chat `image_url` parts as `data:` URLs and (under
//! `--allowed-local-media-path`) `file://` URLs reach the model (the tiny kimi_k25 fixture's
//! greedy tokens equal transformers'); remote URLs, files outside the allowed directory and
//! broken images get a 400 naming the field, and the server keeps serving. 127.0.0.1 only.

use base64::Engine as _;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// kimi_k25_tiny plus a word-level tokenizer with Kimi's media tokens at the fixture's ids and a
/// template that renders the reference prompt `<s> w10 w11 {content}` .
fn model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("kimi_k25_tiny");
    for f in ["model.safetensors", "config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let special = [
        (0, "<unk>"),
        (1, "<s>"),
        (2, "</s>"),
        (250, "<|media_pad|>"),
        (252, "<|media_begin|>"),
        (253, "<|media_content|>"),
        (254, "<|media_end|>"),
    ];
    let mut vocab = serde_json::Map::new();
    for i in 0..256usize {
        let word = match (i, special.iter().find(|s| s.0 == i)) {
            (_, Some((_, s))) => s.to_string(),
            (20, None) => "image".to_string(),
            _ => format!("w{i}"),
        };
        vocab.insert(word, i.into());
    }
    let added: Vec<Value> = special
        .iter()
        .map(|(id, s)| {
            json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let cfg = json!({
        "chat_template": "<s> w10 w11 {% for m in messages %}{{ m.content }}{% endfor %}",
        "bos_token": "<s>", "eos_token": "</s>"
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

struct Server(Child, String);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(model: &Path, allowed: &Path) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--backend",
            "cpu",
            "--served-model-name",
            "m",
        ])
        .arg("--model")
        .arg(model)
        .arg("--allowed-local-media-path")
        .arg(allowed)
        .env_remove("DAYONE_API_KEY")
        .env("XDG_RUNTIME_DIR", "/tmp")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dayone serve");
    let out = child.stdout.take().unwrap();
    // Killed and reaped on every path from here (Drop), the panics included.
    let mut server = Server(child, String::new());
    let deadline = Instant::now() + Duration::from_secs(120);
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("dayone serve: ready at ") {
            server.1 = rest.split_once(' ').unwrap().0.to_string();
            return server;
        }
        assert!(Instant::now() < deadline, "no ready line");
    }
    panic!("dayone serve exited before it was ready");
}

fn chat(server: &Server, url: &str) -> (u16, Value) {
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": "w21 w30 w31 w32 w33"}
        ]}],
        "max_tokens": 6,
        "temperature": 0,
        "ignore_eos": true,
        "return_token_ids": true
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(format!("{}/v1/chat/completions", server.1))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    })
}

fn reference_greedy() -> Value {
    let path = fixture("kimi_k25_tiny").join("reference.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"][0]["greedy_ids"].clone()
}

#[test]
fn chat_with_images() {
    let model = model_dir();
    let images = fixture("kimi_k25_images").canonicalize().unwrap();
    let server = start(model.path(), &images);
    let png = std::fs::read(images.join("rgb_100x73.png")).unwrap();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let data_url = format!("data:image/png;base64,{}", b64(&png));
    let want = reference_greedy();

    let (status, body) = chat(&server, &data_url);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["token_ids"], want, "{body}");
    // 13 prompt ids, the one `<|media_pad|>` counted as the image's 12 tokens.
    assert_eq!(body["usage"]["prompt_tokens"], 24, "{body}");
    let file_url = format!("file://{}", images.join("rgb_100x73.png").display());
    let (status, body) = chat(&server, &file_url);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["token_ids"], want, "{body}");

    let outside = format!("file://{}", model.path().join("config.json").display());
    let bad = [
        ("https://example.com/cat.png".to_string(), "not fetched"),
        (outside, "outside --allowed-local-media-path"),
        ("data:image/png;base64,@@@".to_string(), "invalid base64"),
        (
            format!("data:image/png;base64,{}", b64(&png[..png.len() / 2])),
            "truncated or corrupt",
        ),
        (
            format!("data:text/plain;base64,{}", b64(b"hi")),
            "not an image",
        ),
        (
            format!("data:image/png;base64,{}", b64(b"GIF89a....")),
            "expected PNG, JPEG or WebP",
        ),
    ];
    for (url, want_msg) in bad {
        let (status, body) = chat(&server, &url);
        assert_eq!(status, 400, "{url:.60}: {body}");
        let msg = body["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(want_msg), "{url:.60}: {msg}");
        assert!(
            body["error"]["param"]
                .as_str()
                .unwrap_or_default()
                .contains("image_url"),
            "{body}"
        );
    }
    // Still serving.
    let (status, body) = chat(&server, &data_url);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["token_ids"], want);
}
