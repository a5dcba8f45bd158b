//! MoonViT image preprocessing (Kimi-K2.5 `Kimi_K25ImageProcessor`, Kimi-VL
//! `KimiVLImageProcessor`): shrink to the patch budget (never enlarge), zero-pad bottom/right to
//! a multiple of `patch · merge` (Kimi-VL with `pad_input: false`: center-crop down to one),
//! normalise, cut into patches in raster order.
//!
//! Source: transformers 5.24 `models/kimi_k25/image_processing_kimi_k25.py` (`navit_resize`,
//! `patchify`) and the hub `kimi_k25_vision_processing.py`; vision.md §1.4. The resize itself is
//! Pillow's antialiased bicubic ([`super::pillow_resize`]), as in the original processor;
//! transformers resizes with torchvision, which differs from it by ≤ 2 LSB on shrunk images.

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::decode::RgbImage;
use super::pillow_resize::resize_bicubic;

/// Image processor settings (`preprocessor_config.json`; defaults = Kimi-K2.5's).
#[derive(Clone, Debug, PartialEq)]
pub struct ImageProcessorConfig {
    /// Patch side in pixels (`patch_size`, 14).
    pub patch_size: usize,
    /// Patches merged per side into one token (`merge_size` / `merge_kernel_size`, 2).
    pub merge_size: usize,
    /// Patch budget per image (`max_patches` / `in_patch_limit`, 16384).
    pub max_patches: usize,
    /// Patch budget per side (`size.max_height` / `patch_limit_on_one_side`, 512).
    pub max_patches_per_side: usize,
    /// Per-channel mean after scaling to [0, 1] (`image_mean`, 0.5).
    pub mean: [f32; 3],
    /// Per-channel standard deviation (`image_std`, 0.5).
    pub std: [f32; 3],
    /// Zero-pad bottom/right up to a multiple of `patch · merge` (`true`: K2.5 always; Kimi-VL's
    /// `pad_input: true`), else center-crop down to one (Kimi-VL `pad_input: false`).
    pub pad_input: bool,
}

/// OpenAI CLIP's mean, the `KimiVLImageProcessor` class default.
const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// OpenAI CLIP's std, the `KimiVLImageProcessor` class default.
const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

impl Default for ImageProcessorConfig {
    fn default() -> Self {
        Self {
            patch_size: 14,
            merge_size: 2,
            max_patches: 16384,
            max_patches_per_side: 512,
            mean: [0.5; 3],
            std: [0.5; 3],
            pad_input: true,
        }
    }
}

impl ImageProcessorConfig {
    /// Kimi-VL's `KimiVLImageProcessor` class defaults: `in_token_limit` 4096 patches,
    /// `pad_input` false, CLIP mean/std. Its rescale (`s = √(limit / ((W//p)·(H//p)))` when over
    /// the limit, `int(W·s)`) is [`Self::navit_resize`] with no side limit below the position
    /// table's 512 patches; the reference raises past 512, this shrinks to fit instead.
    pub fn kimi_vl() -> Self {
        Self {
            max_patches: 4096,
            max_patches_per_side: 512,
            mean: CLIP_MEAN,
            std: CLIP_STD,
            pad_input: false,
            ..Self::default()
        }
    }

    /// [`Self::from_json`] over the defaults of `model_type`'s processor: Kimi-VL's
    /// ([`Self::kimi_vl`]) for `kimi_vl`, else chosen by the file itself.
    ///
    /// Errors: as [`Self::from_json`].
    pub fn for_model(
        model_type: &str,
        v: &Value,
        patch_size: Option<usize>,
        merge_size: Option<usize>,
    ) -> Result<Self> {
        let base = if model_type == "kimi_vl" {
            Self::kimi_vl()
        } else {
            Self::defaults_for(v)
        };
        Self::from_json_over(base, v, patch_size, merge_size)
    }

    /// The defaults a file's `image_processor_type` names: [`Self::kimi_vl`] for
    /// `KimiVLImageProcessor`, K2.5's otherwise.
    fn defaults_for(v: &Value) -> Self {
        match v.get("image_processor_type").and_then(Value::as_str) {
            Some("KimiVLImageProcessor") => Self::kimi_vl(),
            _ => Self::default(),
        }
    }

    /// Reads a `preprocessor_config.json` value, transformers' names first
    /// (`patch_size`, `merge_size`, `max_patches`, `size.max_height`, `image_mean`, `image_std`),
    /// then the original `media_proc_cfg` names (`in_patch_limit`, `patch_limit_on_one_side`,
    /// `merge_kernel_size`) and Kimi-VL's (`in_token_limit`, `pad_input`); absent keys keep the
    /// K2.5 defaults (Kimi-VL's for `image_processor_type: KimiVLImageProcessor`). `patch_size`
    /// and `merge_size` override them when given (the vision config is the authority on the
    /// encoder's sizes).
    ///
    /// Errors: a key of the wrong type or a zero size, naming the key.
    pub fn from_json(
        v: &Value,
        patch_size: Option<usize>,
        merge_size: Option<usize>,
    ) -> Result<Self> {
        Self::from_json_over(Self::defaults_for(v), v, patch_size, merge_size)
    }

