//! Prompt log-probabilities through the engine service (`Request::prompt_logprobs`, what
//! `dayone perplexity` scores with): the same numbers whether the prompt is prefilled in one
//! step or in chunks, batched with other requests or alone, after an identical prompt (no
//! prefix hit: a cached prefix has no logits), and for a prompt that fills the whole window;
//! they agree with the sampled token's logprobs of an ordinary request.

use anyhow::{bail, ensure, Result};
use dayone_engine::loader;
use dayone_engine::sampling::{SamplingParams, TokenLogprobs};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::service::{EngineHandle, Request, StreamEvent};
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::fixture;
use std::sync::Arc;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

fn handle(chunk: usize) -> Result<EngineHandle> {
    let ckpt = loader::open(&fixture("llama_tiny"))?;
    let cfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_batched_tokens: chunk,
            max_prefill_chunk: chunk,
            ..Default::default()
        },
        ..Default::default()
    };
    EngineHandle::start(move || Engine::new(dayone_backend::cpu::CpuBackend, &ckpt, &cfg, None))
}

/// Pseudo-random ids below 256.
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed * 97) >> 7) % 256)
        .collect()
}

/// Submits the prompts together; returns each one's prompt logprobs and cached tokens.
fn score(
    h: &EngineHandle,
    prompts: &[Vec<u32>],
    top: usize,
) -> Result<Vec<(Arc<Vec<TokenLogprobs>>, usize)>> {
    let mut out = Vec::new();
    let mut streams = Vec::new();
    for p in prompts {
        streams.push(h.submit(Request {
            prompt_logprobs: Some(top),
            ..Request::new(
                p.clone(),
                SamplingParams {
                    max_tokens: 1,
                    ..Default::default()
                },
            )
        })?);
    }
    for mut s in streams {
        loop {
            match s.recv_timeout(WAIT)? {
                Some(StreamEvent::Finished {
                    prompt_logprobs: Some(lp),
                    cached_tokens,
                    ..
                }) => {
                    out.push((lp, cached_tokens));
                    break;
                }
                Some(StreamEvent::Finished { .. }) => bail!("no prompt logprobs"),
                Some(StreamEvent::Error(e)) => bail!(e),
                Some(_) => {}
                None => bail!("stream ended"),
            }
        }
    }
    Ok(out)
}

fn close(a: &[TokenLogprobs], b: &[TokenLogprobs], what: &str) -> Result<()> {
    ensure!(
        a.len() == b.len(),
        "{what}: {} vs {} entries",
        a.len(),
        b.len()
    );
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        ensure!(x.token == y.token, "{what}: token {i}");
        ensure!(
            (x.logprob - y.logprob).abs() < 1e-4,
            "{what}: position {i}: {} vs {}",
            x.logprob,
            y.logprob
        );
        ensure!(
            x.top.iter().map(|t| t.0).collect::<Vec<_>>()
                == y.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            "{what}: top ids at {i}"
        );
    }
    Ok(())
}

#[test]
fn prompt_logprobs_are_the_same_chunked_batched_and_repeated() -> Result<()> {
    let (p, q) = (prompt(70, 1), prompt(45, 2));
    let whole = handle(2048)?;
    let alone = score(&whole, std::slice::from_ref(&p), 3)?;
    ensure!(alone[0].0.len() == 69);
    for (i, e) in alone[0].0.iter().enumerate() {
        ensure!(e.token == p[i + 1], "entry {i} scores token {}", e.token);
        ensure!(e.top.len() == 3 && e.logprob <= 0.0);
        ensure!(e.top[0].1 >= e.logprob, "top-1 below the token at {i}");
    }
    // The same prompt again (its blocks are cached now) and batched with another one.
    let both = score(&whole, &[p.clone(), q.clone()], 3)?;
    ensure!(
        both[0].1 == 0,
        "a scored prompt took {} tokens from the prefix cache",
        both[0].1
    );
    close(&alone[0].0, &both[0].0, "repeated")?;
    // Chunked prefill: 16 tokens per step, the two prompts interleaved.
    let chunked = score(&handle(16)?, &[p, q], 3)?;
    close(&alone[0].0, &chunked[0].0, "chunked")?;
    close(&both[1].0, &chunked[1].0, "chunked, second")?;
    Ok(())
}

#[test]
fn a_scored_prompt_may_fill_the_window() -> Result<()> {
    let h = handle(2048)?;
    let window = h.model_info().max_context;
    let p = prompt(window, 3);
    let got = score(&h, std::slice::from_ref(&p), 0)?;
    ensure!(got[0].0.len() == window - 1 && got[0].0.iter().all(|e| e.top.is_empty()));
    // An ordinary request of that length is still refused.
    let refused = h.submit(Request::new(p, SamplingParams::default()));
    ensure!(
        refused.is_err(),
        "a full-window prompt without prompt_logprobs was accepted"
    );
    Ok(())
}

/// Position i's prompt logprob equals what a request of the first i + 1 tokens reports for
/// forcing token i + 1 (its sampled token's logprob under greedy decoding, when greedy picks it).
#[test]
fn prompt_logprobs_match_the_last_row_of_shorter_prompts() -> Result<()> {
    let h = handle(2048)?;
    let p = prompt(20, 4);
    let full = score(&h, std::slice::from_ref(&p), 5)?;
    for i in [0usize, 7, 18] {
        let mut s = h.submit(Request::new(
            p[..=i].to_vec(),
            SamplingParams {
                max_tokens: 1,
                logprobs: Some(5),
                ..Default::default()
            },
        ))?;
        let Some(StreamEvent::Token {
            logprobs: Some(lp), ..
        }) = s.recv_timeout(WAIT)?
        else {
            bail!("no token");
        };
        let e = &full[0].0[i];
        for (a, b) in lp.top.iter().zip(&e.top) {
            ensure!(
                a.0 == b.0 && (a.1 - b.1).abs() < 1e-4,
                "position {i}: {a:?} vs {b:?}"
            );
        }
    }
    Ok(())
}
