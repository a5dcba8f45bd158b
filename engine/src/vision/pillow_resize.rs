//! Pillow's `Image.resize(…, BICUBIC)` for 8-bit RGB, bit for bit.
//!
//! A port of libImaging/Resample.c (`precompute_coeffs`, `normalize_coeffs_8bpc`,
//! `ImagingResampleHorizontal_8bpc` / `Vertical_8bpc`, `ImagingResampleInner`): a separable
//! convolution with Keys' cubic (a = −0.5) whose support widens by the scale when shrinking
//! (antialiasing), coefficients in 22-bit fixed point, horizontal pass first over only the rows
//! the vertical pass reads. The `image` crate's CatmullRom differs from it by up to 17 LSB at hard
//! edges (vision.md §4), hence the port. This is *not* the position-table bicubic of the encoder
//! (torch `interpolate`, a = −0.75, no antialias).

use super::decode::RgbImage;

/// Fixed-point fraction bits of the 8-bit path (`PRECISION_BITS = 32 − 8 − 2`).
const PRECISION_BITS: u32 = 22;

/// Keys' cubic convolution kernel with a = −0.5 (Pillow's `bicubic_filter`), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Per output index: the first input index, the tap count and the fixed-point weights.
struct Taps {
    bounds: Vec<(usize, usize)>,
    ksize: usize,
    coeffs: Vec<i32>,
}

/// `precompute_coeffs` + `normalize_coeffs_8bpc` for resizing `in_size` → `out_size` over the
/// whole input (box `[0, in_size]`).
fn taps(in_size: usize, out_size: usize) -> Taps {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let mut bounds = Vec::with_capacity(out_size);
    let mut coeffs = vec![0i32; out_size * ksize];
    let mut k = vec![0f64; ksize];
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let ss = 1.0 / filterscale;
        // C's `(int)` truncates toward zero; negatives are clamped to 0 right after.
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize - xmin;
        let mut ww = 0.0;
        for (x, kx) in k.iter_mut().enumerate().take(xmax) {
            let w = bicubic((x as f64 + xmin as f64 - center + 0.5) * ss);
            *kx = w;
            ww += w;
        }
        let row = &mut coeffs[xx * ksize..(xx + 1) * ksize];
        for (x, c) in row.iter_mut().enumerate().take(xmax) {
            let w = if ww != 0.0 { k[x] / ww } else { k[x] };
            let scaled = w * (1u32 << PRECISION_BITS) as f64;
            *c = if w < 0.0 {
                (-0.5 + scaled) as i32
            } else {
                (0.5 + scaled) as i32
            };
        }
        bounds.push((xmin, xmax));
    }
    Taps {
        bounds,
        ksize,
        coeffs,
    }
}

/// `clip8`: fixed-point accumulator → u8.
fn clip8(acc: i64) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Horizontal pass over rows `first..first + rows` of `img` → `[rows, out_w]`
/// (`ImagingResampleHorizontal_8bpc`).
fn horizontal(img: &RgbImage, out_w: usize, first: usize, rows: usize) -> RgbImage {
    let hor = taps(img.width, out_w);
    let mut data = vec![0u8; rows * out_w * 3];
    for y in 0..rows {
        let src = &img.data[(y + first) * img.width * 3..(y + first + 1) * img.width * 3];
        let dst = &mut data[y * out_w * 3..(y + 1) * out_w * 3];
        for (xx, &(xmin, xmax)) in hor.bounds.iter().enumerate() {
            let k = &hor.coeffs[xx * hor.ksize..xx * hor.ksize + xmax];
            let mut acc = [1i64 << (PRECISION_BITS - 1); 3];
            for (x, &kx) in k.iter().enumerate() {
                let p = &src[(x + xmin) * 3..(x + xmin) * 3 + 3];
                for c in 0..3 {
                    acc[c] += p[c] as i64 * kx as i64;
                }
            }
            for c in 0..3 {
                dst[xx * 3 + c] = clip8(acc[c]);
            }
        }
    }
    RgbImage {
        width: out_w,
        height: rows,
        data,
    }
}

