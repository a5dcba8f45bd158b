//! One DeepSeek-V3.2-shaped attention layer (MLA, absorbed, with the DSA lightning indexer) in
//! decode: per step, dense MLA over every cached token vs sparse MLA over the indexer's top-k,
//! at several context lengths, through the engine's own layer code (`layers::Mla`,
//! `layers::DsaIndexer`) on random bf16 weights. Caches are filled with random rows (a prefill
//! of that many tokens would only take longer to reach the same state).
//!
//! Reports per step: the whole layer (projections + indexer + attention) dense and sparse, the
//! indexer's part (its projections, key norm/RoPE/cache write and `dsa_topk`), and the two
//! attention kernels alone; per token per sequence is the step time divided by the batch.
//!
//! With `--prefill-chunk N`, each context is instead a prompt of that many tokens prefilled in
//! chunks of `N` (one sequence): the whole prompt's time through the layer dense (expanded MLA
//! prefill, `layers::MlaExpanded`, where the backend has the kernel; else absorbed) and sparse
//! (every query attends only to its top-k keys: no dense pass), the issue-[10] crossover.
//!
//! Usage: `dsa-bench [--backend cuda|wgsl|cpu] [--contexts 8192,32768,131072] [--batch 1]
//!         [--heads 128] [--index-topk 2048] [--iters 20] [--prefill-chunk N] [--json]`

mod sigpipe;

use anyhow::{bail, Result};
use clap::Parser;
use dayone_backend::conformance::Rng;
use dayone_backend::{Backend, DType, HostTensor, RopeStyle, StepMeta};
use dayone_engine::layers::{DsaIndexer, Linear, Mla, MlaExpanded, MlaShape, RmsNorm, Rope};
use std::time::Instant;

/// Command-line flags.
#[derive(Parser)]
#[command(about = "Decode time of one DeepSeek-V3.2 attention layer, dense vs sparse (DSA)")]
struct Args {
    /// Backend: cuda, wgsl or cpu.
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Context lengths (tokens already cached per sequence), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "8192,32768,131072")]
    contexts: Vec<usize>,
    /// Batch sizes (sequences per decode step), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    batch: Vec<usize>,
    /// Attention heads.
    #[arg(long, default_value_t = 128)]
    heads: usize,
    /// Keys the indexer keeps per query.
    #[arg(long, default_value_t = 2048)]
    index_topk: usize,
    /// Timed calls per measurement (after one warm-up).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Prefill each context as a prompt in chunks of this many tokens instead of timing a
    /// decode step.
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// A `[shape]` host tensor in `dt` of small random values: one random block repeated (drawing
/// every value of a 128K-token cache would dominate the run; timings do not depend on values).
fn filled(shape: &[usize], rng: &mut Rng, scale: f32, dt: DType) -> Result<HostTensor> {
    let n: usize = shape.iter().product();
    let block = HostTensor::from_f32_as(vec![1 << 16], &rng.vec(1 << 16, scale), dt)?;
    let bytes = n * dt.size();
    let mut data = Vec::with_capacity(bytes);
    while data.len() < bytes {
        // Shift by a prime stride each round so that rows differ.
        let start = (data.len() / dt.size() * 7919 % (1 << 16)) * dt.size();
        let take = (bytes - data.len()).min(block.data.len() - start);
        data.extend_from_slice(&block.data[start..start + take]);
    }
    HostTensor::new(shape.to_vec(), dt, data)
}

/// DeepSeek-V3.2 widths: D 7168, q_lora 1536, L 512, dn 128, R 64, dv 128; indexer 64 × 128.
const HIDDEN: usize = 7168;
const Q_LORA: usize = 1536;
const KV_LORA: usize = 512;
const NOPE: usize = 128;
const ROPE: usize = 64;
const V_DIM: usize = 128;
const INDEX_HEADS: usize = 64;
const INDEX_DIM: usize = 128;

