//! Llama (Touvron et al. 2023; HF `modeling_llama.py`): pre-norm decoder layers of GQA attention
//! with half-split RoPE and a SwiGLU MLP; final RMSNorm; `lm_head` (or the tied embedding).
//!
//! ```text
//! h = embed[ids]
//! for each layer:  h += attn(rmsnorm_in(h));  h += mlp(rmsnorm_post(h))
//! logits = lm_head(rmsnorm(h)[logit_rows])
//! ```

use crate::cache::{CacheSpec, KvCache};
use crate::config::{rope_inv_freq, LlamaConfig};
use crate::layers::{Attention, AttentionShape, Linear, Mlp, RmsNorm, Rope};
use crate::models::CausalLm;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, RopeStyle};

/// One decoder layer.
pub struct DecoderLayer<B: Backend> {
    /// Norm before attention.
    pub input_layernorm: RmsNorm<B>,
    /// Self-attention.
    pub self_attn: Attention<B>,
    /// Norm before the MLP.
    pub post_attention_layernorm: RmsNorm<B>,
    /// SwiGLU MLP.
    pub mlp: Mlp<B>,
}

/// A Llama-family model (also Qwen3, which adds per-head q/k norms).
pub struct Llama<B: Backend> {
    /// `[V, D]`.
    pub embed_tokens: B::Tensor,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Final norm.
    pub norm: RmsNorm<B>,
    /// `[V, D]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Linear<B>>,
    /// Shared rotary tables.
    pub rope: Rope<B>,
    /// Widths, for the cache spec.
    pub shape: AttentionShape,
}

impl<B: Backend> Llama<B> {
    /// Loads a `llama` checkpoint.
    pub fn load(w: &WeightLoader<B>, c: &LlamaConfig) -> Result<Self> {
        Self::load_with(w, c, None)
    }

    /// Loads the Llama skeleton; `qk_norm = Some(eps)` adds Qwen3's per-head q/k RMSNorm.
    pub fn load_with(w: &WeightLoader<B>, c: &LlamaConfig, qk_norm: Option<f64>) -> Result<Self> {
        let shape = AttentionShape {
            hidden: c.hidden_size,
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: c.head_dim(),
        };
        let b = w.backend();
        let inv_freq = rope_inv_freq(
            &c.rope(),
            shape.head_dim,
            10000.0,
            c.max_position_embeddings,
        )?;
        let rope = Rope::new(b, &inv_freq, RopeStyle::HalfSplit, 1.0)?;
        let embed_tokens = w.get("model.embed_tokens.weight", &[c.vocab_size, c.hidden_size])?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(DecoderLayer {
                    input_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.input_layernorm"),
                        c.hidden_size,
                        c.rms_norm_eps,
                    )?,
                    self_attn: Attention::load(
                        w,
                        &format!("{p}.self_attn"),
                        shape,
                        c.attention_bias,
                        qk_norm,
                    )?,
                    post_attention_layernorm: RmsNorm::load(
                        w,
                        &format!("{p}.post_attention_layernorm"),
                        c.hidden_size,
                        c.rms_norm_eps,
                    )?,
                    mlp: Mlp::load(w, &format!("{p}.mlp"), c.hidden_size, c.intermediate_size)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(w, "model.norm", c.hidden_size, c.rms_norm_eps)?;
        // Some tied checkpoints still ship `lm_head.weight`; use it when present.
        let lm_head = if !c.tie_word_embeddings || w.has("lm_head.weight") {
            Some(Linear::load(
                w,
                "lm_head",
                c.vocab_size,
                c.hidden_size,
                false,
            )?)
        } else {
            None
        };
        Ok(Self {
            embed_tokens,
            layers,
            norm,
            lm_head,
            rope,
            shape,
        })
    }
}

impl<B: Backend> CausalLm<B> for Llama<B> {
    fn cache_spec(&self) -> CacheSpec {
        CacheSpec::paged_kv(
            self.layers.len(),
            self.shape.kv_heads,
            self.shape.head_dim,
            self.shape.head_dim,
        )
    }

    fn forward(
        &self,
        b: &B,
        ids: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        mut trace: Option<&mut Vec<B::Tensor>>,
    ) -> Result<B::Tensor> {
        let mut h = b.embedding(&self.embed_tokens, ids)?;
        if let Some(t) = trace.as_deref_mut() {
            t.push(h.clone());
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let a = layer.self_attn.forward(
                b,
                &layer.input_layernorm.forward(b, &h)?,
                &self.rope,
                meta,
                cache.kv(i)?,
            )?;
            h = b.add(&h, &a)?;
            let m = layer
                .mlp
                .forward(b, &layer.post_attention_layernorm.forward(b, &h)?)?;
            h = b.add(&h, &m)?;
            // HF's `hidden_states`: the embedding, each layer's output but the last, then the
            // final norm of the last layer's output.
            if let Some(t) = trace.as_deref_mut() {
                t.push(if i + 1 < self.layers.len() {
                    h.clone()
                } else {
                    self.norm.forward(b, &h)?
                });
            }
        }
        let last = b.embedding(&h, &meta.logit_rows)?;
        let last = self.norm.forward(b, &last)?;
        match &self.lm_head {
            Some(head) => head.forward(b, &last),
            None => b.linear(&last, &self.embed_tokens, None),
        }
    }
}
