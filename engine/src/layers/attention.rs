//! Multi-head attention with GQA over the paged KV cache (Llama / Qwen3 style).
//!
//! Math (HF `LlamaAttention`, `Qwen3Attention`): `q = W_q x`, `k = W_k x`, `v = W_v x` split into
//! heads; Qwen3 applies RMSNorm per head to q and k before RoPE; RoPE on q and k; causal
//! `softmax(q·kᵀ / sqrt(hd)) v` per head, query head `h` reading KV head `h / (H/Hkv)`; `W_o`.
//! Optionally over a sliding window (Mistral, Qwen2/3 sliding layers, gpt-oss) and with a
//! learned sink logit per head in every softmax row (gpt-oss, HF `GptOssAttention`).

use super::{Addend, Linear, PreNorm, RmsNorm, Rope, RowLinear};
use crate::loader::Split;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{AttentionOptions, Backend, DeviceStepMeta, TensorInfo};

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

/// One attention layer's weights (this rank's heads when split over several ranks).
pub struct Attention<B: Backend> {
    /// Widths of this rank's part: `heads / world` query heads and its key/value heads.
    pub shape: AttentionShape,
    /// `[H·hd, D]`.
    pub q_proj: Linear<B>,
    /// `[Hkv·hd, D]`.
    pub k_proj: Linear<B>,
    /// `[Hkv·hd, D]`.
    pub v_proj: Linear<B>,
    /// `[D, H·hd]`, row-parallel.
    pub o_proj: RowLinear<B>,
    /// Qwen3's per-head norm of q, weight `[hd]`.
    pub q_norm: Option<RmsNorm<B>>,
    /// Qwen3's per-head norm of k, weight `[hd]`.
    pub k_norm: Option<RmsNorm<B>>,
    /// gpt-oss's per-head sink logits `[H]` f32 (this rank's heads).
    pub sinks: Option<B::Tensor>,
    /// Sliding window: a query sees the last this-many positions (itself included).
    pub window: Option<usize>,
}

