//! Manifold-constrained hyper-connections (mHC; GLM-5.3-Flash, HF
//! `Glm5NextTextHyperConnection`): the residual is `n` streams `X ∈ R^{n×D}` per token, and each
//! sublayer `F` (attention or FFN, with its pre-norm) is wrapped as
//!
//! ```text
//! û = u / √(mean(u²) + eps)          u = [X_0 | … | X_{n−1}]  (no weight)
//! m = fn · û  → [pre (n) | post (n) | comb (n²)]   (+ base, × scale per group)
//! pre_i  = σ(s0·m_pre,i + b) + hc_eps;   post_j = 2σ(s1·m_post,j + b)
//! C      = softmax_j(s2·m_comb + b) + hc_eps, then Sinkhorn: columns, (rows, columns) × (iters − 1)
//! y      = F(Σ_i pre_i X_i)                      (collapse before the norm)
//! X'_j   = post_j · y + Σ_i C[i, j] · X_i
//! ```
//! The streams start as copies of the embedding and end as their unweighted mean. The mixing
//! runs on the host in f32 (it is `n(2+n)` numbers per token); the streams travel as one
//! `[N, n·D]` device tensor in the activation dtype.

use crate::weights::WeightLoader;
use anyhow::{ensure, Result};
use dayone_backend::{Backend, HostTensor, TensorInfo};

/// One hyper-connection (`hc_attn_*` or `hc_ffn_*`) of a layer.
pub struct HyperConnection {
    /// Streams `n`.
    pub n: usize,
    /// Residual width `D`.
    pub hidden: usize,
    /// `fn` `[(2+n)·n, n·D]` f32.
    pub fn_w: Vec<f32>,
    /// `base` `[(2+n)·n]`.
    pub base: Vec<f32>,
    /// `scale` `[3]`.
    pub scale: [f32; 3],
    /// Epsilon of the input RMSNorm (`rms_norm_eps`).
    pub norm_eps: f32,
    /// Floor of pre/comb and the Sinkhorn denominators (`hc_eps`).
    pub hc_eps: f32,
    /// Sinkhorn iterations.
    pub iters: usize,
}

/// One step's mixing weights: `pre` `[N, n]`, `post` `[N, n]`, `comb` `[N, n, n]` (row = input
/// stream, column = output stream).
pub struct HcWeights {
    /// Collapse weights.
    pub pre: Vec<f32>,
    /// Expand weights.
    pub post: Vec<f32>,
    /// Doubly-stochastic stream mixing.
    pub comb: Vec<f32>,
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

impl HyperConnection {
    /// Loads `{prefix}_fn`, `{prefix}_base`, `{prefix}_scale` (e.g. `layers.3.hc_attn`), or
    /// transformers' runtime names `{attn_hc,ffn_hc}.{fn,base,scale}`.
    pub fn load<B: Backend>(
        w: &WeightLoader<B>,
        prefix: &str,
        alt: &str,
        (n, hidden): (usize, usize),
        (norm_eps, hc_eps, iters): (f64, f64, usize),
    ) -> Result<Self> {
        let m = (2 + n) * n;
        let get = |a: &str, b: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let name = w.first_of(&[format!("{prefix}_{a}"), format!("{alt}.{b}")])?;
            Ok(w.host_f32(&name, shape)?.to_f32())
        };
        let scale = get("scale", "scale", &[3])?;
        Ok(Self {
            n,
            hidden,
            fn_w: get("fn", "fn", &[m, n * hidden])?,
            base: get("base", "base", &[m])?,
            scale: [scale[0], scale[1], scale[2]],
            norm_eps: norm_eps as f32,
            hc_eps: hc_eps as f32,
            iters,
        })
    }

