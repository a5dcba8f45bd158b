//! DeepSeek-V3.2 sparse attention (DSA) ops (`kernels/dsa.cu`): `layer_norm` (the indexer's key
//! norm) and `dsa_topk` (lightning-indexer scores + per-query top-k). `sparse_latent_attention`
//! is the MLA kernel of `mla_moe.rs` reading a selection list instead of every causal key.
//!
//! `dsa_topk` runs per group of query tokens: `dsa_score_*` writes the group's scores
//! `[group, stride]` f32 (stride = the step's longest causal key count rounded up to 4; the group
//! is sized so this scratch stays under [`DSA_SCORE_BYTES`]), then `dsa_select` (one block per
//! query) finds the top-k by radix select and writes it unsorted. Scoring uses tensor cores (`dsa_score_mma_*`) for
//! bf16/f16 with `H ≤ 64` and `d ∈ 16ℤ, d ≤ 256` (DeepSeek-V3.2: 64 heads × 128), an FMA kernel
//! otherwise.

use crate::{check_dtype, dtype_suffix, rows_last, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::{DType, DeviceStepMeta};

/// Scratch budget of one group's score rows, bytes.
pub const DSA_SCORE_BYTES: usize = 64 << 20;
/// Keys per block of the tensor-core scoring kernel (`DSA_KEYS_PER_BLOCK` in `dsa.cu`).
const MMA_KEYS_PER_BLOCK: usize = 256;
/// Keys per block of the FMA scoring kernel.
const SIMPLE_KEYS_PER_BLOCK: usize = 128;

impl CudaBackend {
    /// Sets the score scratch budget of `dsa_topk` (default [`DSA_SCORE_BYTES`]); tests use a
    /// small one to make a step run in several query groups.
    pub fn set_dsa_score_bytes(&self, bytes: usize) {
        self.dsa_score_bytes
            .store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
    }

    /// See [`dayone_backend::Backend::layer_norm`]: one block per row, `w`, `b` in `x`'s dtype or
    /// f32 (both the same).
    pub(crate) fn layer_norm_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        b: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "layer_norm";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (r, d) = rows_last(OP, "x [R, D]", x)?;
        if w.shape != [d] || b.shape != [d] {
            bail!(
                "{OP}: w and b must be [{d}], got {:?} and {:?}",
                w.shape,
                b.shape
            );
        }
        if (w.dtype != x.dtype && w.dtype != DType::F32) || b.dtype != w.dtype {
            bail!(
                "{OP}: w and b must both be {} or both f32, got {} and {}",
                x.dtype,
                w.dtype,
                b.dtype
            );
        }
        self.bind()?;
        let out = self.alloc(x.shape.clone(), x.dtype)?;
        if r == 0 || d == 0 {
            return Ok(out);
        }
        let f = self.func("dsa", sfx, &format!("layer_norm_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (crate::launch::row_grid(r, 65535), 1, 1),
            (256, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                w.device_ptr(),
                b.device_ptr(),
                (w.dtype == DType::F32) as u32,
                out.device_ptr(),
                to_u32(OP, "R", r)?,
                to_u32(OP, "D", d)?,
                eps
            ],
        )?;
        Ok(out)
    }

    /// See [`dayone_backend::Backend::dsa_topk`] and the module doc.
    pub(crate) fn dsa_topk_impl(
        &self,
        q: &CudaTensor,
        w: &CudaTensor,
        k_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
        topk: usize,
    ) -> Result<CudaTensor> {
        const OP: &str = "dsa_topk";
        let sfx = dtype_suffix(OP, q.dtype)?;
        let hm = &meta.host;
        let n = hm.num_tokens();
        let (h, d, blocks, bs) = hm.check_dsa_topk(OP, &q.shape, &w.shape, &k_cache.shape, topk)?;
        check_dtype(OP, "w", w, q.dtype)?;
        check_dtype(OP, "k_cache", k_cache, q.dtype)?;
        self.bind()?;
        let out = self.alloc(vec![n, topk], DType::U32)?;
        if n == 0 {
            return Ok(out);
        }
        // Longest causal key count of the step, rounded up to 4 (`dsa_select` reads float4):
        // the score rows' stride.
        let stride = hm
            .positions
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap_or(1)
            .next_multiple_of(4);
        let budget = self
            .dsa_score_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        let group = (budget / (stride * 4)).clamp(1, n).min(65535);
        let scores = self.scratch_f32(group * stride)?;
        // Q and K tiles [64][d + 8], then the partial sums [4][64] f32.
        let mma_smem = 2 * 64 * (d + 8) * q.dtype.size() + 4 * 64 * 4;
        let mma = q.dtype != DType::F32
            && h <= 64
            && d.is_multiple_of(16)
            && d <= 256
            && self.info.arch >= 80
            && mma_smem <= self.kernels.max_smem_optin as usize;
        let (score_fn, keys_per_block, smem) = if mma {
            (format!("dsa_score_mma_{sfx}"), MMA_KEYS_PER_BLOCK, mma_smem)
        } else {
            let smem = (h * d + h) * 4;
            if smem > 48 * 1024 {
                bail!("{OP}: H · d = {} is above the supported 12 000", h * d);
            }
            (
                format!("dsa_score_simple_{sfx}"),
                SIMPLE_KEYS_PER_BLOCK,
                smem,
            )
        };
        let score = self.func("dsa", sfx, &score_fn)?;
        let select = self.func("dsa", sfx, "dsa_select")?;
        let tiles = to_u32(OP, "key tiles", stride.div_ceil(keys_per_block))?;
        let hscale = 1.0 / (h as f32).sqrt();
        let (hu, du, bsu) = (
            to_u32(OP, "H", h)?,
            to_u32(OP, "d", d)?,
            to_u32(OP, "block_size", bs)?,
        );
        let (mbu, nbu, su, ku) = (
            to_u32(OP, "max_blocks", hm.max_blocks)?,
            to_u32(OP, "blocks", blocks)?,
            to_u32(OP, "stride", stride)?,
            to_u32(OP, "topk", topk)?,
        );
        let mut tok0 = 0;
        while tok0 < n {
            let g = group.min(n - tok0);
            let t0 = to_u32(OP, "token", tok0)?;
            self.launch(
                OP,
                &score,
                (tiles, g as u32, 1),
                (128, 1, 1),
                smem as u32,
                kparams![
                    q.device_ptr(),
                    w.device_ptr(),
                    k_cache.device_ptr(),
                    meta.token_seq.device_ptr(),
                    meta.positions.device_ptr(),
                    meta.block_tables.device_ptr(),
                    scores.device_ptr(),
                    t0,
                    hu,
                    du,
                    bsu,
                    mbu,
                    nbu,
                    su,
                    scale,
                    hscale
                ],
            )?;
            self.launch(
                OP,
                &select,
                (g as u32, 1, 1),
                (1024, 1, 1),
                0,
                kparams![
                    scores.device_ptr(),
                    meta.positions.device_ptr(),
                    out.device_ptr(),
                    t0,
                    su,
                    ku
                ],
            )?;
            tok0 += g;
        }
        Ok(out)
    }
}
