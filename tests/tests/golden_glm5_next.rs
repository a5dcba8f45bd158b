//! Golden tests for `glm5_next` (GLM-5.3-Flash text: hyper-connections over 4 streams, KDA with
//! the lower-bound gate, NoPE MLA with the pooled DSA indexer and a `shared` layer, clamped
//! SwiGLU in dense and MoE FFNs): a tiny checkpoint made by transformers 5.24
//! (`fixtures/gen_glm5_next.py`). With `index_kpool` 4 and `index_topk` 8 the 13- and 40-token
//! prompts and their decodes are sparse (2 pools + the tail).

use dayone_backend::DType;
use dayone_tests::{check_golden, on_every_backend};

on_every_backend! {
    glm5_f32 => |mk: fn() -> _| check_golden(mk(), "glm5_next_tiny", DType::F32);
    glm5_bf16 => |mk: fn() -> _| check_golden(mk(), "glm5_next_tiny", DType::BF16);
}

use anyhow::Result;
use dayone_backend::Backend;
use dayone_engine::cache::LayerCacheSpec;
use dayone_engine::config::ModelConfig;
use dayone_engine::models::{Mixer, Residual, SparsePlan};
use dayone_engine::EngineConfig;
use dayone_tests::{engine, fixture, greedy, own_bf16_error, reference, rel_err};

/// The largest logits relative error against the reference's float32 run over the steps until
/// the greedy paths part (as `check_golden` compares), printed for the record with the
/// reference's own bf16-vs-f32 error; returns (ours, the reference's own).
fn max_rel_err<B: Backend>(b: B, dtype: DType) -> Result<(f64, f64)> {
    let r = reference("glm5_next_tiny")?;
    let mut e = engine(
        b,
        "glm5_next_tiny",
        EngineConfig {
            dtype,
            kv_cache_tokens: Some(2048),
            ..Default::default()
        },
    )?;
    e.capture_logits = true;
    let (mut worst, mut own) = (0f64, 0f64);
    for case in &r.cases {
        let want = &case.float32;
        own = own.max(own_bf16_error(case));
        e.add_request(case.prompt_ids.clone(), greedy(want.logits.len()))?;
        let (mut step, mut parted) = (0, false);
        while e.has_unfinished() {
            let events = e.step()?;
            if events.is_empty() || parted {
                continue;
            }
            worst = worst.max(rel_err(&e.last_logits[0].1, &want.logits[step]));
            parted = want
                .greedy_ids
                .get(step)
                .is_some_and(|&t| t != events[0].token);
            step += 1;
        }
    }
    eprintln!(
        "glm5_next_tiny {dtype}: max logits rel err {worst:.3e} (transformers' own bf16 error {own:.3e})"
    );
    Ok((worst, own))
}

on_every_backend! {
    glm5_err_f32 => |mk: fn() -> _| max_rel_err(mk(), DType::F32).map(|(e, _)| assert!(e < 1e-4, "{e}"));
    glm5_err_bf16 => |mk: fn() -> _| max_rel_err(mk(), DType::BF16).map(|(e, own)| assert!(e < 2e-2f64.max(1.5 * own), "{e}"));
}

/// The plan from the fixture's config: KDA, pooled-DSA MLA, a shared-selection MLA after it,
/// hyper-connections on every layer; caches derived from the mixers (the 16-wide NoPE latent row,
/// `3 × 16` indexer rows, none for the shared layer).
#[test]
fn plan_and_cache_spec() -> Result<()> {
    let path = fixture("glm5_next_tiny").join("config.json");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let plan = ModelConfig::from_json(&json, "glm5_next_tiny")?.layer_plan()?;
    let kinds: Vec<&str> = plan
        .layers
        .iter()
        .map(|l| match &l.mixer {
            Mixer::Kda { .. } => "kda",
            Mixer::Mla {
                indexer: Some(SparsePlan::Pooled(p)),
                ..
            } => {
                assert_eq!((p.kpool, p.topk, p.tail), (4, 8, true));
                "pooled"
            }
            Mixer::Mla {
                indexer: Some(SparsePlan::Shared),
                ..
            } => "shared",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["kda", "kda", "pooled", "shared", "kda", "pooled"]);
    assert!(plan.layers.iter().all(|l| matches!(
        l.residual,
        Residual::HyperConnections { n: 4, .. }
    ) && l.swiglu_limit == Some(10.0)));
    let spec = plan.cache_spec();
    assert_eq!(
        spec.layers[2],
        LayerCacheSpec::PagedLatentIndexed {
            width: 16,
            index_width: 48
        }
    );
    assert_eq!(spec.layers[3], LayerCacheSpec::PagedLatent { width: 16 });
    Ok(())
}
