//! Multi-head attention with GQA over the paged KV cache (Llama / Qwen3 style).
//!
//! Math (HF `LlamaAttention`, `Qwen3Attention`): `q = W_q x`, `k = W_k x`, `v = W_v x` split into
//! heads; Qwen3 applies RMSNorm per head to q and k before RoPE; RoPE on q and k; causal
//! `softmax(q·kᵀ / sqrt(hd)) v` per head, query head `h` reading KV head `h / (H/Hkv)`; `W_o`.

use super::{Linear, RmsNorm, Rope};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta};

/// Head counts and widths of an attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Residual width `D`.
    pub hidden: usize,
    /// Query heads `H`.
    pub heads: usize,
    /// Key/value heads `Hkv`.
    pub kv_heads: usize,
    /// Per-head width `hd`.
    pub head_dim: usize,
}

/// One attention layer's weights.
pub struct Attention<B: Backend> {
    /// Widths.
    pub shape: AttentionShape,
    /// `[H·hd, D]`.
    pub q_proj: Linear<B>,
    /// `[Hkv·hd, D]`.
    pub k_proj: Linear<B>,
    /// `[Hkv·hd, D]`.
    pub v_proj: Linear<B>,
    /// `[D, H·hd]`.
    pub o_proj: Linear<B>,
    /// Qwen3's per-head norm of q, weight `[hd]`.
    pub q_norm: Option<RmsNorm<B>>,
    /// Qwen3's per-head norm of k, weight `[hd]`.
    pub k_norm: Option<RmsNorm<B>>,
}

impl<B: Backend> Attention<B> {
    /// Loads `{prefix}.{q,k,v,o}_proj` (+ `q_norm`/`k_norm` when `qk_norm`).
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        s: AttentionShape,
        bias: bool,
        qk_norm: Option<f64>,
    ) -> Result<Self> {
        let (q_dim, kv_dim) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let norm = |name: &str| -> Result<Option<RmsNorm<B>>> {
            qk_norm
                .map(|eps| RmsNorm::load(w, &format!("{prefix}.{name}"), s.head_dim, eps))
                .transpose()
        };
        Ok(Self {
            shape: s,
            q_proj: Linear::load(w, &format!("{prefix}.q_proj"), q_dim, s.hidden, bias)?,
            k_proj: Linear::load(w, &format!("{prefix}.k_proj"), kv_dim, s.hidden, bias)?,
            v_proj: Linear::load(w, &format!("{prefix}.v_proj"), kv_dim, s.hidden, bias)?,
            o_proj: Linear::load(w, &format!("{prefix}.o_proj"), s.hidden, q_dim, false)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
        })
    }

    /// `x` `[N, D]` → `[N, D]`; writes this step's keys/values into `(k_cache, v_cache)`.
    pub fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        rope: &Rope<B>,
        meta: &DeviceStepMeta<B::Tensor>,
        kv: (&B::Tensor, &B::Tensor),
    ) -> Result<B::Tensor> {
        let s = self.shape;
        let n = meta.host.num_tokens();
        let heads = |t: B::Tensor, h: usize, norm: &Option<RmsNorm<B>>| -> Result<B::Tensor> {
            let t = match norm {
                Some(norm) => norm.forward(b, &b.reshape(&t, &[n * h, s.head_dim])?)?,
                None => t,
            };
            b.reshape(&t, &[n, h, s.head_dim])
        };
        let q = heads(self.q_proj.forward(b, x)?, s.heads, &self.q_norm)?;
        let k = heads(self.k_proj.forward(b, x)?, s.kv_heads, &self.k_norm)?;
        let v = b.reshape(&self.v_proj.forward(b, x)?, &[n, s.kv_heads, s.head_dim])?;
        let q = rope.forward(b, &q, &meta.positions)?;
        let k = rope.forward(b, &k, &meta.positions)?;
        b.write_kv(&k, &v, kv.0, kv.1, meta)?;
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let o = b.paged_attention(&q, kv.0, kv.1, meta, scale)?;
        self.o_proj
            .forward(b, &b.reshape(&o, &[n, s.heads * s.head_dim])?)
    }
}
