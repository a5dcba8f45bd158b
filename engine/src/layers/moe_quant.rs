//! Routed experts kept in their low-bit form (MXFP4, INT4; [`dayone_backend::quant`]) and
//! decoded per step: only the experts a step's tokens were routed to are converted, into one
//! float workspace that every MoE layer of the model reuses (the layers run one after another,
//! so one layer's decoded experts are dead when the next layer decodes). Never an offline
//! float copy of the experts, never a decoded copy at load. Decode steps (few tokens) may
//! instead read the codes directly ([`Backend::moe_experts_quant`]) where the backend says that
//! is faster ([`Backend::moe_quant_direct_tokens`]; [`QuantPath`]).

use crate::weights::WeightLoader;
use anyhow::{bail, Result};
use dayone_backend::quant_moe::moe_experts_decoded;
use dayone_backend::{
    Backend, DType, ExpertAct, ExpertOptions, HostTensor, QuantFormat, QuantHost, QuantTensor,
    TensorInfo,
};
use std::sync::Arc;

/// The float workspace `[slots, 2F, D]` and `[slots, D, F]` (activation dtype) the experts of
/// a step are decoded into; clones share it.
pub struct ExpertWorkspace<B: Backend> {
    tensors: Arc<(B::Tensor, B::Tensor)>,
}

impl<B: Backend> Clone for ExpertWorkspace<B> {
    fn clone(&self) -> Self {
        Self {
            tensors: self.tensors.clone(),
        }
    }
}

impl<B: Backend> ExpertWorkspace<B> {
    /// A workspace for `slots` experts of width `f` over a residual of width `d`.
    pub fn new(b: &B, slots: usize, f: usize, d: usize, dtype: DType) -> Result<Self> {
        Ok(Self {
            tensors: Arc::new((
                b.zeros(&[slots, 2 * f, d], dtype)?,
                b.zeros(&[slots, d, f], dtype)?,
            )),
        })
    }

    /// Experts the workspace holds at once.
    pub fn slots(&self) -> usize {
        self.tensors.0.shape()[0]
    }

    /// Whether it fits experts of `[2F, D]` / `[D, F]`.
    fn fits(&self, f: usize, d: usize) -> bool {
        self.tensors.0.shape()[1..] == [2 * f, d] && self.tensors.1.shape()[1..] == [d, f]
    }
}

/// Which way the low-bit experts run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantPath {
    /// Read the codes directly ([`Backend::moe_experts_quant`]) for steps of at most
    /// [`Backend::moe_quant_direct_tokens`] tokens, else decode into the workspace.
    #[default]
    Auto,
    /// Always read the codes directly.
    Direct,
    /// Always decode the chosen experts into the workspace first.
    Decode,
}

/// One layer's routed experts, low-bit.
pub struct QuantExperts<B: Backend> {
    /// `[E, 2F, D]` (gate rows first).
    pub gate_up: QuantTensor<B::Tensor>,
    /// `[E, D, F]`.
    pub down: QuantTensor<B::Tensor>,
    /// Where a step's experts are decoded.
    pub workspace: ExpertWorkspace<B>,
    /// Direct or decoded ([`QuantPath::Auto`] at load; benchmarks pin one).
    pub path: QuantPath,
    /// Steps that decode run through the backend's FP8 GEMM instead
    /// ([`ExpertOptions::fp8`]; `--moe-fp8`, off by default; set at load only where the backend
    /// has the path for these formats, see [`WeightLoader::with_moe_fp8`]).
    pub fp8: bool,
}

impl<B: Backend> QuantExperts<B> {
    /// Uploads the stacked low-bit experts and takes the loader's shared workspace for their
    /// shape (sized for every expert of a layer: the worst case of one step).
    pub fn load(w: &WeightLoader<B>, gate_up: &QuantHost, down: &QuantHost) -> Result<Self> {
        let [e, f2, d] = gate_up.shape;
        if down.shape != [e, d, f2 / 2] {
            bail!(
                "quantized experts: down projections {:?} do not match gate/up {:?}",
                down.shape,
                gate_up.shape
            );
        }
        Ok(Self {
            gate_up: w.upload_quant(gate_up)?,
            down: w.upload_quant(down)?,
            workspace: w.expert_workspace(e, f2 / 2, d)?,
            path: QuantPath::Auto,
            fp8: w.moe_fp8()
                && fp8_available(
                    w.backend(),
                    gate_up.format,
                    down.format,
                    w.parallel().is_first(),
                ),
        })
    }

