//! GLM-5.3-Flash image preprocessing (`glm5_next`; transformers 5.24
//! `Glm5NextImageProcessorPil`, vision.md §6): pick an aligned canvas within the token budget
//! (`smart_resize`), resize the content into it (Pillow bicubic; shrink only, unless the image is
//! under the minimum budget), zero-pad bottom/right, rescale and normalise (OpenAI-CLIP
//! statistics), and cut into patches in merge-block order `(h/m, w/m, m, m)`.
//!
//! The processor repeats a still image over `temporal_patch_size` frames; the encoder folds that
//! repetition into its patch weights, so the pixels here hold one frame.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::decode::RgbImage;
use super::pillow_resize::resize_bicubic;
use super::preprocess::{push_patch, PreprocessedImage};

/// OpenAI CLIP mean (transformers `OPENAI_CLIP_MEAN`), as the Python floats numpy rounds to f32.
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// OpenAI CLIP std (transformers `OPENAI_CLIP_STD`), likewise.
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];

/// `preprocessor_config.json` of a `glm5_next` checkpoint (defaults = transformers').
#[derive(Clone, Debug, PartialEq)]
pub struct Glm5ImageProcessorConfig {
    /// Patch side `p` in pixels (`patch_size`, 14).
    pub patch_size: usize,
    /// Frames per temporal patch `T` (`temporal_patch_size`, 2).
    pub temporal_patch_size: usize,
    /// Patches merged per side `m` (`merge_size`, 2).
    pub merge_size: usize,
    /// Smallest image, in merged tokens (`min_image_tokens`, 16).
    pub min_image_tokens: usize,
    /// Largest image, in merged tokens (`max_image_tokens`, 8000).
    pub max_image_tokens: usize,
    /// Per-channel mean after rescaling (`image_mean`, CLIP).
    pub mean: [f32; 3],
    /// Per-channel std (`image_std`, CLIP).
    pub std: [f32; 3],
    /// u8 → float factor (`rescale_factor`, 1/255).
    pub rescale_factor: f64,
}

impl Default for Glm5ImageProcessorConfig {
    fn default() -> Self {
        Self {
            patch_size: 14,
            temporal_patch_size: 2,
            merge_size: 2,
            min_image_tokens: 16,
            max_image_tokens: 8000,
            mean: CLIP_MEAN.map(|x| x as f32),
            std: CLIP_STD.map(|x| x as f32),
            rescale_factor: 1.0 / 255.0,
        }
    }
}

