//! The one decoder every architecture runs through: a token head around a stack of
//! [`Block`]s, each built from a [`LayerPlan`].
//!
//! ```text
//! h = embed[ids]
//! for each layer i:  h = block_i(h)        (block_i: plan.layers[i]; see layers/block.rs)
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```
//! An architecture file maps its `config.json` to a [`ModelPlan`] (which mixer, FFN and residual
//! each layer has, their widths, and the checkpoint's tensor names); [`Decoder::load`] turns the
//! plan into blocks and derives the cache spec from the mixers. A config that orders known layer
//! types differently therefore needs no new code.

use crate::cache::{CacheSpec, KvCache, LayerCacheSpec};
use crate::layers::{
    expand_streams, mean_streams, Attention, AttentionShape, Block, BlockFfn, BlockMixer,
    BlockResidual, DsaIndexer, ExpertNames, GptOssMoe, HyperConnection, Kda, KdaShape, Mla,
    MlaShape, MlaSparse, Mlp, Moe, MoeShape, PooledDsaIndexer, ResidualStream, RmsNorm, Rope,
};
use crate::models::{CausalLm, TokenHead};
use crate::parallel::{ContextParallel, CpStep};
use crate::weights::WeightLoader;
use anyhow::{bail, Result};
use dayone_backend::{Backend, DeviceStepMeta, MoeRouting, RopeStyle};

/// Rotary tables to build: inverse frequencies (see [`crate::config::rope_inv_freq`]), pairing
/// and the cos/sin multiplier.
#[derive(Clone, Debug, PartialEq)]
pub struct RopePlan {
    /// `[rot_dim / 2]`.
    pub inv_freq: Vec<f32>,
    /// How dims are paired.
    pub style: RopeStyle,
    /// YaRN attention factor (1 otherwise).
    pub mscale: f32,
}

/// DeepSeek-V3.2's lightning indexer on an MLA layer.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexerPlan {
    /// Indexer heads `H_i`.
    pub heads: usize,
    /// Indexer head width `d` (also its key cache row).
    pub head_dim: usize,
    /// Keys kept per query.
    pub topk: usize,
    /// Width of the query latent it reads.
    pub q_lora_rank: usize,
    /// Its rotary tables (half-split over the first `qk_rope_head_dim` dims).
    pub rope: RopePlan,
}

/// GLM-5.3-Flash's pooled DSA indexer on an MLA layer.
#[derive(Clone, Debug, PartialEq)]
pub struct PooledIndexerPlan {
    /// Indexer heads `H_i`.
    pub heads: usize,
    /// Indexer head width `d` (its cache row is `3d`: pooled key, raw key, pool gate).
    pub head_dim: usize,
    /// Tokens kept per query from the best pools (a multiple of `kpool`).
    pub topk: usize,
    /// Width of the query latent it reads.
    pub q_lora_rank: usize,
    /// Tokens per pool `K`.
    pub kpool: usize,
    /// Also attend to the query's incomplete pool.
    pub tail: bool,
}

/// Which keys a sparse MLA layer attends to.
#[derive(Clone, Debug, PartialEq)]
pub enum SparsePlan {
    /// DeepSeek-V3.2's per-token lightning indexer.
    Lightning(IndexerPlan),
    /// GLM-5.3-Flash's pooled indexer.
    Pooled(PooledIndexerPlan),
    /// The previous layer's selection (GLM-5.3-Flash `shared`; no indexer cache).
    Shared,
}

/// The token mixer of a layer.
#[derive(Clone, Debug, PartialEq)]
pub enum Mixer {
    /// GQA softmax attention over paged keys/values (Llama, Qwen3).
    Attention {
        /// Head counts and widths.
        shape: AttentionShape,
        /// Bias on q/k/v.
        bias: bool,
        /// Qwen3's per-head q/k RMSNorm epsilon.
        qk_norm: Option<f64>,
        /// Attend only to the last this-many positions (Mistral, sliding layers of Qwen2/3
        /// and gpt-oss).
        sliding_window: Option<usize>,
        /// gpt-oss's learned per-head sink logit (`{mixer}.sinks` `[H]`).
        sinks: bool,
        /// Rotary tables.
        rope: RopePlan,
    },
    /// Multi-head latent attention over the latent cache (DeepSeek-V3, Kimi-Linear).
    Mla {
        /// Widths.
        shape: MlaShape,
        /// Epsilon of the latent norms.
        latent_eps: f64,
        /// Softmax scale.
        scale: f32,
        /// Rotary tables over the `rope_dim` part; `None`: NoPE.
        rope: Option<RopePlan>,
        /// Sparse MLA: its DSA indexer (which adds an indexer-key cache row) or a shared
        /// selection.
        indexer: Option<SparsePlan>,
    },
    /// Kimi Delta Attention over per-sequence state.
    Kda {
        /// Widths.
        shape: KdaShape,
        /// Output norm epsilon.
        eps: f64,
        /// Forget-gate lower bound.
        lower_bound: Option<f64>,
    },
}

/// The feed-forward of a layer.
#[derive(Clone, Debug, PartialEq)]
pub enum Ffn {
    /// SwiGLU MLP of this width.
    Dense {
        /// Width `F`.
        intermediate: usize,
    },
    /// Routed and shared experts.
    Moe {
        /// Widths and expert counts.
        shape: MoeShape,
        /// Router settings.
        routing: MoeRouting,
    },
    /// gpt-oss's experts: biased router, softmax over the top-k, clamped GLU with biases
    /// ([`crate::layers::GptOssMoe`]).
    GptOssMoe {
        /// Routed experts `E`.
        experts: usize,
        /// Width `F` of each expert.
        expert_dim: usize,
        /// Experts per token.
        top_k: usize,
        /// Clamp of gate and up (`swiglu_limit`).
        limit: f64,
        /// Sigmoid slope of the gate (1.702).
        alpha: f64,
    },
}

/// How a layer adds to the residual stream.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Residual {
    /// `h += sublayer(norm(h))`, one stream.
    Plain,
    /// Hyper-connections over `n` streams (layers/hyper_connections.rs), with these
    /// settings; every layer of a model must have the same `n`.
    HyperConnections {
        /// Streams.
        n: usize,
        /// Floor of the mixing weights and Sinkhorn denominators.
        hc_eps: f64,
        /// Sinkhorn iterations.
        sinkhorn_iters: usize,
    },
}

/// What one decoder layer is.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerPlan {
    /// Attention, MLA or KDA.
    pub mixer: Mixer,
    /// Dense or MoE.
    pub ffn: Ffn,
    /// Epsilon of the two block norms.
    pub norm_eps: f64,
    /// Residual kind.
    pub residual: Residual,
    /// SwiGLU clamp of the FFN (dense, shared and routed experts): `min(g, l)`, `clamp(u, ±l)`.
    pub swiglu_limit: Option<f64>,
}

/// An architecture's checkpoint names (Hugging Face layout: `{layers}.{i}.{module}.…`).
#[derive(Clone, Copy, Debug)]
pub struct TensorNames {
    /// Prefix of the decoder layers, before the layer index (`model.layers`).
    pub layers: &'static str,
    /// Norm before the mixer.
    pub input_norm: &'static str,
    /// The mixer module.
    pub mixer: &'static str,
    /// The DSA indexer module inside the mixer.
    pub indexer: &'static str,
    /// Norm before the FFN.
    pub post_norm: &'static str,
    /// The FFN module, in probe order: the first (but the last) whose first tensor the checkpoint
    /// holds, else the last.
    pub ffn: &'static [&'static str],
    /// Per-expert projection spellings of MoE layers.
    pub experts: ExpertNames,
    /// Prefix of `embed_tokens` and the final `norm` (`model`).
    pub model: &'static str,
    /// Prefix of a layer's hyper-connection tensors, before `_fn`/`_base`/`_scale` (`hc_attn`,
    /// `hc_ffn`).
    pub hc: (&'static str, &'static str),
}

impl TensorNames {
    /// Hugging Face's Llama/DeepSeek names.
    pub const HF: TensorNames = TensorNames {
        layers: "model.layers",
        input_norm: "input_layernorm",
        mixer: "self_attn",
        indexer: "indexer",
        post_norm: "post_attention_layernorm",
        ffn: &["mlp"],
        experts: ExpertNames {
            gate: &["gate_proj"],
            up: &["up_proj"],
            down: &["down_proj"],
        },
        model: "model",
        hc: ("hc_attn", "hc_ffn"),
    };
}

/// A whole model: token head settings, names and one plan per layer.
#[derive(Clone, Debug)]
pub struct ModelPlan {
    /// Residual width `D`.
    pub hidden: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Final norm epsilon.
    pub norm_eps: f64,
    /// `lm_head` tied to the embedding.
    pub tied_embeddings: bool,
    /// Checkpoint names.
    pub names: TensorNames,
    /// The decoder layers in order.
    pub layers: Vec<LayerPlan>,
}

impl Mixer {
    /// What a layer with this mixer keeps in the cache.
    /// What the layer keeps per token (or per sequence), one rank of `world` splitting it
    /// ([`crate::parallel`]): attention keeps its key/value heads (at least one), KDA its heads'
    /// state and convolution history; MLA's latent cache is replicated.
    pub fn cache_spec_on(&self, world: usize) -> LayerCacheSpec {
        match (self.cache_spec(), world) {
            (spec, 1) => spec,
            (
                LayerCacheSpec::PagedKv {
                    kv_heads,
                    k_dim,
                    v_dim,
                },
                w,
            ) => LayerCacheSpec::PagedKv {
                kv_heads: (kv_heads / w).max(1),
                k_dim,
                v_dim,
            },
            (
                LayerCacheSpec::Recurrent {
                    convs,
                    conv_channels,
                    conv_taps,
                    heads,
                    k_dim,
                    v_dim,
                },
                w,
            ) => LayerCacheSpec::Recurrent {
                convs,
                conv_channels: conv_channels / w,
                conv_taps,
                heads: heads / w,
                k_dim,
                v_dim,
            },
            (spec, _) => spec,
        }
    }

    pub fn cache_spec(&self) -> LayerCacheSpec {
        match self {
            Mixer::Attention { shape, .. } => LayerCacheSpec::PagedKv {
                kv_heads: shape.kv_heads,
                k_dim: shape.head_dim,
                v_dim: shape.head_dim,
            },
            Mixer::Mla { shape, indexer, .. } => {
                let width = shape.kv_lora_rank + shape.rope_dim;
                match indexer {
                    Some(SparsePlan::Lightning(ix)) => LayerCacheSpec::PagedLatentIndexed {
                        width,
                        index_width: ix.head_dim,
                    },
                    Some(SparsePlan::Pooled(ix)) => LayerCacheSpec::PagedLatentIndexed {
                        width,
                        index_width: 3 * ix.head_dim,
                    },
                    Some(SparsePlan::Shared) | None => LayerCacheSpec::PagedLatent { width },
                }
            }
            Mixer::Kda { shape, .. } => LayerCacheSpec::Recurrent {
                convs: 3,
                conv_channels: shape.heads * shape.head_dim,
                conv_taps: shape.conv_width - 1,
                heads: shape.heads,
                k_dim: shape.head_dim,
                v_dim: shape.head_dim,
            },
        }
    }
}

impl ModelPlan {
    /// Checks that every layer splits over `world` ranks with experts over `ep` groups
    /// ([`crate::parallel`]) before anything is loaded or launched. Errors name the layer and
    /// the count that does not divide.
    pub fn check_parallel(&self, world: usize, ep: usize) -> Result<()> {
        use crate::parallel::{divides, expert_split, kv_split};
        for (i, l) in self.layers.iter().enumerate() {
            let layer = |e: anyhow::Error| {
                e.context(format!("layer {i} over tensor_parallel_size {world}"))
            };
            match &l.mixer {
                Mixer::Attention { shape, .. } => {
                    kv_split(0, world, shape.heads, shape.kv_heads).map(|_| ())
                }
                Mixer::Mla { shape, .. } => divides(shape.heads, world, "MLA heads"),
                Mixer::Kda { shape, .. } => divides(shape.heads, world, "KDA heads"),
            }
            .map_err(layer)?;
            match &l.ffn {
                Ffn::Dense { intermediate } => divides(*intermediate, world, "MLP channels"),
                Ffn::Moe { shape, .. } => {
                    expert_split(0, world, ep, shape.experts, shape.expert_dim)
                        .and_then(|_| divides(shape.shared_dim, world, "shared-expert channels"))
                }
                Ffn::GptOssMoe { .. } if world > 1 => Err(anyhow::anyhow!(
                    "gpt-oss experts do not split over several ranks yet"
                )),
                Ffn::GptOssMoe { .. } => Ok(()),
            }
            .map_err(layer)?;
        }
        Ok(())
    }

    /// Checks that every layer can run under context parallelism ([`crate::parallel::context`]):
    /// the pooled DSA indexer (GLM-5.3-Flash), which pools keys across the step, cannot yet.
    pub fn check_context_parallel(&self) -> Result<()> {
        for (i, l) in self.layers.iter().enumerate() {
            if let Mixer::Mla {
                indexer: Some(SparsePlan::Pooled(_)),
                ..
            } = &l.mixer
            {
                bail!("layer {i}: context parallelism does not split the pooled DSA indexer's steps yet (GLM-5.3-Flash); use --tensor-parallel-size");
            }
        }
        Ok(())
    }

    /// The per-layer cache specs, from the mixers.
    pub fn cache_spec(&self) -> CacheSpec {
        CacheSpec {
            layers: self.layers.iter().map(|l| l.mixer.cache_spec()).collect(),
        }
    }
}

/// A decoder-only model built from a [`ModelPlan`].
pub struct Decoder<B: Backend> {
    /// Embedding, final norm, LM head.
    pub head: TokenHead<B>,
    /// The decoder blocks.
    pub blocks: Vec<Block<B>>,
    /// Per-layer cache specs.
    pub spec: CacheSpec,
    /// Hyper-connection streams (`None`: a plain residual).
    pub streams: Option<usize>,
    /// Context parallelism: long steps split over these ranks ([`crate::parallel::context`]).
    pub cp: Option<ContextParallel<B>>,
}

fn rope<B: Backend>(b: &B, p: &RopePlan) -> Result<Rope<B>> {
    Rope::new(b, &p.inv_freq, p.style, p.mscale)
}

/// Builds layer `i` of `plan` from the checkpoint.
fn load_block<B: Backend>(
    w: &WeightLoader<B>,
    plan: &ModelPlan,
    i: usize,
    l: &LayerPlan,
) -> Result<Block<B>> {
    let names = &plan.names;
    let p = format!("{}.{i}", names.layers);
    let b = w.backend();
    let d = plan.hidden;
    let residual = match l.residual {
        Residual::Plain => BlockResidual::Plain,
        Residual::HyperConnections {
            n,
            hc_eps,
            sinkhorn_iters,
        } => {
            let hc = |name: &str, alt: &str| {
                HyperConnection::load(
                    w,
                    &format!("{p}.{name}"),
                    &format!("{p}.{alt}"),
                    (n, d),
                    (l.norm_eps, hc_eps, sinkhorn_iters),
                )
            };
            BlockResidual::Hyper {
                attn: hc(names.hc.0, "attn_hc")?,
                ffn: hc(names.hc.1, "ffn_hc")?,
            }
        }
    };
    let limit = l.swiglu_limit.map(|x| x as f32);
    let mixer_prefix = format!("{p}.{}", names.mixer);
    let input_norm = RmsNorm::load(w, &format!("{p}.{}", names.input_norm), d, l.norm_eps)?;
    let mixer =
        match &l.mixer {
            Mixer::Attention {
                shape,
                bias,
                qk_norm,
                sliding_window,
                sinks,
                rope: rp,
            } => {
                let attn = Attention::load(w, &mixer_prefix, *shape, *bias, *qk_norm)?
                    .with_extras(w, &mixer_prefix, *sinks, *sliding_window)?;
                BlockMixer::Attention(attn, rope(b, rp)?)
            }
            Mixer::Mla {
                shape,
                latent_eps,
                scale,
                rope: rp,
                indexer,
            } => {
                let mut mla = Mla::load(w, &mixer_prefix, *shape, *latent_eps, *scale)?;
                let ix_prefix = format!("{mixer_prefix}.{}", names.indexer);
                let mut sparse = MlaSparse::Own;
                match indexer {
                    Some(SparsePlan::Lightning(ix)) => {
                        mla.indexer = Some(DsaIndexer::load(
                            w,
                            &ix_prefix,
                            d,
                            ix.q_lora_rank,
                            (ix.heads, ix.head_dim, ix.topk),
                            rope(b, &ix.rope)?,
                        )?);
                    }
                    Some(SparsePlan::Pooled(ix)) => {
                        sparse = MlaSparse::Pooled(PooledDsaIndexer::load(
                            w,
                            &ix_prefix,
                            (d, ix.q_lora_rank),
                            (ix.heads, ix.head_dim, ix.topk, ix.kpool, ix.tail),
                        )?);
                    }
                    Some(SparsePlan::Shared) => sparse = MlaSparse::Shared,
                    None => {}
                }
                BlockMixer::Mla(
                    Box::new(mla),
                    rp.as_ref().map(|r| rope(b, r)).transpose()?,
                    sparse,
                )
            }
            Mixer::Kda {
                shape,
                eps,
                lower_bound,
            } => BlockMixer::Kda(Kda::load(w, &mixer_prefix, *shape, *eps, *lower_bound)?),
        };
    let post_norm = RmsNorm::load(w, &format!("{p}.{}", names.post_norm), d, l.norm_eps)?;
    // The FFN module: the first listed name whose first tensor is present, else the last.
    let ffn_prefix = |probe: &str| -> String {
        let (last, rest) = names.ffn.split_last().expect("TensorNames::ffn is empty");
        let found = rest.iter().find(|n| w.has(&format!("{p}.{n}.{probe}")));
        format!("{p}.{}", found.unwrap_or(last))
    };
    let ffn = match &l.ffn {
        Ffn::Dense { intermediate } => BlockFfn::Dense(
            Mlp::load(w, &ffn_prefix("gate_proj.weight"), d, *intermediate)?.with_limit(limit),
        ),
        Ffn::GptOssMoe {
            experts,
            expert_dim,
            top_k,
            limit,
            alpha,
        } => BlockFfn::GptOss(Box::new(GptOssMoe::load(
            w,
            &ffn_prefix("router.weight"),
            (d, *experts, *expert_dim, *top_k),
            *limit as f32,
            *alpha as f32,
        )?)),
        Ffn::Moe { shape, routing } => BlockFfn::Moe(Moe::load(
            w,
            &ffn_prefix("gate.weight"),
            *shape,
            *routing,
            &names.experts,
            limit,
        )?),
    };
    Ok(Block {
        residual,
        input_norm,
        mixer,
        post_norm,
        ffn,
    })
}

impl<B: Backend> Decoder<B> {
    /// Builds the blocks of `plan` from the checkpoint, then the token head.
    ///
    /// Errors: a missing tensor or one of the wrong shape (naming file, tensor, expected shape),
    /// or a planned layer kind that is not supported yet.
    pub fn load(w: &WeightLoader<B>, plan: &ModelPlan) -> Result<Self> {
        let streams = match plan.layers.first().map(|l| l.residual) {
            Some(Residual::HyperConnections { n, .. }) => Some(n),
            _ => None,
        };
        for (i, l) in plan.layers.iter().enumerate() {
            let n = match l.residual {
                Residual::HyperConnections { n, .. } => Some(n),
                Residual::Plain => None,
            };
            if n != streams {
                bail!("layer {i}: every layer must have the same residual streams ({streams:?}), got {n:?}");
            }
        }
        let blocks = plan
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                load_block(w, plan, i, l).map_err(|e| match w.parallel().world() {
                    1 => e,
                    n => e.context(format!("layer {i} over tensor_parallel_size {n}")),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head = TokenHead::load(
            w,
            plan.names.model,
            plan.vocab,
            plan.hidden,
            plan.norm_eps,
            plan.tied_embeddings,
        )?;
        let world = w.parallel().world();
        Ok(Self {
            head,
            blocks,
            spec: CacheSpec {
                layers: plan
                    .layers
                    .iter()
                    .map(|l| l.mixer.cache_spec_on(world))
                    .collect(),
            },
            streams,
            cp: None,
        })
    }

    /// The embedded step `h` through the blocks and the head: on one device (`cp: None`, `meta`
    /// the step's), or on this rank's slice of a context-parallel step (`meta` = `cp.local`),
    /// whose trace rows and logits rows are gathered from every rank so they are the whole step's.
    fn run_blocks(
        &self,
        b: &B,
        mut h: B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        cp: Option<&CpStep<B>>,
        mut trace: Option<&mut Vec<B::Tensor>>,
    ) -> Result<B::Tensor> {
        let gather = |x: B::Tensor| match cp {
            Some(cp) => cp.gather_tokens(b, &x),
            None => Ok(x),
        };
        if let Some(t) = trace.as_deref_mut() {
            t.push(gather(h.clone())?);
        }
        if let Some(n) = self.streams {
            h = expand_streams(b, &h, n)?;
        }
        // The one-stream view of `h` (the streams' mean with hyper-connections).
        let view = |h: &B::Tensor| -> Result<B::Tensor> {
            match self.streams {
                Some(n) => mean_streams(b, h, n),
                None => Ok(h.clone()),
            }
        };
        let mut sel = None;
        let mut r = ResidualStream::Sum(h);
        for (i, block) in self.blocks.iter().enumerate() {
            r = block.forward(b, r, meta, cache, i, &mut sel, cp)?;
            if trace.is_some() {
                let h = r.sum(b)?;
                let all = gather(view(&h)?)?;
                self.head
                    .trace(b, trace.as_deref_mut(), &all, i, self.blocks.len())?;
                r = ResidualStream::Sum(h);
            }
        }
        let h = r.sum(b)?;
        let logits = self.head.logits(b, &view(&h)?, meta)?;
        match cp {
            Some(cp) => cp.gather_logits(b, &logits),
            None => Ok(logits),
        }
    }
}

impl<B: Backend> CausalLm<B> for Decoder<B> {
    fn cache_spec(&self) -> CacheSpec {
        self.spec.clone()
    }

    fn forward(
        &self,
        b: &B,
        ids: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        trace: Option<&mut Vec<B::Tensor>>,
    ) -> Result<B::Tensor> {
        self.forward_spliced(b, ids, None, meta, cache, trace)
    }

    fn forward_spliced(
        &self,
        b: &B,
        ids: &B::Tensor,
        splice: Option<&super::EmbedSplice>,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        trace: Option<&mut Vec<B::Tensor>>,
    ) -> Result<B::Tensor> {
        let splice = splice.filter(|s| !s.rows.is_empty());
        if let Some(cp) = &self.cp {
            if let Some(step) = cp.plan(b, meta)? {
                if splice.is_some() {
                    bail!("image inputs are not supported under context parallelism yet");
                }
                let h = self.head.embed(b, &step.local_ids(b, ids)?)?;
                return self.run_blocks(b, h, &step.local, cache, Some(&step), trace);
            }
        }
        let h = self.head.embed(b, ids)?;
        if let Some(s) = splice {
            // The placeholders' embedding rows give way to the spliced rows (transformers'
            // `masked_scatter` of the image features).
            let dt = dayone_backend::TensorInfo::dtype(&h);
            let values = dayone_backend::HostTensor::from_f32_as(
                s.values.shape.clone(),
                &s.values.to_f32(),
                dt,
            )?;
            b.write_rows(&h, &s.rows, &values)?;
        }
        self.run_blocks(b, h, meta, cache, None, trace)
    }
}
