//! Tensor and expert parallelism on the CPU backend (ranks as threads joined by the host
//! communicator): N ∈ {2, 4} ranks, with experts over E ∈ {1, 2} groups on the MoE models, give
//! the greedy tokens of one rank and its logits within f32 tolerance, for every request of a
//! batch with shared prefixes (the prefix cache and chunked prefill run unchanged on top).
//! Head counts make the splits non-trivial: llama_tiny has 2 key/value heads (replicated at
//! N = 4), qwen3_tiny 1 and tied embeddings, kimi_linear_tp 4 MLA and 4 KDA heads.

use anyhow::{anyhow, ensure, Context, Result};
use dayone_backend::comm::{thread_group, HostComm, HostGroup};
use dayone_backend::cpu::CpuBackend;
use dayone_backend::DType;
use dayone_engine::parallel::{Distributed, Parallel};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::{loader, Engine, EngineConfig};
use dayone_tests::{fixture, greedy, rel_err};
use std::sync::Arc;
use std::time::Duration;

const NEW_TOKENS: usize = 6;

fn config() -> EngineConfig {
    EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(1024),
        scheduler: SchedulerConfig {
            // Small chunks: prompts prefill over several steps, batched with decodes.
            max_batched_tokens: 24,
            max_prefill_chunk: 24,
            max_num_seqs: 8,
            block_size: 16,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Prompts sharing a 32-token prefix (two blocks) plus one unrelated, over the vocabulary.
fn prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..32u32).map(|i| (i * 29 + 3) % 256).collect();
    let mut out = Vec::new();
    for tail in [5usize, 17, 1] {
        let mut p = shared.clone();
        p.extend((0..tail as u32).map(|i| (i * 53 + 7) % 256));
        out.push(p);
    }
    out.push((0..21u32).map(|i| (i * 11 + 100) % 256).collect());
    out
}

/// Each request's greedy tokens and the logits row behind each of them, in id order.
type Run = Vec<(Vec<u32>, Vec<Vec<f32>>)>;

/// Rank 0's side: submits the prompts (the first alone, so the others hit its prefix), steps
/// to the end, keeps tokens and logits.
fn lead(e: &mut Engine<CpuBackend>) -> Result<Run> {
    e.capture_logits = true;
    let ps = prompts();
    let mut out: Run = ps.iter().map(|_| (Vec::new(), Vec::new())).collect();
    let mut record = |e: &mut Engine<CpuBackend>, events: Vec<dayone_engine::TokenEvent>| {
        for ev in events {
            let row = e
                .last_logits
                .iter()
                .find(|(id, _)| *id == ev.seq_id)
                .map(|(_, r)| r.clone())
                .expect("captured");
            out[ev.seq_id as usize].0.push(ev.token);
            out[ev.seq_id as usize].1.push(row);
        }
    };
    e.add_request(ps[0].clone(), greedy(NEW_TOKENS))?;
    while e.has_unfinished() {
        let ev = e.step()?;
        record(e, ev);
    }
    for p in &ps[1..] {
        e.add_request(p.clone(), greedy(NEW_TOKENS))?;
    }
    while e.has_unfinished() {
        let ev = e.step()?;
        record(e, ev);
    }
    ensure!(
        e.free_blocks() == e.total_blocks(),
        "blocks leaked on rank 0"
    );
    Ok(out)
}

/// One rank alone.
fn single(model: &str) -> Result<Run> {
    let ckpt = loader::open(&fixture(model))?;
    let mut e = Engine::new(CpuBackend, &ckpt, &config(), None)?;
    lead(&mut e)
}

