//! safetensors and HF-directory loading: single files, shards, bad input.

use dayone_backend::DType;
use dayone_engine::loader::{self, SafetensorsSource, TensorSource};
use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

fn write_st(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn single_file_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let bf: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
        .collect();
    let hf: Vec<u8> = [0.25f32, 3.0, 4.0]
        .iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect();
    write_st(
        &dir.path().join("model.safetensors"),
        &[
            (
                "a",
                Dtype::F32,
                vec![2, 2],
                f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
            ),
            ("b", Dtype::BF16, vec![2], bf),
            ("c", Dtype::F16, vec![3, 1], hf),
            ("d", Dtype::I64, vec![1], vec![0; 8]),
            ("e", Dtype::F8_E4M3, vec![2], vec![0; 2]),
        ],
    );
    let src = SafetensorsSource::open_dir(dir.path()).unwrap();
    assert_eq!(src.names(), vec!["a", "b", "c", "d", "e"]);
    assert_eq!(src.shape("a"), Some(vec![2, 2]));
    assert_eq!(src.shape("zz"), None);
    let a = src.load("a").unwrap();
    assert_eq!(a.dtype, DType::F32);
    assert_eq!(a.to_f32(), vec![1.0, 2.0, 3.0, 4.0]);
    let b = src.load("b").unwrap();
    assert_eq!(b.dtype, DType::BF16);
    assert_eq!(b.to_f32(), vec![1.5, -2.0]);
    let c = src.load("c").unwrap();
    assert_eq!((c.dtype, c.shape.clone()), (DType::F16, vec![3, 1]));
    assert_eq!(c.to_f32(), vec![0.25, 3.0, 4.0]);
    let e = src.load("d").unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("tensor d") && e.contains("I64"),
        "{e}"
    );
    let e = src.load("e").unwrap_err().to_string();
    assert!(e.contains("F8_E4M3") && e.contains("tensor e"), "{e}");
    let e = src.load("nope").unwrap_err().to_string();
    assert!(e.contains("nope"), "{e}");
}

#[test]
fn shards_by_index_and_glob() {
    let dir = tempfile::tempdir().unwrap();
    write_st(
        &dir.path().join("model-00001-of-00002.safetensors"),
        &[("x", Dtype::F32, vec![1], f32_bytes(&[7.0]))],
    );
    write_st(
        &dir.path().join("model-00002-of-00002.safetensors"),
        &[("y", Dtype::F32, vec![2], f32_bytes(&[8.0, 9.0]))],
    );
    // Without an index: every *.safetensors.
    let src = SafetensorsSource::open_dir(dir.path()).unwrap();
    assert_eq!(src.names(), vec!["x", "y"]);
    // With an index.
    let index = serde_json::json!({"metadata": {}, "weight_map": {
        "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let src = SafetensorsSource::open_dir(dir.path()).unwrap();
    assert_eq!(src.load("y").unwrap().to_f32(), vec![8.0, 9.0]);
    assert!(src
        .file_of("x")
        .unwrap()
        .ends_with("model-00001-of-00002.safetensors"));
    // Index pointing at a missing shard / tensor.
    let index = serde_json::json!({"weight_map": {"x": "gone.safetensors"}});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let e = SafetensorsSource::open_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gone.safetensors") && e.contains("missing"),
        "{e}"
    );
    let index = serde_json::json!({"weight_map": {"z": "model-00001-of-00002.safetensors"}});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let e = SafetensorsSource::open_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("z"), "{e}");
}

#[test]
fn truncated_and_corrupt_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.safetensors");
    write_st(
        &p,
        &[("a", Dtype::F32, vec![4], f32_bytes(&[1.0, 2.0, 3.0, 4.0]))],
    );
    let good = std::fs::read(&p).unwrap();
    for cut in [0, 3, 8, 20, good.len() - 1] {
        std::fs::write(&p, &good[..cut]).unwrap();
        let e = SafetensorsSource::open_dir(dir.path()).unwrap_err();
        assert!(format!("{e:#}").contains("model.safetensors"), "{e:#}");
    }
    let mut bad = good.clone();
    bad[8] = b'!'; // the opening brace of the JSON header
    std::fs::write(&p, &bad).unwrap();
    assert!(SafetensorsSource::open_dir(dir.path()).is_err());
    // Random flips in the header never panic.
    let mut seed = 12345u64;
    for _ in 0..200 {
        let mut b = good.clone();
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let i = (seed >> 33) as usize % b.len();
        b[i] ^= (seed >> 20) as u8 | 1;
        std::fs::write(&p, &b).unwrap();
        if let Ok(src) = SafetensorsSource::open_dir(dir.path()) {
            for n in src.names() {
                let _ = src.load(&n);
            }
        }
    }
}