fn layer<B: Backend>(b: &B, a: &Args, rng: &mut Rng, dt: DType) -> Result<Mla<B>> {
    let h = a.heads;
    let mut up = |shape: &[usize], scale: f32| -> Result<B::Tensor> {
        b.upload(&filled(shape, rng, scale, dt)?)
    };
    let lin = |w: B::Tensor| Linear::dense(w, None);
    let inv_freq: Vec<f32> = (0..ROPE / 2)
        .map(|i| 10000f32.powf(-2.0 * i as f32 / ROPE as f32))
        .collect();
    let ones = |n: usize| HostTensor::from_f32_as(vec![n], &vec![1.0; n], dt);
    let indexer = DsaIndexer {
        wq_b: lin(up(&[INDEX_HEADS * INDEX_DIM, Q_LORA], 0.03)?),
        wk: lin(up(&[INDEX_DIM, HIDDEN], 0.02)?),
        k_norm: (b.upload(&ones(INDEX_DIM)?)?, up(&[INDEX_DIM], 0.1)?),
        weights_proj: lin(up(&[INDEX_HEADS, HIDDEN], 0.02)?),
        rope: Rope::new(b, &inv_freq, RopeStyle::HalfSplit, 1.0)?,
        heads: INDEX_HEADS,
        head_dim: INDEX_DIM,
        topk: a.index_topk,
    };
    Ok(Mla {
        shape: MlaShape {
            hidden: HIDDEN,
            heads: h,
            q_lora_rank: Some(Q_LORA),
            kv_lora_rank: KV_LORA,
            nope_dim: NOPE,
            rope_dim: ROPE,
            v_dim: V_DIM,
        },
        q_a: Some((
            lin(up(&[Q_LORA, HIDDEN], 0.02)?),
            RmsNorm {
                weight: b.upload(&ones(Q_LORA)?)?,
                eps: 1e-6,
            },
        )),
        q_nope: lin(up(&[h * NOPE, Q_LORA], 0.03)?),
        q_pe: lin(up(&[h * ROPE, Q_LORA], 0.03)?),
        kv_a: lin(up(&[KV_LORA, HIDDEN], 0.02)?),
        k_pe: lin(up(&[ROPE, HIDDEN], 0.02)?),
        kv_a_norm: RmsNorm {
            weight: b.upload(&ones(KV_LORA)?)?,
            eps: 1e-6,
        },
        w_uk_t: up(&[h, KV_LORA, NOPE], 0.05)?,
        w_uv: up(&[h, V_DIM, KV_LORA], 0.05)?,
        o_proj: dayone_engine::layers::RowLinear::single(lin(up(&[HIDDEN, h * V_DIM], 0.01)?)),
        scale: 1.0 / ((NOPE + ROPE) as f32).sqrt(),
        indexer: Some(indexer),
        expanded: Some(MlaExpanded {
            w_q: lin(up(&[h * (NOPE + ROPE), Q_LORA], 0.03)?),
            w_k: lin(up(&[h * (NOPE + ROPE), KV_LORA + ROPE], 0.05)?),
            w_v: lin(up(&[h * V_DIM, KV_LORA + ROPE], 0.05)?),
            min_tokens: 256,
            any_backend: false,
        }),
    })
}

/// Prefill step of one sequence: `n` new tokens at positions `start .. start + n`, blocks of
/// `bs` tokens in order.
fn prefill_meta(start: usize, n: usize, bs: usize) -> StepMeta {
    let len = start + n;
    let max_blocks = len.div_ceil(bs);
    StepMeta {
        positions: (start as u32..len as u32).collect(),
        token_seq: vec![0; n],
        slot_mapping: (start as u32..len as u32).collect(),
        block_tables: (0..max_blocks as u32).collect(),
        seq_lens: vec![len as u32],
        query_start: vec![0, n as u32],
        logit_rows: vec![n as u32 - 1],
        state_slots: vec![0],
        max_blocks,
        block_size: bs,
        max_seq_len: len,
    }
}

/// Seconds to prefill a `ctx`-token prompt in chunks of `chunk` through the layer, dense
/// (`keys: None`) or sparse.
fn prefill_time<B: Backend>(
    b: &B,
    mla: &Mla<B>,
    rope: &Rope<B>,
    x: &B::Tensor,
    ctx: usize,
    chunk: usize,
    (cache, keys): (&B::Tensor, Option<&B::Tensor>),
) -> Result<f64> {
    b.synchronize()?;
    let t0 = Instant::now();
    let mut start = 0;
    while start < ctx {
        let n = chunk;
        let meta = b.upload_meta(prefill_meta(start, n, 64))?;
        mla.forward(b, x, Some(rope), &meta, cache, keys)?;
        start += n;
    }
    b.synchronize()?;
    Ok(t0.elapsed().as_secs_f64())
}

