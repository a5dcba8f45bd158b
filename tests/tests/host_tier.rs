//! The host-memory tier, bit for bit: blocks evicted from a small device cache are kept in host
//! memory and paged back on a later hit (host hit == device hit == miss, tokens and logits), and
//! preemption swaps a sequence out and back in with the same tokens as recomputing it or never
//! preempting it. On every cache type: paged KV, MLA latents, DSA indexer keys, KDA hybrids.

use anyhow::{ensure, Result};
use dayone_backend::{Backend, DType};
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::{Engine, EngineConfig};
use dayone_tests::{engine, greedy, on_every_backend};

const BLOCK: usize = 4;

fn config(kv_tokens: usize, host_bytes: u64, prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        dtype: DType::F32,
        kv_cache_tokens: Some(kv_tokens),
        scheduler: SchedulerConfig {
            max_batched_tokens: 256,
            max_prefill_chunk: 256,
            max_num_seqs: 8,
            block_size: BLOCK,
            ..Default::default()
        },
        prefix_caching,
        host_cache_bytes: host_bytes,
        // Bit-exact parity needs the batch-invariant kernels on CUDA (CPU and WGSL always are).
        batch_invariant: true,
        ..Default::default()
    }
}

fn seq(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 41 + seed * 97 + 5) % 250 + 1)
        .collect()
}

/// Tokens and the logits bits of each sampled token, of one request.
type Run = (Vec<u32>, Vec<Vec<u32>>);

/// Generated tokens per request id, swaps and recomputes.
type Outcome = (Vec<(u64, Vec<u32>)>, u64, u64);

/// Tokens and logits bits of each prompt, run one after another.
fn run_each<B: Backend>(e: &mut Engine<B>, prompts: &[Vec<u32>]) -> Result<Vec<Run>> {
    e.capture_logits = true;
    let mut out = Vec::new();
    for p in prompts {
        e.add_request(p.clone(), greedy(4))?;
        let (mut toks, mut logits) = (Vec::new(), Vec::new());
        while e.has_unfinished() {
            for ev in e.step()? {
                toks.push(ev.token);
                logits.push(e.last_logits[0].1.iter().map(|x| x.to_bits()).collect());
            }
        }
        out.push((toks, logits));
        e.check_consistency()?;
    }
    Ok(out)
}

/// Long enough to cross a chunked recurrent kernel's alignment (64 on WGSL).
fn prompts() -> Vec<Vec<u32>> {
    let a = seq(140, 1);
    let mut v = vec![a.clone()];
    // Others fill the small device cache, evicting `a`'s blocks to the host.
    for i in 0..4 {
        v.push(seq(140, 10 + i));
    }
    v.push(a.clone());
    let mut b = a[..130].to_vec();
    b.extend(seq(7, 3));
    v.push(b);
    v
}

fn host_hit_equals_miss<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let prompts = prompts();
    let mut cold = engine(mk(), model, config(4096, 0, false))?;
    let want = run_each(&mut cold, &prompts)?;
    // 160 tokens of device cache: one prompt at a time, so earlier ones are evicted.
    let mut warm = engine(mk(), model, config(160, 64 << 20, true))?;
    let got = run_each(&mut warm, &prompts)?;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ensure!(
            g.0 == w.0,
            "{model} prompt {i}: tokens differ after a host hit"
        );
        ensure!(
            g.1 == w.1,
            "{model} prompt {i}: logits differ after a host hit"
        );
    }
    let c = warm.counters();
    ensure!(
        c.host_hit_tokens >= 64,
        "{model}: only {} tokens came back from the host tier ({c:?})",
        c.host_hit_tokens
    );
    let m = warm.metrics();
    ensure!(
        m.host_cache_hits == c.host_hit_tokens && m.host_store.bytes > 0 && m.host_load.bytes > 0,
        "{model}: host metrics {m:?}"
    );
    // Without the host tier the same small cache cannot hit those prompts.
    let mut no_host = engine(mk(), model, config(160, 0, true))?;
    run_each(&mut no_host, &prompts)?;
    ensure!(no_host.counters().host_hit_tokens == 0);
    Ok(())
}

