//! gpt-oss's mixture of experts (OpenAI 2025, gpt-oss model card; HF `GptOssMLP`,
//! `GptOssTopKRouter`, `GptOssExperts`; architectures.md §4.4):
//!
//! ```text
//! ℓ = W_r x + b_r (in f32);  chosen = top-k(ℓ);  w = softmax(ℓ[chosen])
//! expert e:  [g, u] = W_gu[e] x + b_gu[e]  (rows interleaved: 2i gate, 2i+1 up)
//!            h = (clamp(u, ±l) + 1) ⊙ min(g, l) ⊙ σ(α · min(g, l));  y_e = W_d[e] h + b_d[e]
//! y = Σ_j w_j · y_{chosen_j}
//! ```
//! The experts come as the released checkpoints store them (MXFP4 `*_blocks` / `*_scales`, kept
//! low-bit and decoded per step, [`QuantExperts`]) or as transformers saves them decoded
//! (`gate_up_proj` `[E, D, 2F]`, `down_proj` `[E, F, D]`, transposed here at load).

use super::QuantExperts;
use crate::weights::WeightLoader;
use anyhow::{bail, Result};
use dayone_backend::{
    Backend, ExpertAct, ExpertOptions, HostTensor, QuantFormat, QuantHost, TensorInfo,
};

/// The routed experts, as stored on the device.
pub enum GptOssExperts<B: Backend> {
    /// Floats: `[E, 2F, D]` (interleaved gate/up rows) and `[E, D, F]`.
    Dense(B::Tensor, B::Tensor),
    /// Low-bit codes, decoded per step.
    Quant(Box<QuantExperts<B>>),
}

/// One gpt-oss MoE block.
pub struct GptOssMoe<B: Backend> {
    /// Router weight `[E, D]` (storage dtype).
    pub router: B::Tensor,
    /// Router bias `[E]`, on the host in f32 (added to the f32 logits there).
    pub router_bias: Vec<f32>,
    /// The experts.
    pub experts: GptOssExperts<B>,
    /// `[E, 2F]` (row order of the gate/up weight).
    pub gate_up_bias: B::Tensor,
    /// `[E, D]`.
    pub down_bias: B::Tensor,
    /// Experts per token.
    pub top_k: usize,
    /// The clamped gated activation.
    pub act: ExpertAct,
}

/// `t` `[E, a, b]` → `[E, b, a]` (host, any float dtype).
fn transpose_last(t: &HostTensor) -> Result<HostTensor> {
    let [e, a, b] = [t.shape[0], t.shape[1], t.shape[2]];
    let es = t.dtype.size();
    let mut out = vec![0u8; t.data.len()];
    for x in 0..e {
        for i in 0..a {
            for j in 0..b {
                let src = ((x * a + i) * b + j) * es;
                let dst = ((x * b + j) * a + i) * es;
                out[dst..dst + es].copy_from_slice(&t.data[src..src + es]);
            }
        }
    }
    HostTensor::new(vec![e, b, a], t.dtype, out)
}

/// MXFP4 `{p}_blocks` `[E, out, in/32, 16]` + `{p}_scales` `[E, out, in/32]` (U8) as one
/// `[E, out, in]` weight.
fn mxfp4(
    w: &WeightLoader<'_, impl Backend>,
    p: &str,
    e: usize,
    out: usize,
    inp: usize,
) -> Result<QuantHost> {
    let (blocks, scales) = (format!("{p}_blocks"), format!("{p}_scales"));
    let src = w.source();
    let b = src.load_raw(&blocks)?;
    let s = src.load_raw(&scales)?;
    let origin = w.origin();
    if b.dtype != "U8" || b.shape != [e, out, inp / 32, 16] {
        bail!(
            "{origin}: {blocks} is {} {:?}, expected U8 {:?}",
            b.dtype,
            b.shape,
            [e, out, inp / 32, 16]
        );
    }
    if s.dtype != "U8" || s.shape != [e, out, inp / 32] {
        bail!(
            "{origin}: {scales} is {} {:?}, expected U8 {:?}",
            s.dtype,
            s.shape,
            [e, out, inp / 32]
        );
    }
    QuantHost::new(
        &format!("{origin}: {p}"),
        QuantFormat::MXFP4,
        [e, out, inp],
        b.data,
        s.data,
        vec![],
    )
}

