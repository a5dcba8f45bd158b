//! `dayone check`: the same prompts on several backends (and against recorded reference
//! activations), per-layer max abs / relative differences, logits, greedy-token agreement.

use crate::backend_choice::BackendKind;
use crate::load;
use crate::with_backend;
use anyhow::{bail, Context, Result};
use clap::Args;
use dayone_backend::{Backend, DType};
use dayone_engine::loader::Checkpoint;
use dayone_engine::sampling::SamplingParams;
use dayone_engine::{prompt, EngineConfig};
use std::path::PathBuf;

/// Flags of `dayone check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Model directory or .gguf file; default: SmolLM2-135M-Instruct.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Comma-separated backends to run (wgsl, cuda).
    #[arg(long, default_value = "wgsl")]
    pub backends: String,
    /// Reference activations recorded by `tests/fixtures/gen_*.py` (`reference.json`); its
    /// prompts are used when given.
    #[arg(long)]
    pub reference: Option<PathBuf>,
    /// Prompt text (when no reference is given).
    #[arg(long, default_value = "The capital of France is")]
    pub prompt: String,
    /// Prompt token ids instead of text, comma-separated.
    #[arg(long)]
    pub prompt_ids: Option<String>,
    /// f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Greedy tokens generated per prompt for the agreement check.
    #[arg(long, default_value_t = 16)]
    pub tokens: usize,
    /// Relative tolerance (default: 1e-4 for f32, 2e-2 for bf16).
    #[arg(long)]
    pub tolerance: Option<f64>,
}

/// What one backend produced for one prompt.
struct Run {
    name: String,
    /// Per layer (HF `hidden_states` order), `[N, D]` f32.
    hidden: Vec<Vec<f32>>,
    logits: Vec<f32>,
    greedy: Vec<u32>,
}

fn run_backend<B: Backend>(
    b: B,
    ckpt: &Checkpoint,
    dtype: DType,
    prompts: &[Vec<u32>],
    tokens: usize,
) -> Result<Vec<Run>> {
    let cfg = EngineConfig {
        dtype,
        ..Default::default()
    };
    let mut engine = load::engine(b, ckpt, &cfg, true)?;
    let name = engine.backend.name();
    let mut runs = Vec::new();
    for p in prompts {
        let (hidden, logits) = engine.trace_prefill(p)?;
        engine.add_request(
            p.clone(),
            SamplingParams {
                max_tokens: tokens,
                ignore_eos: true,
                ..Default::default()
            },
        )?;
        let greedy = engine
            .run_to_completion()?
            .pop()
            .map(|(_, g)| g)
            .unwrap_or_default();
        runs.push(Run {
            name: name.clone(),
            hidden: hidden.iter().map(|h| h.to_f32()).collect(),
            logits,
            greedy,
        });
    }
    Ok(runs)
}

/// Max |a − b| and the relative error `‖a − b‖₂ / ‖b‖₂` (b is the reference side).
fn diff(a: &[f32], b: &[f32]) -> (f64, f64) {
    let max_abs = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max);
    let d: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (max_abs, (d / n.max(1e-300)).sqrt())
}

