//! Routed experts with block-quantized weights ([`crate::quant`]) run by decoding: the distinct
//! experts a step routed to are decoded ([`Backend::dequantize_into`]) into a float workspace,
//! in order of first use, and the float experts run through [`Backend::moe_experts_ext`] with
//! the ids renumbered to workspace slots. The default of [`Backend::moe_experts_quant`]
//! (temporaries sized for the step) and the engine's per-step path (one workspace shared by
//! every MoE layer) are both this.

use crate::{Backend, ExpertOptions, HostTensor, QuantTensor, TensorInfo};
use anyhow::{bail, ensure, Result};

/// The distinct experts of `ids` (`[N·k]`, each `< e` or skipped) in order of first use, and
/// every id renumbered to its expert's place in that list (`u32::MAX` for an id `≥ e`).
pub fn expert_slots(ids: &[u32], e: usize) -> (Vec<u32>, Vec<u32>) {
    let mut slot = vec![u32::MAX; e];
    let mut items = Vec::new();
    for &i in ids {
        let i = i as usize;
        if i < e && slot[i] == u32::MAX {
            slot[i] = items.len() as u32;
            items.push(i as u32);
        }
    }
    let local = ids
        .iter()
        .map(|&i| slot.get(i as usize).copied().unwrap_or(u32::MAX))
        .collect();
    (items, local)
}

/// `y[n] = Σ_j weights[n, j] · (down[e] · act(gate_up[e] · x[n] + b_gu[e]) + b_d[e])` with
/// `e = ids[n, j]` and the experts decoded first into `workspace`
/// (`[S, 2F, D]` and `[S, D, F]` of `x`'s dtype, `S` ≥ the distinct experts of the step).
/// `x` `[N, D]`, `ids` `[N·k]` on the host, `weights` `[N, k]` f32, `gate_up` `[E, 2F, D]`
/// and `down` `[E, D, F]` quantized; the biases of `opts` (`[E, 2F]`, `[E, D]`) are gathered
/// into slot order. With `opts.fp8` the backend's FP8 GEMM ([`Backend::moe_experts_fp8`])
/// runs the step instead where it has one. Errors: more distinct experts than workspace slots,
/// mismatched shapes.
#[allow(clippy::too_many_arguments)]
pub fn moe_experts_decoded<B: Backend>(
    b: &B,
    x: &B::Tensor,
    ids: &[u32],
    weights: &B::Tensor,
    gate_up: &QuantTensor<B::Tensor>,
    down: &QuantTensor<B::Tensor>,
    opts: &ExpertOptions<B::Tensor>,
    workspace: (&B::Tensor, &B::Tensor),
) -> Result<B::Tensor> {
    let [e, f2, d] = gate_up.shape;
    ensure!(
        down.shape == [e, d, f2 / 2],
        "moe_experts_quant: down {:?} does not match gate_up {:?}",
        down.shape,
        gate_up.shape
    );
    ensure!(
        ids.len() == weights.shape().iter().product::<usize>(),
        "moe_experts_quant: {} ids for weights {:?}",
        ids.len(),
        weights.shape()
    );
    let (items, local) = expert_slots(ids, e);
    let (gu, dn) = workspace;
    let slots = gu.shape()[0];
    if items.len() > slots {
        bail!(
            "moe: {} experts chosen in one step but the workspace holds {slots}",
            items.len()
        );
    }
    if items.is_empty() {
        return b.zeros(x.shape(), x.dtype());
    }
    let chosen = b.upload(&HostTensor::from_u32(vec![items.len()], &items)?)?;
    let local = b.upload(&HostTensor::from_u32(weights.shape().to_vec(), &local)?)?;
    // Biases in slot order, one row per workspace slot (slots past the chosen repeat the first
    // chosen expert's row; no token reads them).
    let mut rows = items.clone();
    rows.resize(slots, items[0]);
    let rows = match (opts.gate_up_bias, opts.down_bias) {
        (None, None) => None,
        _ => Some(b.upload(&HostTensor::from_u32(vec![slots], &rows)?)?),
    };
    let gather = |t: Option<&B::Tensor>| -> Result<Option<B::Tensor>> {
        match (t, &rows) {
            (Some(t), Some(r)) => Ok(Some(b.embedding(t, r)?)),
            _ => Ok(None),
        }
    };
    let (gub, dnb) = (gather(opts.gate_up_bias)?, gather(opts.down_bias)?);
    let slot_opts = ExpertOptions {
        act: opts.act,
        gate_up_bias: gub.as_ref(),
        down_bias: dnb.as_ref(),
        fp8: opts.fp8,
    };
    if opts.fp8 {
        if let Some(y) = b.moe_experts_fp8(
            x,
            &local,
            weights,
            gate_up,
            down,
            &chosen,
            &slot_opts,
            (gu, dn),
        )? {
            return Ok(y);
        }
    }
    b.dequantize_into(gate_up, &chosen, gu)?;
    b.dequantize_into(down, &chosen, dn)?;
    b.moe_experts_ext(x, &local, weights, gu, dn, &slot_opts)
}

/// [`moe_experts_decoded`] into temporaries sized for the step's distinct experts, with the
/// ids (`[N, k]` u32 on the device) read back: the default of
/// [`Backend::moe_experts_quant`], and the fallback of a backend's direct kernel for formats
/// or shapes it does not take.
pub fn moe_experts_decoded_temp<B: Backend>(
    b: &B,
    x: &B::Tensor,
    ids: &B::Tensor,
    weights: &B::Tensor,
    gate_up: &QuantTensor<B::Tensor>,
    down: &QuantTensor<B::Tensor>,
    opts: &ExpertOptions<B::Tensor>,
) -> Result<B::Tensor> {
    let host = b.download(ids)?.to_u32()?;
    let [e, f2, d] = gate_up.shape;
    let m = expert_slots(&host, e).0.len().max(1);
    let dt = x.dtype();
    let gu = b.zeros(&[m, f2, d], dt)?;
    let dn = b.zeros(&[m, d, f2 / 2], dt)?;
    moe_experts_decoded(b, x, &host, weights, gate_up, down, opts, (&gu, &dn))
}

#[cfg(test)]
mod tests {
    use super::expert_slots;

    #[test]
    fn slots_in_order_of_first_use() {
        let (items, local) = expert_slots(&[5, 2, 5, 9, 2, 0], 6);
        assert_eq!(items, vec![5, 2, 0]);
        assert_eq!(local, vec![0, 1, 0, u32::MAX, 1, 2]);
    }
}
