//! GLM-5.3-Flash's DSA indexer with k-pool compression (HF `Glm5NextTextIndexer`): the lightning
//! indexer of [`super::DsaIndexer`] scores fixed pools of `K` tokens instead of single tokens,
//! and the MLA attends to the tokens of the best pools plus the query's incomplete pool.
//!
//! ```text
//! k_s = LayerNorm(W_k x_s),  γ_s = W_γ x_s                (per channel c of d; no RoPE)
//! pool p = tokens [pK, (p+1)K), complete pools only:  K_p[c] = Σ_j softmax_j(γ_{pK+j}[c] + ape[j, c]) · k_{pK+j}[c]
//! I(t, p) = Σ_h w_h · H^−½ · relu(d^−½ · q_h · K_p)       over the pools with (p+1)K − 1 ≤ t
//! Sel(t)  = tokens of the min(topk/K, #visible) best pools  ∪  [⌊(t+1)/K⌋·K, t]   (the tail)
//! ```
//! Cache row per token (`[blocks, bs, 3d]`): `[pooled key | k | γ]`: the raw `(k, γ)` of every
//! token, and pool `p`'s key in the row of its last token `pK + K − 1` once the pool is complete
//! (a pool's key never changes, and it lives in a block holding the pool's own tokens, so a
//! prefix-shared block stays consistent). Pooling runs on the host over the blocks of the pools
//! a step completes (`read_rows` / `write_rows`); scoring and top-k run on the device as DSA's
//! [`Backend::dsa_topk`] over the pooled keys gathered into a paged tensor of their own, so the
//! per-step cost on the host follows the step's tokens, not the context.

use super::{Linear, Weight};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, HostTensor, TensorInfo};

/// One layer's pooled indexer.
pub struct PooledDsaIndexer<B: Backend> {
    /// `[H_i·d, q_lora_rank]`.
    pub wq_b: Linear<B>,
    /// `[d, D]`.
    pub wk: Linear<B>,
    /// LayerNorm weight and bias `[d]`.
    pub k_norm: (B::Tensor, B::Tensor),
    /// `[H_i, D]`.
    pub weights_proj: Linear<B>,
    /// `index_kpool_compress_gate` `[d, D]`.
    pub gate: Linear<B>,
    /// `index_kpool_compress_ape` `[K, d]` f32.
    pub ape: Vec<f32>,
    /// Heads `H_i`.
    pub heads: usize,
    /// Head width `d`.
    pub head_dim: usize,
    /// Tokens kept per query (a multiple of `kpool`), tail excluded.
    pub topk: usize,
    /// Pool size `K`.
    pub kpool: usize,
    /// Append the query's incomplete pool.
    pub tail: bool,
}

