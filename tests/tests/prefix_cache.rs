//! Prefix caching, bit for bit: a prompt served partly from the cache produces the same greedy
//! tokens and the same logits (every bit) as the same prompt computed from scratch, on every
//! model type — paged KV (llama), MLA latents (deepseek_v3), MLA + DSA indexer keys
//! (deepseek_v32 with index_topk below the prompt length) and KDA hybrids (kimi_linear, which
//! resume from recurrent-state checkpoints). Hits must happen (the counters show them), and
//! after many random requests and aborts every block and state slot is accounted for.

use anyhow::{ensure, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{engine, greedy, on_every_backend};

const BLOCK: usize = 4;
const NEW_TOKENS: usize = 6;

fn config(prefix_caching: bool, chunk: usize, interval: usize) -> EngineConfig {
    EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(2048),
        scheduler: SchedulerConfig {
            max_batched_tokens: chunk,
            max_prefill_chunk: chunk,
            max_num_seqs: 16,
            block_size: BLOCK,
            ..Default::default()
        },
        prefix_caching,
        state_checkpoint_interval: interval,
        // Bit-exact parity needs the batch-invariant kernels on CUDA (CPU and WGSL always are).
        batch_invariant: true,
        ..Default::default()
    }
}

/// Tokens and the logits row of every sampled token, of one request.
type Run = (Vec<u32>, Vec<Vec<u32>>);

/// Runs `prompts` one after another on `e` (so later ones can hit earlier ones' prefixes).
fn run_each<B: Backend>(e: &mut Engine<B>, prompts: &[Vec<u32>]) -> Result<Vec<Run>> {
    e.capture_logits = true;
    let mut out = Vec::new();
    for p in prompts {
        e.add_request(p.clone(), greedy(NEW_TOKENS))?;
        let (mut toks, mut logits) = (Vec::new(), Vec::new());
        while e.has_unfinished() {
            for ev in e.step()? {
                toks.push(ev.token);
                let row = &e.last_logits[0].1;
                logits.push(row.iter().map(|x| x.to_bits()).collect());
            }
        }
        out.push((toks, logits));
    }
    e.check_consistency()?;
    Ok(out)
}

fn seq(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + seed * 101 + 11) % 250 + 1)
        .collect()
}

/// Prompts sharing prefixes of several lengths (whole blocks, inside a block, the whole prompt).
fn prompts() -> Vec<Vec<u32>> {
    let base = seq(41, 0);
    let mut v = vec![base.clone()];
    for (cut, tail) in [(8, 1), (13, 2), (24, 3), (40, 4)] {
        let mut p = base[..cut].to_vec();
        p.extend(seq(9, tail));
        v.push(p);
    }
    v.push(base.clone()); // the same prompt again: everything but the last token hits
    v.push(seq(3, 9)); // shorter than one block: nothing to share
                       // Long enough for the chunked KDA path (64-token chunks) on both sides of a hit.
    let long = seq(150, 6);
    v.push(long.clone());
    let mut branch = long[..100].to_vec();
    branch.extend(seq(70, 7));
    v.push(branch);
    v.push(long);
    v
}

/// Cache on (later prompts hit earlier ones) == cache off, tokens and logits bit for bit.
fn hit_equals_miss<B: Backend>(mk: impl Fn() -> B, model: &str, interval: usize) -> Result<()> {
    let prompts = prompts();
    let mut cold = engine(mk(), model, config(false, 2048, interval))?;
    let want = run_each(&mut cold, &prompts)?;
    ensure!(
        cold.counters().prefix_hit_tokens == 0,
        "cache off must not hit"
    );
    let mut warm = engine(mk(), model, config(true, 2048, interval))?;
    let got = run_each(&mut warm, &prompts)?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ensure!(
            g.0 == w.0,
            "{model} prompt {i}: tokens {:?} with cache != {:?} without",
            g.0,
            w.0
        );
        ensure!(
            g.1 == w.1,
            "{model} prompt {i}: logits differ with the cache (same tokens)"
        );
    }
    let c = warm.counters();
    ensure!(
        c.prefix_hit_tokens >= (2 * BLOCK) as u64,
        "{model}: only {} prompt tokens hit the cache ({:?})",
        c.prefix_hit_tokens,
        c
    );
    Ok(())
}

