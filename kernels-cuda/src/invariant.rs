//! Batch-invariant mode: every op gives a row (a token) the same bits however many rows share
//! its call and however its prompt was cut into steps — what prefix-cache hits, chunked prefill,
//! preemption and continuous batching need to be bit-exact (serving.md §D4; vLLM's
//! `VLLM_BATCH_INVARIANT`, SGLang's `--enable-deterministic-inference`).
//!
//! What changes when it is on:
//! - GEMMs (`linear`, `linear_f32`, `head_linear`, the prefill side of `linear_quant`) run
//!   `kernels/gemm_inv.cu`, whose per-element reduction order is fixed (no GEMV for small M, no
//!   cuBLAS algorithm chosen by M);
//! - decode attention takes the prefill kernels (the split-K decode kernel reduces keys in
//!   another order, split by the step's batch) and MLA/DSA attention never splits keys;
//! - MoE experts use the tiled kernels for every token count (no GEMV below a threshold);
//! - KDA is token-recurrent for every sequence (its state carried in f32 between tokens).
//!
//! The rest of the backend is invariant already: norms, RoPE, elementwise ops and the tiled
//! attention kernels are per row, and the DSA top-k writes its selection in position order.

use crate::{to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::DType;
use std::sync::atomic::Ordering;

/// One invariant GEMM call: `y[b][M, N] = x[b][M, K] · w[b][N, K]ᵀ` for `b < batch`, rows of
/// x, w, y `lda`, `ldw`, `ldy` elements apart and batches `strides` elements apart.
pub(crate) struct InvGemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldw: usize,
    pub ldy: usize,
    pub batch: usize,
    pub strides: [usize; 3],
}

impl InvGemm {
    /// A plain `[M, K] · [N, K]ᵀ` with contiguous rows.
    pub fn plain(m: usize, n: usize, k: usize) -> Self {
        InvGemm {
            m,
            n,
            k,
            lda: k,
            ldw: k,
            ldy: n,
            batch: 1,
            strides: [0; 3],
        }
    }
}

/// Key segments of the tensor-core invariant GEMM, `(count, length)`, from K alone: up to 4 of
/// at least 1024 keys (a multiple of 128), so that a decode-sized product has 4× the blocks
/// while every M reduces each element in the same segments and order.
pub(crate) fn key_segments(k: usize) -> (usize, usize) {
    let want = (k / 1024).clamp(1, 4);
    let len = k.div_ceil(want).div_ceil(128) * 128;
    (k.div_ceil(len.max(1)).max(1), len.max(128))
}

impl CudaBackend {
    /// Whether the batch-invariant kernels are in use.
    pub(crate) fn invariant(&self) -> bool {
        self.batch_invariant.load(Ordering::Relaxed)
    }

    pub(crate) fn set_invariant(&self, on: bool) {
        self.batch_invariant.store(on, Ordering::Relaxed);
    }

