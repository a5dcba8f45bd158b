//! What every decoder-only model here shares around its layers: the token embedding, the final
//! RMSNorm and the LM head (or the tied embedding), plus HF's `hidden_states` trace order.
//!
//! Over several ranks both are split by vocabulary rows when the vocabulary divides (vLLM's
//! `VocabParallelEmbedding` / `ParallelLMHead`): a rank looks up the tokens in its rows (the
//! others read a zero row) and the ranks' lookups are summed; each rank's logits for its rows
//! are gathered and put back in vocabulary order. Otherwise both are replicated.

use crate::layers::{Linear, RmsNorm, Weight};
use crate::parallel::Parallel;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DType, DeviceStepMeta, HostTensor, TensorInfo};

/// Embedding `[V, D]`, final norm and LM head.
pub struct TokenHead<B: Backend> {
    /// `{model}.embed_tokens.weight` `[V, D]` (`model` is the architecture's prefix), kept
    /// quantized when the checkpoint stores it so (GGUF Q8_0 tables: looked-up rows decoded);
    /// split by vocabulary: this rank's `[V / world, D]` rows then one zero row.
    pub embed_tokens: Weight<B>,
    /// The dtype looked-up rows of a quantized table are decoded to (the storage dtype).
    pub embed_dtype: DType,
    /// `model.norm`.
    pub norm: RmsNorm<B>,
    /// `lm_head` `[V, D]` (split: this rank's `[V / world, D]`); `None` when tied to the
    /// embedding on one rank.
    pub lm_head: Option<Linear<B>>,
    /// The vocabulary split over the ranks: `(first row, rows)` of this rank; `None`: whole.
    pub vocab_rows: Option<(usize, usize)>,
    /// The ranks.
    pub parallel: Parallel<B>,
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
        let par = w.parallel();
        let world = par.world();
        let embed = format!("{model}.embed_tokens.weight");
        let head_name = if !tied || w.has("lm_head.weight") {
            Some("lm_head.weight")
        } else {
            None
        };
        if world == 1 || !vocab.is_multiple_of(world) {
            if world > 1 {
                eprintln!("note: vocab_size {vocab} does not split over tensor_parallel_size {world}: the embedding and LM head are replicated");
            }
            return Ok(Self {
                lm_head: head_name
                    .map(|_| Linear::load(w, "lm_head", vocab, hidden, false))
                    .transpose()?,
                embed_tokens: w.get_weight(&format!("{model}.embed_tokens"), vocab, hidden)?,
                embed_dtype: w.backend().activation_dtype(w.dtype()),
                norm: RmsNorm::load(w, &format!("{model}.norm"), hidden, eps)?,
                vocab_rows: None,
                parallel: par.clone(),
            });
        }
        let rows = par.split(0);
        let per = vocab / world;
        let mut table = w.host_split(&embed, &[vocab, hidden], rows)?;
        let head = match head_name {
            Some(n) => w.host_split(n, &[vocab, hidden], rows)?,
            // Tied: the head is the rank's embedding rows, kept without the zero row.
            None => table.clone(),
        };
        table.shape[0] += 1;
        table
            .data
            .resize(table.data.len() + hidden * table.dtype.size(), 0);
        Ok(Self {
            embed_tokens: Weight::Dense(w.upload(table)?),
            embed_dtype: w.backend().activation_dtype(w.dtype()),
            norm: RmsNorm::load(w, &format!("{model}.norm"), hidden, eps)?,
            lm_head: Some(Linear {
                weight: Weight::Dense(w.upload(head)?),
                bias: None,
            }),
            vocab_rows: Some((par.rank() * per, per)),
            parallel: par.clone(),
        })
    }

    /// `ids` `[N]` u32 → `[N, D]`. Split by vocabulary: ids outside this rank's rows read its
    /// zero row, and the ranks' lookups are summed (each token found on exactly one rank).
    pub fn embed(&self, b: &B, ids: &B::Tensor) -> Result<B::Tensor> {
        let table = match &self.embed_tokens {
            Weight::Dense(t) => t,
            Weight::Quant(q) => {
                // Decode only the looked-up rows: the table seen as `[V, 1, D]` items.
                let [_, v, d] = q.shape;
                let n = ids.shape()[0];
                let out = b.zeros(&[n, 1, d], self.embed_dtype)?;
                b.dequantize_into(&q.reshaped([v, 1, d])?, ids, &out)?;
                return b.reshape(&out, &[n, d]);
            }
        };
        let Some((first, rows)) = self.vocab_rows else {
            return b.embedding(table, ids);
        };
        let local: Vec<u32> = b
            .download(ids)?
            .to_u32()?
            .into_iter()
            .map(|t| match (t as usize).checked_sub(first) {
                Some(i) if i < rows => i as u32,
                _ => rows as u32,
            })
            .collect();
        let local = b.upload(&HostTensor::from_u32(vec![local.len()], &local)?)?;
        self.parallel.all_reduce(b, &b.embedding(table, &local)?)
    }

    /// Each rank's logits `[M, V / world]` gathered into `[M, V]` in vocabulary order: the
    /// all-gather stacks them `[world·M, V / world]` by rank; row `m·world + r` of the result
    /// (seen as `[M·world, V / world]`) is row `r·M + m` of that, one row gather.
    fn gather_vocab(&self, b: &B, local: &B::Tensor) -> Result<B::Tensor> {
        let (m, per) = (local.shape()[0], local.shape()[1]);
        let w = self.parallel.world();
        let all = self.parallel.comm.all_gather(b, local)?;
        if m == 0 {
            return b.reshape(&all, &[0, w * per]);
        }
        let order: Vec<u32> = (0..m)
            .flat_map(|row| (0..w).map(move |r| (r * m + row) as u32))
            .collect();
        let order = b.upload(&HostTensor::from_u32(vec![order.len()], &order)?)?;
        b.reshape(&b.embedding(&all, &order)?, &[m, w * per])
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
        let logits = match &self.lm_head {
            Some(head) => head.forward(b, &last)?,
            None => self.embed_tokens.forward(b, &last, None)?,
        };
        match self.vocab_rows {
            Some(_) => self.gather_vocab(b, &logits),
            None => Ok(logits),
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