/// `--prefill-chunk`: dense vs sparse prefill of whole prompts.
fn run_prefill<B: Backend>(
    b: &B,
    a: &Args,
    mla: &mut Mla<B>,
    rope: &Rope<B>,
    chunk: usize,
    rng: &mut Rng,
    dt: DType,
) -> Result<()> {
    let bs = 64;
    if !a.json {
        println!(
            "DeepSeek-V3.2 attention layer on {}: prefill in chunks of {chunk}, {} heads, top-{}; {dt}; seconds per prompt",
            b.name(), a.heads, a.index_topk
        );
        println!(
            "{:>8} {:>12} {:>10} {:>8}",
            "prompt", "dense (s)", "sparse (s)", "speedup"
        );
    }
    let x = b.upload(&filled(&[chunk, HIDDEN], rng, 1.0, dt)?)?;
    for &ctx in &a.contexts {
        if ctx % chunk != 0 {
            bail!("--contexts {ctx} must be a multiple of --prefill-chunk {chunk}");
        }
        let blocks = ctx.div_ceil(bs);
        let cache = b.upload(&filled(&[blocks, bs, KV_LORA + ROPE], rng, 1.0, dt)?)?;
        let keys = b.upload(&filled(&[blocks, bs, INDEX_DIM], rng, 1.0, dt)?)?;
        let ix = mla.indexer.take().expect("indexer");
        let mut dense = f64::MAX;
        for _ in 0..a.iters {
            dense = dense.min(prefill_time(b, mla, rope, &x, ctx, chunk, (&cache, None))?);
        }
        mla.indexer = Some(ix);
        let mut sparse = f64::MAX;
        for _ in 0..a.iters {
            sparse = sparse.min(prefill_time(
                b,
                mla,
                rope,
                &x,
                ctx,
                chunk,
                (&cache, Some(&keys)),
            )?);
        }
        if a.json {
            println!(
                "{{\"prompt\":{ctx},\"chunk\":{chunk},\"dense_s\":{dense:.4},\"sparse_s\":{sparse:.4},\"backend\":\"{}\"}}",
                b.name()
            );
        } else {
            println!(
                "{ctx:>8} {dense:>12.3} {sparse:>10.3} {:>7.2}×",
                dense / sparse
            );
        }
    }
    Ok(())
}

/// Decode step of `batch` sequences, each at position `ctx` (so `ctx + 1` keys), contiguous
/// blocks of `bs` tokens.
fn decode_meta(batch: usize, ctx: usize, bs: usize) -> StepMeta {
    let max_blocks = (ctx + 1).div_ceil(bs);
    let block_tables: Vec<u32> = (0..batch * max_blocks).map(|i| i as u32).collect();
    StepMeta {
        positions: vec![ctx as u32; batch],
        token_seq: (0..batch as u32).collect(),
        slot_mapping: (0..batch)
            .map(|s| (s * max_blocks * bs + ctx) as u32)
            .collect(),
        block_tables,
        seq_lens: vec![ctx as u32 + 1; batch],
        query_start: (0..=batch as u32).collect(),
        logit_rows: (0..batch as u32).collect(),
        state_slots: (0..batch as u32).collect(),
        max_blocks,
        block_size: bs,
        max_seq_len: ctx + 1,
    }
}

/// Mean seconds of `f` over `iters` runs after one warm-up.
fn time<B: Backend>(b: &B, iters: u64, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    b.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    b.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() / iters as f64)
}