    /// Runs `kernels/gemm_inv.cu` for `g` (`x`, `w` of one dtype; `y` of that dtype or f32).
    /// Tensor cores for 16-bit inputs whose K, row strides and batch strides are multiples of 8
    /// (16-byte rows), the FMA kernel otherwise; the tile variant follows M, the per-element
    /// order does not.
    pub(crate) fn gemm_inv(
        &self,
        op: &str,
        x: &CudaTensor,
        w: &CudaTensor,
        y: &CudaTensor,
        g: &InvGemm,
    ) -> Result<()> {
        let sfx = crate::dtype_suffix(op, x.dtype)?;
        let osfx = match (y.dtype, x.dtype) {
            (a, b) if a == b => "",
            (DType::F32, _) => "_of32",
            (a, b) => bail!("{op}: output dtype {a} with inputs {b}"),
        };
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(());
        }
        let aligned = [g.k, g.lda, g.ldw, g.strides[0], g.strides[1]]
            .iter()
            .all(|v| v % 8 == 0);
        let mma = x.dtype != DType::F32 && aligned && self.info.arch >= 80;
        // (kernel, variant, BM, BN, threads, dynamic shared memory); gemm_inv.cu lists them.
        let mma_smem =
            |stages: usize, bm: usize, bn: usize, bk: usize| stages * (bm + bn) * (bk + 8) * 2;
        let (name, variant, bm, bn, threads, smem) = if mma {
            if g.m <= 16 {
                ("mma", "s", 16, 32, 64, mma_smem(5, 16, 32, 128))
            } else if g.m <= 128 {
                ("mma", "m", 64, 64, 128, mma_smem(4, 64, 64, 32))
            } else {
                ("mma", "l", 128, 128, 128, mma_smem(3, 128, 128, 32))
            }
        } else if g.m <= 16 {
            ("fma", "s", 16, 64, 256, 0)
        } else {
            ("fma", "l", 64, 64, 256, 0)
        };
        if smem > self.kernels.max_smem_optin as usize {
            bail!(
                "{op}: the invariant GEMM needs {smem} bytes of shared memory, the device allows {}",
                self.kernels.max_smem_optin
            );
        }
        let (nseg, kseg) = if mma {
            key_segments(g.k)
        } else {
            (1, g.k.max(1))
        };
        let f = self.func(
            "gemm_inv",
            sfx,
            &format!("gemm_inv_{name}_{sfx}_{variant}{osfx}"),
        )?;
        let grid = (
            to_u32(op, "N tiles", g.n.div_ceil(bn))?,
            to_u32(op, "M tiles", g.m.div_ceil(bm))?,
            to_u32(op, "batch · segments", g.batch * nseg)?,
        );
        let dims = [
            to_u32(op, "M", g.m)?,
            to_u32(op, "N", g.n)?,
            to_u32(op, "K", g.k)?,
            to_u32(op, "lda", g.lda)?,
            to_u32(op, "ldw", g.ldw)?,
            to_u32(op, "ldy", g.ldy)?,
        ];
        let strides = g.strides.map(|v| v as u64);
        if !mma {
            return self.launch(
                op,
                &f,
                grid,
                (threads, 1, 1),
                0,
                kparams![
                    x.device_ptr(),
                    w.device_ptr(),
                    y.device_ptr(),
                    dims[0],
                    dims[1],
                    dims[2],
                    dims[3],
                    dims[4],
                    dims[5],
                    strides[0],
                    strides[1],
                    strides[2]
                ],
            );
        }
        let part = if nseg > 1 {
            Some(self.scratch_f32(g.batch * nseg * g.m * g.n)?)
        } else {
            None
        };
        let pp = part.as_ref().map_or(0u64, |t| t.device_ptr());
        let (ksegu, nsegu) = (to_u32(op, "segment", kseg)?, nseg as u32);
        self.launch(
            op,
            &f,
            grid,
            (threads, 1, 1),
            smem as u32,
            kparams![
                x.device_ptr(),
                w.device_ptr(),
                y.device_ptr(),
                pp,
                dims[0],
                dims[1],
                dims[2],
                dims[3],
                dims[4],
                dims[5],
                strides[0],
                strides[1],
                strides[2],
                ksegu,
                nsegu
            ],
        )?;
        if nseg > 1 {
            let f = self.func("gemm_inv", sfx, &format!("gemm_inv_combine_{sfx}{osfx}"))?;
            let total = g.batch * g.m * g.n;
            self.launch(
                op,
                &f,
                (
                    crate::launch::elementwise_grid(total, 4, 256, 8 * self.info.sms),
                    1,
                    1,
                ),
                (256, 1, 1),
                0,
                kparams![
                    pp,
                    y.device_ptr(),
                    dims[0],
                    dims[1],
                    dims[5],
                    strides[2],
                    to_u32(op, "batch", g.batch)?,
                    nsegu
                ],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::key_segments;

    #[test]
    fn segments_depend_on_k_only_and_cover_it() {
        assert_eq!(key_segments(64), (1, 128));
        assert_eq!(key_segments(1000), (1, 1024));
        assert_eq!(key_segments(4096), (4, 1024));
        assert_eq!(key_segments(14336), (4, 3584));
        for k in [8, 72, 1024, 2040, 2056, 5000, 7168, 18432] {
            let (n, len) = key_segments(k);
            assert!(n * len >= k && (n - 1) * len < k, "{k}: {n} × {len}");
            assert!(len.is_multiple_of(128) && (1..=4).contains(&n));
        }
    }
}
