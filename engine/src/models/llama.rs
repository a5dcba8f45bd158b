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
use crate::layers::{Attention, AttentionShape, Mlp, RmsNorm, Rope};
use crate::models::{CausalLm, TokenHead};
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
    /// Embedding, final norm, LM head.
    pub head: TokenHead<B>,
    /// The decoder layers.
    pub layers: Vec<DecoderLayer<B>>,
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
        let head = TokenHead::load(
            w,
            c.vocab_size,
            c.hidden_size,
            c.rms_norm_eps,
            c.tie_word_embeddings,
        )?;
        Ok(Self {
            head,
            layers,
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
        let mut h = self.head.embed(b, ids)?;
        if let Some(t) = trace.as_deref_mut() {
            t.push(h.clone());
        }
        for (i, layer) in self.layers.iter().enumerate() {
            let x = layer.input_layernorm.forward(b, &h)?;
            let a = layer
                .self_attn
                .forward(b, &x, &self.rope, meta, cache.kv(i)?)?;
            h = b.add(&h, &a)?;
            let m = layer
                .mlp
                .forward(b, &layer.post_attention_layernorm.forward(b, &h)?)?;
            h = b.add(&h, &m)?;
            self.head
                .trace(b, trace.as_deref_mut(), &h, i, self.layers.len())?;
        }
        self.head.logits(b, &h, meta)
    }
}
