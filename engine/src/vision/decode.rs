//! Image bytes → 8-bit RGB, the way the reference processors see them.
//!
//! transformers' `convert_to_rgb` (and vLLM's `rgba_to_rgb`) composite any transparency onto
//! **white** with `PIL.Image.alpha_composite`; no EXIF rotation is applied (vLLM, the original
//! Kimi processor). PNG, JPEG and WebP are accepted, recognised by their magic bytes rather than
//! a declared media type. JPEG goes through zune-jpeg, which differs from PIL's libjpeg-turbo by
//! a few LSB at chroma edges (vision.md §4); PNG decodes identically.

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, ImageReader, Limits};

/// The largest image accepted, in pixels: Pillow's `Image.MAX_IMAGE_PIXELS` (89 478 485), past
/// which PIL warns of a decompression bomb. Checked from the header, before any pixel is decoded.
pub const MAX_IMAGE_PIXELS: u64 = 89_478_485;

/// Why an image could not be turned into RGB pixels. Every message names what was expected.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// No bytes at all.
    #[error("the image is empty (0 bytes)")]
    Empty,
    /// The bytes start with no PNG, JPEG or WebP signature.
    #[error("unsupported image format (first bytes {0}); expected PNG, JPEG or WebP")]
    UnknownFormat(String),
    /// The header declares a width or height of zero.
    #[error("the {format} image has a zero size ({width}×{height})")]
    ZeroSized {
        /// Detected format.
        format: &'static str,
        /// Declared width in pixels.
        width: u32,
        /// Declared height in pixels.
        height: u32,
    },
    /// The header declares more than [`MAX_IMAGE_PIXELS`] pixels.
    #[error(
        "the {format} image is too large: {width}×{height} = {pixels} pixels, the limit is {limit}"
    )]
    TooLarge {
        /// Detected format.
        format: &'static str,
        /// Declared width in pixels.
        width: u32,
        /// Declared height in pixels.
        height: u32,
        /// `width · height`.
        pixels: u64,
        /// [`MAX_IMAGE_PIXELS`].
        limit: u64,
    },
    /// The decoder refused the data (truncated or corrupt file).
    #[error("the {format} image could not be decoded (truncated or corrupt): {message}")]
    Corrupt {
        /// Detected format.
        format: &'static str,
        /// The decoder's own message.
        message: String,
    },
}

/// A decoded image: 8-bit RGB, row-major, `data.len() == width · height · 3`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RgbImage {
    /// Width in pixels (> 0).
    pub width: usize,
    /// Height in pixels (> 0).
    pub height: usize,
    /// `[height, width, 3]` u8.
    pub data: Vec<u8>,
}

/// The formats [`decode_image`] reads, recognised by their signatures.
fn sniff(bytes: &[u8]) -> Option<(ImageFormat, &'static str)> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some((ImageFormat::Png, "PNG"))
    } else if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some((ImageFormat::Jpeg, "JPEG"))
    } else if bytes.len() >= 12 && &bytes[0..4] == b"RIFF" && &bytes[8..12] == b"WEBP" {
        Some((ImageFormat::WebP, "WebP"))
    } else {
        None
    }
}

