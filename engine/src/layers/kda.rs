//! Kimi Delta Attention (Kimi Linear report, arXiv:2510.26692 §2; HF `KimiLinearDeltaAttention`,
//! fla `naive_recurrent_kda`): a gated delta-rule linear attention with per-channel forget gates
//! and a fixed-size state per sequence.
//!
//! ```text
//! q, k, v = silu(shortconv(W_q x)), silu(shortconv(W_k x)), silu(shortconv(W_v x))   per head [K]
//! g = −exp(A_log)·softplus(W_fb W_fa x + dt_bias)      β = σ(W_b x)
//! S ← diag(exp g) S;  S ← S + k ⊗ β(v − Sᵀk);  o = Sᵀ q̂      (q̂, k̂ L2-normalised, q̂ · K^−½)
//! y = W_o · (RMSNorm(o) ⊙ w ⊙ σ(W_gb W_ga x))
//! ```

use super::{Linear, PreNorm, RowLinear, Weight};
use crate::weights::WeightLoader;
use anyhow::{bail, Result};
use dayone_backend::{Backend, DeviceStepMeta, HostTensor, KdaProjections};

/// Widths of a KDA layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdaShape {
    /// Residual width `D`.
    pub hidden: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Head width `K = V`.
    pub head_dim: usize,
    /// Short-convolution width `W`.
    pub conv_width: usize,
}

/// One KDA layer's weights.
pub struct Kda<B: Backend> {
    /// Widths.
    pub shape: KdaShape,
    /// `[H·K, D]` each.
    pub q_proj: Linear<B>,
    /// Key projection.
    pub k_proj: Linear<B>,
    /// Value projection.
    pub v_proj: Linear<B>,
    /// Short-convolution taps for q, k, v: `[H·K, W]` f32 each.
    pub conv: [B::Tensor; 3],
    /// Forget-gate low-rank pair: `[K, D]` then `[H·K, K]`.
    pub f_a: Linear<B>,
    /// Second half of the forget-gate pair.
    pub f_b: Linear<B>,
    /// `A_log` `[H]` f32.
    pub a_log: B::Tensor,
    /// `dt_bias` `[H, K]` f32.
    pub dt_bias: B::Tensor,
    /// `[H, D]`: β logits.
    pub b_proj: Linear<B>,
    /// Output-gate low-rank pair.
    pub g_a: Linear<B>,
    /// Second half of the output-gate pair.
    pub g_b: Linear<B>,
    /// Output norm weight `[K]` (shared by the heads).
    pub o_norm: B::Tensor,
    /// Output norm epsilon.
    pub eps: f32,
    /// `[D, H·K]`, row-parallel.
    pub o_proj: RowLinear<B>,
    /// Forget-gate lower bound (newer family members).
    pub lower_bound: Option<f32>,
}

