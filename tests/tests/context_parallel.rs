//! Context parallelism on the CPU backend (ranks as threads joined by the host communicator):
//! at 2 and 4 ranks every step of at least `world` tokens is cut into one slice per rank
//! (`context_parallel_min_tokens` 1), and the greedy tokens and the logits behind each of them
//! equal one rank's bit for bit: the CPU kernels compute each token's row in a fixed order
//! whatever the rows beside it (batch-invariant), the keys every rank gathers are the bytes one
//! rank would have written, and the KDA state passed from rank to rank is the state one rank
//! reaches token by token. Prompts of 37 and 71 tokens split unevenly; a run prefills them
//! whole, another in chunks of 24 tokens batched with decodes (the decode steps of a single
//! sequence run whole on every rank, from caches the split prefill filled); a third prompt
//! resumes from the first one's cached prefix. qwen3_tiny (per-head q/k norms, tied
//! embeddings) and gpt_oss_tiny (sinks, sliding windows) run at 2 ranks.

use anyhow::{anyhow, ensure, Context, Result};
use dayone_backend::comm::{thread_group, HostComm, HostGroup};
use dayone_backend::cpu::CpuBackend;
use dayone_backend::DType;
use dayone_engine::parallel::{Distributed, Parallel};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::{loader, Engine, EngineConfig};
use dayone_tests::{fixture, greedy};
use std::sync::Arc;
use std::time::Duration;

const NEW_TOKENS: usize = 5;

/// Whole prompts in one step, or chunks of 24 tokens batched with decodes.
fn config(chunk: usize, world: usize) -> EngineConfig {
    EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(1024),
        scheduler: SchedulerConfig {
            max_batched_tokens: chunk,
            max_prefill_chunk: chunk,
            max_num_seqs: 8,
            block_size: 16,
            ..Default::default()
        },
        context_parallel_size: world,
        context_parallel_min_tokens: 1,
        ..Default::default()
    }
}

/// Prompts of 37 and 71 tokens over the vocabulary (71 = 2·35 + 1 = 4·17 + 3: uneven slices),
/// and one of 45 whose first 32 tokens (two blocks) are the first prompt's: run after it, it
/// starts from the prefix cache (and, on a recurrent model, a state checkpoint).
fn prompts() -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = [(37u32, 29u32, 3u32), (71, 53, 7)]
        .iter()
        .map(|&(n, a, c)| (0..n).map(|i| (i * a + c) % 256).collect())
        .collect();
    let mut shared = out[0][..32].to_vec();
    shared.extend((0..13u32).map(|i| (i * 11 + 100) % 256));
    out.push(shared);
    out
}

/// Each request's greedy tokens and the logits row behind each of them, in id order.
type Run = Vec<(Vec<u32>, Vec<Vec<f32>>)>;

/// Rank 0's side: the prompts one after another (`batch` false) or all at once, stepped to
/// the end.
fn lead(e: &mut Engine<CpuBackend>, batch: bool) -> Result<Run> {
    e.capture_logits = true;
    let ps = prompts();
    let mut out: Run = ps.iter().map(|_| (Vec::new(), Vec::new())).collect();
    let mut drain = |e: &mut Engine<CpuBackend>| -> Result<()> {
        while e.has_unfinished() {
            for ev in e.step()? {
                let row = e
                    .last_logits
                    .iter()
                    .find(|(id, _)| *id == ev.seq_id)
                    .map(|(_, r)| r.clone())
                    .context("captured logits")?;
                out[ev.seq_id as usize].0.push(ev.token);
                out[ev.seq_id as usize].1.push(row);
            }
        }
        Ok(())
    };
    for p in &ps {
        e.add_request(p.clone(), greedy(NEW_TOKENS))?;
        if !batch {
            drain(e)?;
        }
    }
    drain(e)?;
    let hit = e.counters().prefix_hit_tokens;
    ensure!(
        batch || hit >= 32,
        "the third prompt should start from the first's 32 cached tokens, {hit} hit"
    );
    ensure!(
        e.free_blocks() == e.total_blocks(),
        "blocks leaked on rank 0"
    );
    Ok(out)
}

fn single(model: &str, chunk: usize, batch: bool) -> Result<Run> {
    let ckpt = loader::open(&fixture(model))?;
    let mut e = Engine::new(CpuBackend, &ckpt, &config(chunk, 1), None)?;
    lead(&mut e, batch)
}

