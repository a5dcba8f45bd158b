//! `dayone chat` with piped stdin: one answer line per user turn, the conversation carried through
//! the chat template, `/reset` and `/exit`. Runs tiny llama (random weights, vocab 256) with a
//! word-level tokenizer and a chat template written here, on the CPU backend.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// llama_tiny plus a word-level tokenizer over its 256 ids and a chat template.
fn chat_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = fixture("llama_tiny");
    for f in ["model.safetensors", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    // A 65536-token window, so that an answer can run until Ctrl-C stops it.
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    cfg["max_position_embeddings"] = 65536.into();
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
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
    for i in 0..256u32 {
        let word = named
            .get(i as usize)
            .map(|s| s.to_string())
            .unwrap_or(format!("w{i}"));
        vocab.insert(word, i.into());
    }
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let tokenizer = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let config = serde_json::json!({
        "chat_template": "{% for m in messages %}<s> {{ m.role }} {{ m.content }} </s> {% endfor %}{% if add_generation_prompt %}<s> assistant {% endif %}",
        "bos_token": "<s>",
        "eos_token": "</s>",
    });
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    dir
}

/// Runs `dayone chat` with `input` on stdin; returns (stdout lines, stderr) of a run that
/// succeeded.
fn chat(model: &Path, input: &str, extra: &[&str]) -> (Vec<String>, String) {
    let out = chat_output(model, input.as_bytes(), extra);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{stderr}");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    (lines, stderr)
}

/// Runs `dayone chat` (CPU, 6 tokens per answer, EOS ignored) with the bytes `input` on stdin.
fn chat_output(model: &Path, input: &[u8], extra: &[&str]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "chat",
            "--backend",
            "cpu",
            "--max-tokens",
            "6",
            "--ignore-eos",
            "--model",
        ])
        .arg(model)
        .args(extra)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dayone");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn two_turns_answer_in_context_and_reset_forgets() {
    let model = chat_model();
    // Two turns: two answers of at most 6 words (special tokens print nothing).
    let (lines, stderr) = chat(model.path(), "hello\nworld\n", &[]);
    assert_eq!(lines.len(), 2, "one answer per turn: {lines:?}\n{stderr}");
    for l in &lines {
        let words = l.split_whitespace().count();
        assert!((1..=6).contains(&words), "1 to 6 words per answer: {l:?}");
    }
    // "world" after /reset is answered without the first turn: the same as alone, and (the
    // prompt being different) not what it was answered in the conversation.
    let (alone, _) = chat(model.path(), "world\n", &[]);
    let (reset, _) = chat(
        model.path(),
        "hello\n/reset\nworld\n/exit\nignored after exit\n",
        &[],
    );
    assert_eq!(reset.len(), 2, "{reset:?}");
    assert_eq!(reset[0], lines[0], "greedy answers repeat");
    assert_eq!(reset[1], alone[0], "/reset forgets the first turn");
    assert_ne!(lines[1], alone[0], "the second turn sees the first");
}

#[test]
fn stop_strings_cut_the_answer() {
    let model = chat_model();
    let (lines, _) = chat(model.path(), "hello\n", &[]);
    let words: Vec<&str> = lines[0].split_whitespace().collect();
    // Stop at the third word: the answer ends before it.
    let (cut, _) = chat(model.path(), "hello\n", &["--stop", words[2]]);
    let first = lines[0].find(words[2]).unwrap();
    assert_eq!(cut[0], lines[0][..first], "{cut:?} vs {lines:?}");
}

/// Piped input is a script: a line that is not UTF-8 stops it with an error naming the line
/// (after the turns before it were answered), without a panic.
#[test]
fn a_piped_line_that_is_not_utf8_is_named() {
    let model = chat_model();
    let out = chat_output(model.path(), b"hello\n\xff\xfe\n", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("stdin line 2 is not UTF-8"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        1,
        "the first turn's answer"
    );
}

#[test]
fn a_checkpoint_without_a_chat_template_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(["chat", "--backend", "cpu", "--model"])
        .arg(fixture("llama_tiny"))
        .stdin(Stdio::null())
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tokenizer") || err.contains("chat template"),
        "{err}"
    );
}

/// `generate --stop` on the same tokenizer: the text ends before the stop string, reported as
/// `finish_reason: "stop"` with the string that matched.
#[test]
fn generate_stop_string_ends_the_text() {
    let model = chat_model();
    let gen = |extra: &[&str]| -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_dayone"))
            .args([
                "generate",
                "--backend",
                "cpu",
                "--output",
                "json",
                "--ignore-eos",
                "-n",
                "8",
                "--prompt",
                "hello world",
                "--model",
            ])
            .arg(model.path())
            .args(extra)
            .env("XDG_RUNTIME_DIR", "/tmp")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let full = gen(&[]);
    let text = full["text"].as_str().unwrap().to_string();
    let word = text.split_whitespace().nth(3).expect("4 words").to_string();
    let cut = gen(&["--stop", "no such text", "--stop", &word]);
    assert_eq!(
        cut["text"].as_str().unwrap(),
        &text[..text.find(&word).unwrap()]
    );
    assert_eq!(cut["finish_reason"], "stop");
    assert_eq!(cut["stop"].as_str(), Some(word.as_str()));
    assert_eq!(full["finish_reason"], "length");
}

/// Reads from `out` until `until` says the bytes so far are enough.
fn read_until(out: &mut impl Read, got: &mut Vec<u8>, until: impl Fn(&[u8]) -> bool) {
    let mut buf = [0u8; 256];
    while !until(got) {
        let n = out.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stdout closed early: {}",
            String::from_utf8_lossy(got)
        );
        got.extend_from_slice(&buf[..n]);
    }
}

/// Ctrl-C stops the answer being generated, not the session: twice (the second Ctrl-C too only
/// stops an answer), then /exit ends the session normally (exit 0, not 130).
#[test]
fn ctrl_c_stops_the_answer_not_the_session() {
    let model = chat_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args([
            "chat",
            "--backend",
            "cpu",
            "--max-tokens",
            "60000",
            "--ignore-eos",
            "--model",
        ])
        .arg(model.path())
        .env("XDG_RUNTIME_DIR", "/tmp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run dayone");
    let mut stdin = child.stdin.take().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut got = Vec::new();
    for (turn, line) in ["hello\n", "world\n"].iter().enumerate() {
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.flush().unwrap();
        let start = got.len();
        // The answer is streaming: stop it.
        read_until(&mut out, &mut got, |g| g.len() >= start + 32);
        unsafe {
            libc::kill(child.id() as i32, libc::SIGINT);
        }
        // It ends with a newline; the session waits for the next line.
        read_until(&mut out, &mut got, |g| {
            g.iter().filter(|&&b| b == b'\n').count() > turn
        });
    }
    stdin.write_all(b"/exit\n").unwrap();
    drop(stdin);
    let rest = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&rest.stderr);
    assert_eq!(rest.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr.matches("(answer stopped)").count(), 2, "{stderr}");
    got.extend_from_slice(&rest.stdout);
    let text = String::from_utf8(got).unwrap();
    assert_eq!(text.lines().count(), 2, "two stopped answers: {text}");
}