/// A second prompt sharing two blocks with a first hits at least one block, with the default
/// checkpoint placement (end of prompt) on a hybrid model too (vllm#40696), and a prompt that
/// leaves a cached prefix later than the last checkpoint leaves a junction checkpoint for the
/// next one (vllm#45238).
///
/// On a hybrid model the unit is the checkpoint alignment (the block, or a chunked kernel's
/// chunk: 64 tokens on WGSL), where resuming is bit-exact.
fn second_prompt_hits<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let b = mk();
    let unit = unit(&b, model);
    let mut e = engine(b, model, config(true, 2048, 0))?;
    let first = seq(2 * unit + 1, 0);
    let mut second = first[..2 * unit].to_vec();
    second.extend(seq(5, 1));
    run_each(&mut e, &[first])?;
    let before = e.counters().prefix_hit_tokens;
    run_each(&mut e, &[second])?;
    let hit = e.counters().prefix_hit_tokens - before;
    ensure!(
        hit >= unit as u64,
        "{model}: the second prompt hit {hit} tokens"
    );
    let m = e.metrics();
    ensure!(
        m.prefix_cache_hits == e.counters().prefix_hit_tokens
            && m.prefix_cache_queries > m.prefix_cache_hits,
        "{model}: the metrics must show the hit: {} of {} tokens",
        m.prefix_cache_hits,
        m.prefix_cache_queries
    );
    if model.starts_with("kimi") {
        ensure!(
            m.state_checkpoint_hits == m.prefix_cache_hits,
            "{model}: checkpoint hits {m:?}"
        );
    }
    ensure!(
        m.kv_blocks_cached > 0 && m.requests_running == 0,
        "{model}: gauges {m:?}"
    );
    // A long first prompt: its only checkpoint (end of prompt) lies past the shared part.
    let long = seq(6 * unit + 2, 3);
    let branch = |t: u32| {
        let mut p = long[..3 * unit].to_vec();
        p.extend(seq(6, t));
        p
    };
    run_each(&mut e, std::slice::from_ref(&long))?;
    run_each(&mut e, &[branch(7)])?;
    let before = e.counters().prefix_hit_tokens;
    run_each(&mut e, &[branch(8)])?;
    let hit = e.counters().prefix_hit_tokens - before;
    ensure!(
        hit >= (3 * unit) as u64,
        "{model}: a third prompt on a shared junction hit only {hit} tokens"
    );
    Ok(())
}

/// Where prefixes can hit: the block, or on a hybrid model the checkpoint alignment.
fn unit<B: Backend>(b: &B, model: &str) -> usize {
    if model.starts_with("kimi") {
        let a = b.recurrent_split_alignment();
        BLOCK * a / gcd(BLOCK, a)
    } else {
        BLOCK
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Chunked prefill with the cache on, at many chunk sizes, == one-shot with the cache off.
fn chunked_hits_equal_one_shot<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let prompts = prompts();
    let mut cold = engine(mk(), model, config(false, 4096, 0))?;
    let want = run_each(&mut cold, &prompts)?;
    // A chunked recurrent kernel is split-invariant at its alignment only: chunked prefill is
    // bit-exact there when the chunk size is a multiple of it.
    let u = unit(&cold.backend, model);
    let sizes = if u > BLOCK {
        vec![u, 2 * u, 3 * u]
    } else {
        vec![1, 3, 5, 16]
    };
    for chunk in sizes {
        let mut warm = engine(mk(), model, config(true, chunk, 0))?;
        let got = run_each(&mut warm, &prompts)?;
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            ensure!(
                g.0 == w.0,
                "{model} chunk {chunk} prompt {i}: tokens differ"
            );
            ensure!(
                g.1 == w.1,
                "{model} chunk {chunk} prompt {i}: logits differ"
            );
        }
    }
    Ok(())
}

