//! DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437; HF `modeling_deepseek_v3.py`), which also
//! loads Kimi-K2: pre-norm decoder layers of MLA attention and, after the first
//! `first_k_dense_replace` dense layers, a sigmoid-routed MoE with shared experts.
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += mla(rmsnorm_in(h));  h += (moe | mlp)(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```
//! The multi-token-prediction layers stored after `num_hidden_layers` are not loaded.

use crate::cache::{CacheSpec, KvCache, LayerCacheSpec};
use crate::config::{rope_inv_freq, DeepseekV3Config};
use crate::layers::{DsaIndexer, Mla, MlaShape, Mlp, Moe, MoeShape, RmsNorm, Rope};
use crate::models::{CausalLm, TokenHead};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, MoeRouting, RopeStyle};

/// The feed-forward half of a layer.
pub enum Ffn<B: Backend> {
    /// Dense SwiGLU.
    Dense(Mlp<B>),
    /// Routed experts plus shared experts.
    Moe(Moe<B>),
}

/// One decoder layer.
pub struct DecoderLayer<B: Backend> {
    /// Norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Multi-head latent attention.
    pub self_attn: Mla<B>,
    /// Norm before the feed-forward.
    pub post_attention_layernorm: RmsNorm<B>,
    /// Dense MLP or MoE.
    pub mlp: Ffn<B>,
}

/// A DeepSeek-V3-family model.
pub struct DeepseekV3<B: Backend> {
    /// Embedding, final norm, LM head.
    pub head: TokenHead<B>,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Rotary tables over the `qk_rope_head_dim` dims.
    pub rope: Rope<B>,
    /// `kv_lora_rank + qk_rope_head_dim`: latent cache width.
    pub cache_width: usize,
    /// DSA indexer key width (`index_head_dim`), when the model has indexers.
    pub index_width: Option<usize>,
}

impl<B: Backend> DeepseekV3<B> {
    /// Loads a `deepseek_v3` checkpoint.
    pub fn load(w: &WeightLoader<B>, c: &DeepseekV3Config) -> Result<Self> {
        let b = w.backend();
        let rp = c.rope();
        let inv_freq = rope_inv_freq(&rp, c.qk_rope_head_dim, 10000.0, c.max_position_embeddings)?;
        let style = if c.rope_interleave {
            RopeStyle::Interleaved
        } else {
            RopeStyle::HalfSplit
        };
        let mscale = rp.attention_factor(c.max_position_embeddings);
        let rope = Rope::new(b, &inv_freq, style, mscale)?;
        if c.num_nextn_predict_layers > 0 {
            tracing::info!(
                "skipping {} multi-token-prediction layer(s) for plain decoding",
                c.num_nextn_predict_layers
            );
        }
        let mla = MlaShape {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            q_lora_rank: c.q_lora_rank,
            kv_lora_rank: c.kv_lora_rank,
            nope_dim: c.qk_nope_head_dim,
            rope_dim: c.qk_rope_head_dim,
            v_dim: c.v_head_dim,
        };
        let routing = MoeRouting {
            top_k: c.num_experts_per_tok,
            n_group: c.n_group,
            topk_group: c.topk_group,
            norm_topk_prob: c.norm_topk_prob,
            routed_scaling_factor: c.routed_scaling_factor as f32,
        };
        let moe = MoeShape {
            hidden: c.hidden_size,
            experts: c.n_routed_experts,
            expert_dim: c.moe_intermediate_size,
            shared_dim: c.moe_intermediate_size * c.n_shared_experts.unwrap_or(0),
        };
        let scale = c.softmax_scale();
        let eps = c.rms_norm_eps;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(DecoderLayer {
                    input_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.input_layernorm"),
                        c.hidden_size,
                        eps,
                    )?,
                    self_attn: {
                        let mut attn = Mla::load(w, &format!("{p}.self_attn"), mla, 1e-6, scale)?;
                        // DeepSeek-V3.2: the indexer ropes half-split whatever the MLA's layout.
                        if let (Some(ix), Some(q_lora)) = (c.indexer(), c.q_lora_rank) {
                            let rope = Rope::new(b, &inv_freq, RopeStyle::HalfSplit, mscale)?;
                            let prefix = format!("{p}.self_attn.indexer");
                            attn.indexer = Some(DsaIndexer::load(
                                w,
                                &prefix,
                                c.hidden_size,
                                q_lora,
                                ix,
                                rope,
                            )?);
                        }
                        attn
                    },
                    post_attention_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.post_attention_layernorm"),
                        c.hidden_size,
                        eps,
                    )?,
                    mlp: if c.is_moe_layer(i) {
                        Ffn::Moe(Moe::load(w, &format!("{p}.mlp"), moe, routing)?)
                    } else {
                        Ffn::Dense(Mlp::load(
                            w,
                            &format!("{p}.mlp"),
                            c.hidden_size,
                            c.intermediate_size,
                        )?)
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let head = TokenHead::load(w, c.vocab_size, c.hidden_size, eps, c.tie_word_embeddings)?;
        Ok(Self {
            head,
            layers,
            rope,
            cache_width: c.kv_lora_rank + c.qk_rope_head_dim,
            index_width: c.indexer().map(|ix| ix.1),
        })
    }
}

impl<B: Backend> CausalLm<B> for DeepseekV3<B> {
    fn cache_spec(&self) -> CacheSpec {
        let layer = match self.index_width {
            Some(index_width) => LayerCacheSpec::PagedLatentIndexed {
                width: self.cache_width,
                index_width,
            },
            None => LayerCacheSpec::PagedLatent {
                width: self.cache_width,
            },
        };
        CacheSpec {
            layers: vec![layer; self.layers.len()],
        }
    }

    fn forward(
        &self,
        b: &B,
        ids: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        mut trace: Option<&mut Vec<B::Tensor>>,
    ) -> Result<B::Tensor> {
        let mut h = self.head.embed(b, ids)?;
        if let Some(t) = trace.as_deref_mut() {
            t.push(h.clone());
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let x = layer.input_layernorm.forward(b, &h)?;
            let a = layer.self_attn.forward(
                b,
                &x,
                Some(&self.rope),
                meta,
                cache.latent(i)?,
                cache.index_keys(i),
            )?;
            h = b.add(&h, &a)?;
            let x = layer.post_attention_layernorm.forward(b, &h)?;
            let m = match &layer.mlp {
                Ffn::Dense(mlp) => mlp.forward(b, &x)?,
                Ffn::Moe(moe) => moe.forward(b, &x)?,
            };
            h = b.add(&h, &m)?;
            self.head
                .trace(b, trace.as_deref_mut(), &h, i, self.layers.len())?;
        }
        self.head.logits(b, &h, meta)
    }
}
