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
//! prefix-shared block stays consistent). Pooling, scoring and top-k run on the host (composed
//! from `read_rows` / `write_rows`; the backends have no pooled-indexer op).

use super::{Linear, Weight};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, HostTensor};

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

/// Sorted by score (descending), ties lower pool first; the first `m`.
fn best(scores: &[f32], m: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    idx.truncate(m);
    idx
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

        // Every block of the step's sequences up to their last position in this step.
        let bs = host.block_size;
        let mut last = vec![None::<usize>; host.num_seqs()];
        for t in 0..n {
            let s = host.token_seq[t] as usize;
            let p = host.positions[t] as usize;
            last[s] = Some(last[s].map_or(p, |q: usize| q.max(p)));
        }
        let mut blocks: Vec<u32> = Vec::new();
        let mut base = vec![0usize; host.num_seqs()]; // index into `blocks` of the seq's block 0
        for (s, l) in last.iter().enumerate() {
            base[s] = blocks.len();
            if let Some(l) = l {
                for j in 0..=l / bs {
                    blocks.push(host.block_tables[s * host.max_blocks + j]);
                }
            }
        }
        let rows = b.read_rows(cache, &blocks)?;
        let dtype = rows.dtype;
        let mut vals = rows.to_f32();
        let w3 = 3 * d;
        let row = |s: usize, pos: usize| (base[s] + pos / bs) * bs * w3 + (pos % bs) * w3;

        // Pools completed in this step.
        let mut touched = false;
        for t in 0..n {
            let (s, p) = (host.token_seq[t] as usize, host.positions[t] as usize);
            if (p + 1) % kp != 0 {
                continue;
            }
            let pool = (p + 1) / kp - 1;
            let start = pool * kp;
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
            touched = true;
        }
        if touched {
            let shape = rows.shape.clone();
            let back = HostTensor::from_f32_as(shape, &vals, dtype)?;
            // Re-round to the cache dtype, as stored.
            vals = back.to_f32();
            b.write_rows(cache, &blocks, &back)?;
        }

        let m_max = self.topk / kp;
        let sparse = host
            .positions
            .iter()
            .any(|&p| (p as usize + 1) / kp > m_max);
        if !sparse {
            return Ok(None);
        }
        let h = self.heads;
        let q = b.download(&self.wq_b.forward(b, c_q)?)?.to_f32();
        let wts = b.download(&self.weights_proj.forward(b, x)?)?.to_f32();
        let (qs, hs) = (1.0 / (d as f32).sqrt(), 1.0 / (h as f32).sqrt());
        let width = self.width();
        let mut sel = vec![u32::MAX; n * width];
        for t in 0..n {
            let (s, p) = (host.token_seq[t] as usize, host.positions[t] as usize);
            let visible = (p + 1) / kp;
            let out = &mut sel[t * width..(t + 1) * width];
            let pools: Vec<usize> = if visible <= m_max {
                (0..visible).collect()
            } else {
                let scores: Vec<f32> = (0..visible)
                    .map(|pool| {
                        let r = row(s, pool * kp + kp - 1);
                        let key = &vals[r..r + d];
                        (0..h)
                            .map(|hh| {
                                let qh = &q[(t * h + hh) * d..(t * h + hh + 1) * d];
                                let dot: f32 = qh.iter().zip(key).map(|(a, b)| a * b).sum();
                                wts[t * h + hh] * hs * (dot * qs).max(0.0)
                            })
                            .sum()
                    })
                    .collect();
                best(&scores, m_max)
            };
            let mut i = 0;
            for pool in pools {
                for j in 0..kp {
                    out[i] = (pool * kp + j) as u32;
                    i += 1;
                }
            }
            if self.tail {
                for pos in visible * kp..=p {
                    out[i] = pos as u32;
                    i += 1;
                }
            }
        }
        Ok(Some(
            b.upload(&HostTensor::from_u32(vec![n, width], &sel)?)?,
        ))
    }
}
