//! An MoE block with a dense shared expert at decode sizes in two launches
//! ([`Backend::moe_experts_shared`], `kernels/moe_decode.cu`): the gate/up GEMV of every
//! (token, choice) pair and of each token's shared expert, then the down GEMV whose last block
//! per (token, column block) merges the pairs and adds the shared expert. The general path
//! launches nine kernels for the same block (sort, two grouped GEMVs, combine, the shared
//! expert's two GEMVs, the add); a Kimi-Linear-48B decode step has 26 such blocks.
//!
//! [`Backend::moe_experts_shared`]: dayone_backend::Backend::moe_experts_shared

use crate::mla_moe::check_experts;
use crate::{check_dtype, dtype_suffix, launch, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::moe_experts_then_shared;

impl CudaBackend {
    /// See [`Backend::moe_experts_shared`]: the fused block for at most
    /// [`launch::MOE_DECODE_MAX_PAIRS`] pairs (outside batch-invariant mode, widths in 8ℤ),
    /// else the separate ops. Errors: shapes or dtypes that do not match.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_experts_shared_impl(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &CudaTensor,
        down: &CudaTensor,
        shared: [&CudaTensor; 3],
    ) -> Result<CudaTensor> {
        const OP: &str = "moe_experts_shared";
        let (n, d, e, f) = check_experts(OP, x, ids, weights, gate_up, down)?;
        let k = ids.shape[1];
        let [gate_s, up_s, down_s] = shared;
        let fs = gate_s.shape.first().copied().unwrap_or(0);
        if gate_s.shape != [fs, d] || up_s.shape != [fs, d] || down_s.shape != [d, fs] {
            bail!(
                "{OP}: the shared expert must be gate, up [Fs, {d}] and down [{d}, Fs], got {:?}, {:?} and {:?}",
                gate_s.shape,
                up_s.shape,
                down_s.shape
            );
        }
        for (what, t) in [("gate_s", gate_s), ("up_s", up_s), ("down_s", down_s)] {
            check_dtype(OP, what, t, x.dtype)?;
        }
        let slots = n * k + n;
        let var = launch::moe_decode_variant();
        let (gu_grid, dn_grid) = launch::moe_decode_grids(slots, d, f, fs, var.dn_rpw);
        let fits = n > 0
            && k > 0
            && n * k <= launch::MOE_DECODE_MAX_PAIRS
            && [d, f, fs].iter().all(|w| *w > 0 && w.is_multiple_of(8))
            && n * dn_grid.0 <= launch::DECODE_COUNTERS
            && !self.invariant()
            && self.fusion(launch::DecodeFusion::MoeBlock);
        let counters = if fits { self.decode_counters()? } else { None };
        let Some(counters) = counters else {
            return moe_experts_then_shared(self, x, ids, weights, gate_up, down, shared);
        };
        let sfx = dtype_suffix(OP, x.dtype)?;
        self.bind()?;
        let fmax = f.max(fs);
        let h = self.alloc(vec![slots, fmax], x.dtype)?;
        let y2 = self.alloc(vec![slots, d], x.dtype)?;
        let y = self.alloc(vec![n, d], x.dtype)?;
        let u = |what: &str, v: usize| to_u32(OP, what, v);
        let (nu, ku, eu, du, fu, fsu, fmu) = (
            u("N", n)?,
            u("k", k)?,
            u("E", e)?,
            u("D", d)?,
            u("F", f)?,
            u("Fs", fs)?,
            u("F", fmax)?,
        );
        let threads = (32 * launch::MOE_GEMV_WARPS as u32, 1, 1);
        let grid = |(x, y): (usize, usize)| -> Result<(u32, u32, u32)> {
            Ok((u("grid.x", x)?, u("slots", y)?, 1))
        };
        let gu = self.func("moe", sfx, &format!("moe_dec_gu{}_{sfx}", var.gu))?;
        self.launch(
            OP,
            &gu,
            grid(gu_grid)?,
            threads,
            0,
            kparams![
                x.device_ptr(),
                ids.device_ptr(),
                gate_up.device_ptr(),
                gate_s.device_ptr(),
                up_s.device_ptr(),
                h.device_ptr(),
                nu,
                ku,
                eu,
                du,
                fu,
                fsu,
                fmu
            ],
        )?;
        let dn = self.func("moe", sfx, &format!("moe_dec_dn{}_{sfx}", var.dn))?;
        self.launch(
            OP,
            &dn,
            grid(dn_grid)?,
            threads,
            0,
            kparams![
                h.device_ptr(),
                ids.device_ptr(),
                weights.device_ptr(),
                down.device_ptr(),
                down_s.device_ptr(),
                y2.device_ptr(),
                y.device_ptr(),
                counters.device_ptr(),
                nu,
                ku,
                eu,
                du,
                fu,
                fsu,
                fmu
            ],
        )?;
        Ok(y)
    }
}