    /// Whether a step of `n` tokens with `top_k` experts each reads the codes directly.
    fn direct(&self, b: &B, n: usize, top_k: usize) -> bool {
        match self.path {
            QuantPath::Direct => true,
            QuantPath::Decode => false,
            QuantPath::Auto => {
                let e = self.gate_up.shape[0];
                let max = b
                    .moe_quant_direct_tokens(self.gate_up.format, e, top_k)
                    .min(b.moe_quant_direct_tokens(self.down.format, e, top_k));
                n > 0 && n <= max
            }
        }
    }

    /// `y[n] = Σ_j weights[n, j] · Expert_{ids[n, j]}(x[n])` (SwiGLU): `x` `[N, D]`, `ids`
    /// `[N, k]` u32, `weights` `[N, k]` f32 → `[N, D]`. Small steps read the codes directly
    /// (no read-back of the ids); others read the ids back and decode the chosen experts.
    pub fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        ids: &B::Tensor,
        weights: &B::Tensor,
    ) -> Result<B::Tensor> {
        let opts = ExpertOptions {
            act: ExpertAct::Swiglu,
            gate_up_bias: None,
            down_bias: None,
            fp8: self.fp8,
        };
        let top_k = weights.shape().last().copied().unwrap_or(1);
        if self.direct(b, x.shape()[0], top_k) {
            return b.moe_experts_quant(x, ids, weights, &self.gate_up, &self.down, &opts);
        }
        let host = b.download(ids)?.to_u32()?;
        self.decoded(b, x, &host, weights, &opts)
    }

    /// [`QuantExperts::forward`] with the routed ids already on the host (`[N·k]`, the shape
    /// of `weights`), another activation and the projections' biases (`[E, 2F]`, `[E, D]`).
    pub fn forward_with(
        &self,
        b: &B,
        x: &B::Tensor,
        host: &[u32],
        weights: &B::Tensor,
        act: ExpertAct,
        biases: Option<(&B::Tensor, &B::Tensor)>,
    ) -> Result<B::Tensor> {
        let opts = ExpertOptions {
            act,
            gate_up_bias: biases.map(|b| b.0),
            down_bias: biases.map(|b| b.1),
            fp8: self.fp8,
        };
        let n = x.shape()[0];
        if self.direct(b, n, host.len() / n.max(1)) {
            let ids = b.upload(&HostTensor::from_u32(weights.shape().to_vec(), host)?)?;
            return b.moe_experts_quant(x, &ids, weights, &self.gate_up, &self.down, &opts);
        }
        self.decoded(b, x, host, weights, &opts)
    }

    /// The chosen experts decoded into the shared workspace, then the float experts
    /// ([`dayone_backend::quant_moe::moe_experts_decoded`]).
    fn decoded(
        &self,
        b: &B,
        x: &B::Tensor,
        host: &[u32],
        weights: &B::Tensor,
        opts: &ExpertOptions<B::Tensor>,
    ) -> Result<B::Tensor> {
        let (gu, dn) = &*self.workspace.tensors;
        moe_experts_decoded(
            b,
            x,
            host,
            weights,
            &self.gate_up,
            &self.down,
            opts,
            (gu, dn),
        )
    }
}

/// Whether the backend runs both formats through its FP8 expert GEMM; when not and `warn` (the
/// job's first rank), says once per process that `--moe-fp8` falls back to the float decode (as
/// vLLM falls back, with a warning, where a quantisation kernel is missing on the device).
fn fp8_available<B: Backend>(b: &B, gate_up: QuantFormat, down: QuantFormat, warn: bool) -> bool {
    if b.moe_fp8_available(gate_up) && b.moe_fp8_available(down) {
        return true;
    }
    if !warn {
        return false;
    }
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            "--moe-fp8: {} has no FP8 expert GEMM for {} / {} experts (it needs CUDA sm_89+, \
             MXFP4 or INT4 with groups of a multiple of 32, no --batch-invariant); the experts decode to the float dtype",
            b.name(),
            gate_up.name(),
            down.name()
        );
    });
    false
}

