//! What every decoder-only model here shares around its layers: the token embedding, the final
//! RMSNorm and the LM head (or the tied embedding), plus HF's `hidden_states` trace order.

use crate::layers::{Linear, RmsNorm};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta};

/// Embedding `[V, D]`, final norm and LM head.
pub struct TokenHead<B: Backend> {
    /// `{model}.embed_tokens.weight` `[V, D]` (`model` is the architecture's prefix).
    pub embed_tokens: B::Tensor,
    /// `model.norm`.
    pub norm: RmsNorm<B>,
    /// `lm_head` `[V, D]`; `None` when tied to the embedding.
    pub lm_head: Option<Linear<B>>,
}

impl<B: Backend> TokenHead<B> {
    /// Loads the three; a tied checkpoint that still ships `lm_head.weight` uses it.
    pub fn load(
        w: &WeightLoader<B>,
        model: &str,
        vocab: usize,
        hidden: usize,
        eps: f64,
        tied: bool,
    ) -> Result<Self> {
        let lm_head = if !tied || w.has("lm_head.weight") {
            Some(Linear::load(w, "lm_head", vocab, hidden, false)?)
        } else {
            None
        };
        Ok(Self {
            embed_tokens: w.get(&format!("{model}.embed_tokens.weight"), &[vocab, hidden])?,
            norm: RmsNorm::load(w, &format!("{model}.norm"), hidden, eps)?,
            lm_head,
        })
    }

    /// `ids` `[N]` u32 → `[N, D]`.
    pub fn embed(&self, b: &B, ids: &B::Tensor) -> Result<B::Tensor> {
        b.embedding(&self.embed_tokens, ids)
    }

    /// Logits `[M, V]` of the rows `meta.logit_rows` of `h` `[N, D]` (norm is per row, so the
    /// rows are gathered first).
    pub fn logits(
        &self,
        b: &B,
        h: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
    ) -> Result<B::Tensor> {
        let last = self.norm.forward(b, &b.embedding(h, &meta.logit_rows)?)?;
        match &self.lm_head {
            Some(head) => head.forward(b, &last),
            None => b.linear(&last, &self.embed_tokens, None),
        }
    }

    /// Records `h` after layer `layer` of `layers` in HF's `hidden_states` order: each layer's
    /// output but the last, then the final norm of the last layer's output.
    pub fn trace(
        &self,
        b: &B,
        trace: Option<&mut Vec<B::Tensor>>,
        h: &B::Tensor,
        layer: usize,
        layers: usize,
    ) -> Result<()> {
        if let Some(t) = trace {
            t.push(if layer + 1 < layers {
                h.clone()
            } else {
                self.norm.forward(b, h)?
            });
        }
        Ok(())
    }
}