/// 16 requests in flight at once, sharing prefixes of assorted lengths, == each alone.
fn concurrent_shared_prefixes<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let base = seq(30, 5);
    let prompts: Vec<Vec<u32>> = (0..16)
        .map(|i| {
            let mut p = base[..(i * 7) % 29 + 1].to_vec();
            p.extend(seq(3 + i % 5, 20 + i as u32));
            p
        })
        .collect();
    let mut e = engine(mk(), model, config(true, 64, 0))?;
    for p in &prompts {
        e.add_request(p.clone(), greedy(NEW_TOKENS))?;
    }
    let together = e.run_to_completion()?;
    e.check_consistency()?;
    for (i, p) in prompts.iter().enumerate() {
        let mut alone = engine(mk(), model, config(false, 2048, 0))?;
        alone.add_request(p.clone(), greedy(NEW_TOKENS))?;
        let got = alone.run_to_completion()?;
        ensure!(
            got[0].1 == together[i].1,
            "{model} request {i}: batched with shared prefixes differs from alone"
        );
    }
    Ok(())
}

/// 500 random requests, some aborted at random points: afterwards every block is free or
/// cached, every state slot is free, and the pool's bookkeeping is consistent.
fn no_leaks<B: Backend>(mk: impl Fn() -> B, model: &str, host_bytes: u64) -> Result<()> {
    let b = mk();
    let base_len = 40.max(2 * unit(&b, model) + 8);
    let mut cfg = config(true, 32, 0);
    cfg.kv_cache_tokens = Some(6 * base_len); // small: eviction and preemption happen
    cfg.host_cache_bytes = host_bytes; // with a host tier: swaps and host hits too
    let mut e = engine(b, model, cfg)?;
    let mut rng = 12345u64;
    let mut next = || {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) as usize
    };
    let base = seq(base_len, 1);
    let mut live: Vec<u64> = Vec::new();
    let mut submitted = 0;
    while submitted < 500 || e.has_unfinished() {
        if submitted < 500 && live.len() < 12 {
            let mut p = base[..next() % base_len + 1].to_vec();
            p.extend(seq(next() % 6, next() as u32 % 50));
            live.push(e.add_request(p, greedy(1 + next() % 4))?);
            submitted += 1;
        }
        if !live.is_empty() && next() % 5 == 0 {
            let id = live.swap_remove(next() % live.len());
            e.abort(id)?;
        }
        for ev in e.step()? {
            if ev.finish.is_some() {
                live.retain(|&x| x != ev.seq_id);
            }
        }
        e.check_consistency()?;
    }
    ensure!(
        e.free_blocks() == e.total_blocks(),
        "{} of {} blocks free",
        e.free_blocks(),
        e.total_blocks()
    );
    ensure!(
        e.counters().prefix_hit_tokens > 0,
        "the random prompts share prefixes but nothing hit"
    );
    Ok(())
}

on_every_backend! {
    llama_hit => |mk: fn() -> _| hit_equals_miss(mk, "llama_tiny", 0);
    mla_hit => |mk: fn() -> _| hit_equals_miss(mk, "deepseek_v3_tiny", 0);
    dsa_hit => |mk: fn() -> _| hit_equals_miss(mk, "deepseek_v32_tiny", 0);
    kda_hit => |mk: fn() -> _| hit_equals_miss(mk, "kimi_linear_tiny", 0);
    kda_hit_dense_checkpoints => |mk: fn() -> _| hit_equals_miss(mk, "kimi_linear_tiny", BLOCK);
    llama_second_hits => |mk: fn() -> _| second_prompt_hits(mk, "llama_tiny");
    kda_second_hits => |mk: fn() -> _| second_prompt_hits(mk, "kimi_linear_tiny");
    dsa_second_hits => |mk: fn() -> _| second_prompt_hits(mk, "deepseek_v32_tiny");
    llama_chunked => |mk: fn() -> _| chunked_hits_equal_one_shot(mk, "llama_tiny");
    kda_chunked => |mk: fn() -> _| chunked_hits_equal_one_shot(mk, "kimi_linear_tiny");
    llama_concurrent => |mk: fn() -> _| concurrent_shared_prefixes(mk, "llama_tiny");
    kda_concurrent => |mk: fn() -> _| concurrent_shared_prefixes(mk, "kimi_linear_tiny");
    llama_no_leaks => |mk: fn() -> _| no_leaks(mk, "llama_tiny", 0);
    kda_no_leaks => |mk: fn() -> _| no_leaks(mk, "kimi_linear_tiny", 0);
    llama_no_leaks_host => |mk: fn() -> _| no_leaks(mk, "llama_tiny", 1 << 20);
    kda_no_leaks_host => |mk: fn() -> _| no_leaks(mk, "kimi_linear_tiny", 1 << 20);
}