/// Runs `dayone check`.
pub fn run(a: CheckArgs) -> Result<()> {
    let dtype = load::dtype(&a.dtype)?;
    let tol = a
        .tolerance
        .unwrap_or(if dtype == DType::F32 { 1e-4 } else { 2e-2 });
    let kinds = a
        .backends
        .split(',')
        .map(|s| BackendKind::parse(s.trim()))
        .collect::<Result<Vec<_>>>()?;
    if kinds.is_empty() {
        bail!("--backends is empty");
    }
    let path = load::model_path(a.model.clone())?;
    let ckpt = load::open(&path)?;
    let reference: Option<serde_json::Value> = match &a.reference {
        Some(p) => Some(
            serde_json::from_str(
                &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            )
            .with_context(|| format!("{}: not valid JSON", p.display()))?,
        ),
        None => None,
    };
    let dkey = if dtype == DType::F32 {
        "float32"
    } else {
        "bfloat16"
    };
    let cases: Vec<serde_json::Value> = reference
        .as_ref()
        .and_then(|r| r.get("cases"))
        .and_then(|c| c.as_array())
        .cloned()
        .unwrap_or_default();
    let prompts: Vec<Vec<u32>> = if !cases.is_empty() {
        cases
            .iter()
            .map(|c| {
                serde_json::from_value(c["prompt_ids"].clone())
                    .context("reference: `prompt_ids` must be a list of ids")
            })
            .collect::<Result<_>>()?
    } else if let Some(s) = &a.prompt_ids {
        vec![prompt::parse_ids(s)?]
    } else {
        vec![prompt::prompt_ids(&ckpt.assets, &a.prompt, false, None)?]
    };
    let mut all: Vec<Vec<Run>> = Vec::new();
    for k in &kinds {
        all.push(with_backend!(*k, |b| run_backend(
            b, &ckpt, dtype, &prompts, a.tokens
        ))?);
    }
    let mut worst: f64 = 0.0;
    let mut tokens_ok = true;
    for (pi, p) in prompts.iter().enumerate() {
        println!("prompt {pi}: {} tokens, dtype {}", p.len(), a.dtype);
        let first = &all[0][pi];
        let d = first.hidden.first().map(|h| h.len() / p.len()).unwrap_or(0);
        let case = cases.get(pi).and_then(|c| c.get(dkey));
        let ref_hidden: Option<Vec<Vec<f32>>> = case
            .and_then(|c| c.get("hidden_states"))
            .and_then(|h| serde_json::from_value(h.clone()).ok());
        let ref_logits: Option<Vec<Vec<f32>>> = case
            .and_then(|c| c.get("logits"))
            .and_then(|h| serde_json::from_value(h.clone()).ok());
        let ref_greedy: Option<Vec<u32>> = case
            .and_then(|c| c.get("greedy_ids"))
            .and_then(|h| serde_json::from_value(h.clone()).ok());
        println!(
            "  {:<10} {:>28} {:>28}",
            "layer", "max|Δ| / rel (vs reference)", "max|Δ| / rel (vs first)"
        );
        for l in 0..first.hidden.len() {
            for run in all.iter().map(|r| &r[pi]) {
                let last = &run.hidden[l][(p.len() - 1) * d..];
                let vs_ref = ref_hidden
                    .as_ref()
                    .and_then(|h| h.get(l))
                    .map(|h| diff(last, h));
                let vs_first = diff(&run.hidden[l], &first.hidden[l]);
                if let Some((_, r)) = vs_ref {
                    worst = worst.max(r);
                }
                worst = worst.max(vs_first.1);
                let name = if l == 0 {
                    "embed".to_string()
                } else {
                    format!("layer {l}")
                };
                let fmt = |x: Option<(f64, f64)>| {
                    x.map(|(a, r)| format!("{a:.3e} / {r:.3e}"))
                        .unwrap_or_else(|| "-".into())
                };
                println!(
                    "  {:<10} {:>28} {:>28}  {}",
                    name,
                    fmt(vs_ref),
                    fmt(Some(vs_first)),
                    run.name
                );
            }
        }
        for run in all.iter().map(|r| &r[pi]) {
            let vs_ref = ref_logits
                .as_ref()
                .and_then(|l| l.first())
                .map(|l| diff(&run.logits, l));
            let vs_first = diff(&run.logits, &first.logits);
            if let Some((_, r)) = vs_ref {
                worst = worst.max(r);
            }
            worst = worst.max(vs_first.1);
            let fmt = |x: Option<(f64, f64)>| {
                x.map(|(a, r)| format!("{a:.3e} / {r:.3e}"))
                    .unwrap_or_else(|| "-".into())
            };
            println!(
                "  {:<10} {:>28} {:>28}  {}",
                "logits",
                fmt(vs_ref),
                fmt(Some(vs_first)),
                run.name
            );
        }
        for run in all.iter().map(|r| &r[pi]) {
            let agree_first = run
                .greedy
                .iter()
                .zip(&first.greedy)
                .take_while(|(x, y)| x == y)
                .count();
            let agree_ref = ref_greedy.as_ref().map(|g| {
                format!(
                    "{}/{}",
                    run.greedy.iter().zip(g).take_while(|(x, y)| x == y).count(),
                    g.len().min(run.greedy.len())
                )
            });
            if agree_first < first.greedy.len()
                || ref_greedy
                    .as_ref()
                    .is_some_and(|g| !run.greedy.iter().zip(g).all(|(x, y)| x == y))
            {
                tokens_ok = false;
            }
            println!(
                "  greedy: {}/{} agree with {}, {} with reference  {}",
                agree_first,
                first.greedy.len(),
                first.name,
                agree_ref.unwrap_or_else(|| "-".into()),
                run.name
            );
        }
    }
    println!(
        "worst relative difference {worst:.3e} (tolerance {tol:.1e}); greedy tokens {}",
        if tokens_ok { "identical" } else { "DIFFER" }
    );
    if worst > tol || !tokens_ok {
        bail!("check failed: worst relative difference {worst:.3e} vs tolerance {tol:.1e}, greedy tokens {}", if tokens_ok { "identical" } else { "differ" });
    }
    Ok(())
}
