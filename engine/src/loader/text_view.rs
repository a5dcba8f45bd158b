//! The text model of a multimodal checkpoint seen under plain Hugging Face names, so that the one
//! [`crate::models::Decoder`] loads it unchanged: Kimi-K2.5's and Kimi-VL's original names
//! (`language_model.model.layers.N.…`, `language_model.lm_head.weight`) and transformers 5's
//! (`model.language_model.layers.N.…`, `lm_head.weight`) both appear as `model.layers.N.…` and
//! `lm_head.weight`. Vision tensors are hidden. Quantized and raw reads pass through, so INT4
//! experts load as they do in a text checkpoint.

use super::{RawTensor, Split, TensorSource};
use anyhow::Result;
use dayone_backend::{DType, HostTensor, QuantHost};

/// Which multimodal layout the checkpoint uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// `language_model.model.*`, `language_model.lm_head.weight` (hub checkpoints, vLLM).
    Original,
    /// `model.language_model.*`, `lm_head.weight` (transformers 5 `save_pretrained`).
    Transformers,
}

/// A [`TensorSource`] exposing only the text model of `inner` under HF text names.
pub struct TextModelView<'a> {
    inner: &'a dyn TensorSource,
    layout: Layout,
}

impl<'a> TextModelView<'a> {
    /// Picks the layout by probing for the embedding table; a checkpoint with neither keeps the
    /// original layout, so a missing tensor is reported under its original name.
    pub fn new(inner: &'a dyn TensorSource) -> Self {
        let layout = if inner
            .shape("model.language_model.embed_tokens.weight")
            .is_some()
        {
            Layout::Transformers
        } else {
            Layout::Original
        };
        Self { inner, layout }
    }

    /// The checkpoint's name for HF text name `name`.
    fn map(&self, name: &str) -> String {
        match (self.layout, name.strip_prefix("model.")) {
            (Layout::Original, Some(rest)) => format!("language_model.model.{rest}"),
            (Layout::Original, None) => format!("language_model.{name}"),
            (Layout::Transformers, Some(rest)) => format!("model.language_model.{rest}"),
            (Layout::Transformers, None) => name.to_string(),
        }
    }

    /// The HF text name of checkpoint name `name`, `None` for tensors outside the text model.
    fn unmap(&self, name: &str) -> Option<String> {
        match self.layout {
            Layout::Original => name.strip_prefix("language_model.").map(str::to_string),
            Layout::Transformers => match name.strip_prefix("model.language_model.") {
                Some(rest) => Some(format!("model.{rest}")),
                None => (name == "lm_head.weight").then(|| name.to_string()),
            },
        }
    }
}

impl TensorSource for TextModelView<'_> {
    fn names(&self) -> Vec<String> {
        self.inner
            .names()
            .iter()
            .filter_map(|n| self.unmap(n))
            .collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.shape(&self.map(name))
    }

    fn load(&self, name: &str) -> Result<HostTensor> {
        self.inner.load(&self.map(name))
    }

    fn load_split(&self, name: &str, split: &Split) -> Result<HostTensor> {
        self.inner.load_split(&self.map(name), split)
    }

    fn origin(&self) -> String {
        self.inner.origin()
    }

    fn quant(&self, name: &str) -> Result<Option<QuantHost>> {
        self.inner.quant(&self.map(name))
    }

    fn load_raw(&self, name: &str) -> Result<RawTensor> {
        self.inner.load_raw(&self.map(name))
    }

    fn stored_dtype(&self, name: &str) -> Option<DType> {
        self.inner.stored_dtype(&self.map(name))
    }
}
