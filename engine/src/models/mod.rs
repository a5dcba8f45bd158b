//! Architectures, one small file each, mapping a `config.json` to a per-layer [`ModelPlan`]
//! ([`registry`] lists them); every plan runs through the one [`Decoder`]. A model turns a step's
//! token ids into logits, reading and writing its cache; it knows the [`Backend`] trait and
//! nothing about which backend runs it.

mod decoder;
mod deepseek_v3;
mod deepseek_v32;
mod glm5_next;
mod gpt_oss;
mod kimi_k25;
mod kimi_linear;
mod kimi_vl;
mod llama;
mod qwen2;
mod qwen3;
pub mod registry;
mod token_head;

pub use decoder::{
    Decoder, Ffn, IndexerPlan, LayerPlan, Mixer, ModelPlan, PooledIndexerPlan, Residual, RopePlan,
    SparsePlan, TensorNames,
};
pub use registry::{architecture, layer_plan, Architecture, ARCHITECTURES};
pub use token_head::TokenHead;

use crate::cache::{CacheSpec, KvCache};
use crate::config::ModelConfig;
use crate::loader::Checkpoint;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DType, DeviceStepMeta};

/// A decoder-only language model.
pub trait CausalLm<B: Backend>: Send + Sync {
    /// What the model keeps per token (and per sequence) in its cache.
    fn cache_spec(&self) -> CacheSpec;

    /// One forward step over `ids` `[N]` u32 described by `meta`; returns logits `[M, V]` for
    /// the rows in `meta.logit_rows`, in the activation dtype. When `trace` is given, the hidden
    /// state `[N, D]` after the embedding and after each layer is pushed to it (for `dayone check`).
    fn forward(
        &self,
        b: &B,
        ids: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        trace: Option<&mut Vec<B::Tensor>>,
    ) -> Result<B::Tensor>;

    /// [`CausalLm::forward`] with some embedding rows replaced ([`EmbedSplice`]: image rows at
    /// their placeholders). The default refuses a splice (a text-only model) and otherwise runs
    /// [`CausalLm::forward`].
    fn forward_spliced(
        &self,
        b: &B,
        ids: &B::Tensor,
        splice: Option<&EmbedSplice>,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &KvCache<B>,
        trace: Option<&mut Vec<B::Tensor>>,
    ) -> Result<B::Tensor> {
        if splice.is_some_and(|s| !s.rows.is_empty()) {
            anyhow::bail!("this model takes no image inputs");
        }
        self.forward(b, ids, meta, cache, trace)
    }
}

/// Embedding rows of one step replaced by precomputed rows (the projected image features at
/// their placeholder tokens); the decoder sees embeddings, never pixels.
#[derive(Clone, Debug)]
pub struct EmbedSplice {
    /// Step rows (indices into the step's `[N]` tokens) to replace, `[K]`.
    pub rows: Vec<u32>,
    /// The replacement rows `[K, D]`, any float dtype (converted to the activation dtype).
    pub values: dayone_backend::HostTensor,
}

/// How a model is built beyond its checkpoint.
pub struct LoadOptions<B: Backend> {
    /// This rank's split ([`crate::parallel::Parallel::single`] on one device).
    pub parallel: crate::parallel::Parallel<B>,
    /// Which form MLA prefill takes ([`crate::EngineConfig::mla_prefill`]).
    pub mla_prefill: crate::layers::MlaPrefill,
    /// Keep block-quantized weights in their low-bit form ([`WeightLoader::with_keep_quantized`]).
    pub keep_quantized: bool,
    /// FP8 expert GEMM for the low-bit experts ([`WeightLoader::with_moe_fp8`]).
    pub moe_fp8: bool,
    /// Under context parallelism (`parallel.context`), the smallest step that is split
    /// ([`crate::parallel::ContextParallel`]).
    pub context_parallel_min_tokens: usize,
}

/// Builds the model that `config` names from a checkpoint, storing float weights as `dtype`:
/// its architecture's [`ModelPlan`] run through the one [`Decoder`], this rank's slices of it
/// when `options.parallel` splits it over several ranks; with the bytes of weights it uploaded.
///
/// Errors: a missing tensor or one of the wrong shape (naming file, tensor, expected shape).
pub fn load_model<B: Backend>(
    b: &B,
    config: &ModelConfig,
    ckpt: &Checkpoint,
    dtype: DType,
    progress: Option<&dyn Fn(usize, usize)>,
    options: LoadOptions<B>,
) -> Result<(Box<dyn CausalLm<B>>, u64)> {
    crate::loader::warn_layers_beyond(ckpt.tensors.as_ref(), config.stored_layers());
    let context = options.parallel.context.clone();
    // A multimodal checkpoint's text model, seen under plain HF names.
    let text_view;
    let tensors: &dyn crate::loader::TensorSource = match config {
        ModelConfig::KimiK25(_) => {
            text_view = crate::loader::TextModelView::new(ckpt.tensors.as_ref());
            &text_view
        }
        _ => ckpt.tensors.as_ref(),
    };
    let mut w = WeightLoader::new(b, tensors, dtype)
        .with_parallel(options.parallel)
        .with_mla_prefill(options.mla_prefill)
        .with_keep_quantized(options.keep_quantized)
        .with_moe_fp8(options.moe_fp8);
    if let Some(p) = progress {
        w = w.with_progress(p);
    }
    let plan = layer_plan(config)?;
    if context.is_some() {
        plan.check_context_parallel()?;
    }
    let mut model = Decoder::load(&w, &plan)?;
    if w.moe_fp8() && w.parallel().is_first() {
        // Each low-bit expert layer made or shared a decode workspace; none: nothing to run in FP8.
        if let Some(note) = moe_fp8_unused(!w.workspaces().borrow().is_empty(), w.keeps_quantized())
        {
            tracing::warn!("{note}");
        }
    }
    if let Some(comm) = context {
        model.cp = Some(crate::parallel::ContextParallel::new(
            comm,
            options.context_parallel_min_tokens,
            b.recurrent_split_alignment(),
        ));
    }
    Ok((Box::new(model), w.loaded_bytes()))
}

/// Why `--moe-fp8` changes nothing for a model, or `None` when it has low-bit (MXFP4, INT4)
/// routed experts kept low-bit (`quant_experts`); `keeps_quantized`: whether block-quantized
/// weights stay low-bit at all ([`WeightLoader::keeps_quantized`]).
fn moe_fp8_unused(quant_experts: bool, keeps_quantized: bool) -> Option<String> {
    if quant_experts {
        None
    } else if !keeps_quantized {
        Some(
            "--moe-fp8 has no effect: low-bit weights are decoded at load (--dequantize-at-load, \
             or -tp > 1), so no MXFP4 / INT4 experts remain"
                .into(),
        )
    } else {
        Some(
            "--moe-fp8 has no effect: this model has no MXFP4 / INT4 routed experts (it applies \
             only to those)"
                .into(),
        )
    }
}