impl<B: Backend> Kda<B> {
    /// Loads `{prefix}.*` in either the published layout (`q_conv1d`, `f_a_proj`, `A_log` …) or
    /// transformers 5's (`conv1d` stacking q, k, v; `forget_gate.*`). `s` is the whole layer's
    /// shape; over several ranks this rank keeps `heads / world` heads of every per-head
    /// tensor (projections, convolution taps, `A_log`, `dt_bias`, `W_o`'s columns) and the
    /// low-rank `f_a`/`g_a` whole (vLLM's KDA layout); its recurrent state is its heads'.
    ///
    /// Errors: missing or misshapen tensors; heads that do not split over the ranks.
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        s: KdaShape,
        eps: f64,
        lower_bound: Option<f64>,
    ) -> Result<Self> {
        let par = w.parallel();
        if !s.heads.is_multiple_of(par.world()) {
            bail!(
                "{prefix}: {} KDA heads do not split over tensor_parallel_size {}",
                s.heads,
                par.world()
            );
        }
        let (hh, k, d, width) = (s.heads, s.head_dim, s.hidden, s.conv_width);
        let (full_p, h) = (hh * k, hh / par.world());
        let p = h * k;
        let heads = par.split(0);
        let name = |a: &str| format!("{prefix}.{a}");
        let either = |a: &str| w.first_of(&[name(a), name(&format!("forget_gate.{a}"))]);
        let conv = if w.has(&name("conv1d.weight")) {
            let all = w.host_split_f32(
                &name("conv1d.weight"),
                &[3 * full_p, 1, width],
                heads.grouped(3),
            )?;
            let part = |i: usize| -> Result<B::Tensor> {
                let bytes = p * width * 4;
                w.backend().upload(&HostTensor::new(
                    vec![p, width],
                    all.dtype,
                    all.data[i * bytes..(i + 1) * bytes].to_vec(),
                )?)
            };
            [part(0)?, part(1)?, part(2)?]
        } else {
            let one = |c: &str| -> Result<B::Tensor> {
                let t = w.host_split_f32(
                    &name(&format!("{c}_conv1d.weight")),
                    &[full_p, 1, width],
                    heads,
                )?;
                w.backend()
                    .upload(&HostTensor::new(vec![p, width], t.dtype, t.data)?)
            };
            [one("q")?, one("k")?, one("v")?]
        };
        let a_log_name = either("A_log")?;
        let a_log = w.host_f32(&a_log_name, &w_shape(w, &a_log_name)?)?;
        if a_log.numel() != hh {
            bail!(
                "{a_log_name}: expected {hh} values (one per head), got shape {:?}",
                a_log.shape
            );
        }
        // Stored as `[H]` or `[1, 1, H, 1]`: this rank's heads of the flat values.
        let a_log = heads.apply(&HostTensor::new(vec![hh], a_log.dtype, a_log.data)?)?;
        let dt_name = either("dt_bias")?;
        let dt_bias = w.host_split_f32(&dt_name, &[full_p], heads)?;
        let col = |n: &str, out: usize, inp: usize| Linear::column(w, n, out, inp, false);
        Ok(Self {
            shape: KdaShape { heads: h, ..s },
            q_proj: col(&name("q_proj"), full_p, d)?,
            k_proj: col(&name("k_proj"), full_p, d)?,
            v_proj: col(&name("v_proj"), full_p, d)?,
            conv,
            f_a: Linear::load(
                w,
                either("f_a_proj.weight")?.trim_end_matches(".weight"),
                k,
                d,
                false,
            )?,
            f_b: col(
                either("f_b_proj.weight")?.trim_end_matches(".weight"),
                full_p,
                k,
            )?,
            a_log: w
                .backend()
                .upload(&HostTensor::new(vec![h], a_log.dtype, a_log.data)?)?,
            dt_bias: w.backend().upload(&HostTensor::new(
                vec![h, k],
                dt_bias.dtype,
                dt_bias.data,
            )?)?,
            b_proj: col(&name("b_proj"), hh, d)?,
            g_a: Linear::load(w, &name("g_a_proj"), k, d, false)?,
            g_b: col(&name("g_b_proj"), full_p, k)?,
            o_norm: w.get(&name("o_norm.weight"), &[k])?,
            eps: eps as f32,
            o_proj: RowLinear::load(w, &name("o_proj"), d, full_p, false)?,
            lower_bound: lower_bound.map(|x| x as f32),
        })
    }

    /// `x` `[N, D]` (the pre-norm input, normalised inside the projections' call where the
    /// backend can) → `[N, D]`; reads and updates the sequences' conv histories and states.
    pub fn forward(
        &self,
        b: &B,
        x: &PreNorm<B>,
        meta: &DeviceStepMeta<B::Tensor>,
        conv_state: &[B::Tensor],
        state: &B::Tensor,
    ) -> Result<B::Tensor> {
        let s = self.shape;
        let n = meta.host.num_tokens();
        // Every projection of x at once, its norm included (one decode GEMV launch on CUDA).
        let [q, k, v, f, beta, g] = x.linear_n(
            b,
            [
                &self.q_proj,
                &self.k_proj,
                &self.v_proj,
                &self.f_a,
                &self.b_proj,
                &self.g_a,
            ],
        )?;
        let (o, gate) = match (&self.f_b, &self.g_b) {
            (
                Linear {
                    weight: Weight::Dense(w_fb),
                    bias: None,
                },
                Linear {
                    weight: Weight::Dense(w_gb),
                    bias: None,
                },
            ) => {
                // The convolutions, both gates' second factors and the recurrent step in one
                // call (one decode launch on CUDA).
                let c = &self.conv;
                let p = KdaProjections {
                    qkv: [&q, &k, &v],
                    conv_w: [&c[0], &c[1], &c[2]],
                    conv_state: [&conv_state[0], &conv_state[1], &conv_state[2]],
                    f: &f,
                    w_fb,
                    g: &g,
                    w_gb,
                    beta: &beta,
                    a_log: &self.a_log,
                    dt_bias: &self.dt_bias,
                    lower_bound: self.lower_bound,
                    state,
                    heads: s.heads,
                    head_dim: s.head_dim,
                };
                b.kda_from_projections(&p, meta)?
            }
            _ => self.step_unfused(b, [q, k, v], &f, &g, &beta, meta, conv_state, state)?,
        };
        let o = b.reshape(&o, &[n, s.heads * s.head_dim])?;
        // The gated output norm inside o_proj's call where the weight is dense (one decode GEMV
        // launch on CUDA with the `gated_norm` fusion).
        if let Linear {
            weight: Weight::Dense(w),
            bias,
        } = &self.o_proj.local
        {
            let y = b.gated_rms_norm_linear(
                &o,
                &gate,
                &self.o_norm,
                self.eps,
                s.head_dim,
                w,
                bias.as_ref(),
            )?;
            return self.o_proj.parallel.all_reduce(b, &y);
        }
        let rows = [n * s.heads, s.head_dim];
        let o = b.gated_rms_norm(
            &b.reshape(&o, &rows)?,
            &b.reshape(&gate, &rows)?,
            &self.o_norm,
            self.eps,
        )?;
        self.o_proj
            .forward(b, &b.reshape(&o, &[n, s.heads * s.head_dim])?)
    }

    /// The step from the projections with a quantized or biased gate factor: the
    /// convolutions, each factor's own projection, then `kda` → (`o` `[N, H, K]`, gate `[N, H·K]`).
    #[allow(clippy::too_many_arguments)]
    fn step_unfused(
        &self,
        b: &B,
        [q, k, v]: [B::Tensor; 3],
        f: &B::Tensor,
        g: &B::Tensor,
        beta: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        conv_state: &[B::Tensor],
        state: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor)> {
        let s = self.shape;
        let n = meta.host.num_tokens();
        let heads = |t: &B::Tensor| b.reshape(t, &[n, s.heads, s.head_dim]);
        let c = &self.conv;
        let [q, k, v] = super::outputs(
            "short_conv_many",
            b.short_conv_many(
                &[&q, &k, &v],
                &[&c[0], &c[1], &c[2]],
                &[&conv_state[0], &conv_state[1], &conv_state[2]],
                meta,
            )?,
        )?;
        let a = heads(&self.f_b.forward(b, f)?)?;
        let o = b.kda(
            &heads(&q)?,
            &heads(&k)?,
            &heads(&v)?,
            &a,
            beta,
            &self.a_log,
            &self.dt_bias,
            self.lower_bound,
            state,
            meta,
        )?;
        Ok((o, self.g_b.forward(b, g)?))
    }
}

/// The stored shape of a tensor (for parameters whose layout varies, such as `A_log`).
fn w_shape<B: Backend>(w: &WeightLoader<B>, name: &str) -> Result<Vec<usize>> {
    w.shape(name)
        .ok_or_else(|| anyhow::anyhow!("tensor `{name}` is missing"))
}
