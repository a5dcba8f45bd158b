//! One pre-norm decoder block, written once for every architecture (nano-vllm's
//! `Qwen3DecoderLayer`, gpt-fast's `TransformerBlock`):
//!
//! ```text
//! h += mixer(rmsnorm_in(h))          mixer: GQA attention | MLA (± RoPE, ± DSA indexer) | KDA
//! h += ffn(rmsnorm_post(h))          ffn:   SwiGLU MLP | MoE
//! ```
//! Which mixer and FFN a layer has comes from the model's layer plan
//! ([`crate::models::LayerPlan`]); the block only runs them. Layer `i` reads and writes cache
//! entry `i`, whose kind ([`crate::cache::LayerCacheSpec`]) the plan derived from the mixer.

use super::{Attention, Kda, Mla, Mlp, Moe, RmsNorm, Rope};
use crate::cache::KvCache;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta};

/// The token-mixing half of a block.
pub enum BlockMixer<B: Backend> {
    /// GQA softmax attention over the paged KV cache, with its rotary tables.
    Attention(Attention<B>, Rope<B>),
    /// Multi-head latent attention over the latent cache; `None`: NoPE (Kimi-Linear).
    Mla(Mla<B>, Option<Rope<B>>),
    /// Kimi Delta Attention over per-sequence recurrent state.
    Kda(Kda<B>),
}

/// The feed-forward half of a block.
pub enum BlockFfn<B: Backend> {
    /// Dense SwiGLU.
    Dense(Mlp<B>),
    /// Routed experts plus shared experts.
    Moe(Moe<B>),
}

/// One decoder block with a plain residual stream.
pub struct Block<B: Backend> {
    /// Norm before the mixer (`input_layernorm`).
    pub input_norm: RmsNorm<B>,
    /// Attention, MLA or KDA.
    pub mixer: BlockMixer<B>,
    /// Norm before the feed-forward (`post_attention_layernorm`).
    pub post_norm: RmsNorm<B>,
    /// Dense MLP or MoE.
    pub ffn: BlockFfn<B>,
}

impl<B: Backend> BlockMixer<B> {
    /// `x` `[N, D]` → `[N, D]`, reading and writing layer `layer`'s cache.
    pub fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        layer: usize,
    ) -> Result<B::Tensor> {
        match self {
            BlockMixer::Attention(attn, rope) => attn.forward(b, x, rope, meta, cache.kv(layer)?),
            BlockMixer::Mla(mla, rope) => mla.forward(
                b,
                x,
                rope.as_ref(),
                meta,
                cache.latent(layer)?,
                cache.index_keys(layer),
            ),
            BlockMixer::Kda(kda) => {
                let (conv, state) = cache.recurrent(layer)?;
                kda.forward(b, x, meta, conv, state)
            }
        }
    }
}

impl<B: Backend> BlockFfn<B> {
    /// `x` `[N, D]` → `[N, D]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        match self {
            BlockFfn::Dense(mlp) => mlp.forward(b, x),
            BlockFfn::Moe(moe) => moe.forward(b, x),
        }
    }
}

impl<B: Backend> Block<B> {
    /// The residual stream `h` `[N, D]` after this block (layer `layer` of the model).
    pub fn forward(
        &self,
        b: &B,
        h: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        layer: usize,
    ) -> Result<B::Tensor> {
        let x = self.input_norm.forward(b, h)?;
        let a = self.mixer.forward(b, &x, meta, cache, layer)?;
        let h = b.add(h, &a)?;
        let m = self.ffn.forward(b, &self.post_norm.forward(b, &h)?)?;
        b.add(&h, &m)
    }
}
