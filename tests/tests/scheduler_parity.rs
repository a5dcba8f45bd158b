//! Scheduler parity: batching and chunked prefill must not change a sequence's tokens, and every
//! KV block returns to the free list when all sequences finish.

use anyhow::{ensure, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::EngineConfig;
use dayone_tests::{engine, greedy, on_every_backend, reference};

const MODEL: &str = "llama_tiny";
const NEW_TOKENS: usize = 12;

fn config(chunk: usize, block_size: usize) -> EngineConfig {
    EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(1024),
        scheduler: SchedulerConfig {
            max_batched_tokens: chunk,
            max_prefill_chunk: chunk,
            max_num_seqs: 16,
            block_size,
        },
    }
}

/// Greedy continuations of all reference prompts, submitted together.
fn run_batched<B: Backend>(b: B, cfg: EngineConfig, prompts: &[Vec<u32>]) -> Result<Vec<Vec<u32>>> {
    let mut e = engine(b, MODEL, cfg)?;
    let total = e.total_blocks();
    for p in prompts {
        e.add_request(p.clone(), greedy(NEW_TOKENS))?;
    }
    let out = e.run_to_completion()?;
    ensure!(
        e.free_blocks() == total,
        "{} of {total} blocks free after all sequences finished",
        e.free_blocks()
    );
    Ok(out.into_iter().map(|(_, g)| g).collect())
}

fn prompts() -> Result<Vec<Vec<u32>>> {
    let mut p: Vec<Vec<u32>> = reference(MODEL)?
        .cases
        .into_iter()
        .map(|c| c.prompt_ids)
        .collect();
    // A longer prompt so that chunking crosses several blocks.
    p.push((0..70u32).map(|i| (i * 37 + 11) % 256).collect());
    Ok(p)
}

fn batched_equals_alone<B: Backend>(mk: impl Fn() -> B) -> Result<()> {
    let prompts = prompts()?;
    let together = run_batched(mk(), config(2048, 16), &prompts)?;
    for (i, p) in prompts.iter().enumerate() {
        let alone = run_batched(mk(), config(2048, 16), std::slice::from_ref(p))?;
        ensure!(
            alone[0] == together[i],
            "prompt {i}: alone {:?} != batched {:?}",
            alone[0],
            together[i]
        );
    }
    Ok(())
}

fn chunked_equals_one_shot<B: Backend>(mk: impl Fn() -> B) -> Result<()> {
    let prompts = prompts()?;
    let one_shot = run_batched(mk(), config(4096, 16), &prompts)?;
    for (chunk, bs) in [(1, 16), (3, 16), (7, 4), (16, 16), (33, 8)] {
        let chunked = run_batched(mk(), config(chunk, bs), &prompts)?;
        ensure!(
            chunked == one_shot,
            "token budget {chunk}, block size {bs}: {chunked:?} != one-shot {one_shot:?}"
        );
    }
    Ok(())
}

fn preemption_keeps_tokens<B: Backend>(mk: impl Fn() -> B) -> Result<()> {
    let prompts = prompts()?;
    let roomy = run_batched(mk(), config(2048, 4), &prompts)?;
    // 36 blocks of 4 tokens cannot hold every sequence at once: some are preempted and recomputed.
    let mut tight = config(2048, 4);
    tight.kv_cache_tokens = Some(144);
    let squeezed = run_batched(mk(), tight, &prompts)?;
    ensure!(
        squeezed == roomy,
        "with preemption {squeezed:?} != without {roomy:?}"
    );
    Ok(())
}

on_every_backend! {
    batched => batched_equals_alone;
    chunked => chunked_equals_one_shot;
    preempted => preemption_keeps_tokens;
}
