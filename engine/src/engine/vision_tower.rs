//! The vision towers the engine can hold, each with its image processor: MoonViT (`kimi_k25`)
//! and the GLM-5.3-Flash tower (`glm5_next`). The engine's image path ([`super::media`]) sees
//! only this: preprocess, count tokens, encode.

use crate::config::{Glm5NextVision, ModelConfig};
use crate::layers::vision::{Glm5Vit, MoonVit};
use crate::loader::Checkpoint;
use crate::vision::{
    preprocess, preprocess_glm5, Glm5ImageProcessorConfig, ImageProcessorConfig, PreprocessedImage,
    RgbImage,
};
use crate::weights::WeightLoader;
use anyhow::{Context, Result};
use dayone_backend::{Backend, DType};

/// A loaded vision tower and its processor settings.
pub(crate) enum VisionTower<B: Backend> {
    /// Kimi-K2.5's (and Kimi-VL's) MoonViT + projector.
    MoonVit {
        encoder: MoonVit<B>,
        processor: ImageProcessorConfig,
    },
    /// GLM-5.3-Flash's tower + downsample + merger.
    Glm5 {
        encoder: Glm5Vit<B>,
        processor: Glm5ImageProcessorConfig,
    },
}

/// `preprocessor_config.json` next to the checkpoint, `Null` when absent. Errors name the file.
fn preprocessor_json(ckpt: &Checkpoint) -> Result<(serde_json::Value, String)> {
    let pre = ckpt.path.join("preprocessor_config.json");
    let v = if pre.is_file() {
        serde_json::from_str(&std::fs::read_to_string(&pre)?)
            .with_context(|| format!("parsing {}", pre.display()))?
    } else {
        serde_json::Value::Null
    };
    Ok((v, pre.display().to_string()))
}

impl<B: Backend> VisionTower<B> {
    /// Loads the tower of `config` with its image-token id, `None` for a model without one (a
    /// text-only architecture; a `glm5_next` checkpoint without `vision_config` or without
    /// `model.visual.*` tensors).
    ///
    /// Errors: a bad `vision_config` or `preprocessor_config.json` (naming the field), a missing
    /// or mis-shaped tensor of a tower that is present.
    pub(crate) fn load(
        b: &B,
        config: &ModelConfig,
        ckpt: &Checkpoint,
        dtype: DType,
    ) -> Result<Option<(Self, u32)>> {
        let w = WeightLoader::new(b, ckpt.tensors.as_ref(), dtype);
        match config {
            ModelConfig::KimiK25(k) => {
                let (pre, origin) = preprocessor_json(ckpt)?;
                let (p, m) = (k.vision.patch_size, k.vision.merge_kernel.0);
                // Kimi-VL (`kimi_vl`) runs this tower under its own processor defaults.
                let processor =
                    ImageProcessorConfig::for_model(&k.model_type, &pre, Some(p), Some(m))
                        .context(origin)?;
                let encoder = MoonVit::load(&w, &k.vision)?;
                Ok(Some((
                    Self::MoonVit { encoder, processor },
                    k.media_placeholder_token_id,
                )))
            }
            ModelConfig::Glm5Next(_) => {
                let origin = ckpt.path.join("config.json").display().to_string();
                let Some(g) = Glm5NextVision::from_json(&ckpt.config, &origin)? else {
                    return Ok(None);
                };
                if !w.has("model.visual.patch_embed.proj.weight") {
                    eprintln!(
                        "note: {} has a vision_config but no model.visual.* tensors: text only",
                        ckpt.path.display()
                    );
                    return Ok(None);
                }
                let (pre, origin) = preprocessor_json(ckpt)?;
                let v = &g.vision;
                let processor = Glm5ImageProcessorConfig::from_json(
                    &pre,
                    Some(v.patch_size),
                    Some(v.spatial_merge_size),
                    Some(v.temporal_patch_size),
                )
                .context(origin)?;
                let encoder = Glm5Vit::load(&w, v)?;
                Ok(Some((Self::Glm5 { encoder, processor }, g.image_token_id)))
            }
            _ => Ok(None),
        }
    }

    /// One image as the model's processor prepares it.
    pub(crate) fn preprocess(&self, img: &RgbImage) -> PreprocessedImage {
        match self {
            Self::MoonVit { processor, .. } => preprocess(img, processor),
            Self::Glm5 { processor, .. } => preprocess_glm5(img, processor),
        }
    }

    /// Tokens an image of `height × width` pixels becomes in the prompt.
    pub(crate) fn num_tokens(&self, height: usize, width: usize) -> usize {
        match self {
            Self::MoonVit { processor, .. } => processor.num_tokens(height, width),
            Self::Glm5 { processor, .. } => processor.num_tokens(height, width),
        }
    }

    /// Patches per prompt token (the merge area).
    pub(crate) fn merge_area(&self) -> usize {
        match self {
            Self::MoonVit { encoder, .. } => {
                let (mh, mw) = encoder.config().merge_kernel;
                mh * mw
            }
            Self::Glm5 { encoder, .. } => encoder.config().merge_area(),
        }
    }

    /// Encodes preprocessed images: `[Σ tokens, D]`, image after image.
    pub(crate) fn encode(&self, b: &B, images: &[PreprocessedImage]) -> Result<B::Tensor> {
        match self {
            Self::MoonVit { encoder, .. } => encoder.encode(b, images),
            Self::Glm5 { encoder, .. } => encoder.encode(b, images),
        }
    }
}
