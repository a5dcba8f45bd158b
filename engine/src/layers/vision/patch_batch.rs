//! Several images in one encoder call: their patch rows stacked, and the varlen layout in which
//! each image attends only to its own patches (bidirectional, cu_seqlens as in vLLM's encoders).

use crate::vision::PreprocessedImage;
use anyhow::{ensure, Result};
use dayone_backend::VarlenMeta;

/// The images' patches, image after image.
pub(crate) struct PatchBatch {
    /// `[N, 3·p²]` f32 patch rows (each image's in its processor's order).
    pub pixels: Vec<f32>,
    /// One sequence per image, non-causal; positions are patch indices within the image.
    pub meta: VarlenMeta,
    /// Total patches `N`.
    pub n: usize,
}

impl PatchBatch {
    /// Stacks `images` of patch size `p` whose grids are multiples of the `(mh, mw)` merge.
    ///
    /// Errors: no images, an image whose pixel count does not match its grid, a grid that is
    /// empty or not a multiple of the merge (naming the image's index).
    pub fn new(images: &[PreprocessedImage], p: usize, (mh, mw): (usize, usize)) -> Result<Self> {
        ensure!(!images.is_empty(), "vision encoder: no images");
        let n: usize = images.iter().map(|im| im.num_patches()).sum();
        let mut pixels = Vec::with_capacity(n * 3 * p * p);
        let mut starts = vec![0u32];
        let mut within = Vec::with_capacity(n);
        for (i, im) in images.iter().enumerate() {
            let (h, w) = (im.grid_h, im.grid_w);
            ensure!(
                im.pixels.len() == h * w * 3 * p * p,
                "vision encoder: image {i} has {} pixel values, expected {h}·{w}·3·{p}² for its grid",
                im.pixels.len()
            );
            ensure!(
                h > 0 && w > 0 && h % mh == 0 && w % mw == 0,
                "vision encoder: image {i} grid {h}×{w} is not a positive multiple of the {mh}×{mw} merge"
            );
            pixels.extend_from_slice(&im.pixels);
            within.extend(0..(h * w) as u32);
            starts.push(starts[i] + (h * w) as u32);
        }
        let meta = VarlenMeta {
            query_start: starts.clone(),
            key_start: starts,
            key_pos0: vec![0; images.len()],
            positions: within,
            causal: false,
        };
        Ok(PatchBatch { pixels, meta, n })
    }
}
