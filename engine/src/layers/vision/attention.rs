//! Bidirectional attention within each image (block-diagonal mask over the packed patches;
//! FlashAttention's varlen form with `causal = false`, as vLLM runs the MoonViT tower).
//!
//! For now computed on the host (download `q`, `k`, `v`; f64 softmax per image and head;
//! upload): correct on every backend, fast on none. It is to move onto the device through the
//! varlen attention op (`Backend::attention_varlen` with a non-causal `VarlenMeta`) once that op
//! is in the trait; the golden test (tests/tests/golden_kimi_k25.rs) pins the result either way.

use anyhow::{ensure, Result};
use dayone_backend::{Backend, HostTensor, TensorInfo};

/// `softmax(scale · q·kᵀ) · v` per image and head, each image's patches attending to all of its
/// own patches and to nothing else. `q`, `k`, `v` `[N, H, hd]` (one float dtype), `starts`
/// `[I + 1]` the images' first rows (`starts[I] = N`) → `[N, H, hd]` in `q`'s dtype.
pub fn attention_within_images<B: Backend>(
    b: &B,
    q: &B::Tensor,
    k: &B::Tensor,
    v: &B::Tensor,
    starts: &[usize],
    scale: f32,
) -> Result<B::Tensor> {
    let shape = q.shape().to_vec();
    ensure!(
        shape.len() == 3 && k.shape() == shape.as_slice() && v.shape() == shape.as_slice(),
        "vision attention: q, k, v must share one [N, H, hd] shape, got {:?}, {:?}, {:?}",
        shape,
        k.shape(),
        v.shape()
    );
    let (n, h, d) = (shape[0], shape[1], shape[2]);
    ensure!(
        starts.first() == Some(&0) && starts.last() == Some(&n),
        "vision attention: image starts {starts:?} must run from 0 to {n}"
    );
    let dtype = q.dtype();
    let (qh, kh, vh) = (b.download(q)?, b.download(k)?, b.download(v)?);
    let (qv, kv, vv) = (qh.to_f32(), kh.to_f32(), vh.to_f32());
    let mut out = vec![0f32; n * h * d];
    let mut scores = Vec::new();
    let mut acc = vec![0f64; d];
    for w in starts.windows(2) {
        let (lo, hi) = (w[0], w[1]);
        for t in lo..hi {
            for hh in 0..h {
                let qrow = &qv[(t * h + hh) * d..(t * h + hh + 1) * d];
                scores.clear();
                let mut mx = f64::NEG_INFINITY;
                for j in lo..hi {
                    let krow = &kv[(j * h + hh) * d..(j * h + hh + 1) * d];
                    let s = qrow
                        .iter()
                        .zip(krow)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64;
                    mx = mx.max(s);
                    scores.push(s);
                }
                let mut sum = 0.0;
                acc.iter_mut().for_each(|a| *a = 0.0);
                for (j, s) in (lo..hi).zip(&scores) {
                    let p = (s - mx).exp();
                    sum += p;
                    let vrow = &vv[(j * h + hh) * d..(j * h + hh + 1) * d];
                    for (a, &x) in acc.iter_mut().zip(vrow) {
                        *a += p * x as f64;
                    }
                }
                let o = &mut out[(t * h + hh) * d..(t * h + hh + 1) * d];
                for (o, a) in o.iter_mut().zip(&acc) {
                    *o = (a / sum) as f32;
                }
            }
        }
    }
    b.upload(&HostTensor::from_f32_as(vec![n, h, d], &out, dtype)?)
}