/// A host hit == the same hit from the device, tokens and logits bit for bit: the host tier
/// restores the device bytes verbatim and the steps split the prompts alike. (Unlike
/// [`host_hit_equals_miss`] this holds on backends whose kernels are not split-invariant.)
fn host_hit_equals_device_hit<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let prompts = prompts();
    let mut roomy = config(4096, 0, true);
    roomy.state_checkpoints = Some(64); // keeps every checkpoint on the device
    let mut device = engine(mk(), model, roomy)?;
    let want = run_each(&mut device, &prompts)?;
    let mut host = engine(mk(), model, config(160, 64 << 20, true))?;
    let got = run_each(&mut host, &prompts)?;
    ensure!(host.counters().host_hit_tokens > 0, "{model}: no host hit");
    ensure!(
        host.counters().prefix_hit_tokens == device.counters().prefix_hit_tokens,
        "{model}: the host tier should hit as much as a cache that holds everything"
    );
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        ensure!(
            g.0 == w.0,
            "{model} prompt {i}: host-hit tokens != device-hit tokens"
        );
        ensure!(
            g.1 == w.1,
            "{model} prompt {i}: host-hit logits != device-hit logits"
        );
    }
    Ok(())
}

/// Several sequences in a cache too small for all: swapped (host tier) == recomputed (none) ==
/// never preempted (a roomy cache).
fn swap_equals_recompute<B: Backend>(mk: impl Fn() -> B, model: &str) -> Result<()> {
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| seq(30 + 9 * i, 20 + i as u32)).collect();
    let run = |cfg: EngineConfig| -> Result<Outcome> {
        let mut e = engine(mk(), model, cfg)?;
        for p in &prompts {
            e.add_request(p.clone(), greedy(24))?;
        }
        let out = e.run_to_completion()?;
        e.check_consistency()?;
        ensure!(e.free_blocks() == e.total_blocks());
        let c = e.counters();
        Ok((out, c.preemptions_swap, c.preemptions_recompute))
    };
    let (roomy, _, _) = run(config(4096, 0, false))?;
    let (swapped, swaps, _) = run(config(200, 64 << 20, false))?;
    let (recomputed, _, recomputes) = run(config(200, 0, false))?;
    ensure!(swaps > 0, "{model}: nothing was swapped");
    ensure!(
        recomputes > 0,
        "{model}: nothing was preempted without a host tier"
    );
    ensure!(
        swapped == roomy,
        "{model}: swapped {swapped:?} != never preempted {roomy:?}"
    );
    ensure!(
        recomputed == roomy,
        "{model}: recomputed != never preempted"
    );
    Ok(())
}

on_every_backend! {
    llama_host_hit => |mk: fn() -> _| host_hit_equals_miss(mk, "llama_tiny");
    mla_host_hit => |mk: fn() -> _| host_hit_equals_miss(mk, "deepseek_v3_tiny");
    dsa_host_hit => |mk: fn() -> _| host_hit_equals_miss(mk, "deepseek_v32_tiny");
    kda_host_hit => |mk: fn() -> _| host_hit_equals_miss(mk, "kimi_linear_tiny");
    llama_host_device => |mk: fn() -> _| host_hit_equals_device_hit(mk, "llama_tiny");
    kda_host_device => |mk: fn() -> _| host_hit_equals_device_hit(mk, "kimi_linear_tiny");
    dsa_host_device => |mk: fn() -> _| host_hit_equals_device_hit(mk, "deepseek_v32_tiny");
    llama_swap => |mk: fn() -> _| swap_equals_recompute(mk, "llama_tiny");
    kda_swap => |mk: fn() -> _| swap_equals_recompute(mk, "kimi_linear_tiny");
    mla_swap => |mk: fn() -> _| swap_equals_recompute(mk, "deepseek_v3_tiny");
}