impl<B: Backend> GptOssMoe<B> {
    /// Loads `{prefix}.router` and `{prefix}.experts.*` for `experts` experts of width `f` over
    /// a residual of width `d`.
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        (d, experts, f, top_k): (usize, usize, usize, usize),
        limit: f32,
        alpha: f32,
    ) -> Result<Self> {
        if w.parallel().world() > 1 {
            bail!(
                "gpt-oss experts do not split over several ranks yet (tensor_parallel_size 1 only)"
            );
        }
        let router = w.get(&format!("{prefix}.router.weight"), &[experts, d])?;
        let router_bias = w
            .host_f32(&format!("{prefix}.router.bias"), &[experts])?
            .to_f32();
        let ex = format!("{prefix}.experts");
        let gate_up_bias = w.get(&format!("{ex}.gate_up_proj_bias"), &[experts, 2 * f])?;
        let down_bias = w.get(&format!("{ex}.down_proj_bias"), &[experts, d])?;
        let experts = if w.has(&format!("{ex}.gate_up_proj_blocks")) {
            let gu = mxfp4(w, &format!("{ex}.gate_up_proj"), experts, 2 * f, d)?;
            let dn = mxfp4(w, &format!("{ex}.down_proj"), experts, d, f)?;
            if w.keeps_quantized() {
                GptOssExperts::Quant(Box::new(QuantExperts::load(w, &gu, &dn)?))
            } else {
                GptOssExperts::Dense(
                    w.upload(gu.to_host(w.dtype())?)?,
                    w.upload(dn.to_host(w.dtype())?)?,
                )
            }
        } else {
            let gu = w.host(&format!("{ex}.gate_up_proj"), &[experts, d, 2 * f])?;
            let dn = w.host(&format!("{ex}.down_proj"), &[experts, f, d])?;
            GptOssExperts::Dense(
                w.upload(transpose_last(&gu)?)?,
                w.upload(transpose_last(&dn)?)?,
            )
        };
        Ok(Self {
            router,
            router_bias,
            experts,
            gate_up_bias,
            down_bias,
            top_k,
            act: ExpertAct::GptOss { alpha, limit },
        })
    }

    /// `x` `[N, D]` → `[N, D]`.
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        let n = x.shape()[0];
        // The logits in f32 (bf16 rounding before the top-k would flip near-ties), bias added
        // on the host.
        let mut logits = b.download(&b.linear_f32(x, &self.router)?)?.to_f32();
        let e = self.router_bias.len();
        for row in logits.chunks_exact_mut(e.max(1)) {
            for (l, bias) in row.iter_mut().zip(&self.router_bias) {
                *l += bias;
            }
        }
        let (ids, weights) = route(&logits, n, self.top_k);
        let k = self.top_k;
        let weights = b.upload(&HostTensor::from_f32(vec![n, k], &weights)?)?;
        match &self.experts {
            GptOssExperts::Dense(gu, dn) => b.moe_experts_ext(
                x,
                &b.upload(&HostTensor::from_u32(vec![n, k], &ids)?)?,
                &weights,
                gu,
                dn,
                &ExpertOptions {
                    act: self.act,
                    gate_up_bias: Some(&self.gate_up_bias),
                    down_bias: Some(&self.down_bias),
                    fp8: false,
                },
            ),
            GptOssExperts::Quant(q) => q.forward_with(
                b,
                x,
                &ids,
                &weights,
                self.act,
                Some((&self.gate_up_bias, &self.down_bias)),
            ),
        }
    }
}

/// Top-`k` experts of each of the `n` rows of router logits (descending; ties: lower index
/// first) and their softmax weights over the chosen logits (in f32, about the largest).
pub fn route(logits: &[f32], n: usize, k: usize) -> (Vec<u32>, Vec<f32>) {
    let e = logits.len() / n.max(1);
    let (mut ids, mut weights) = (Vec::with_capacity(n * k), Vec::with_capacity(n * k));
    for row in logits.chunks_exact(e.max(1)).take(n) {
        let mut order: Vec<u32> = (0..e as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let top = row[chosen[0] as usize];
        let ex: Vec<f32> = chosen
            .iter()
            .map(|&i| (row[i as usize] - top).exp())
            .collect();
        let sum: f32 = ex.iter().sum();
        ids.extend_from_slice(chosen);
        weights.extend(ex.iter().map(|v| v / sum));
    }
    (ids, weights)
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn router_picks_the_top_logits_and_softmaxes_them() {
        let (ids, w) = route(&[0.0, 3.0, 1.0, 3.0, -2.0, 0.5, 0.5, 9.0], 2, 2);
        assert_eq!(ids, vec![1, 3, 3, 1]); // row 2: 9.0, then the tie 0.5 at experts 1 and 2
        assert!((w[0] - 0.5).abs() < 1e-6 && (w[1] - 0.5).abs() < 1e-6);
        let e = (-8.5f32).exp();
        assert!((w[2] - 1.0 / (1.0 + e)).abs() < 1e-6);
    }
}