/// `world` ranks as threads, experts over `ep` groups; rank 0's run.
fn split(model: &str, world: usize, ep: usize) -> Result<Run> {
    let groups = thread_group(world, Duration::from_secs(60));
    let handles: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let model = model.to_string();
            std::thread::spawn(move || -> Result<Option<Run>> {
                let group: Arc<dyn HostGroup> = Arc::new(g);
                let rank = group.rank();
                let comm = Arc::new(HostComm::new(group.clone()));
                let dist = Distributed {
                    parallel: Parallel::new(comm, ep)?,
                    group,
                    done: None,
                    memory_shared_by: world,
                };
                let ckpt = loader::open(&fixture(&model))?;
                let mut e = Engine::new_distributed(CpuBackend, &ckpt, &config(), None, Some(dist))
                    .with_context(|| format!("rank {rank}"))?;
                if rank == 0 {
                    // No rank holds the whole model: each holds less than one rank alone would,
                    // all together at least that (replicated norms and latent projections).
                    let whole = Engine::new(CpuBackend, &ckpt, &config(), None)?.rank_memory()[0].0;
                    let mem = e.rank_memory();
                    ensure!(mem.len() == world, "{} ranks report memory", mem.len());
                    ensure!(
                        mem.iter().all(|m| m.0 < whole)
                            && mem.iter().map(|m| m.0).sum::<u64>() >= whole,
                        "rank weights {mem:?} vs {whole} on one rank"
                    );
                    let run = lead(&mut e)?;
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

fn parity(model: &str, world: usize, ep: usize) -> Result<()> {
    let one = single(model)?;
    let many = split(model, world, ep)?;
    for (i, ((t1, l1), (tn, ln))) in one.iter().zip(&many).enumerate() {
        ensure!(
            t1 == tn,
            "{model} tp {world} ep {ep}: request {i} tokens {tn:?}, one rank {t1:?}"
        );
        for (s, (a, b)) in ln.iter().zip(l1).enumerate() {
            let e = rel_err(a, b);
            ensure!(
                e < 1e-4,
                "{model} tp {world} ep {ep}: request {i} step {s} logits rel err {e:.2e}"
            );
        }
    }
    Ok(())
}

macro_rules! parity_tests {
    ($($name:ident: $model:expr, $world:expr, $ep:expr;)*) => {
        $(
            #[test]
            fn $name() {
                parity($model, $world, $ep).unwrap();
            }
        )*
    };
}

parity_tests! {
    llama_tp2: "llama_tiny", 2, 1;
    llama_tp4_replicated_kv: "llama_tiny", 4, 1;
    qwen3_tp2_tied: "qwen3_tiny", 2, 1;
    qwen3_tp4: "qwen3_tiny", 4, 1;
    deepseek_v3_tp2: "deepseek_v3_tiny", 2, 1;
    deepseek_v3_tp2_ep2: "deepseek_v3_tiny", 2, 2;
    deepseek_v3_tp4_ep2: "deepseek_v3_tiny", 4, 2;
    deepseek_v32_tp2: "deepseek_v32_tiny", 2, 1;
    deepseek_v32_tp4_ep2: "deepseek_v32_tiny", 4, 2;
    kimi_linear_tp2: "kimi_linear_tp", 2, 1;
    kimi_linear_tp4: "kimi_linear_tp", 4, 1;
    kimi_linear_tp4_ep2: "kimi_linear_tp", 4, 2;
}

#[test]
fn heads_that_do_not_split_are_named() {
    let err = split("llama_tiny", 3, 1).unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("4 attention heads do not split over tensor_parallel_size 3"),
        "{msg}"
    );
}

#[test]
fn an_expert_group_count_that_does_not_divide_is_named() {
    let comm: Arc<dyn dayone_backend::comm::Comm<CpuBackend>> = Arc::new(HostComm::new(Arc::new(
        thread_group(2, Duration::from_secs(1)).remove(0),
    )));
    let err = Parallel::new(comm, 3).err().expect("ep 3 over 2 ranks");
    assert!(
        format!("{err:#}")
            .contains("expert_parallel_size (3) must divide tensor_parallel_size (2)"),
        "{err:#}"
    );
}