fn run<B: Backend>(b: B, a: &Args) -> Result<()> {
    let dt = b.activation_dtype(DType::BF16);
    let mut rng = Rng::new(11);
    let mut mla = layer(&b, a, &mut rng, dt)?;
    let inv_freq: Vec<f32> = (0..ROPE / 2)
        .map(|i| 10000f32.powf(-2.0 * i as f32 / ROPE as f32))
        .collect();
    let rope = Rope::new(&b, &inv_freq, RopeStyle::Interleaved, 1.0)?;
    if let Some(chunk) = a.prefill_chunk {
        return run_prefill(&b, a, &mut mla, &rope, chunk, &mut rng, dt);
    }
    let bs = 64;
    if !a.json {
        println!(
            "DeepSeek-V3.2 attention layer on {}: D {HIDDEN}, {} heads, L {KV_LORA} + R {ROPE}, \
             indexer {INDEX_HEADS} × {INDEX_DIM}, top-{}; {dt}; ms per decode step",
            b.name(),
            a.heads,
            a.index_topk
        );
        println!(
            "{:>7} {:>5} {:>10} {:>10} {:>8} {:>10} {:>8} {:>11} {:>11} {:>9}",
            "context",
            "batch",
            "dense",
            "sparse",
            "speedup",
            "indexer",
            "share",
            "dense attn",
            "sparse attn",
            "dsa_topk"
        );
    }
    for &batch in &a.batch {
        for &ctx in &a.contexts {
            let meta = decode_meta(batch, ctx, bs);
            let blocks = batch * meta.max_blocks;
            let cache = b.upload(&filled(&[blocks, bs, KV_LORA + ROPE], &mut rng, 1.0, dt)?)?;
            let keys = b.upload(&filled(&[blocks, bs, INDEX_DIM], &mut rng, 1.0, dt)?)?;
            let x = b.upload(&filled(&[batch, HIDDEN], &mut rng, 1.0, dt)?)?;
            let dmeta = b.upload_meta(meta)?;
            let ix = mla.indexer.take().expect("indexer");
            let dense = time(&b, a.iters, || {
                mla.forward(&b, &x, Some(&rope), &dmeta, &cache, None)
                    .map(drop)
            })?;
            mla.indexer = Some(ix);
            let sparse = time(&b, a.iters, || {
                mla.forward(&b, &x, Some(&rope), &dmeta, &cache, Some(&keys))
                    .map(drop)
            })?;
            let ixr = mla.indexer.as_ref().expect("indexer");
            let cq = {
                let (proj, norm) = mla.q_a.as_ref().expect("q_a");
                norm.forward(&b, &proj.forward(&b, &x)?)?
            };
            let indexer = time(&b, a.iters, || {
                ixr.select(&b, &x, &cq, &dmeta, &keys).map(drop)
            })?;
            // The attention kernels alone on this step's inputs.
            let h = a.heads;
            let q_lat = b.upload(&filled(&[batch, h, KV_LORA], &mut rng, 1.0, dt)?)?;
            let q_pe = b.upload(&filled(&[batch, h, ROPE], &mut rng, 1.0, dt)?)?;
            let iq = b.upload(&filled(
                &[batch, INDEX_HEADS, INDEX_DIM],
                &mut rng,
                1.0,
                dt,
            )?)?;
            let iw = b.upload(&filled(&[batch, INDEX_HEADS], &mut rng, 1.0, dt)?)?;
            let index_scale = 1.0 / (INDEX_DIM as f32).sqrt();
            let selected = b.dsa_topk(&iq, &iw, &keys, &dmeta, index_scale, ixr.topk)?;
            let dense_attn = time(&b, a.iters, || {
                b.paged_latent_attention(&q_lat, &q_pe, &cache, &dmeta, mla.scale)
                    .map(drop)
            })?;
            let sparse_attn = time(&b, a.iters, || {
                b.sparse_latent_attention(&q_lat, &q_pe, &cache, &dmeta, mla.scale, &selected)
                    .map(drop)
            })?;
            let topk = time(&b, a.iters, || {
                b.dsa_topk(&iq, &iw, &keys, &dmeta, index_scale, ixr.topk)
                    .map(drop)
            })?;
            let ms = |s: f64| s * 1e3;
            if a.json {
                println!(
                    "{{\"context\":{ctx},\"batch\":{batch},\"dense_ms\":{:.4},\"sparse_ms\":{:.4},\
                     \"indexer_ms\":{:.4},\"dense_attn_ms\":{:.4},\"sparse_attn_ms\":{:.4},\
                     \"dsa_topk_ms\":{:.4},\"backend\":\"{}\"}}",
                    ms(dense),
                    ms(sparse),
                    ms(indexer),
                    ms(dense_attn),
                    ms(sparse_attn),
                    ms(topk),
                    b.name()
                );
            } else {
                println!(
                    "{ctx:>7} {batch:>5} {:>10.3} {:>10.3} {:>7.2}× {:>10.3} {:>7.0}% {:>11.3} {:>11.3} {:>9.3}",
                    ms(dense),
                    ms(sparse),
                    dense / sparse,
                    ms(indexer),
                    100.0 * indexer / sparse,
                    ms(dense_attn),
                    ms(sparse_attn),
                    ms(topk)
                );
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    sigpipe::restore();
    let a = Args::parse();
    match a.backend.as_str() {
        "cuda" => run(dayone_cuda::CudaBackend::new(0)?, &a),
        "wgsl" => run(dayone_wgsl::WgslBackend::new()?, &a),
        "cpu" => run(dayone_backend::cpu::CpuBackend, &a),
        other => bail!("--backend must be cuda, wgsl or cpu, got {other}"),
    }
}
