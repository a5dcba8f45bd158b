//! A `glm5_next` vision checkpoint (tests/fixtures/glm5_next_vision_tiny) from the command line:
//! `dayone generate --image` and `dayone serve` with a chat `image_url` part (rendered as
//! `<|begin_of_image|><|image|><|end_of_image|>`) give transformers' greedy tokens; a broken
//! image gets a 400 naming the field and the server keeps serving (127.0.0.1 only); `dayone
//! info` shows the tower.

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

/// The reference's first case: prompt ids with the image run collapsed, greedy ids.
fn reference() -> (Vec<u64>, Value) {
    let path = fixture("glm5_next_vision_tiny").join("vision_reference.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut ids: Vec<u64> = Vec::new();
    for t in v["cases"][0]["prompt_ids"].as_array().unwrap() {
        let t = t.as_u64().unwrap();
        if !(t == 250 && ids.last() == Some(&250)) {
            ids.push(t);
        }
    }
    (ids, v["cases"][0]["greedy_ids"].clone())
}

/// glm5_next_vision_tiny plus a word-level tokenizer (`w{i}` = id i) with GLM's image tokens at
/// the fixture's ids and a template that renders `{words before the image} {content}`.
fn model_dir(before: &[u64]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("glm5_next_vision_tiny");
    for f in [
        "model.safetensors",
        "config.json",
        "preprocessor_config.json",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let special = [
        (0, "<unk>"),
        (1, "<s>"),
        (2, "</s>"),
        (250, "<|image|>"),
        (252, "<|begin_of_image|>"),
        (253, "<|end_of_image|>"),
    ];
    let mut vocab = serde_json::Map::new();
    for i in 0..256usize {
        let word = match special.iter().find(|s| s.0 == i) {
            Some((_, s)) => s.to_string(),
            None => format!("w{i}"),
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
    let words: Vec<String> = before.iter().skip(1).map(|i| format!("w{i}")).collect();
    let cfg = json!({
        "chat_template": format!("<s> {} {{% for m in messages %}}{{{{ m.content }}}}{{% endfor %}}", words.join(" ")),
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

fn start(model: &Path) -> Server {
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

fn chat(server: &Server, url: &str, text: &str) -> (u16, Value) {
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text}
        ]}],
        "max_tokens": 8,
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

#[test]
fn chat_with_an_image() {
    let (ids, want) = reference();
    let image_at = ids.iter().position(|&t| t == 252).unwrap();
    let model = model_dir(&ids[..image_at]);
    let server = start(model.path());
    let text: Vec<String> = ids[image_at + 3..]
        .iter()
        .map(|i| format!("w{i}"))
        .collect();
    let text = text.join(" ");
    let png = std::fs::read(fixture("kimi_k25_images").join("rgb_100x73.png")).unwrap();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let data_url = format!("data:image/png;base64,{}", b64(&png));

    let (status, body) = chat(&server, &data_url, &text);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["token_ids"], want, "{body}");
    // The one `<|image|>` counted as the image's 20 tokens (enlarged to 112×140 pixels).
    assert_eq!(body["usage"]["prompt_tokens"], ids.len() + 19, "{body}");

    let broken = format!("data:image/png;base64,{}", b64(&png[..png.len() / 2]));
    let (status, body) = chat(&server, &broken, &text);
    assert_eq!(status, 400, "{body}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("truncated or corrupt"), "{msg}");
    assert!(
        body["error"]["param"]
            .as_str()
            .unwrap_or_default()
            .contains("image_url"),
        "{body}"
    );
    // Still serving.
    let (status, body) = chat(&server, &data_url, &text);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["token_ids"], want);
}

fn dayone(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone")
}

#[test]
fn generate_with_an_image() {
    let (ids, want) = reference();
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
    let model = fixture("glm5_next_vision_tiny").display().to_string();
    let img = fixture("kimi_k25_images").join("rgb_100x73.png");
    let out = dayone(&[
        "generate",
        "--model",
        &model,
        "--backend",
        "cpu",
        "--prompt-ids",
        &ids.join(","),
        "--image",
        &img.display().to_string(),
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--output",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["generated_ids"], want);
}

#[test]
fn info_shows_the_vision_tower() {
    let model = fixture("glm5_next_vision_tiny").display().to_string();
    let out = dayone(&["info", "-m", &model, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["vision"]["tower"], "GLM-5.3-Flash ViT");
    assert_eq!(j["vision"]["layers"], 2);
    assert_eq!(j["vision"]["hidden_size"], 32);
    assert_eq!(j["vision"]["image_placeholder_id"], 250);
}