/// `world` context-parallel ranks as threads; rank 0's run.
fn split(model: &str, world: usize, chunk: usize, batch: bool) -> Result<Run> {
    let groups = thread_group(world, Duration::from_secs(60));
    let handles: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let model = model.to_string();
            std::thread::spawn(move || -> Result<Option<Run>> {
                let group: Arc<dyn HostGroup> = Arc::new(g);
                let rank = group.rank();
                let dist = Distributed {
                    parallel: Parallel::context(Arc::new(HostComm::new(group.clone()))),
                    group,
                    done: None,
                    memory_shared_by: world,
                };
                let ckpt = loader::open(&fixture(&model))?;
                let cfg = config(chunk, world);
                let mut e = Engine::new_distributed(CpuBackend, &ckpt, &cfg, None, Some(dist))
                    .with_context(|| format!("rank {rank}"))?;
                if rank == 0 {
                    // Every rank holds the whole model.
                    let mem = e.rank_memory();
                    ensure!(mem.iter().all(|m| m.0 == mem[0].0), "rank weights {mem:?}");
                    let run = lead(&mut e, batch)?;
                    drop(e); // releases the followers
                    Ok(Some(run))
                } else {
                    e.follow()?;
                    ensure!(
                        e.free_blocks() == e.total_blocks(),
                        "blocks leaked on rank {rank}"
                    );
                    Ok(None)
                }
            })
        })
        .collect();
    let mut lead_run = None;
    let mut errors = Vec::new();
    for (r, h) in handles.into_iter().enumerate() {
        match h.join().map_err(|_| anyhow!("rank {r} panicked"))? {
            Ok(Some(run)) => lead_run = Some(run),
            Ok(None) => {}
            Err(e) => errors.push(format!("rank {r} of {world}: {e:#}")),
        }
    }
    if !errors.is_empty() {
        // The first failure is the cause; the others are ranks left waiting for it.
        anyhow::bail!("{}", errors.join("\n"));
    }
    lead_run.ok_or_else(|| anyhow!("rank 0 returned nothing"))
}

/// CP at `world` ranks equals one rank, bit for bit, prefilling whole prompts one after
/// another and chunked prompts batched together.
fn parity(model: &str, world: usize) -> Result<()> {
    for (chunk, batch) in [(128, false), (24, true)] {
        let one = single(model, chunk, batch)?;
        let many = split(model, world, chunk, batch)?;
        let what = format!("{model} cp {world} chunk {chunk}");
        for (i, ((t1, l1), (tn, ln))) in one.iter().zip(&many).enumerate() {
            ensure!(t1.len() == NEW_TOKENS, "{what}: request {i} made {t1:?}");
            ensure!(
                t1 == tn,
                "{what}: request {i} tokens {tn:?}, one rank {t1:?}"
            );
            for (s, (a, b)) in ln.iter().zip(l1).enumerate() {
                let diff = a
                    .iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                ensure!(
                    a == b,
                    "{what}: request {i} token {s} logits differ from one rank's (max |Δ| {diff:e})"
                );
            }
        }
    }
    Ok(())
}

macro_rules! parity_tests {
    ($($name:ident: $model:expr, $world:expr;)*) => {
        $(
            #[test]
            fn $name() {
                parity($model, $world).unwrap();
            }
        )*
    };
}

parity_tests! {
    llama_cp2: "llama_tiny", 2;
    llama_cp4: "llama_tiny", 4;
    deepseek_v3_cp2: "deepseek_v3_tiny", 2;
    deepseek_v3_cp4: "deepseek_v3_tiny", 4;
    deepseek_v32_cp2: "deepseek_v32_tiny", 2;
    deepseek_v32_cp4: "deepseek_v32_tiny", 4;
    kimi_linear_cp2: "kimi_linear_tiny", 2;
    kimi_linear_cp4: "kimi_linear_tiny", 4;
    qwen3_cp2_tied_qk_norm: "qwen3_tiny", 2;
    gpt_oss_cp2_sinks_window: "gpt_oss_tiny", 2;
}

#[test]
fn tensor_and_context_parallel_together_are_refused() {
    let ckpt = loader::open(&fixture("llama_tiny")).unwrap();
    let cfg = EngineConfig {
        tensor_parallel_size: 2,
        ..config(128, 2)
    };
    let err = Engine::new(CpuBackend, &ckpt, &cfg, None)
        .err()
        .expect("tp 2 with cp 2");
    assert!(
        format!("{err:#}").contains("--context-parallel-size 2 with --tensor-parallel-size 2"),
        "{err:#}"
    );
}

#[test]
fn the_pooled_indexer_is_refused() {
    let err = split("glm5_next_tiny", 2, 128, false).unwrap_err();
    assert!(
        format!("{err:#}").contains("context parallelism does not split the pooled DSA indexer"),
        "{err:#}"
    );
}
