//! MoonViT image preprocessing vs transformers 5.24's `Kimi_K25ImageProcessor` (and Pillow's
//! resize where the processor shrinks). Fixtures: tests/fixtures/gen_kimi_k25_images.py.
//!
//! References are stored as the u8 each `pixel_values` float came from (the generator checks
//! `(u8 − 127.5)/127.5` reproduces the floats bit for bit), so a match in u8 plus the same float
//! expression is a bit-exact match of `pixel_values`.

use dayone_engine::vision::{decode_image, preprocess, ImageError, ImageProcessorConfig};
use dayone_tests::fixture;
use serde_json::Value;

fn dir() -> std::path::PathBuf {
    fixture("kimi_k25_images")
}

/// A reference file as `[num_patches, 588]` u8 (grayscale PNG rows).
fn reference(name: &str) -> (usize, Vec<u8>) {
    let bytes = std::fs::read(dir().join(name)).unwrap();
    let img = decode_image(&bytes).unwrap();
    let gray: Vec<u8> = img.data.chunks_exact(3).map(|p| p[0]).collect();
    assert_eq!(img.width, 3 * 14 * 14, "{name}");
    (img.height, gray)
}

fn manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join("manifest.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

/// Largest |ours − reference| in LSB over all values, ours mapped back from f32 to u8, after
/// checking that every f32 of ours is exactly `(u8 − 127.5)/127.5`.
fn max_lsb(ours: &[f32], reference: &[u8]) -> u32 {
    assert_eq!(ours.len(), reference.len());
    let mut worst = 0;
    for (&x, &r) in ours.iter().zip(reference) {
        let u = (x * 127.5 + 127.5).round();
        assert!((0.0..=255.0).contains(&u));
        assert_eq!(
            ((u - 127.5) / 127.5).to_bits(),
            x.to_bits(),
            "not a u8 level: {x}"
        );
        worst = worst.max((u as i32 - r as i32).unsigned_abs());
    }
    worst
}

#[test]
fn pixels_match_the_hf_processor() {
    let cases = manifest();
    assert!(cases.len() >= 8);
    for case in cases {
        let file = case["file"].as_str().unwrap();
        let cfg = ImageProcessorConfig::from_json(&case["kwargs"], None, None).unwrap();
        let img = decode_image(&std::fs::read(dir().join(file)).unwrap()).unwrap();
        assert_eq!(
            (img.width, img.height),
            (
                case["width"].as_u64().unwrap() as usize,
                case["height"].as_u64().unwrap() as usize
            )
        );
        let out = preprocess(&img, &cfg);
        let grid = [out.grid_h as u64, out.grid_w as u64];
        assert_eq!(
            grid.to_vec(),
            case["grid"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_u64().unwrap())
                .collect::<Vec<_>>(),
            "{file}"
        );
        let resized = [out.resized.0 as u64, out.resized.1 as u64];
        assert_eq!(
            resized.to_vec(),
            case["resized"]
                .as_array()
                .unwrap()
                .iter()
                .map(|g| g.as_u64().unwrap())
                .collect::<Vec<_>>(),
            "{file}"
        );
        let (n, hf) = reference(case["ref_hf"].as_str().unwrap());
        assert_eq!(n, out.num_patches(), "{file}");
        let vs_hf = max_lsb(&out.pixels, &hf);
        if let Some(pil) = case["ref_pil"].as_str() {
            // Shrunk: bit-exact with Pillow's resize; transformers' torchvision resize differs
            // from Pillow by what the generator measured.
            let (_, pil) = reference(pil);
            let vs_pil = max_lsb(&out.pixels, &pil);
            assert_eq!(
                vs_pil, 0,
                "{file}: vs Pillow resize ({vs_hf} LSB vs transformers)"
            );
            let bound = case["hf_vs_pil_max_lsb"].as_u64().unwrap() as u32;
            assert!(
                vs_hf <= bound,
                "{file}: {vs_hf} LSB vs transformers (bound {bound})"
            );
        } else if file.ends_with(".jpg") {
            // zune-jpeg vs libjpeg-turbo: a few LSB at chroma edges (vision.md §4).
            assert!(vs_hf <= 6, "{file}: {vs_hf} LSB vs transformers");
            eprintln!("{file}: {vs_hf} LSB vs transformers (JPEG decoders differ)");
        } else {
            assert_eq!(vs_hf, 0, "{file}: pixels differ from transformers");
        }
    }
}

#[test]
fn token_counts_follow_navit_resize() {
    // vision.md §1.4 examples (transformers `navit_resize`, default config).
    let cfg = ImageProcessorConfig::default();
    for ((w, h), (gh, gw), tokens) in [
        ((100, 73), (6, 8), 12),
        ((224, 224), (16, 16), 64),
        ((1920, 1080), (78, 138), 2691),
        ((4000, 3000), (112, 150), 4200),
        ((7168, 7168), (128, 128), 4096),
        ((10000, 300), (16, 512), 2048),
        ((20, 500), (36, 2), 18),
        ((30, 30), (4, 4), 4),
    ] {
        let (_, (ph, pw)) = cfg.navit_resize(h, w);
        assert_eq!((ph / 14, pw / 14), (gh, gw), "{w}x{h}");
        assert_eq!(cfg.num_tokens(h, w), tokens, "{w}x{h}");
    }
}

/// A PNG with only a signature and an IHDR chunk declaring `w × h` (no pixel data).
fn png_header(w: u32, h: u32) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut c = 0xFFFF_FFFFu32;
        for &b in bytes {
            c ^= b as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
        }
        !c
    }
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend_from_slice(&w.to_be_bytes());
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]); // 8-bit RGB
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    // IHDR, then the start of the pixel data (an IDAT of a few zlib bytes), as a bomb would be.
    for chunk in [ihdr, b"IDAT\x78\x9c\x00\x00".to_vec()] {
        png.extend_from_slice(&(chunk.len() as u32 - 4).to_be_bytes());
        png.extend_from_slice(&chunk);
        png.extend_from_slice(&crc32(&chunk).to_be_bytes());
    }
    png
}

