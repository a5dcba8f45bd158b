//! Vision input, host side: image bytes → RGB ([`decode`]), Pillow-exact resize
//! ([`pillow_resize`]), MoonViT preprocessing ([`preprocess`]), GLM-5.3-Flash preprocessing
//! ([`glm5_preprocess`]). Pure host code: nothing here
//! knows a backend, the scheduler or the decoder.

pub mod decode;
pub mod encoder_cache;
pub mod glm5_preprocess;
pub mod pillow_resize;
pub mod preprocess;

pub use decode::{decode_image, ImageError, RgbImage, MAX_IMAGE_PIXELS};

/// The prompt text that stands for one image, by `model_type`: Kimi-K2.5's
/// `<|media_begin|>image<|media_content|><|media_pad|><|media_end|>` (vLLM
/// `get_placeholder_str`); its `<|media_pad|>` is the placeholder the engine expands.
/// Kimi-VL's is the same with `<|media_start|>` (the same id, 163602; vLLM `kimi_vl.py`).
/// GLM-5.3-Flash's `<|begin_of_image|><|image|><|end_of_image|>` (`Glm5NextProcessor`), its
/// `<|image|>` expanded the same way. `None` for models without a vision tower.
pub fn image_markup(model_type: &str) -> Option<&'static str> {
    match model_type {
        "kimi_k25" => Some("<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"),
        "kimi_vl" => Some("<|media_start|>image<|media_content|><|media_pad|><|media_end|>"),
        "glm5_next" => Some("<|begin_of_image|><|image|><|end_of_image|>"),
        _ => None,
    }
}

/// Reads and decodes an image file ([`decode_image`]); errors name the file.
pub fn load_image_file(path: &std::path::Path) -> anyhow::Result<RgbImage> {
    use anyhow::Context;
    let bytes = std::fs::read(path).with_context(|| format!("reading image {}", path.display()))?;
    decode_image(&bytes).with_context(|| format!("image {}", path.display()))
}
pub use glm5_preprocess::{preprocess_glm5, Glm5ImageProcessorConfig};
pub use preprocess::{preprocess, ImageProcessorConfig, PreprocessedImage};