/// Decodes PNG / JPEG / WebP bytes to RGB, compositing transparency onto white.
///
/// Errors ([`ImageError`]): empty input, an unknown signature, a zero-sized or larger than
/// [`MAX_IMAGE_PIXELS`] header (refused before decoding), or data the decoder rejects.
pub fn decode_image(bytes: &[u8]) -> Result<RgbImage, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    let (format, name) = sniff(bytes).ok_or_else(|| {
        let head: Vec<String> = bytes.iter().take(8).map(|b| format!("{b:02x}")).collect();
        ImageError::UnknownFormat(head.join(" "))
    })?;
    let corrupt = |e: image::ImageError| ImageError::Corrupt {
        format: name,
        message: e.to_string(),
    };
    let (width, height) = ImageReader::with_format(Cursor::new(bytes), format)
        .into_dimensions()
        .map_err(corrupt)?;
    if width == 0 || height == 0 {
        return Err(ImageError::ZeroSized {
            format: name,
            width,
            height,
        });
    }
    let pixels = width as u64 * height as u64;
    if pixels > MAX_IMAGE_PIXELS {
        return Err(ImageError::TooLarge {
            format: name,
            width,
            height,
            pixels,
            limit: MAX_IMAGE_PIXELS,
        });
    }
    if format == ImageFormat::Jpeg && !jpeg_has_end(bytes) {
        // zune-jpeg fills a truncated scan with grey; PIL refuses it ("image file is truncated").
        return Err(ImageError::Corrupt {
            format: name,
            message: "no end-of-image marker after the last scan (truncated file)".into(),
        });
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    let mut limits = Limits::default();
    // 16-bit RGBA is the widest layout the three decoders produce.
    limits.max_alloc = Some(MAX_IMAGE_PIXELS * 8 + (1 << 20));
    reader.limits(limits);
    let img = reader.decode().map_err(corrupt)?;
    Ok(to_rgb_on_white(&img))
}

/// Whether a JPEG's end-of-image marker (FF D9) follows its last start-of-scan marker (FF DA):
/// inside entropy-coded data a 0xFF byte is always followed by 0x00 or a restart marker, so an
/// FF D9 there is the real end, and a thumbnail's EOI (in an APP segment) comes before any scan.
fn jpeg_has_end(bytes: &[u8]) -> bool {
    let last = |m: u8| bytes.windows(2).rposition(|w| w == [0xFF, m]);
    matches!((last(0xDA), last(0xD9)), (Some(sos), Some(eoi)) if eoi > sos)
}

/// RGB of `img`; with an alpha channel, `PIL.Image.alpha_composite(white, img)` then RGB.
fn to_rgb_on_white(img: &DynamicImage) -> RgbImage {
    let (width, height) = (img.width() as usize, img.height() as usize);
    let data = if img.color().has_alpha() {
        let rgba = img.to_rgba8();
        let mut out = Vec::with_capacity(width * height * 3);
        for px in rgba.as_raw().chunks_exact(4) {
            let a = px[3];
            for &c in &px[..3] {
                out.push(composite_on_white(c, a));
            }
        }
        out
    } else {
        img.to_rgb8().into_raw()
    };
    RgbImage {
        width,
        height,
        data,
    }
}

/// One channel of Pillow's `ImagingAlphaComposite` (libImaging/AlphaComposite.c) with an opaque
/// white destination: 7 extra bits of precision and rounded divisions by 255, bit for bit.
fn composite_on_white(src: u8, alpha: u8) -> u8 {
    const PRECISION_BITS: u32 = 7;
    let shift_div_255 = |a: u32| ((a >> 8) + a) >> 8;
    if alpha == 0 {
        return 255;
    }
    let (src, a, dst, dst_a) = (src as u32, alpha as u32, 255u32, 255u32);
    let blend = dst_a * (255 - a);
    let outa255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << PRECISION_BITS) / outa255;
    let coef2 = 255 * (1 << PRECISION_BITS) - coef1;
    let tmp = src * coef1 + dst * coef2;
    (shift_div_255(tmp + (0x80 << PRECISION_BITS)) >> PRECISION_BITS) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opaque_and_transparent_pixels_composite_as_pil() {
        for c in [0u8, 1, 128, 255] {
            assert_eq!(composite_on_white(c, 255), c);
            assert_eq!(composite_on_white(c, 0), 255);
        }
        // Half alpha: (0·128 + 255·127)/255 rounds to 127 in PIL.
        assert_eq!(composite_on_white(0, 128), 127);
    }

    #[test]
    fn bad_bytes_get_named_errors() {
        assert!(matches!(decode_image(&[]), Err(ImageError::Empty)));
        let e = decode_image(b"GIF89a....").unwrap_err().to_string();
        assert!(e.contains("expected PNG, JPEG or WebP"), "{e}");
        let e = decode_image(b"\x89PNG\r\n\x1a\n\0\0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("PNG image could not be decoded"), "{e}");
    }
}