impl<B: Backend> Attention<B> {
    /// Loads `{prefix}.{q,k,v,o}_proj` (+ `q_norm`/`k_norm` when `qk_norm`); `s` is the whole
    /// layer's shape. Over several ranks ([`WeightLoader::parallel`]) it keeps this rank's query
    /// heads and their key/value heads ([`crate::parallel::Parallel::kv_heads`]).
    ///
    /// Errors: missing or misshapen tensors; head counts that do not split over the ranks.
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        s: AttentionShape,
        bias: bool,
        qk_norm: Option<f64>,
    ) -> Result<Self> {
        let par = w.parallel();
        let (q_dim, kv_dim) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
        let (kv0, kvn) = par.kv_heads(s.heads, s.kv_heads)?;
        let kv_split = Split::along(0, s.kv_heads / kvn, kv0 / kvn);
        let norm = |name: &str| -> Result<Option<RmsNorm<B>>> {
            qk_norm
                .map(|eps| RmsNorm::load(w, &format!("{prefix}.{name}"), s.head_dim, eps))
                .transpose()
        };
        let kv = |name: &str| {
            Linear::load_split(
                w,
                &format!("{prefix}.{name}"),
                (kv_dim, s.hidden),
                bias,
                kv_split,
            )
        };
        Ok(Self {
            shape: AttentionShape {
                heads: s.heads / par.world(),
                kv_heads: kvn,
                ..s
            },
            q_proj: Linear::column(w, &format!("{prefix}.q_proj"), q_dim, s.hidden, bias)?,
            k_proj: kv("k_proj")?,
            v_proj: kv("v_proj")?,
            // Llama and gpt-oss bias o_proj with `attention_bias`; Qwen2 biases q/k/v only.
            o_proj: RowLinear::load(
                w,
                &format!("{prefix}.o_proj"),
                s.hidden,
                q_dim,
                bias && w.has(&format!("{prefix}.o_proj.bias")),
            )?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            sinks: None,
            window: None,
        })
    }

    /// Adds gpt-oss's sinks `{prefix}.sinks` `[H]` (this rank's heads) and a sliding window.
    pub fn with_extras(
        mut self,
        w: &WeightLoader<B>,
        prefix: &str,
        sinks: bool,
        window: Option<usize>,
    ) -> Result<Self> {
        if sinks {
            let par = w.parallel();
            let all = self.shape.heads * par.world();
            let t = w.host_split_f32(&format!("{prefix}.sinks"), &[all], par.split(0))?;
            self.sinks = Some(w.upload_f32(t)?);
        }
        self.window = window;
        Ok(self)
    }

    /// `t` `[N, h·hd]` as heads `[N, h, hd]`, each RMS-normed when `norm` is given (Qwen3).
    fn heads(&self, b: &B, t: B::Tensor, h: usize, norm: &Option<RmsNorm<B>>) -> Result<B::Tensor> {
        let (n, hd) = (t.shape()[0], self.shape.head_dim);
        let t = match norm {
            Some(norm) => norm.forward(b, &b.reshape(&t, &[n * h, hd])?)?,
            None => t,
        };
        b.reshape(&t, &[n, h, hd])
    }

    /// This step's new cache rows: keys `[N, Hkv, hd]` (normed, rotated) and values
    /// `[N, Hkv, hd]` of `x` `[N, D]` (what [`Attention::forward`] writes; context parallelism
    /// gathers them from every rank first).
    pub fn key_rows(
        &self,
        b: &B,
        x: &B::Tensor,
        rope: &Rope<B>,
        meta: &DeviceStepMeta<B::Tensor>,
    ) -> Result<(B::Tensor, B::Tensor)> {
        let [k, v] = Linear::forward_n(b, x, [&self.k_proj, &self.v_proj])?;
        let s = self.shape;
        let n = meta.host.num_tokens();
        let k = self.heads(b, k, s.kv_heads, &self.k_norm)?;
        let v = b.reshape(&v, &[n, s.kv_heads, s.head_dim])?;
        Ok((rope.forward(b, &k, &meta.positions)?, v))
    }

    /// `x` `[N, D]` (a pre-norm input: q, k and v take the norm in their own call where the
    /// backend fuses it) → `[N, D]`, `o_proj` still to project on one rank
    /// ([`RowLinear::forward_addend`]); writes this step's keys/values into `(k_cache, v_cache)`.
    pub fn forward(
        &self,
        b: &B,
        x: &PreNorm<B>,
        rope: &Rope<B>,
        meta: &DeviceStepMeta<B::Tensor>,
        kv: (&B::Tensor, &B::Tensor),
    ) -> Result<Addend<'_, B>> {
        let s = self.shape;
        let n = meta.host.num_tokens();
        let [q, k, v] = super::outputs(
            "q/k/v",
            x.linear_many(b, &[&self.q_proj, &self.k_proj, &self.v_proj])?,
        )?;
        let q = self.heads(b, q, s.heads, &self.q_norm)?;
        let k = self.heads(b, k, s.kv_heads, &self.k_norm)?;
        let v = b.reshape(&v, &[n, s.kv_heads, s.head_dim])?;
        let q = rope.forward_write_kv(b, &q, &k, &v, meta, kv)?;
        let scale = 1.0 / (s.head_dim as f32).sqrt();
        let opts = AttentionOptions {
            // A window no sequence of the step outgrows changes nothing: plain causal attention
            // (which every backend has).
            window: self.window.filter(|&w| meta.host.max_seq_len > w),
            sinks: self.sinks.as_ref(),
        };
        let o = b.paged_attention_ext(&q, kv.0, kv.1, meta, scale, &opts)?;
        // o_proj as the residual's addend: with the next norm in one call where it can be.
        self.o_proj
            .forward_addend(b, b.reshape(&o, &[n, s.heads * s.head_dim])?)
    }
}
