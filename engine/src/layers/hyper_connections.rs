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
//! The streams start as copies of the embedding and end as their unweighted mean. The streams
//! travel as one `[N, n·D]` device tensor in the activation dtype and stay on the device: the
//! norm and the projection run there (`rms_norm` with a ones weight, then `linear_f32`), only
//! the `(2+n)·n` mixes per token come back to the host for the sigmoid/softmax/Sinkhorn, and
//! the collapse, mixing and expansion are [`Backend::stream_mix`] on `[N, n, D]` views.
//!
//! Precision (HF computes steps 1–2 in f32: `flattened.float()`, `F.linear(·, fn.float())`):
//! `fn` is rounded to the weight dtype, as HF holds the parameter, and kept in f32 on the
//! device; the streams are widened to f32 ([`Backend::to_f32`]) before the norm, so `û` and the
//! projection are HF's f32 computation whatever the activation dtype. (Rounding `û` to bf16
//! before the projection put CUDA's bf16 logits 1.8× further from f32 than HF's own bf16 run on
//! the glm5_next_vision golden.)

use crate::weights::WeightLoader;
use anyhow::{ensure, Result};
use dayone_backend::{Backend, HostTensor, TensorInfo};

/// One hyper-connection (`hc_attn_*` or `hc_ffn_*`) of a layer.
pub struct HyperConnection<B: Backend> {
    /// Streams `n`.
    pub n: usize,
    /// Residual width `D`.
    pub hidden: usize,
    /// `fn` `[(2+n)·n, n·D]` on the device: the weight dtype's values held in f32.
    pub fn_w: B::Tensor,
    /// Ones `[n·D]` f32: the weight of the unweighted input RMSNorm (on the f32 streams).
    pub ones: B::Tensor,
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

impl<B: Backend> HyperConnection<B> {
    /// Loads `{prefix}_fn`, `{prefix}_base`, `{prefix}_scale` (e.g. `layers.3.hc_attn`), or
    /// transformers' runtime names `{attn_hc,ffn_hc}.{fn,base,scale}`; `fn` goes to the device.
    ///
    /// Errors: a missing tensor or one of another shape (naming the checkpoint and tensor).
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        alt: &str,
        (n, hidden): (usize, usize),
        (norm_eps, hc_eps, iters): (f64, f64, usize),
    ) -> Result<Self> {
        let m = (2 + n) * n;
        let name = |a: &str| w.first_of(&[format!("{prefix}_{a}"), format!("{alt}.{a}")]);
        let get = |a: &str, shape: &[usize]| -> Result<Vec<f32>> {
            Ok(w.host_f32(&name(a)?, shape)?.to_f32())
        };
        let scale = get("scale", &[3])?;
        let ones = HostTensor::from_f32(vec![n * hidden], &vec![1.0; n * hidden])?;
        Ok(Self {
            n,
            hidden,
            // HF holds `fn` in the model dtype and projects with `fn.float()`: round, then widen.
            fn_w: w.upload_f32(w.host(&name("fn")?, &[m, n * hidden])?)?,
            ones: w.upload_f32(ones)?,
            base: get("base", &[m])?,
            scale: [scale[0], scale[1], scale[2]],
            norm_eps: norm_eps as f32,
            hc_eps: hc_eps as f32,
            iters,
        })
    }

    /// The raw mixes `m = fn · û` of the streams `h` `[N, n·D]`: `û` = `h` over its row RMS
    /// (`rms_norm` with the ones weight) and the projection (`linear_f32`) on the device, both
    /// in f32 from 16-bit streams as HF does (`hidden_streams.float()`, `self.fn.float()`):
    /// rounding `û` or `fn` to bf16 moved the Sinkhorn weights enough to fail the bf16 golden.
    /// Only the `[N, (2+n)·n]` f32 result is read back.
    pub fn mixes(&self, b: &B, h: &B::Tensor) -> Result<Vec<f32>> {
        let u = b.rms_norm(&b.to_f32(h)?, &self.ones, self.norm_eps)?;
        Ok(b.download(&b.linear_f32(&u, &self.fn_w)?)?.to_f32())
    }