impl Glm5ImageProcessorConfig {
    /// Reads a `preprocessor_config.json` value (`Null`: all defaults). `patch_size`,
    /// `merge_size` and `temporal_patch_size` from the vision config override the file's when
    /// given (the encoder's sizes are the authority).
    ///
    /// Errors: a key of the wrong type, a zero size or std, `min_image_tokens` above
    /// `max_image_tokens`, naming the key.
    pub fn from_json(
        v: &Value,
        patch_size: Option<usize>,
        merge_size: Option<usize>,
        temporal_patch_size: Option<usize>,
    ) -> Result<Self> {
        let mut c = Self::default();
        let int = |key: &str| -> Result<Option<usize>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .with_context(|| format!("preprocessor config: `{key}` must be an integer")),
            }
        };
        let triple = |key: &str| -> Result<Option<[f32; 3]>> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => Ok(Some([n.as_f64().unwrap_or(0.0) as f32; 3])),
                Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    Ok(Some([0, 1, 2].map(|i| a[i].as_f64().unwrap_or(0.0) as f32)))
                }
                Some(_) => bail!("preprocessor config: `{key}` must be a number or 3 numbers"),
            }
        };
        c.patch_size = patch_size.or(int("patch_size")?).unwrap_or(c.patch_size);
        c.merge_size = merge_size.or(int("merge_size")?).unwrap_or(c.merge_size);
        c.temporal_patch_size = temporal_patch_size
            .or(int("temporal_patch_size")?)
            .unwrap_or(c.temporal_patch_size);
        c.min_image_tokens = int("min_image_tokens")?.unwrap_or(c.min_image_tokens);
        c.max_image_tokens = int("max_image_tokens")?.unwrap_or(c.max_image_tokens);
        c.mean = triple("image_mean")?.unwrap_or(c.mean);
        c.std = triple("image_std")?.unwrap_or(c.std);
        if let Some(x) = v.get("rescale_factor").filter(|x| !x.is_null()) {
            c.rescale_factor = x
                .as_f64()
                .context("preprocessor config: `rescale_factor` must be a number")?;
        }
        for (name, n) in [
            ("patch_size", c.patch_size),
            ("merge_size", c.merge_size),
            ("temporal_patch_size", c.temporal_patch_size),
            ("max_image_tokens", c.max_image_tokens),
        ] {
            if n == 0 {
                bail!("preprocessor config: `{name}` must be > 0");
            }
        }
        if c.min_image_tokens > c.max_image_tokens {
            bail!(
                "preprocessor config: `min_image_tokens` {} exceeds `max_image_tokens` {}",
                c.min_image_tokens,
                c.max_image_tokens
            );
        }
        if c.std.contains(&0.0) {
            bail!("preprocessor config: `image_std` must be non-zero");
        }
        Ok(c)
    }

    /// transformers' `smart_resize` for a still image (`num_frames = T`): the canvas
    /// `(height, width)` in pixels, multiples of `p·m`, with `T·H·W` within
    /// `[min, max]_image_tokens · T·(p·m)²`. Too small: scaled up by
    /// √(min / (T·h·w)) and aligned up. Too large: a binary search over the content height
    /// (width following the aspect ratio, floored) for the largest aligned canvas in budget.
    pub fn smart_resize(&self, height: usize, width: usize) -> (usize, usize) {
        let factor = self.patch_size * self.merge_size;
        let t = self.temporal_patch_size;
        let per_token = t * factor * factor;
        let (min_px, max_px) = (
            self.min_image_tokens * per_token,
            self.max_image_tokens * per_token,
        );
        let align = |v: usize| v.div_ceil(factor) * factor;
        // `aligned_frames = max(T, round(num_frames / T) · T)` with num_frames = T.
        let frames = t;
        let (mut ah, mut aw) = (align(height), align(width));
        if frames * ah * aw < min_px {
            let scale = (min_px as f64 / (t * height * width) as f64).sqrt();
            ah = align(((height as f64 * scale).ceil() as usize).max(1));
            aw = align(((width as f64 * scale).ceil() as usize).max(1));
        }
        if frames * ah * aw > max_px {
            // max_px ≥ frames·factor² since max_image_tokens ≥ 1: one aligned patch always fits.
            let (mut lo, mut hi) = (1usize, height);
            let mut best = (factor, factor);
            while lo <= hi {
                let ch = (lo + hi) / 2;
                let cw = (width * ch / height).max(1);
                let (bh, bw) = (align(ch), align(cw));
                if frames * bh * bw <= max_px {
                    best = (bh, bw);
                    lo = ch + 1;
                } else {
                    hi = ch - 1;
                }
            }
            (ah, aw) = best;
        }
        (ah, aw)
    }

    /// The content size inside the canvas (`Glm5NextImageProcessorPil.resize`): scale
    /// `min(H/h, W/w)`, capped at 1 unless the image is under the minimum budget, floored, at
    /// least 1 and at most the canvas. Returns `(content (h, w), canvas (H, W))`.
    pub fn content_size(&self, height: usize, width: usize) -> ((usize, usize), (usize, usize)) {
        let (th, tw) = self.smart_resize(height, width);
        let factor = self.patch_size * self.merge_size;
        let t = self.temporal_patch_size;
        let mut scale = (th as f64 / height as f64).min(tw as f64 / width as f64);
        if t * height * width >= t * factor * factor * self.min_image_tokens {
            scale = scale.min(1.0);
        }
        let ch = ((height as f64 * scale).floor() as usize).clamp(1, th);
        let cw = ((width as f64 * scale).floor() as usize).clamp(1, tw);
        ((ch, cw), (th, tw))
    }

    /// Merged tokens an image of `height × width` becomes: `(H/p)·(W/p)/m²`.
    pub fn num_tokens(&self, height: usize, width: usize) -> usize {
        let (th, tw) = self.smart_resize(height, width);
        let cell = self.patch_size * self.merge_size;
        (th / cell) * (tw / cell)
    }
}

