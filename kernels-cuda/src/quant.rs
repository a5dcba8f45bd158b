//! Block-quantized weights: decoding items into a workspace (`dequant_*`) and the low-bit GEMV
//! for small M (`gemv_q_*`, M ≤ 16 by default); larger M decodes once into a pooled temporary and runs
//! cuBLAS.

use crate::{dtype_suffix, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::{DType, QuantTensor, TensorInfo};

/// The largest M the low-bit GEMV serves (`DAYONE_QUANT_GEMV_MAX_M`, default 16 — measured
/// faster than decoding then cuBLAS at M = 1 and 16 on the H200, slower at 32 —
/// at most 32; 0: always decode then cuBLAS), for measuring both paths on a shape.
fn gemv_max_m() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        crate::launch::env_knob("DAYONE_QUANT_GEMV_MAX_M", |&m: &usize| m <= 32, "0 to 32")
            .unwrap_or(16)
    })
}

/// Threads per block of the GEMV (one warp per output row).
const GEMV_Q_THREADS: u32 = 256;

impl CudaBackend {
    fn quant_ptrs(op: &str, q: &QuantTensor<CudaTensor>) -> Result<[u64; 3]> {
        for (t, name) in [(&q.codes, "codes"), (&q.scales, "scales")] {
            if t.dtype != DType::U32 {
                bail!("{op}: quantized {name} must be u32 words, got {}", t.dtype);
            }
        }
        Ok([
            q.codes.device_ptr(),
            q.scales.device_ptr(),
            q.mins.as_ref().map_or(0, |m| m.device_ptr()),
        ])
    }

    pub(crate) fn dequantize_into_impl(
        &self,
        q: &QuantTensor<CudaTensor>,
        items: &CudaTensor,
        out: &CudaTensor,
    ) -> Result<()> {
        const OP: &str = "dequantize_into";
        let [_, rows, cols] = q.shape;
        let m = items.numel();
        if items.dtype != DType::U32 || items.shape.len() != 1 {
            bail!(
                "{OP}: items must be a u32 [M] tensor, got {:?} {}",
                items.shape,
                items.dtype
            );
        }
        if out.shape.len() != 3 || out.shape[1..] != [rows, cols] || out.shape[0] < m {
            bail!(
                "{OP}: out must be [>= {m}, {rows}, {cols}], got {:?}",
                out.shape
            );
        }
        self.dequant_launch(q, items.device_ptr(), m, out)
    }

    /// Decodes `m` items into `out`: those listed at `items` (a device `[m]` u32 array), or
    /// items `0..m` when `items` is 0 (no list to upload).
    fn dequant_launch(
        &self,
        q: &QuantTensor<CudaTensor>,
        items: u64,
        m: usize,
        out: &CudaTensor,
    ) -> Result<()> {
        const OP: &str = "dequantize_into";
        let [e, rows, cols] = q.shape;
        let sfx = dtype_suffix(OP, out.dtype)?;
        let p = Self::quant_ptrs(OP, q)?;
        let [kind, scale, has_min, group] = q.format.kernel_params();
        self.bind()?;
        let work = (m * rows * cols / 8) as u64;
        if work == 0 {
            return Ok(());
        }
        let f = self.func("quant", sfx, &format!("dequant_{sfx}"))?;
        let blocks = work.div_ceil(256).min(65535 * 8) as u32;
        self.launch(
            OP,
            &f,
            (blocks, 1, 1),
            (256, 1, 1),
            0,
            kparams![
                p[0],
                p[1],
                p[2],
                items,
                out.device_ptr(),
                to_u32(OP, "M", m)?,
                to_u32(OP, "rows", rows)?,
                to_u32(OP, "cols", cols)?,
                to_u32(OP, "items", e)?,
                kind,
                scale,
                has_min,
                group
            ],
        )
    }

    pub(crate) fn linear_quant_impl(
        &self,
        x: &CudaTensor,
        q: &QuantTensor<CudaTensor>,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear_quant";
        let [items, n, k] = q.shape;
        if items != 1 || x.shape.len() != 2 || x.shape[1] != k {
            bail!(
                "{OP}: expected x [M, {k}] and one weight [1, {n}, {k}], got x {:?} and w {:?}",
                x.shape,
                q.shape
            );
        }
        if let Some(b) = bias {
            if b.shape != [n] || b.dtype != x.dtype {
                bail!(
                    "{OP}: bias must be {} [{n}], got {} {:?}",
                    x.dtype,
                    b.dtype,
                    b.shape
                );
            }
        }
        let m = x.shape[0];
        let Some(mt) = [1usize, 2, 4, 8, 16, 32]
            .into_iter()
            .find(|&t| t >= m && m <= gemv_max_m() && !self.invariant())
        else {
            // Prefill: decode once into a pooled temporary, then cuBLAS.
            let w = self.alloc(vec![1, n, k], x.dtype)?;
            self.dequant_launch(q, 0, 1, &w)?;
            let w = CudaTensor {
                shape: vec![n, k],
                ..w
            };
            return self.linear_impl(x, &w, bias, false);
        };
        let sfx = dtype_suffix(OP, x.dtype)?;
        let p = Self::quant_ptrs(OP, q)?;
        let [kind, scale, has_min, group] = q.format.kernel_params();
        self.bind()?;
        let out = self.alloc(vec![m, n], x.dtype)?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        let f = self.func("quant", sfx, &format!("gemv_q_{sfx}_m{mt}"))?;
        let rows_per_block = (GEMV_Q_THREADS / 32) as usize;
        self.launch(
            OP,
            &f,
            (to_u32(OP, "blocks", n.div_ceil(rows_per_block))?, 1, 1),
            (GEMV_Q_THREADS, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                p[0],
                p[1],
                p[2],
                bias.map_or(0u64, |b| b.device_ptr()),
                out.device_ptr(),
                m as u32,
                to_u32(OP, "N", n)?,
                to_u32(OP, "K", k)?,
                kind,
                scale,
                has_min,
                group
            ],
        )?;
        Ok(out)
    }
}