    /// The mixing weights from the raw mixes `mix` `[N, (2+n)·n]` (f32, as [`Self::mixes`]
    /// returns them): sigmoid gates, softmax and Sinkhorn on the host, `n(2+n)` numbers a token.
    pub fn weights(&self, mixes: &[f32]) -> HcWeights {
        let n = self.n;
        let m = (2 + n) * n;
        let tokens = mixes.len() / m;
        let mut pre = vec![0f32; tokens * n];
        let mut post = vec![0f32; tokens * n];
        let mut comb = vec![0f32; tokens * n * n];
        let eps = self.hc_eps;
        for t in 0..tokens {
            let mix = &mixes[t * m..(t + 1) * m];
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
    /// `h` `[N, n·D]` → `[N, n·D]`, in `h`'s dtype. With `X` = `h` seen as `[N, n, D]`:
    /// `x_in = Σ_i pre_i X_i`, `y = sublayer(x_in)`, `X'_j = Σ_i C[i, j] X_i + post_j y`, each sum
    /// one [`Backend::stream_mix`] (f32 accumulation), the two terms added in `h`'s dtype (HF adds
    /// them in the model dtype too).
    ///
    /// Errors: `h` not `[N, n·D]`, `sublayer` not returning `[N, D]`, or an op's error.
    pub fn forward(
        &self,
        b: &B,
        h: &B::Tensor,
        sublayer: impl FnOnce(&B::Tensor) -> Result<B::Tensor>,
    ) -> Result<B::Tensor> {
        let (n, d) = (self.n, self.hidden);
        let shape = h.shape().to_vec();
        ensure!(
            shape.len() == 2 && shape[1] == n * d,
            "hyper-connections: streams must be [N, {}], got {shape:?}",
            n * d
        );
        let tokens = shape[0];
        let wts = self.weights(&self.mixes(b, h)?);
        let weights = |shape: Vec<usize>, v: &[f32]| b.upload(&HostTensor::from_f32(shape, v)?);
        let x = b.reshape(h, &[tokens, n, d])?;
        let pre = weights(vec![tokens, n, 1], &wts.pre)?;
        let x_in = b.reshape(&b.stream_mix(&x, &pre)?, &[tokens, d])?;
        let y = sublayer(&x_in)?;
        ensure!(
            y.shape() == [tokens, d],
            "hyper-connections: the sublayer must return [{tokens}, {d}], got {:?}",
            y.shape()
        );
        let y = b.reshape(&y, &[tokens, 1, d])?;
        let comb = weights(vec![tokens, n, n], &wts.comb)?;
        let post = weights(vec![tokens, 1, n], &wts.post)?;
        let out = b.add(&b.stream_mix(&x, &comb)?, &b.stream_mix(&y, &post)?)?;
        b.reshape(&out, &shape)
    }
}

/// `n` copies of each row: `x` `[N, D]` → `[N, n·D]` (a [`Backend::stream_mix`] with weight 1).
///
/// Errors: `x` not rank 2, or an op's error.
pub fn expand_streams<B: Backend>(b: &B, x: &B::Tensor, n: usize) -> Result<B::Tensor> {
    ensure!(
        x.shape().len() == 2,
        "expand_streams: x must be [N, D], got {:?}",
        x.shape()
    );
    let (tokens, d) = (x.shape()[0], x.shape()[1]);
    let ones = b.upload(&HostTensor::from_f32(
        vec![tokens, 1, n],
        &vec![1.0; tokens * n],
    )?)?;
    let out = b.stream_mix(&b.reshape(x, &[tokens, 1, d])?, &ones)?;
    b.reshape(&out, &[tokens, n * d])
}

/// The unweighted mean of the streams: `h` `[N, n·D]` → `[N, D]` (a [`Backend::stream_mix`]
/// with weights `1/n`).
///
/// Errors: `h` not `[N, n·D]`, or an op's error.
pub fn mean_streams<B: Backend>(b: &B, h: &B::Tensor, n: usize) -> Result<B::Tensor> {
    ensure!(
        h.shape().len() == 2 && n > 0 && h.shape()[1] % n == 0,
        "mean_streams: streams must be [N, {n}·D], got {:?}",
        h.shape()
    );
    let (tokens, nd) = (h.shape()[0], h.shape()[1]);
    let d = nd / n;
    let w = b.upload(&HostTensor::from_f32(
        vec![tokens, n, 1],
        &vec![1.0 / n as f32; tokens * n],
    )?)?;
    let out = b.stream_mix(&b.reshape(h, &[tokens, n, d])?, &w)?;
    b.reshape(&out, &[tokens, d])
}
