//! MoonViT's learned position table resampled to an image's patch grid: PyTorch
//! `F.interpolate(mode="bicubic", align_corners=False)` (Keys' cubic with a = −0.75, no
//! antialias, edge taps clamped), which transformers 5.24 evaluates as an `embedding_bag` over
//! precomputed 4×4 taps (`get_vision_interpolation_indices_and_weights`). vision.md §2 step 2.
//!
//! Not the image resize: that one is Pillow's antialiased a = −0.5 bicubic
//! ([`crate::vision::pillow_resize`]).

/// Keys' cubic coefficient `a` of PyTorch's `upsample_bicubic2d`.
const A: f64 = -0.75;

/// The 4 source indices and weights for output index `i` of a resize `in_size → out_size`
/// (`area_pixel_compute_source_index` with `cubic = true`: src = (i + ½)·in/out − ½, not clamped;
/// taps ⌊src⌋−1 … ⌊src⌋+2 clamped to `[0, in_size)`).
fn taps(i: usize, in_size: usize, out_size: usize) -> ([usize; 4], [f64; 4]) {
    let scale = in_size as f64 / out_size as f64;
    let src = (i as f64 + 0.5) * scale - 0.5;
    let x0 = src.floor();
    let t = src - x0;
    let cc1 = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let cc2 = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let w = [cc2(t + 1.0), cc1(t), cc1(1.0 - t), cc2(2.0 - t)];
    let idx = [-1i64, 0, 1, 2].map(|d| (x0 as i64 + d).clamp(0, in_size as i64 - 1) as usize);
    (idx, w)
}

/// Resamples `table` `[th, tw, c]` (row-major f32) to `[h, w, c]`, returned flattened in raster
/// order (row `r·w + col`), computed in f64. Equals the table when `(h, w) == (th, tw)`.
pub fn resample_table(
    table: &[f32],
    th: usize,
    tw: usize,
    c: usize,
    h: usize,
    w: usize,
) -> Vec<f32> {
    debug_assert_eq!(table.len(), th * tw * c);
    let rows: Vec<_> = (0..h).map(|i| taps(i, th, h)).collect();
    let cols: Vec<_> = (0..w).map(|j| taps(j, tw, w)).collect();
    let mut out = vec![0f32; h * w * c];
    let mut acc = vec![0f64; c];
    for (i, (ri, rw)) in rows.iter().enumerate() {
        for (j, (ci, cw)) in cols.iter().enumerate() {
            acc.iter_mut().for_each(|a| *a = 0.0);
            for a in 0..4 {
                for b in 0..4 {
                    let wt = rw[a] * cw[b];
                    let src = &table[(ri[a] * tw + ci[b]) * c..(ri[a] * tw + ci[b] + 1) * c];
                    for (acc, &v) in acc.iter_mut().zip(src) {
                        *acc += wt * v as f64;
                    }
                }
            }
            let dst = &mut out[(i * w + j) * c..(i * w + j + 1) * c];
            for (d, &a) in dst.iter_mut().zip(&acc) {
                *d = a as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_the_table() {
        let table: Vec<f32> = (0..4 * 5 * 3).map(|i| (i as f32 * 0.37).sin()).collect();
        let out = resample_table(&table, 4, 5, 3, 4, 5);
        for (a, b) in out.iter().zip(&table) {
            assert!((a - b).abs() < 1e-6);
        }
    }

    #[test]
    fn weights_sum_to_one_and_edges_clamp() {
        for (i, n, o) in [(0, 8, 6), (5, 8, 6), (0, 8, 36), (35, 8, 36), (1, 8, 2)] {
            let (idx, w) = taps(i, n, o);
            assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-12);
            assert!(idx.iter().all(|&k| k < n));
        }
    }
}