/// Vertical pass with taps `vert` whose first indices are relative to row `offset` of `img`
/// (`ImagingResampleVertical_8bpc` after the bounds shift) → `[out_h, img.width]`.
fn vertical(img: &RgbImage, vert: &Taps, offset: usize) -> RgbImage {
    let w = img.width;
    let out_h = vert.bounds.len();
    let mut data = vec![0u8; out_h * w * 3];
    for (yy, &(ymin, ymax)) in vert.bounds.iter().enumerate() {
        let k = &vert.coeffs[yy * vert.ksize..yy * vert.ksize + ymax];
        let dst = &mut data[yy * w * 3..(yy + 1) * w * 3];
        for (i, d) in dst.iter_mut().enumerate() {
            let mut acc = 1i64 << (PRECISION_BITS - 1);
            for (y, &ky) in k.iter().enumerate() {
                acc += img.data[(y + ymin - offset) * w * 3 + i] as i64 * ky as i64;
            }
            *d = clip8(acc);
        }
    }
    RgbImage {
        width: w,
        height: out_h,
        data,
    }
}

/// Resizes `img` to `out_w × out_h` as Pillow 13's `Image.resize((out_w, out_h), BICUBIC)`
/// does on an RGB image. Same size returns a copy. Both sizes must be > 0 (the caller's resize
/// rule guarantees it).
///
/// Pass order: horizontal first (over only the rows the vertical pass reads), except when the
/// height shrinks by more than twice as many pixels as the width, `in_h − out_h > 2·(in_w −
/// out_w)`: then vertical first (Pillow PR #9549, in 13.0). The order changes the u8
/// intermediate, so it changes results by a few LSB; the rule was fixed by checking Pillow
/// 13.0.0 on both sides of the boundary (dh = 2·dw → horizontal first, dh = 2·dw + 1 →
/// vertical first). An image whose height grows is always horizontal first (checked against
/// Pillow 13.0.0 on 5 312 enlarge/shrink size pairs of a 100×73 image).
pub fn resize_bicubic(img: &RgbImage, out_w: usize, out_h: usize) -> RgbImage {
    assert!(out_w > 0 && out_h > 0, "resize to an empty image");
    let need_h = out_w != img.width;
    let need_v = out_h != img.height;
    let vert = taps(img.height, out_h);
    let (dh, dw) = (
        img.height as i64 - out_h as i64,
        img.width as i64 - out_w as i64,
    );
    match (need_h, need_v) {
        (false, false) => img.clone(),
        (true, false) => horizontal(img, out_w, 0, img.height),
        (false, true) => vertical(img, &vert, 0),
        (true, true) if dh > 0 && dh > 2 * dw => {
            let tmp = vertical(img, &vert, 0);
            horizontal(&tmp, out_w, 0, out_h)
        }
        (true, true) => {
            // Rows of the source the vertical pass reads.
            let first = vert.bounds[0].0;
            let last = vert.bounds[out_h - 1].0 + vert.bounds[out_h - 1].1;
            let tmp = horizontal(img, out_w, first, last - first);
            vertical(&tmp, &vert, first)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (i, o) in [(100, 37), (37, 100), (7300, 7168), (5, 1)] {
            let t = taps(i, o);
            for (xx, &(_, n)) in t.bounds.iter().enumerate() {
                let s: i64 = t.coeffs[xx * t.ksize..xx * t.ksize + n]
                    .iter()
                    .map(|&c| c as i64)
                    .sum();
                assert!(
                    (s - (1 << PRECISION_BITS)).abs() <= n as i64,
                    "{i}->{o} at {xx}"
                );
            }
        }
    }

    #[test]
    fn a_flat_image_stays_flat() {
        let img = RgbImage {
            width: 50,
            height: 9,
            data: [10u8, 200, 77].repeat(450),
        };
        let out = resize_bicubic(&img, 23, 4);
        assert_eq!(out.data, [10u8, 200, 77].repeat(23 * 4));
    }
}
