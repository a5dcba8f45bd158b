//! DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2-Exp report; HF
//! `DeepseekV32Indexer`): a cheap score of every past token, whose top-k the MLA then attends to.
//!
//! ```text
//! q = W_qb_idx c_q  → [H_i, d];  k = LayerNorm(W_k x) → [d]   (one key head, in its own cache)
//! RoPE (half-split) on the first qk_rope_head_dim dims of q and k
//! w = W_w x · H_i^−½
//! I(t, s) = Σ_h w_h · relu(d^−½ · q_h · k_s),  keep the index_topk largest s ≤ t
//! ```

use super::{Linear, Rope};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta};

/// One layer's indexer.
pub struct DsaIndexer<B: Backend> {
    /// `[H_i·d, q_lora_rank]`.
    pub wq_b: Linear<B>,
    /// `[d, D]`.
    pub wk: Linear<B>,
    /// LayerNorm weight and bias `[d]`.
    pub k_norm: (B::Tensor, B::Tensor),
    /// `[H_i, D]`.
    pub weights_proj: Linear<B>,
    /// Half-split RoPE over the first `qk_rope_head_dim` dims.
    pub rope: Rope<B>,
    /// Heads `H_i`.
    pub heads: usize,
    /// Head width `d`.
    pub head_dim: usize,
    /// Keys kept per query.
    pub topk: usize,
}

impl<B: Backend> DsaIndexer<B> {
    /// Loads `{prefix}.{wq_b, wk, k_norm, weights_proj}`.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        hidden: usize,
        q_lora: usize,
        (heads, head_dim, topk): (usize, usize, usize),
        rope: Rope<B>,
    ) -> Result<Self> {
        Ok(Self {
            wq_b: Linear::load(
                w,
                &format!("{prefix}.wq_b"),
                heads * head_dim,
                q_lora,
                false,
            )?,
            wk: Linear::load(w, &format!("{prefix}.wk"), head_dim, hidden, false)?,
            k_norm: (
                w.get(&format!("{prefix}.k_norm.weight"), &[head_dim])?,
                w.get(&format!("{prefix}.k_norm.bias"), &[head_dim])?,
            ),
            weights_proj: Linear::load(w, &format!("{prefix}.weights_proj"), heads, hidden, false)?,
            rope,
            heads,
            head_dim,
            topk,
        })
    }

    /// This step's new indexer key rows `[N, d]` of `x` `[N, D]` (LayerNorm, then RoPE), which
    /// [`DsaIndexer::select`] writes (context parallelism gathers them from every rank first).
    pub fn key_rows(
        &self,
        b: &B,
        x: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
    ) -> Result<B::Tensor> {
        let n = meta.host.num_tokens();
        let k = b.layer_norm(
            &self.wk.forward(b, x)?,
            &self.k_norm.0,
            &self.k_norm.1,
            1e-6,
        )?;
        let k = self
            .rope
            .forward(b, &b.reshape(&k, &[n, 1, self.head_dim])?, &meta.positions)?;
        b.reshape(&k, &[n, self.head_dim])
    }

    /// Writes this step's indexer keys into `k_cache` `[blocks, bs, d]` and returns the selected
    /// positions `[N, topk]` u32 (`u32::MAX` padding), or `None` when no query of the step has
    /// more than `topk` causal keys: the selection would be every key, so dense MLA is the same
    /// attention and the scoring is skipped. `x` `[N, D]`, `c_q` `[N, q_lora]`.
    pub fn select(
        &self,
        b: &B,
        x: &B::Tensor,
        c_q: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        k_cache: &B::Tensor,
    ) -> Result<Option<B::Tensor>> {
        let n = meta.host.num_tokens();
        b.write_cache(&self.key_rows(b, x, meta)?, k_cache, 0, meta)?;
        // Also the step's longest sequence: under context parallelism a rank's slice, whose
        // `max_seq_len` is the whole step's, decides as the whole step does.
        let last = meta.host.positions.iter().map(|&p| p as usize + 1).max();
        if last.unwrap_or(0).max(meta.host.max_seq_len) <= self.topk {
            return Ok(None);
        }
        let q = b.reshape(&self.wq_b.forward(b, c_q)?, &[n, self.heads, self.head_dim])?;
        let q = self.rope.forward(b, &q, &meta.positions)?;
        let weights = self.weights_proj.forward(b, x)?;
        let scale = 1.0 / (self.head_dim as f32).sqrt();
        Ok(Some(
            b.dsa_topk(&q, &weights, k_cache, meta, scale, self.topk)?,
        ))
    }
}