impl<B: Backend> PooledDsaIndexer<B> {
    /// Loads `{prefix}.{wq_b, wk, k_norm, weights_proj, index_kpool_compress_gate,
    /// index_kpool_compress_ape}`.
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        (hidden, q_lora): (usize, usize),
        (heads, head_dim, topk, kpool, tail): (usize, usize, usize, usize, bool),
    ) -> Result<Self> {
        let p = |a: &str| format!("{prefix}.{a}");
        Ok(Self {
            wq_b: Linear::load(w, &p("wq_b"), heads * head_dim, q_lora, false)?,
            wk: Linear::load(w, &p("wk"), head_dim, hidden, false)?,
            k_norm: (
                w.get(&p("k_norm.weight"), &[head_dim])?,
                w.get(&p("k_norm.bias"), &[head_dim])?,
            ),
            weights_proj: Linear::load(w, &p("weights_proj"), heads, hidden, false)?,
            gate: Linear {
                weight: Weight::Dense(w.get(&p("index_kpool_compress_gate"), &[head_dim, hidden])?),
                bias: None,
            },
            ape: w
                .host_f32(&p("index_kpool_compress_ape"), &[kpool, head_dim])?
                .to_f32(),
            heads,
            head_dim,
            topk,
            kpool,
            tail,
        })
    }

    /// Width of a selection row: `topk` plus the tail's `K − 1`.
    pub fn width(&self) -> usize {
        self.topk + if self.tail { self.kpool - 1 } else { 0 }
    }

    /// Writes this step's `(k, γ)` and the keys of the pools it completes into `cache`
    /// `[blocks, bs, 3d]`, and returns the selected positions `[N, width]` u32 (`u32::MAX`
    /// padding), or `None` when every query of the step sees at most `topk / K` pools (then the
    /// selection is every causal token: dense MLA). `x` `[N, D]`, `c_q` `[N, q_lora]`.
    pub fn select(
        &self,
        b: &B,
        x: &B::Tensor,
        c_q: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &B::Tensor,
    ) -> Result<Option<B::Tensor>> {
        let (d, kp) = (self.head_dim, self.kpool);
        let host = &meta.host;
        let n = host.num_tokens();
        let k = b.layer_norm(
            &self.wk.forward(b, x)?,
            &self.k_norm.0,
            &self.k_norm.1,
            1e-6,
        )?;
        let g = self.gate.forward(b, x)?;
        b.write_cache(&k, cache, d, meta)?;
        b.write_cache(&g, cache, 2 * d, meta)?;

        self.pool_completed(b, meta, cache)?;

        let m_max = self.topk / kp;
        let visible = |t: usize| (host.positions[t] as usize + 1) / kp;
        if (0..n).all(|t| visible(t) <= m_max) {
            return Ok(None);
        }
        let h = self.heads;
        let q = b.reshape(&self.wq_b.forward(b, c_q)?, &[n, h, d])?;
        let wts = self.weights_proj.forward(b, x)?;
        let (keys, pool_meta) = self.pooled_keys(b, meta, cache)?;
        let scale = 1.0 / (d as f32).sqrt();
        let best = b.download(&b.dsa_topk(&q, &wts, &keys, &pool_meta, scale, m_max)?)?;
        let best = best.to_u32()?;
        let width = self.width();
        let mut sel = vec![u32::MAX; n * width];
        for t in 0..n {
            let (p, vis) = (host.positions[t] as usize, visible(t));
            let out = &mut sel[t * width..(t + 1) * width];
            // The scorer sees pool positions `0..=max(vis, 1) - 1`: drop a pool the query cannot
            // see yet (only when `vis` is 0) and the padding.
            let pools = best[t * m_max..(t + 1) * m_max]
                .iter()
                .map(|&pool| pool as usize)
                .filter(|&pool| pool < vis);
            let mut i = 0;
            for pool in pools {
                for j in 0..kp {
                    out[i] = (pool * kp + j) as u32;
                    i += 1;
                }
            }
            if self.tail {
                for pos in vis * kp..=p {
                    out[i] = pos as u32;
                    i += 1;
                }
            }
        }
        Ok(Some(
            b.upload(&HostTensor::from_u32(vec![n, width], &sel)?)?,
        ))
    }
    /// Writes the key of every pool that a token of this step completes (position `p` with
    /// `(p + 1) % K == 0`) into the row of the pool's last token. Reads and writes back only the
    /// cache blocks holding those pools' tokens, so a step's cost follows its own tokens, not
    /// the context.
    fn pool_completed(
        &self,
        b: &B,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &B::Tensor,
    ) -> Result<()> {
        let (d, kp) = (self.head_dim, self.kpool);
        let host = &meta.host;
        let bs = host.block_size;
        let block_of = |s: usize, pos: usize| host.block_tables[s * host.max_blocks + pos / bs];
        // (sequence, first token) of each completed pool, and the blocks holding their tokens.
        let mut pools = Vec::new();
        let mut blocks: Vec<u32> = Vec::new();
        let mut slot = std::collections::HashMap::new();
        for t in 0..host.num_tokens() {
            let (s, p) = (host.token_seq[t] as usize, host.positions[t] as usize);
            if (p + 1) % kp != 0 {
                continue;
            }
            let start = p + 1 - kp;
            pools.push((s, start));
            for pos in (start..=p).step_by(bs).chain([p]) {
                let blk = block_of(s, pos);
                slot.entry(blk).or_insert_with(|| {
                    blocks.push(blk);
                    blocks.len() - 1
                });
            }
        }
        if pools.is_empty() {
            return Ok(());
        }
        let rows = b.read_rows(cache, &blocks)?;
        let mut vals = rows.to_f32();
        let w3 = 3 * d;
        let row = |s: usize, pos: usize| (slot[&block_of(s, pos)] * bs + pos % bs) * w3;
        for &(s, start) in &pools {
            let mut key = vec![0f32; d];
            for (c, kc) in key.iter_mut().enumerate() {
                let logits: Vec<f32> = (0..kp)
                    .map(|j| vals[row(s, start + j) + 2 * d + c] + self.ape[j * d + c])
                    .collect();
                let mx = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = logits.iter().map(|l| (l - mx).exp()).collect();
                let sum: f32 = e.iter().sum();
                *kc = (0..kp)
                    .map(|j| e[j] / sum * vals[row(s, start + j) + d + c])
                    .sum();
            }
            let r = row(s, start + kp - 1);
            vals[r..r + d].copy_from_slice(&key);
        }
        let back = HostTensor::from_f32_as(rows.shape.clone(), &vals, rows.dtype)?;
        b.write_rows(cache, &blocks, &back)
    }

    /// The pooled keys the step's queries can see, gathered on the device into a paged tensor
    /// of their own (`[blocks', POOL_BLOCK, d]`, pool `i` of a sequence at pool position `i`),
    /// and the step's metadata in pool positions (query at `p` → `⌊(p+1)/K⌋ − 1`, at least 0),
    /// so that [`Backend::dsa_topk`] scores pools as DSA scores tokens.
    fn pooled_keys(
        &self,
        b: &B,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &B::Tensor,
    ) -> Result<(B::Tensor, DeviceStepMeta<B::Tensor>)> {
        const POOL_BLOCK: usize = 64;
        let (d, kp) = (self.head_dim, self.kpool);
        let host = &meta.host;
        let (bs, seqs) = (host.block_size, host.num_seqs());
        let mut vis = vec![0usize; seqs];
        let mut positions = Vec::with_capacity(host.num_tokens());
        for t in 0..host.num_tokens() {
            let (s, p) = (host.token_seq[t] as usize, host.positions[t] as usize);
            let v = (p + 1) / kp;
            vis[s] = vis[s].max(v);
            positions.push(v.saturating_sub(1) as u32);
        }
        let max_blocks = vis
            .iter()
            .map(|v| v.max(&1).div_ceil(POOL_BLOCK))
            .max()
            .unwrap_or(1);
        // Row ids into the cache viewed as `[blocks · bs · 3, d]` (sub-row 0 of a token's row is
        // its pooled-key slot); padding rows read row 0 and are never visible.
        let mut ids = vec![0u32; seqs * max_blocks * POOL_BLOCK];
        let mut tables = Vec::with_capacity(seqs * max_blocks);
        for (s, &v) in vis.iter().enumerate() {
            for j in 0..max_blocks {
                tables.push((s * max_blocks + j) as u32);
            }
            for pool in 0..v {
                let pos = pool * kp + kp - 1;
                let blk = host.block_tables[s * host.max_blocks + pos / bs] as usize;
                ids[s * max_blocks * POOL_BLOCK + pool] = (3 * (blk * bs + pos % bs)) as u32;
            }
        }
        let blocks = cache.shape()[0];
        let table = b.reshape(cache, &[blocks * bs * 3, d])?;
        let ids = b.upload(&HostTensor::from_u32(vec![ids.len()], &ids)?)?;
        let keys = b.reshape(
            &b.embedding(&table, &ids)?,
            &[seqs * max_blocks, POOL_BLOCK, d],
        )?;
        let mut pool_host = host.clone();
        pool_host.positions = positions;
        pool_host.block_tables = tables;
        pool_host.max_blocks = max_blocks;
        pool_host.block_size = POOL_BLOCK;
        let u = |v: &[u32]| b.upload(&HostTensor::from_u32(vec![v.len()], v)?);
        let pool_meta = DeviceStepMeta {
            positions: u(&pool_host.positions)?,
            block_tables: u(&pool_host.block_tables)?,
            token_seq: meta.token_seq.clone(),
            slot_mapping: meta.slot_mapping.clone(),
            seq_lens: meta.seq_lens.clone(),
            query_start: meta.query_start.clone(),
            logit_rows: meta.logit_rows.clone(),
            state_slots: meta.state_slots.clone(),
            host: pool_host,
        };
        Ok((keys, pool_meta))
    }
}
