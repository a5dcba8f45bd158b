//! One pre-norm decoder block, written once for every architecture (nano-vllm's
//! `Qwen3DecoderLayer`, gpt-fast's `TransformerBlock`):
//!
//! ```text
//! h += mixer(rmsnorm_in(h))          mixer: GQA attention | MLA (± RoPE, ± DSA indexer) | KDA
//! h += ffn(rmsnorm_post(h))          ffn:   SwiGLU MLP | MoE
//! ```
//! With hyper-connections (GLM-5.3-Flash) `h` is `n` streams `[N, n·D]` and each half is
//! `h = hc(h, |x| sublayer(rmsnorm(x)))` ([`HyperConnection::forward`]).
//! A `shared` sparse-MLA layer reads the selection of the layer before it, which the caller
//! carries from block to block.
//! Which mixer and FFN a layer has comes from the model's layer plan
//! ([`crate::models::LayerPlan`]); the block only runs them. Layer `i` reads and writes cache
//! entry `i`, whose kind ([`crate::cache::LayerCacheSpec`]) the plan derived from the mixer.

use super::{
    Addend, Attention, HyperConnection, Kda, Mla, MlaSparse, Mlp, Moe, PreNorm, RmsNorm, Rope,
    Selection,
};
use crate::cache::KvCache;
use crate::parallel::CpStep;
use anyhow::{bail, Result};
use dayone_backend::{Backend, DeviceStepMeta};

/// The token-mixing half of a block.
pub enum BlockMixer<B: Backend> {
    /// GQA softmax attention over the paged KV cache, with its rotary tables.
    Attention(Attention<B>, Rope<B>),
    /// Multi-head latent attention over the latent cache; `None`: NoPE (Kimi-Linear); how it
    /// picks its keys when sparse.
    Mla(Box<Mla<B>>, Option<Rope<B>>, MlaSparse<B>),
    /// Kimi Delta Attention over per-sequence recurrent state.
    Kda(Kda<B>),
}

/// The feed-forward half of a block.
pub enum BlockFfn<B: Backend> {
    /// Dense SwiGLU.
    Dense(Mlp<B>),
    /// Routed experts plus shared experts.
    Moe(Moe<B>),
    /// gpt-oss's biased experts.
    GptOss(Box<super::GptOssMoe<B>>),
}

/// How a block adds to the residual.
pub enum BlockResidual<B: Backend> {
    /// One stream: `h += sublayer(norm(h))`.
    Plain,
    /// Hyper-connections around the mixer and the FFN.
    Hyper {
        /// Around the mixer (`hc_attn_*`).
        attn: HyperConnection<B>,
        /// Around the FFN (`hc_ffn_*`).
        ffn: HyperConnection<B>,
    },
}

/// One decoder block.
pub struct Block<B: Backend> {
    /// Plain residual or hyper-connections.
    pub residual: BlockResidual<B>,
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
    /// `x` `[N, D]` (the pre-norm input: GQA attention and KDA take the norm inside their
    /// projections' call, MLA materialises it) → `[N, D]` (GQA attention's still to project:
    /// see [`Addend`]), reading and writing layer `layer`'s cache. `sel` carries the
    /// sparse-MLA selection from the previous layer and is replaced by this layer's (`None` when
    /// it selected nothing). Under context parallelism (`cp`; `x` and `meta` are this rank's
    /// slice) every rank's new key rows are gathered into the cache first, and a recurrent
    /// layer runs in turn after the ranks before it ([`CpStep`]).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        b: &B,
        input: &PreNorm<B>,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        layer: usize,
        sel: &mut Option<Selection<B>>,
        cp: Option<&CpStep<B>>,
    ) -> Result<Addend<'_, B>> {
        if let BlockMixer::Attention(attn, rope) = self {
            *sel = None;
            let kv = cache.kv(layer)?;
            if let Some(cp) = cp {
                let (k, v) = attn.key_rows(b, input.x(b)?, rope, meta)?;
                cp.write_kv(b, &k, &v, kv.0, kv.1)?;
            }
            return attn.forward(b, input, rope, meta, kv);
        }
        match self {
            BlockMixer::Attention(..) => unreachable!("handled above"),
            BlockMixer::Mla(mla, rope, sparse) => {
                let x = input.x(b)?;
                if let Some(cp) = cp {
                    if let MlaSparse::Pooled(_) = sparse {
                        bail!(
                            "context parallelism does not split the pooled DSA indexer's steps yet"
                        );
                    }
                    let latent = cache.latent(layer)?;
                    let (c_kv, k_pe) = mla.latent_rows(b, x, rope.as_ref(), meta)?;
                    cp.write_cache(b, &c_kv, latent, 0)?;
                    cp.write_cache(b, &k_pe, latent, mla.shape.kv_lora_rank)?;
                    if let (Some(ix), Some(keys)) = (&mla.indexer, cache.index_keys(layer)) {
                        cp.write_cache(b, &ix.key_rows(b, x, meta)?, keys, 0)?;
                    }
                }
                let (y, mine) = mla.forward_sparse(
                    b,
                    x,
                    rope.as_ref(),
                    meta,
                    cache.latent(layer)?,
                    cache.index_keys(layer),
                    sparse,
                    sel.as_ref(),
                )?;
                *sel = mine;
                Ok(Addend::Ready(y))
            }
            BlockMixer::Kda(kda) => {
                *sel = None;
                let (conv, state) = cache.recurrent(layer)?;
                match cp {
                    Some(cp) => {
                        let rows: Vec<&B::Tensor> = conv.iter().chain([state]).collect();
                        cp.chain(b, &rows, || kda.forward(b, input, meta, conv, state))
                    }
                    None => kda.forward(b, input, meta, conv, state),
                }
                .map(Addend::Ready)
            }
        }
    }
}