impl<B: Backend> WeightLoader<'_, B> {
    /// The workspace shared by the MoE layers whose experts are `[2F, D]` / `[D, F]`, made at
    /// the first such layer with room for `experts` experts (in the activation dtype).
    pub fn expert_workspace(
        &self,
        experts: usize,
        f: usize,
        d: usize,
    ) -> Result<ExpertWorkspace<B>> {
        let mut list = self.workspaces().borrow_mut();
        if let Some(ws) = list
            .iter()
            .find(|ws| ws.fits(f, d) && ws.slots() >= experts)
        {
            return Ok(ws.clone());
        }
        let b = self.backend();
        let ws = ExpertWorkspace::new(b, experts, f, d, b.activation_dtype(self.dtype()))?;
        list.push(ws.clone());
        Ok(ws)
    }
}

#[cfg(test)]
mod tests {
    use super::{ExpertWorkspace, QuantExperts, QuantPath};
    use dayone_backend::conformance::{compare, rand_tensor, Rng};
    use dayone_backend::conformance_quant::rand_quant;
    use dayone_backend::cpu::CpuBackend;
    use dayone_backend::{Backend, DType, ExpertAct, HostTensor, QuantFormat, QuantTensor};

    /// Both paths of the layer (the backend's `moe_experts_quant` with the ids on the device or
    /// uploaded from the host, and decoding into the shared workspace) give the same experts.
    #[test]
    fn direct_and_decoded_paths_agree() {
        let b = CpuBackend;
        let mut rng = Rng::new(5);
        let (e, d, f, n, k) = (5, 64, 32, 3, 2);
        let q = |rng: &mut Rng, shape| {
            QuantTensor::upload(&b, &rand_quant(rng, QuantFormat::MXFP4, shape).unwrap()).unwrap()
        };
        let mut layer = QuantExperts {
            gate_up: q(&mut rng, [e, 2 * f, d]),
            down: q(&mut rng, [e, d, f]),
            workspace: ExpertWorkspace::new(&b, e, f, d, DType::F32).unwrap(),
            path: QuantPath::Decode,
            fp8: false,
        };
        let x = b
            .upload(&rand_tensor(&mut rng, &[n, d], DType::F32, 1.0).unwrap())
            .unwrap();
        let host = [4u32, 1, 1, 0, 4, 4];
        let ids = b
            .upload(&HostTensor::from_u32(vec![n, k], &host).unwrap())
            .unwrap();
        let w = b
            .upload(&HostTensor::from_f32(vec![n, k], &[0.5, 0.25, 1.0, 0.1, 0.3, 0.7]).unwrap())
            .unwrap();
        let gu_bias = b
            .upload(&rand_tensor(&mut rng, &[e, 2 * f], DType::F32, 1.0).unwrap())
            .unwrap();
        let dn_bias = b
            .upload(&rand_tensor(&mut rng, &[e, d], DType::F32, 1.0).unwrap())
            .unwrap();
        let act = ExpertAct::GptOss {
            alpha: 1.702,
            limit: 7.0,
        };
        let run = |layer: &QuantExperts<CpuBackend>| {
            let plain = layer.forward(&b, &x, &ids, &w).unwrap();
            let ext = layer
                .forward_with(&b, &x, &host, &w, act, Some((&gu_bias, &dn_bias)))
                .unwrap();
            (b.download(&plain).unwrap(), b.download(&ext).unwrap())
        };
        let decoded = run(&layer);
        layer.path = QuantPath::Direct;
        let direct = run(&layer);
        compare("forward", "direct vs decode", &direct.0, &decoded.0, 0.0).unwrap();
        compare(
            "forward_with",
            "direct vs decode",
            &direct.1,
            &decoded.1,
            0.0,
        )
        .unwrap();
        // Auto on a backend without a direct kernel decodes.
        assert_eq!(b.moe_quant_direct_tokens(QuantFormat::MXFP4, 32, 4), 0);
        // `--moe-fp8` on a backend without the FP8 GEMM: refused at load (with a warning), and a
        // layer that asks anyway gets the decode path's result.
        assert!(!super::fp8_available(
            &b,
            QuantFormat::MXFP4,
            QuantFormat::MXFP4,
            true
        ));
        layer.path = QuantPath::Decode;
        layer.fp8 = true;
        let fallback = run(&layer);
        compare("forward", "fp8 fallback", &fallback.0, &decoded.0, 0.0).unwrap();
        compare("forward_with", "fp8 fallback", &fallback.1, &decoded.1, 0.0).unwrap();
    }
}