/// Preprocesses one RGB image as `Glm5NextImageProcessorPil` does: canvas and content size
/// ([`Glm5ImageProcessorConfig::content_size`]), Pillow bicubic resize when the size changes,
/// zero padding bottom/right (before normalising, so padded pixels become `−mean/std`),
/// `x = (f32(u·rescale) − mean) / std` in f32, patches `[h·w, 3·p·p]` in merge-block order
/// (block row, block column, row in block, column in block), each `(c, py, px)`.
pub fn preprocess_glm5(img: &RgbImage, cfg: &Glm5ImageProcessorConfig) -> PreprocessedImage {
    let ((rh, rw), (ph, pw)) = cfg.content_size(img.height, img.width);
    let resized;
    let src = if (rh, rw) == (img.height, img.width) {
        img
    } else {
        resized = resize_bicubic(img, rw, rh);
        &resized
    };
    let mut canvas = vec![0u8; ph * pw * 3];
    for y in 0..rh {
        canvas[y * pw * 3..(y * pw + rw) * 3]
            .copy_from_slice(&src.data[y * rw * 3..(y + 1) * rw * 3]);
    }
    // numpy: `rescale` multiplies in f64 and casts to f32; `normalize` subtracts and divides
    // in f32.
    let lut: [[f32; 256]; 3] = std::array::from_fn(|c| {
        std::array::from_fn(|u| ((u as f64 * cfg.rescale_factor) as f32 - cfg.mean[c]) / cfg.std[c])
    });
    let (p, m) = (cfg.patch_size, cfg.merge_size);
    let (gh, gw) = (ph / p, pw / p);
    let mut pixels = Vec::with_capacity(gh * gw * 3 * p * p);
    for by in 0..gh / m {
        for bx in 0..gw / m {
            for dy in 0..m {
                for dx in 0..m {
                    let cell = (by * m + dy, bx * m + dx);
                    push_patch(&mut pixels, &canvas, pw, p, cell, &lut);
                }
            }
        }
    }
    PreprocessedImage {
        grid_h: gh,
        grid_w: gw,
        pixels,
        resized: (rh, rw),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes worked by hand from transformers' `smart_resize` (factor 28, T 2).
    #[test]
    fn smart_resize_budgets() {
        let c = Glm5ImageProcessorConfig::default();
        // Under 16 tokens: √(16·1568 / (2·73·100)) = 1.3108 → ceil(95.7) = 96 → 112,
        // ceil(131.1) = 132 → 140; the content is enlarged by min(112/73, 140/100) = 1.4.
        assert_eq!(c.content_size(73, 100), ((102, 140), (112, 140)));
        // In budget: aligned up, content unchanged.
        assert_eq!(c.content_size(200, 300), ((200, 300), (224, 308)));
        assert_eq!(c.num_tokens(200, 300), 8 * 11);
        let small = Glm5ImageProcessorConfig {
            max_image_tokens: 64,
            ..c
        };
        let (h, w) = small.smart_resize(200, 300);
        assert!(
            h % 28 == 0 && w % 28 == 0 && (h / 28) * (w / 28) <= 64,
            "{h}x{w}"
        );
    }
}
