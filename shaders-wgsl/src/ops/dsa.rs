//! DeepSeek-V3.2 sparse attention (DSA) ops: `layer_norm`, `dsa_topk` (`sparse_latent_attention`
//! is the latent attention of `mla.rs` over a selection list).

use crate::{
    f32_param, pipelines, WTensor, WgslBackend, DSA_MAX_TOPK, DSA_SCORE_BYTES, MAX_GROUPS,
};
use anyhow::{ensure, Result};
use dayone_backend::{DType, DeviceStepMeta};

impl WgslBackend {
    pub(crate) fn layer_norm_impl(
        &self,
        x: &WTensor,
        w: &WTensor,
        b: &WTensor,
        eps: f32,
    ) -> Result<WTensor> {
        const OP: &str = "layer_norm";
        ensure!(
            x.shape.len() == 2,
            "{OP}: x must have shape [R, D], got {:?}",
            x.shape
        );
        let (r, d) = (x.shape[0], x.shape[1]);
        ensure!(
            w.shape == [d] && b.shape == [d],
            "{OP}: w and b must have shape [{d}], got {:?} and {:?}",
            w.shape,
            b.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let w = &self.f32_of(OP, "w", w)?;
        let b = &self.f32_of(OP, "b", b)?;
        let out = self.alloc(&[r, d], DType::F32)?;
        if r * d == 0 {
            return Ok(out);
        }
        self.dispatch(
            &pipelines::LAYER_NORM_K,
            &[r as u32, d as u32, f32_param(eps), 0],
            &[
                x.single(OP, "x")?,
                w.single(OP, "w")?,
                b.single(OP, "b")?,
                out.single(OP, "output")?,
            ],
            Self::grid(OP, r as u64)?,
        )?;
        Ok(out)
    }

    pub(crate) fn dsa_topk_impl(
        &self,
        q: &WTensor,
        w: &WTensor,
        k_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
        topk: usize,
    ) -> Result<WTensor> {
        const OP: &str = "dsa_topk";
        let hm = &meta.host;
        let n = hm.num_tokens();
        let (h, d, _, bs) = hm.check_dsa_topk(OP, &q.shape, &w.shape, &k_cache.shape, topk)?;
        // The workgroup sort holds at most this many picks.
        ensure!(
            topk <= DSA_MAX_TOPK,
            "{OP}: topk must be at most {DSA_MAX_TOPK} on this backend, got {topk}"
        );
        let q = &self.f32_of(OP, "q", q)?;
        let w = &self.f32_of(OP, "w", w)?;
        let k_cache = &self.f32_of(OP, "k_cache", k_cache)?;
        let out = self.alloc(&[n, topk], DType::U32)?;
        if n == 0 {
            return Ok(out);
        }
        // Scores of a group of tokens `[group, stride]` f32 at a time (bounded scratch).
        let stride = hm
            .positions
            .iter()
            .map(|&p| p as usize + 1)
            .max()
            .unwrap_or(1);
        let budget = self.max_chunk.min(DSA_SCORE_BYTES) as usize;
        let group = (budget / (stride * 4)).clamp(1, n).min(MAX_GROUPS as usize);
        let tiles = stride.div_ceil(64);
        ensure!(
            tiles as u64 <= MAX_GROUPS,
            "{OP}: {stride} keys exceed the score grid"
        );
        let scores = self.alloc(&[group, stride], DType::F32)?;
        let hscale = 1.0 / (h as f32).sqrt();
        let mut tok0 = 0;
        while tok0 < n {
            let g = group.min(n - tok0);
            let p = [
                h as u32,
                d as u32,
                bs as u32,
                hm.max_blocks as u32,
                f32_param(scale),
                f32_param(hscale),
                topk as u32,
                stride as u32,
                tok0 as u32,
                0,
                0,
                0,
            ];
            self.dispatch(
                &pipelines::DSA_SCORE,
                &p,
                &[
                    q.single(OP, "q")?,
                    w.single(OP, "w")?,
                    k_cache.single(OP, "k_cache")?,
                    meta.positions.single(OP, "positions")?,
                    meta.token_seq.single(OP, "token_seq")?,
                    meta.block_tables.single(OP, "block_tables")?,
                    scores.single(OP, "scores")?,
                ],
                [tiles as u32, g as u32, 1],
            )?;
            self.dispatch(
                &pipelines::DSA_SELECT_K,
                &p,
                &[
                    scores.single(OP, "scores")?,
                    meta.positions.single(OP, "positions")?,
                    out.single(OP, "output")?,
                ],
                [g as u32, 1, 1],
            )?;
            tok0 += g;
        }
        Ok(out)
    }
}
