//! DeepSeek-V3.2 sparse attention (DSA) ops: `layer_norm`, `dsa_topk`, `sparse_latent_attention`.

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

    pub(crate) fn sparse_latent_attention_impl(
        &self,
        q_lat: &WTensor,
        q_rope: &WTensor,
        cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
        selected: &WTensor,
    ) -> Result<WTensor> {
        const OP: &str = "sparse_latent_attention";
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q_lat.shape.len() == 3 && q_lat.shape[0] == n,
            "{OP}: q_lat must have shape [{n}, H, L], got {:?}",
            q_lat.shape
        );
        let (h, l) = (q_lat.shape[1], q_lat.shape[2]);
        ensure!(
            q_rope.shape.len() == 3 && q_rope.shape[..2] == [n, h],
            "{OP}: q_rope must have shape [{n}, {h}, R], got {:?}",
            q_rope.shape
        );
        let r = q_rope.shape[2];
        ensure!(
            cache.shape.len() == 3 && cache.shape[2] == l + r,
            "{OP}: cache must have shape [blocks, bs, {l} + {r}], got {:?}",
            cache.shape
        );
        ensure!(
            selected.shape.len() == 2 && selected.shape[0] == n,
            "{OP}: selected must have shape [{n}, topk], got {:?}",
            selected.shape
        );
        Self::u32_in(OP, "selected", selected)?;
        let topk = selected.shape[1];
        let (blocks, bs) = (cache.shape[0], cache.shape[1]);
        ensure!(
            l > 0 && l <= 512 && l + r <= 1024,
            "{OP}: needs 0 < L <= 512 and L + R <= 1024, got L {l}, R {r}"
        );
        hm.check_paged(OP, blocks, bs)?;
        let q_lat = &self.f32_of(OP, "q_lat", q_lat)?;
        let q_rope = &self.f32_of(OP, "q_rope", q_rope)?;
        Self::float_in(OP, "cache", cache)?;
        let out = self.alloc(&[n, h, l], DType::F32)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        ensure!(
            h as u64 <= MAX_GROUPS && n as u64 <= MAX_GROUPS,
            "{OP}: more than 65535 heads or tokens"
        );
        let p = [
            h as u32,
            l as u32,
            r as u32,
            bs as u32,
            hm.max_blocks as u32,
            f32_param(scale),
            (n * h) as u32,
            topk as u32,
        ];
        if topk == 0 {
            // Nothing selected: no keys (and `mla_attention.wgsl` reads topk 0 as dense).
            return dayone_backend::Backend::zeros(self, &[n, h, l], DType::F32);
        }
        // With R == 0 bind q_lat in q_rope's place (unread).
        let qr = if r == 0 {
            q_lat.single(OP, "q_lat")?
        } else {
            q_rope.single(OP, "q_rope")?
        };
        self.dispatch(
            &pipelines::MLA_ATTN,
            &p,
            &[
                q_lat.single(OP, "q_lat")?,
                qr,
                cache.single(OP, "cache")?,
                meta.positions.single(OP, "positions")?,
                meta.token_seq.single(OP, "token_seq")?,
                meta.block_tables.single(OP, "block_tables")?,
                selected.single(OP, "selected")?,
                out.single(OP, "output")?,
            ],
            [h as u32, n as u32, 1],
        )?;
        Ok(out)
    }
}
