//! Kimi-Linear (Moonshot AI 2025, arXiv:2510.26692; HF `modeling_kimi_linear.py`): a hybrid of
//! KDA linear-attention layers and NoPE MLA layers (which kind per layer comes from
//! `linear_attn_config`, whose lists are 1-based), with a dense first layer and sigmoid-routed
//! MoE after it.
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += (kda | mla)(rmsnorm_in(h));  h += (mlp | moe)(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```
//! KDA layers keep a fixed-size state per sequence (state slots); MLA layers keep the paged
//! latent cache `[c_kv | k_pe]` (`k_pe` unrotated: no RoPE anywhere).

use crate::cache::{CacheSpec, KvCache, LayerCacheSpec};
use crate::config::KimiLinearConfig;
use crate::layers::{Kda, KdaShape, Mla, MlaShape, Mlp, Moe, MoeShape, RmsNorm};
use crate::models::{CausalLm, TokenHead};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, MoeRouting};

/// The mixing half of a layer.
pub enum Mixer<B: Backend> {
    /// Kimi Delta Attention.
    Kda(Kda<B>),
    /// Multi-head latent attention without RoPE.
    Mla(Mla<B>),
}

/// The feed-forward half of a layer.
pub enum Ffn<B: Backend> {
    /// Dense SwiGLU.
    Dense(Mlp<B>),
    /// Routed + shared experts.
    Moe(Moe<B>),
}

/// One decoder layer.
pub struct DecoderLayer<B: Backend> {
    /// Norm before the mixer.
    pub input_layernorm: RmsNorm<B>,
    /// KDA or MLA.
    pub mixer: Mixer<B>,
    /// Norm before the feed-forward.
    pub post_attention_layernorm: RmsNorm<B>,
    /// Dense MLP or MoE.
    pub ffn: Ffn<B>,
}

/// A Kimi-Linear model.
pub struct KimiLinear<B: Backend> {
    /// Embedding, final norm, LM head.
    pub head: TokenHead<B>,
    /// Decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Per-layer cache specs.
    pub spec: CacheSpec,
}

impl<B: Backend> KimiLinear<B> {
    /// Loads a `kimi_linear` checkpoint (published names or transformers 5's).
    pub fn load(w: &WeightLoader<B>, c: &KimiLinearConfig) -> Result<Self> {
        let eps = c.rms_norm_eps;
        let kda = KdaShape {
            hidden: c.hidden_size,
            heads: c.kda_heads(),
            head_dim: c.kda_head_dim(),
            conv_width: c.conv_width(),
        };
        let mla = MlaShape {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            q_lora_rank: c.q_lora_rank,
            kv_lora_rank: c.kv_lora_rank,
            nope_dim: c.qk_nope_head_dim,
            rope_dim: c.qk_rope_head_dim,
            v_dim: c.v_head_dim,
        };
        let scale = 1.0 / ((c.qk_nope_head_dim + c.qk_rope_head_dim) as f32).sqrt();
        let routing = MoeRouting {
            top_k: c.num_experts_per_tok,
            n_group: c.n_group,
            topk_group: c.topk_group,
            // Kimi's reference renormalises only when more than one expert is chosen.
            norm_topk_prob: c.norm_topk_prob && c.num_experts_per_tok > 1,
            routed_scaling_factor: c.routed_scaling_factor as f32,
        };
        let moe = MoeShape {
            hidden: c.hidden_size,
            experts: c.num_local_experts,
            expert_dim: c.moe_intermediate_size,
            shared_dim: c.moe_intermediate_size * c.n_shared_experts.unwrap_or(0),
        };
        let mut spec = CacheSpec { layers: Vec::new() };
        let mut layers = Vec::new();
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let mixer = if c.is_kda_layer(i) {
                spec.layers.push(LayerCacheSpec::Recurrent {
                    convs: 3,
                    conv_channels: kda.heads * kda.head_dim,
                    conv_taps: kda.conv_width - 1,
                    heads: kda.heads,
                    k_dim: kda.head_dim,
                    v_dim: kda.head_dim,
                });
                let lb = c.linear_attn_config.gate_lower_bound;
                Mixer::Kda(Kda::load(w, &format!("{p}.self_attn"), kda, eps, lb)?)
            } else {
                spec.layers.push(LayerCacheSpec::PagedLatent {
                    width: c.kv_lora_rank + c.qk_rope_head_dim,
                });
                // transformers builds the latent norms with its default eps 1e-6.
                Mixer::Mla(Mla::load(w, &format!("{p}.self_attn"), mla, 1e-6, scale)?)
            };
            // Published checkpoints name the FFN `mlp` (dense) / `block_sparse_moe` (MoE);
            // transformers 5 saves both as `block_sparse_moe`.
            let ffn_prefix = |probe: &str| -> String {
                let moe_name = format!("{p}.block_sparse_moe");
                if w.has(&format!("{moe_name}.{probe}")) {
                    moe_name
                } else {
                    format!("{p}.mlp")
                }
            };
            let ffn = if c.is_moe_layer(i) {
                Ffn::Moe(Moe::load(w, &ffn_prefix("gate.weight"), moe, routing)?)
            } else {
                Ffn::Dense(Mlp::load(
                    w,
                    &ffn_prefix("gate_proj.weight"),
                    c.hidden_size,
                    c.intermediate_size,
                )?)
            };
            layers.push(DecoderLayer {
                input_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.input_layernorm"),
                    c.hidden_size,
                    eps,
                )?,
                mixer,
                post_attention_layernorm: RmsNorm::load(
                    w,
                    &format!("{p}.post_attention_layernorm"),
                    c.hidden_size,
                    eps,
                )?,
                ffn,
            });
        }
        let head = TokenHead::load(w, c.vocab_size, c.hidden_size, eps, c.tie_word_embeddings)?;
        Ok(Self { head, layers, spec })
    }
}

impl<B: Backend> CausalLm<B> for KimiLinear<B> {
    fn cache_spec(&self) -> CacheSpec {
        self.spec.clone()
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
            let a = match &layer.mixer {
                Mixer::Kda(kda) => {
                    let (conv, state) = cache.recurrent(i)?;
                    kda.forward(b, &x, meta, conv, state)?
                }
                Mixer::Mla(mla) => mla.forward(b, &x, None, meta, cache.latent(i)?, None)?,
            };
            h = b.add(&h, &a)?;
            let x = layer.post_attention_layernorm.forward(b, &h)?;
            let m = match &layer.ffn {
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