    /// [`Self::from_json`] with absent keys taken from `base`.
    fn from_json_over(
        base: Self,
        v: &Value,
        patch_size: Option<usize>,
        merge_size: Option<usize>,
    ) -> Result<Self> {
        let mut c = base;
        let root = v.get("media_proc_cfg").unwrap_or(v);
        let int = |key: &str| -> Result<Option<usize>> {
            match root.get(key).or_else(|| v.get(key)) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .with_context(|| format!("preprocessor config: `{key}` must be an integer")),
            }
        };
        let triple = |key: &str| -> Result<Option<[f32; 3]>> {
            match root.get(key).or_else(|| v.get(key)) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => Ok(Some([n.as_f64().unwrap_or(0.0) as f32; 3])),
                Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    Ok(Some([0, 1, 2].map(|i| a[i].as_f64().unwrap_or(0.0) as f32)))
                }
                Some(_) => bail!("preprocessor config: `{key}` must be a number or 3 numbers"),
            }
        };
        if let Some(p) = int("patch_size")? {
            c.patch_size = p;
        }
        if let Some(m) = int("merge_size")? {
            c.merge_size = m;
        } else if let Some(Value::Array(a)) = root.get("merge_kernel_size") {
            if let Some(m) = a.first().and_then(Value::as_u64) {
                c.merge_size = m as usize;
            }
        }
        if let Some(n) = int("max_patches")?
            .or(int("in_patch_limit")?)
            .or(int("in_token_limit")?)
        {
            c.max_patches = n;
        }
        match root.get("pad_input").or_else(|| v.get("pad_input")) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => c.pad_input = *b,
            Some(_) => bail!("preprocessor config: `pad_input` must be true or false"),
        }
        let side = match root.get("size").and_then(|s| s.get("max_height")) {
            Some(x) => Some(
                x.as_u64()
                    .context("preprocessor config: `size.max_height` must be an integer")?
                    as usize,
            ),
            None => int("patch_limit_on_one_side")?,
        };
        if let Some(s) = side {
            c.max_patches_per_side = s;
        }
        if let Some(m) = triple("image_mean")? {
            c.mean = m;
        }
        if let Some(s) = triple("image_std")? {
            c.std = s;
        }
        if let Some(p) = patch_size {
            c.patch_size = p;
        }
        if let Some(m) = merge_size {
            c.merge_size = m;
        }
        for (name, n) in [
            ("patch_size", c.patch_size),
            ("merge_size", c.merge_size),
            ("max_patches", c.max_patches),
            ("max_patches_per_side", c.max_patches_per_side),
        ] {
            if n == 0 {
                bail!("preprocessor config: `{name}` must be > 0");
            }
        }
        if c.std.contains(&0.0) {
            bail!("preprocessor config: `image_std` must be non-zero");
        }
        Ok(c)
    }

    /// transformers' `navit_resize`: `(resized (h, w), padded (h, w))` in pixels for an image of
    /// `height × width`. Scale s = min(1, √(max_patches / (max(1, H//p)·max(1, W//p))),
    /// side·p/H, side·p/W); size = max(1, ⌊dim·s⌋) capped at side·p; padded up to a multiple of
    /// p·merge, or with `pad_input: false` cropped down to one (Kimi-VL `rescale`: `dim − dim %
    /// (p·merge)`; a side under one cell, which the reference crops to nothing, is padded to one
    /// cell instead). Computed in f64 as Python does.
    pub fn navit_resize(&self, height: usize, width: usize) -> ((usize, usize), (usize, usize)) {
        let p = self.patch_size;
        let side = self.max_patches_per_side * p;
        let nh = ((height / p) as f64).max(1.0);
        let nw = ((width / p) as f64).max(1.0);
        let for_total = (self.max_patches as f64 / (nh * nw)).sqrt();
        let for_h = side as f64 / height as f64;
        let for_w = side as f64 / width as f64;
        let scale = 1f64.min(for_total).min(for_h).min(for_w);
        let new_h = ((height as f64 * scale) as usize).max(1).min(side);
        let new_w = ((width as f64 * scale) as usize).max(1).min(side);
        let factor = self.merge_size * p;
        let fit = |n: usize| {
            if self.pad_input || n < factor {
                n.div_ceil(factor) * factor
            } else {
                n - n % factor
            }
        };
        ((new_h, new_w), (fit(new_h), fit(new_w)))
    }

    /// Tokens an image of `height × width` becomes after the merge: `(H_p/p/m)·(W_p/p/m)`.
    pub fn num_tokens(&self, height: usize, width: usize) -> usize {
        let (_, (ph, pw)) = self.navit_resize(height, width);
        let cell = self.patch_size * self.merge_size;
        (ph / cell) * (pw / cell)
    }
}

