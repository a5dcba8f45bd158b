//! Vision input, host side: image bytes → RGB ([`decode`]), Pillow-exact resize
//! ([`pillow_resize`]), MoonViT preprocessing ([`preprocess`]). Pure host code: nothing here
//! knows a backend, the scheduler or the decoder.

pub mod decode;
pub mod pillow_resize;
pub mod preprocess;

pub use decode::{decode_image, ImageError, RgbImage, MAX_IMAGE_PIXELS};
pub use preprocess::{preprocess, ImageProcessorConfig, PreprocessedImage};
