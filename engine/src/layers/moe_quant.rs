//! Routed experts kept in their low-bit form (MXFP4, INT4; [`dayone_backend::quant`]) and
//! decoded per step: only the experts a step's tokens were routed to are converted, into one
//! float workspace that every MoE layer of the model reuses (the layers run one after another,
//! so one layer's decoded experts are dead when the next layer decodes). Never an offline
//! float copy of the experts, never a decoded copy at load.

use crate::weights::WeightLoader;
use anyhow::{bail, Result};
use dayone_backend::{
    Backend, DType, ExpertAct, ExpertOptions, HostTensor, QuantHost, QuantTensor, TensorInfo,
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

/// One layer's routed experts, low-bit.
pub struct QuantExperts<B: Backend> {
    /// `[E, 2F, D]` (gate rows first).
    pub gate_up: QuantTensor<B::Tensor>,
    /// `[E, D, F]`.
    pub down: QuantTensor<B::Tensor>,
    /// Where a step's experts are decoded.
    pub workspace: ExpertWorkspace<B>,
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
        })
    }

    /// `y[n] = Σ_j weights[n, j] · Expert_{ids[n, j]}(x[n])` (SwiGLU) with the chosen experts
    /// decoded first: `x` `[N, D]`, `ids` `[N, k]` u32, `weights` `[N, k]` f32 → `[N, D]`.
    pub fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        ids: &B::Tensor,
        weights: &B::Tensor,
    ) -> Result<B::Tensor> {
        let host = b.download(ids)?.to_u32()?;
        self.forward_with(b, x, &host, weights, ExpertAct::Swiglu, None)
    }

    /// [`QuantExperts::forward`] with the routed ids already on the host (`[N·k]`, the shape
    /// of `weights`), another activation and the projections' biases (`[E, 2F]`, `[E, D]`,
    /// gathered per step into the workspace's slot order).
    pub fn forward_with(
        &self,
        b: &B,
        x: &B::Tensor,
        host: &[u32],
        weights: &B::Tensor,
        act: ExpertAct,
        biases: Option<(&B::Tensor, &B::Tensor)>,
    ) -> Result<B::Tensor> {
        let e = self.gate_up.shape[0];
        // The distinct experts in order of first use; each gets the next workspace slot.
        let mut slot = vec![u32::MAX; e];
        let mut items = Vec::new();
        for &i in host {
            let i = i as usize;
            if i < e && slot[i] == u32::MAX {
                slot[i] = items.len() as u32;
                items.push(i as u32);
            }
        }
        let slots = self.workspace.slots();
        if items.len() > slots {
            bail!(
                "moe: {} experts chosen in one step but the workspace holds {slots}",
                items.len()
            );
        }
        let local: Vec<u32> = host
            .iter()
            .map(|&i| slot.get(i as usize).copied().unwrap_or(u32::MAX))
            .collect();
        let (gu, dn) = &*self.workspace.tensors;
        let chosen = b.upload(&HostTensor::from_u32(vec![items.len()], &items)?)?;
        b.dequantize_into(&self.gate_up, &chosen, gu)?;
        b.dequantize_into(&self.down, &chosen, dn)?;
        let local = b.upload(&HostTensor::from_u32(weights.shape().to_vec(), &local)?)?;
        // Biases in slot order, one row per workspace slot (slots past the chosen repeat the
        // first chosen expert's row; no token reads them).
        let gathered = match biases {
            Some((gub, dnb)) => {
                let mut rows = items.clone();
                rows.resize(slots, items.first().copied().unwrap_or(0));
                let rows = b.upload(&HostTensor::from_u32(vec![slots], &rows)?)?;
                Some((b.embedding(gub, &rows)?, b.embedding(dnb, &rows)?))
            }
            None => None,
        };
        let opts = ExpertOptions {
            act,
            gate_up_bias: gathered.as_ref().map(|g| &g.0),
            down_bias: gathered.as_ref().map(|g| &g.1),
        };
        b.moe_experts_ext(x, &local, weights, gu, dn, &opts)
    }
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