#[test]
fn bad_images_get_clear_errors() {
    let good = std::fs::read(dir().join("rgb_100x73.png")).unwrap();
    // Truncated: the header is fine, the pixel data stops half-way.
    let e = decode_image(&good[..good.len() / 2]).unwrap_err();
    assert!(
        matches!(e, ImageError::Corrupt { format: "PNG", .. }),
        "{e}"
    );
    let jpeg = std::fs::read(dir().join("photo_120x90.jpg")).unwrap();
    // Cut in the header, in the scan (zune-jpeg would fill the rest with grey; PIL refuses it),
    // and just before the end-of-image marker.
    for cut in [200, jpeg.len() / 10, jpeg.len() / 2, jpeg.len() - 2] {
        let e = decode_image(&jpeg[..cut]).unwrap_err();
        assert!(
            matches!(e, ImageError::Corrupt { format: "JPEG", .. }),
            "cut at {cut}: {e}"
        );
    }
    assert!(decode_image(&jpeg).is_ok());
    // A 30 000 × 30 000 header is refused before any allocation.
    let e = decode_image(&png_header(30_000, 30_000)).unwrap_err();
    assert!(
        matches!(e, ImageError::TooLarge { width: 30_000, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("30000×30000"), "{e}");
    // Zero-sized: the PNG decoder already refuses the header; either way an error naming PNG.
    let e = decode_image(&png_header(0, 10)).unwrap_err();
    assert!(e.to_string().contains("PNG"), "{e}");
    // Wrong media type: text, GIF, empty.
    for bytes in [&b"hello, not an image"[..], b"GIF89a\x01\x00\x01\x00", b""] {
        let e = decode_image(bytes).unwrap_err().to_string();
        assert!(
            e.contains("PNG, JPEG or WebP") || e.contains("empty"),
            "{e}"
        );
    }
}
