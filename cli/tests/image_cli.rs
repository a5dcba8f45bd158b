//! `dayone generate --image`: the tiny kimi_k25 fixture's greedy tokens for one image equal
//! transformers' (tests/fixtures/gen_kimi_k25.py); bad images and a placeholder count that does
//! not match the images get one clear error.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn dayone(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dayone"))
        .args(args)
        .env("XDG_RUNTIME_DIR", "/tmp")
        .output()
        .expect("run dayone")
}

fn model() -> String {
    fixture("kimi_k25_tiny").display().to_string()
}

fn image(name: &str) -> String {
    fixture("kimi_k25_images").join(name).display().to_string()
}

/// The reference's greedy ids of case `name`.
fn reference_case(name: &str) -> serde_json::Value {
    let path = fixture("kimi_k25_tiny").join("reference.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap()
        .clone()
}

fn reference_greedy(name: &str) -> Vec<u64> {
    reference_case(name)["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn one_image_matches_transformers() {
    // The reference prompt with its 12-token placeholder run written as one `<|media_pad|>` (250).
    let out = dayone(&[
        "generate",
        "--model",
        &model(),
        "--backend",
        "cpu",
        "--prompt-ids",
        "1,10,11,252,20,253,250,254,21,30,31,32,33",
        "--image",
        &image("rgb_100x73.png"),
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--output",
        "json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let got: Vec<u64> = json["generated_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(got, reference_greedy("one_image"));
    // The prompt as the model saw it: the placeholder expanded into the image's tokens, in the
    // JSON and in the stats line (the ids given stay as given).
    let expanded = reference_case("one_image")["prompt_ids"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(json["prompt_ids"].as_array().unwrap().len(), 13);
    assert_eq!(json["prompt_tokens"], expanded, "{json}");
    assert!(
        stderr.contains(&format!("prompt: {expanded} tokens")),
        "{stderr}"
    );
}

fn fails_with(args: &[&str], want: &str) {
    let out = dayone(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains(want), "{args:?}: want {want:?} in {stderr}");
}

#[test]
fn bad_images_and_counts_are_refused() {
    let m = model();
    let base = |img: &str| -> Vec<String> {
        [
            "generate",
            "--model",
            &m,
            "--backend",
            "cpu",
            "--prompt-ids",
            "1,250,3",
            "--image",
            img,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let dir = tempfile::tempdir().unwrap();
    let truncated = dir.path().join("cut.png");
    let png = std::fs::read(image("rgb_100x73.png")).unwrap();
    std::fs::write(&truncated, &png[..png.len() / 2]).unwrap();
    let text = dir.path().join("notes.png");
    std::fs::write(&text, "not an image").unwrap();
    for (file, want) in [
        (truncated.display().to_string(), "truncated or corrupt"),
        (text.display().to_string(), "expected PNG, JPEG or WebP"),
        (
            dir.path().join("missing.png").display().to_string(),
            "missing.png",
        ),
    ] {
        let args = base(&file);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&args, want);
    }
    // Two images, one placeholder.
    let img = image("rgb_100x73.png");
    fails_with(
        &[
            "generate",
            "--model",
            &m,
            "--backend",
            "cpu",
            "--prompt-ids",
            "1,250,3",
            "--image",
            &img,
            "--image",
            &img,
        ],
        "1 image placeholder",
    );
    // A text-only model.
    fails_with(
        &[
            "generate",
            "--model",
            &fixture("llama_tiny").display().to_string(),
            "--backend",
            "cpu",
            "--prompt",
            "hi",
            "--image",
            &img,
        ],
        "takes no images",
    );
}

#[test]
fn info_shows_the_vision_tower() {
    let out = dayone(&["info", "-m", &model(), "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["model_type"], "kimi_k25");
    assert_eq!(j["vision"]["layers"], 2);
    assert_eq!(j["vision"]["hidden_size"], 64);
    assert_eq!(j["vision"]["image_placeholder_id"], 250);
}