#[test]
fn hf_dir_assets() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let e = loader::open(d).err().unwrap().to_string();
    assert!(
        e.contains("no config.json (expected a Hugging Face model directory or a .gguf file)"),
        "{e}"
    );
    std::fs::write(d.join("config.json"), "{not json").unwrap();
    let e = format!("{:#}", loader::open(d).err().unwrap());
    assert!(
        e.contains("config.json") && e.contains("invalid JSON"),
        "{e}"
    );
    std::fs::write(
        d.join("config.json"),
        r#"{"model_type": "llama", "eos_token_id": 5, "bos_token_id": 4}"#,
    )
    .unwrap();
    let e = loader::open(d).err().unwrap().to_string();
    assert!(e.contains("no weights"), "{e}");
    write_st(
        &d.join("model.safetensors"),
        &[("w", Dtype::F32, vec![1], f32_bytes(&[1.0]))],
    );
    let ck = loader::open(d).unwrap();
    assert_eq!(ck.config["model_type"], "llama");
    assert_eq!(ck.assets.eos_ids, vec![5]);
    assert_eq!(ck.assets.bos_id, Some(4));
    assert!(ck.assets.tokenizer.is_none() && ck.assets.chat_template.is_none());
    assert!(!ck.assets.add_bos);

    std::fs::write(
        d.join("generation_config.json"),
        r#"{"eos_token_id": [7, 8]}"#,
    )
    .unwrap();
    std::fs::write(
        d.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
            "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "add_bos_token": true}"#,
    )
    .unwrap();
    let ck = loader::open(d).unwrap();
    assert_eq!(ck.assets.eos_ids, vec![7, 8]);
    assert_eq!(ck.assets.chat_template.as_deref(), Some("D"));
    assert_eq!(ck.assets.bos_token.as_deref(), Some("<s>"));
    assert_eq!(ck.assets.eos_token.as_deref(), Some("</s>"));
    assert!(ck.assets.add_bos);
    std::fs::write(d.join("chat_template.jinja"), "J").unwrap();
    let ck = loader::open(d).unwrap();
    assert_eq!(ck.assets.chat_template.as_deref(), Some("J"));
    std::fs::write(d.join("generation_config.json"), r#"{"eos_token_id": "x"}"#).unwrap();
    let e = loader::open(d).err().unwrap().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("eos_token_id"),
        "{e}"
    );
}

#[test]
fn committed_fixture_dirs() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let (Ok(tiny), Ok(sharded)) = (
        loader::open(&root.join("llama_tiny")),
        loader::open(&root.join("llama_sharded")),
    ) else {
        eprintln!("skipped: tests/fixtures/llama_tiny or llama_sharded missing");
        return;
    };
    assert!(!tiny.tensors.names().is_empty());
    let b = sharded.tensors.names();
    assert!(!b.is_empty());
    for n in &b {
        let t = sharded.tensors.load(n).unwrap();
        assert_eq!(Some(t.shape.clone()), sharded.tensors.shape(n));
    }
    assert_eq!(sharded.assets.eos_ids, vec![2]);
    assert_eq!(sharded.config["model_type"], "llama");
}
