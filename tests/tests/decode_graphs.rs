//! Decode steps as graphs (`engine/graphs.rs`; CUDA graphs on CUDA) against the same engine with
//! `enforce_eager`, in batch-invariant mode: every step's logits bit for bit and the tokens, for
//! three concurrent requests (batch buckets 4 → 2 → 1 as they finish at different lengths) whose
//! contexts grow past a block-table width bucket (a second capture). On CUDA the graphs must
//! actually replay for llama, qwen3 and kimi_linear (recurrent state: padding on the scratch
//! row); CPU and WGSL have no graphs and run eagerly both times (the comparison then checks
//! that the flag changes nothing there).

use anyhow::{ensure, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::cache::prefix::ExtraKeys;
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{engine, greedy, on_every_backend};

/// `(tokens per request, logits rows per step)` of one run.
type Run = (Vec<Vec<u32>>, Vec<Vec<(u64, Vec<f32>)>>);

fn run<B: Backend>(e: &mut Engine<B>, vocab: u32) -> Result<Run> {
    e.capture_logits = true;
    // Prompts of 250, 120 and 40 tokens; 30, 20 and 12 new tokens: the first crosses 256
    // tokens (16 blocks of 16) while decoding.
    let lens = [(250usize, 30usize), (120, 20), (40, 12)];
    let mut ids = Vec::new();
    for (i, &(p, n)) in lens.iter().enumerate() {
        let prompt: Vec<u32> = (0..p as u32)
            .map(|t| (t * 7 + 3 * i as u32 + 1) % vocab)
            .collect();
        ids.push(e.add_request_with_images(prompt, greedy(n), ExtraKeys::default(), &[])?);
    }
    let mut tokens = vec![Vec::new(); ids.len()];
    let mut logits = Vec::new();
    while e.has_unfinished() {
        for ev in e.step()? {
            let i = ids.iter().position(|&id| id == ev.seq_id).unwrap();
            tokens[i].push(ev.token);
        }
        logits.push(e.last_logits.clone());
    }
    Ok((tokens, logits))
}

fn check<B: Backend>(make: impl Fn() -> B, model: &str, must_replay: bool) -> Result<()> {
    let cfg = |eager: bool| EngineConfig {
        dtype: DType::BF16,
        batch_invariant: true,
        enforce_eager: eager,
        ..EngineConfig::default()
    };
    let mut graphs = engine(make(), model, cfg(false))?;
    let on_cuda = graphs.backend.name().starts_with("cuda");
    let vocab = 200;
    let (tg, lg) = run(&mut graphs, vocab)?;
    let mut eager = engine(make(), model, cfg(true))?;
    let (te, le) = run(&mut eager, vocab)?;
    ensure!(
        eager.graph_stats().is_none(),
        "enforce_eager still made graphs"
    );
    let (captures, replays, off) = graphs.graph_stats().expect("graphs are on by default");
    eprintln!("{model}: {captures} captures, {replays} replays, off: {off:?}");
    if on_cuda && must_replay {
        ensure!(
            off.is_none() && captures >= 4 && replays > captures,
            "{model}: CUDA decode graphs did not run: {captures} captures, {replays} replays, off: {off:?}"
        );
    }
    ensure!(
        tg == te,
        "{model}: tokens with graphs {tg:?} vs eager {te:?}"
    );
    ensure!(lg.len() == le.len(), "{model}: step counts differ");
    for (step, (a, b)) in lg.iter().zip(&le).enumerate() {
        for ((ia, ra), (ib, rb)) in a.iter().zip(b) {
            ensure!(ia == ib, "{model} step {step}: rows of other sequences");
            let same = ra.iter().zip(rb).all(|(x, y)| x.to_bits() == y.to_bits());
            ensure!(
                same && ra.len() == rb.len(),
                "{model} step {step}: graph logits differ from eager (captures {captures}, replays {replays})"
            );
        }
    }
    Ok(())
}

on_every_backend! {
    llama => |make| check(make, "llama_tiny", true);
    qwen3 => |make| check(make, "qwen3_tiny", true);
    deepseek_v3 => |make| check(make, "deepseek_v3_tiny", false);
    // Recurrent state: padding sequences use the scratch state row.
    kimi_linear => |make| check(make, "kimi_linear_tiny", true);
    // Reads its hyper-connection mixes back mid-step: stays eager, results unchanged.
    glm5_next => |make| check(make, "glm5_next_tiny", false);
}