impl<B: Backend> BlockFfn<B> {
    /// `x` `[N, D]` (the pre-norm input: a dense MLP takes the norm inside its gate/up call,
    /// an MoE inside its router's, gpt-oss's MoE materialises it) → `[N, D]` (the dense MLP's
    /// still to project: see [`Addend`]).
    pub fn forward(&self, b: &B, input: &PreNorm<B>) -> Result<Addend<'_, B>> {
        match self {
            BlockFfn::Dense(mlp) => mlp.forward_pre(b, input),
            BlockFfn::Moe(moe) => moe.forward_pre(b, input).map(Addend::Ready),
            BlockFfn::GptOss(moe) => moe.forward(b, input.x(b)?).map(Addend::Ready),
        }
    }
}

/// The residual stream between blocks: summed, or the previous plain block's `h` and
/// feed-forward output `m` not yet added — the next plain block adds them in the same launch as
/// its input norm ([`Backend::add_rms_norm`], or with `m`'s projection:
/// [`Backend::linear_add_rms_norm`]; bit-equal to adding first).
pub enum ResidualStream<'a, B: Backend> {
    /// `[N, D]` (or `[N, n·D]` streams).
    Sum(B::Tensor),
    /// `h + m`, both `[N, D]`.
    Pending(B::Tensor, Addend<'a, B>),
}

impl<B: Backend> ResidualStream<'_, B> {
    /// The summed residual (one `add` for a pending one, after its projection).
    pub fn sum(self, b: &B) -> Result<B::Tensor> {
        match self {
            ResidualStream::Sum(h) => Ok(h),
            ResidualStream::Pending(h, m) => m.add_to(b, &h),
        }
    }
}

impl<B: Backend> Block<B> {
    /// The residual `h` (`[N, D]`, or `[N, n·D]` streams with hyper-connections) after this
    /// block (layer `layer` of the model); `sel` and `cp` as in [`BlockMixer::forward`] (the
    /// feed-forward is token-local). A plain block leaves its last add pending.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<'a>(
        &'a self,
        b: &B,
        h: ResidualStream<'a, B>,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        layer: usize,
        sel: &mut Option<Selection<B>>,
        cp: Option<&CpStep<B>>,
    ) -> Result<ResidualStream<'a, B>> {
        match &self.residual {
            BlockResidual::Plain => {
                let (h, m) = match h {
                    ResidualStream::Sum(h) => (h, None),
                    ResidualStream::Pending(h, m) => (h, Some(m)),
                };
                let input = PreNorm::new(&self.input_norm, &h, m.as_ref());
                let a = self.mixer.forward(b, &input, meta, cache, layer, sel, cp)?;
                let h = input.into_sum(b)?;
                let post = PreNorm::new(&self.post_norm, &h, Some(&a));
                let m = self.ffn.forward(b, &post)?;
                Ok(ResidualStream::Pending(post.into_sum(b)?, m))
            }
            BlockResidual::Hyper { attn, ffn } => {
                let h = &h.sum(b)?;
                let h = attn.forward(b, h, |x| {
                    let input = PreNorm::new(&self.input_norm, x, None);
                    self.mixer
                        .forward(b, &input, meta, cache, layer, sel, cp)?
                        .tensor(b)
                })?;
                ffn.forward(b, &h, |x| {
                    self.ffn
                        .forward(b, &PreNorm::new(&self.post_norm, x, None))?
                        .tensor(b)
                })
                .map(ResidualStream::Sum)
            }
        }
    }
}