    /// The mixing weights of the streams `x` `[N, n·D]` (f32).
    pub fn weights(&self, x: &[f32]) -> HcWeights {
        let (n, nd) = (self.n, self.n * self.hidden);
        let tokens = x.len() / nd;
        let m = (2 + n) * n;
        let mut pre = vec![0f32; tokens * n];
        let mut post = vec![0f32; tokens * n];
        let mut comb = vec![0f32; tokens * n * n];
        let eps = self.hc_eps;
        for t in 0..tokens {
            let u = &x[t * nd..(t + 1) * nd];
            let ms: f32 = u.iter().map(|v| v * v).sum::<f32>() / nd as f32;
            let r = 1.0 / (ms + self.norm_eps).sqrt();
            let mix: Vec<f32> = (0..m)
                .map(|o| {
                    let row = &self.fn_w[o * nd..(o + 1) * nd];
                    row.iter().zip(u).map(|(a, b)| a * (b * r)).sum::<f32>()
                })
                .collect();
            for i in 0..n {
                pre[t * n + i] = sigmoid(mix[i] * self.scale[0] + self.base[i]) + eps;
                post[t * n + i] = 2.0 * sigmoid(mix[n + i] * self.scale[1] + self.base[n + i]);
            }
            let c = &mut comb[t * n * n..(t + 1) * n * n];
            for i in 0..n {
                let row = &mut c[i * n..(i + 1) * n];
                for j in 0..n {
                    row[j] = mix[2 * n + i * n + j] * self.scale[2] + self.base[2 * n + i * n + j];
                }
                let mx = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let mut s = 0.0;
                for v in row.iter_mut() {
                    *v = (*v - mx).exp();
                    s += *v;
                }
                for v in row.iter_mut() {
                    *v = *v / s + eps;
                }
            }
            let cols = |c: &mut [f32]| {
                for j in 0..n {
                    let s: f32 = (0..n).map(|i| c[i * n + j]).sum::<f32>() + eps;
                    for i in 0..n {
                        c[i * n + j] /= s;
                    }
                }
            };
            let rows = |c: &mut [f32]| {
                for i in 0..n {
                    let s: f32 = c[i * n..(i + 1) * n].iter().sum::<f32>() + eps;
                    for v in &mut c[i * n..(i + 1) * n] {
                        *v /= s;
                    }
                }
            };
            cols(c);
            for _ in 1..self.iters {
                rows(c);
                cols(c);
            }
        }
        HcWeights { pre, post, comb }
    }

    /// Runs `sublayer` (norm included) on the collapsed streams and returns the new streams:
    /// `h` `[N, n·D]` → `[N, n·D]`, in `h`'s dtype.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        h: &B::Tensor,
        sublayer: impl FnOnce(&B::Tensor) -> Result<B::Tensor>,
    ) -> Result<B::Tensor> {
        let (n, d) = (self.n, self.hidden);
        let dtype = h.dtype();
        let shape = h.shape().to_vec();
        ensure!(
            shape.len() == 2 && shape[1] == n * d,
            "hyper-connections: streams must be [N, {}], got {shape:?}",
            n * d
        );
        let tokens = shape[0];
        let x = b.download(h)?.to_f32();
        let wts = self.weights(&x);
        let mut x_in = vec![0f32; tokens * d];
        for t in 0..tokens {
            for i in 0..n {
                let p = wts.pre[t * n + i];
                let src = &x[(t * n + i) * d..(t * n + i + 1) * d];
                for (o, v) in x_in[t * d..(t + 1) * d].iter_mut().zip(src) {
                    *o += p * v;
                }
            }
        }
        let x_in = b.upload(&HostTensor::from_f32_as(vec![tokens, d], &x_in, dtype)?)?;
        let y = b.download(&sublayer(&x_in)?)?.to_f32();
        let mut out = vec![0f32; tokens * n * d];
        for t in 0..tokens {
            let yt = &y[t * d..(t + 1) * d];
            for j in 0..n {
                let o = &mut out[(t * n + j) * d..(t * n + j + 1) * d];
                let post = wts.post[t * n + j];
                for (a, v) in o.iter_mut().zip(yt) {
                    *a = post * v;
                }
                for i in 0..n {
                    let c = wts.comb[(t * n + i) * n + j];
                    let src = &x[(t * n + i) * d..(t * n + i + 1) * d];
                    for (a, v) in o.iter_mut().zip(src) {
                        *a += c * v;
                    }
                }
            }
        }
        b.upload(&HostTensor::from_f32_as(shape, &out, dtype)?)
    }
}

/// `n` copies of each row: `x` `[N, D]` → `[N, n·D]`.
pub fn expand_streams<B: Backend>(b: &B, x: &B::Tensor, n: usize) -> Result<B::Tensor> {
    let (tokens, d) = (x.shape()[0], x.shape()[1]);
    let v = b.download(x)?.to_f32();
    let mut out = Vec::with_capacity(tokens * n * d);
    for t in 0..tokens {
        for _ in 0..n {
            out.extend_from_slice(&v[t * d..(t + 1) * d]);
        }
    }
    b.upload(&HostTensor::from_f32_as(
        vec![tokens, n * d],
        &out,
        x.dtype(),
    )?)
}

/// The unweighted mean of the streams: `h` `[N, n·D]` → `[N, D]`.
pub fn mean_streams<B: Backend>(b: &B, h: &B::Tensor, n: usize) -> Result<B::Tensor> {
    let (tokens, nd) = (h.shape()[0], h.shape()[1]);
    let d = nd / n;
    let v = b.download(h)?.to_f32();
    let mut out = vec![0f32; tokens * d];
    for t in 0..tokens {
        for i in 0..n {
            for (o, x) in out[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&v[(t * n + i) * d..(t * n + i + 1) * d])
            {
                *o += x;
            }
        }
        for o in &mut out[t * d..(t + 1) * d] {
            *o /= n as f32;
        }
    }
    b.upload(&HostTensor::from_f32_as(vec![tokens, d], &out, h.dtype())?)
}
