//! Scheduler parity: batching, chunked prefill (chunks at odd split points, chunks shorter than the
//! KDA convolution width) and preemption must not change a sequence's tokens, and every KV block
//! returns to the free list when all sequences finish. Run on a plain-attention model, on the MLA
//! latent cache, and on the KDA hybrid whose per-sequence state slots must never leak between
//! batched sequences (cf. vllm#41292, tpu-inference#3412).

use anyhow::{ensure, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::EngineConfig;
use dayone_tests::{engine, greedy, on_every_backend, reference};

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
            ..Default::default()
        },
        // Bit-exact parity needs the batch-invariant kernels on CUDA (CPU and WGSL always are).
        batch_invariant: true,
        ..Default::default()
    }
}

/// Greedy continuations of all reference prompts, submitted together.
fn run_batched<B: Backend>(
    b: B,
    model: &str,
    cfg: EngineConfig,
    prompts: &[Vec<u32>],
) -> Result<Vec<Vec<u32>>> {
    let mut e = engine(b, model, cfg)?;
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

fn prompts(model: &str) -> Result<Vec<Vec<u32>>> {
    let mut p: Vec<Vec<u32>> = reference(model)?
        .cases
        .into_iter()
        .map(|c| c.prompt_ids)
        .collect();
    // A longer prompt so that chunking crosses several blocks.
    p.push((0..70u32).map(|i| (i * 37 + 11) % 256).collect());
    Ok(p)
}

fn batched_equals_alone<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let prompts = prompts(model)?;
    let together = run_batched(mk(), model, config(2048, 16), &prompts)?;
    for (i, p) in prompts.iter().enumerate() {
        let alone = run_batched(mk(), model, config(2048, 16), std::slice::from_ref(p))?;
        ensure!(
            alone[0] == together[i],
            "prompt {i}: alone {:?} != batched {:?}",
            alone[0],
            together[i]
        );
    }
    Ok(())
}

fn chunked_equals_one_shot<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let prompts = prompts(model)?;
    let one_shot = run_batched(mk(), model, config(4096, 16), &prompts)?;
    for (chunk, bs) in [(1, 16), (3, 16), (7, 4), (16, 16), (33, 8)] {
        let chunked = run_batched(mk(), model, config(chunk, bs), &prompts)?;
        ensure!(
            chunked == one_shot,
            "token budget {chunk}, block size {bs}: {chunked:?} != one-shot {one_shot:?}"
        );
    }
    Ok(())
}

fn preemption_keeps_tokens<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let prompts = prompts(model)?;
    let roomy = run_batched(mk(), model, config(2048, 4), &prompts)?;
    // 36 blocks of 4 tokens cannot hold every sequence at once: some are preempted and recomputed.
    let mut tight = config(2048, 4);
    tight.kv_cache_tokens = Some(144);
    let squeezed = run_batched(mk(), model, tight, &prompts)?;
    ensure!(
        squeezed == roomy,
        "with preemption {squeezed:?} != without {roomy:?}"
    );
    Ok(())
}

on_every_backend! {
    batched => |mk: fn() -> _| batched_equals_alone(mk, "llama_tiny");
    chunked => |mk: fn() -> _| chunked_equals_one_shot(mk, "llama_tiny");
    preempted => |mk: fn() -> _| preemption_keeps_tokens(mk, "llama_tiny");
    mla_batched => |mk: fn() -> _| batched_equals_alone(mk, "deepseek_v3_tiny");
    mla_chunked => |mk: fn() -> _| chunked_equals_one_shot(mk, "deepseek_v3_tiny");
    kda_batched => |mk: fn() -> _| batched_equals_alone(mk, "kimi_linear_tiny");
    kda_chunked => |mk: fn() -> _| chunked_equals_one_shot(mk, "kimi_linear_tiny");
    kda_preempted => |mk: fn() -> _| preemption_keeps_tokens(mk, "kimi_linear_tiny");
}