/// One preprocessed image, ready for the encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct PreprocessedImage {
    /// Patch grid rows `h` (= padded height / patch).
    pub grid_h: usize,
    /// Patch grid columns `w`.
    pub grid_w: usize,
    /// `[h·w, 3·p·p]` f32: patches in raster order over the grid, each channel-first
    /// `(c, py, px)` — transformers' `pixel_values` `[h·w, 3, p, p]` flattened.
    pub pixels: Vec<f32>,
    /// Size after the resize and before the padding, `(height, width)`.
    pub resized: (usize, usize),
}

impl PreprocessedImage {
    /// Number of patches `h · w`.
    pub fn num_patches(&self) -> usize {
        self.grid_h * self.grid_w
    }
}

/// The canvas before normalisation: `[H_p, W_p, 3]` u8. Padded: the resized image at the top left,
/// zeros (black) elsewhere. Cropped: the window at offset `(⌊(H′ − H_p)/2⌋, ⌊(W′ − W_p)/2⌋)`
/// (PIL `crop` as Kimi-VL's `rescale` calls it). Returns it with its `(resized, canvas)` sizes.
pub fn resized_canvas(
    img: &RgbImage,
    cfg: &ImageProcessorConfig,
) -> (Vec<u8>, (usize, usize), (usize, usize)) {
    let ((rh, rw), (ph, pw)) = cfg.navit_resize(img.height, img.width);
    let resized;
    let src = if (rh, rw) == (img.height, img.width) {
        img
    } else {
        resized = resize_bicubic(img, rw, rh);
        &resized
    };
    // Per axis: the source offset of a crop (0 when padding) and the rows/columns copied.
    let (top, left) = (rh.saturating_sub(ph) / 2, rw.saturating_sub(pw) / 2);
    let (copy_h, copy_w) = (rh.min(ph), rw.min(pw));
    let mut canvas = vec![0u8; ph * pw * 3];
    for y in 0..copy_h {
        let from = ((top + y) * rw + left) * 3;
        canvas[y * pw * 3..(y * pw + copy_w) * 3]
            .copy_from_slice(&src.data[from..from + copy_w * 3]);
    }
    (canvas, (rh, rw), (ph, pw))
}

/// Preprocesses one RGB image: [`ImageProcessorConfig::navit_resize`], Pillow bicubic shrink,
/// zero padding, `x = (u8/255 − mean)/std` (in the reference's f32 order, see `normalize`),
/// patches in raster order.
pub fn preprocess(img: &RgbImage, cfg: &ImageProcessorConfig) -> PreprocessedImage {
    let (canvas, resized, (ph, pw)) = resized_canvas(img, cfg);
    let p = cfg.patch_size;
    let (gh, gw) = (ph / p, pw / p);
    let lut: [[f32; 256]; 3] = std::array::from_fn(|c| {
        std::array::from_fn(|u| normalize(u as u8, cfg.mean[c], cfg.std[c]))
    });
    let mut pixels = Vec::with_capacity(gh * gw * 3 * p * p);
    for gy in 0..gh {
        for gx in 0..gw {
            push_patch(&mut pixels, &canvas, pw, p, (gy, gx), &lut);
        }
    }
    PreprocessedImage {
        grid_h: gh,
        grid_w: gw,
        pixels,
        resized,
    }
}

/// One value's normalisation as transformers' torchvision backend computes it in f32: the
/// rescale is fused into the statistics (`mean·255`, `std·255`, f32), then `(u − mean′) / std′`
/// (`_fuse_mean_std_and_rescale_factor` + `tvF.normalize`). Equals `(u/255 − mean)/std` up to
/// f32 rounding; this order makes it bit-equal to the reference.
/// Appends grid cell `(gy, gx)` of an RGB `canvas` (`pw` pixels wide, `[.., pw, 3]` u8) as one
/// patch row in (c, py, px) order — the patch-embedding conv's weight order — each byte mapped
/// through its channel's normalisation table `lut[c][u]`.
pub(crate) fn push_patch(
    pixels: &mut Vec<f32>,
    canvas: &[u8],
    pw: usize,
    p: usize,
    (gy, gx): (usize, usize),
    lut: &[[f32; 256]; 3],
) {
    for (c, lut) in lut.iter().enumerate() {
        for py in 0..p {
            let row = (gy * p + py) * pw;
            for px in 0..p {
                pixels.push(lut[canvas[(row + gx * p + px) * 3 + c] as usize]);
            }
        }
    }
}

fn normalize(u: u8, mean: f32, std: f32) -> f32 {
    (u as f32 - mean * 255.0) / (std * 255.0)
}
