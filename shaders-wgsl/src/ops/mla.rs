//! DeepSeek-V3 multi-head latent attention: `head_linear`, `write_cache`, and latent attention
//! (`paged_latent_attention`, and `sparse_latent_attention` for DeepSeek-V3.2).

use crate::{f32_param, pipelines, WTensor, WgslBackend, MAX_GROUPS};
use anyhow::{bail, ensure, Result};
use dayone_backend::{DType, DeviceStepMeta};

impl WgslBackend {
    pub(crate) fn head_linear_impl(&self, x: &WTensor, w: &WTensor) -> Result<WTensor> {
        const OP: &str = "head_linear";
        ensure!(
            x.shape.len() == 3 && w.shape.len() == 3,
            "{OP}: expected x [N, H, K] and w [H, O, K], got {:?} and {:?}",
            x.shape,
            w.shape
        );
        let (n, h, k) = (x.shape[0], x.shape[1], x.shape[2]);
        let o = w.shape[1];
        ensure!(
            w.shape[0] == h && w.shape[2] == k,
            "{OP}: w must have shape [{h}, O, {k}] to match x {:?}, got {:?}",
            x.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        let (wb, bf16) = self.weight_in(OP, "w", w)?;
        let out = self.alloc(&[n, h, o], DType::F32)?;
        let total = n * h * o;
        if total == 0 {
            return Ok(out);
        }
        ensure!(total < u32::MAX as usize, "{OP}: output too large");
        // GPUs with long rows: a workgroup per output; else an invocation per output.
        let (spec, g) = if !self.cpu_kernels && k >= 64 {
            (&pipelines::HEAD_LINEAR_WG, Self::grid(OP, total as u64)?)
        } else {
            (
                &pipelines::HEAD_LINEAR_LANES,
                Self::grid(OP, (total as u64).div_ceil(64))?,
            )
        };
        self.dispatch(
            spec,
            &[h as u32, k as u32, o as u32, total as u32, bf16, 0, 0, 0],
            &[x.single(OP, "x")?, wb, out.single(OP, "output")?],
            g,
        )?;
        Ok(out)
    }

    pub(crate) fn write_cache_impl(
        &self,
        x: &WTensor,
        cache: &WTensor,
        col: usize,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<()> {
        const OP: &str = "write_cache";
        let n = meta.host.num_tokens();
        ensure!(
            x.shape.len() == 2 && x.shape[0] == n,
            "{OP}: x must have shape [{n}, w], got {:?}",
            x.shape
        );
        ensure!(
            cache.shape.len() == 3,
            "{OP}: cache must have shape [blocks, bs, W], got {:?}",
            cache.shape
        );
        let (w, width) = (x.shape[1], cache.shape[2]);
        ensure!(
            col + w <= width,
            "{OP}: columns {col}..{} exceed the cache width {width}",
            col + w
        );
        ensure!(
            meta.host.slot_mapping.len() == n,
            "{OP}: slot_mapping must have {n} entries"
        );
        let x = &self.f32_of(OP, "x", x)?;
        Self::float_in(OP, "cache", cache)?;
        let capacity = cache.shape[0] * cache.shape[1];
        if let Some(&bad) = meta
            .host
            .slot_mapping
            .iter()
            .find(|&&s| s as usize >= capacity)
        {
            bail!(
                "{OP}: slot {bad} outside the cache of {capacity} slots ({:?})",
                cache.shape
            );
        }
        let total = n * w;
        if total == 0 {
            return Ok(());
        }
        let g = Self::grid(OP, (total as u64).div_ceil(256))?;
        self.dispatch(
            &pipelines::WRITE_CACHE_K,
            &[total as u32, w as u32, width as u32, col as u32],
            &[
                x.single(OP, "x")?,
                meta.slot_mapping.single(OP, "slot_mapping")?,
                cache.single(OP, "cache")?,
            ],
            g,
        )
    }

    /// MLA absorbed attention over the latent cache: dense over every causal key, or, with
    /// `selected` `[N, topk]` u32 (DSA), over the listed positions only (`mla_attention.wgsl`
    /// takes both; the CPU-adapter lanes kernel is dense only).
    pub(crate) fn latent_attention_impl(
        &self,
        q_lat: &WTensor,
        q_rope: &WTensor,
        cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
        selected: Option<&WTensor>,
    ) -> Result<WTensor> {
        let op = if selected.is_some() {
            "sparse_latent_attention"
        } else {
            "paged_latent_attention"
        };
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q_lat.shape.len() == 3 && q_lat.shape[0] == n,
            "{op}: q_lat must have shape [{n}, H, L], got {:?}",
            q_lat.shape
        );
        let (h, l) = (q_lat.shape[1], q_lat.shape[2]);
        ensure!(
            q_rope.shape.len() == 3 && q_rope.shape[..2] == [n, h],
            "{op}: q_rope must have shape [{n}, {h}, R], got {:?}",
            q_rope.shape
        );
        let r = q_rope.shape[2];
        ensure!(
            cache.shape.len() == 3 && cache.shape[2] == l + r,
            "{op}: cache must have shape [blocks, bs, {l} + {r}], got {:?}",
            cache.shape
        );
        let topk = match selected {
            Some(sel) => {
                ensure!(
                    sel.shape.len() == 2 && sel.shape[0] == n,
                    "{op}: selected must have shape [{n}, topk], got {:?}",
                    sel.shape
                );
                Self::u32_in(op, "selected", sel)?;
                sel.shape[1]
            }
            None => 0,
        };
        let (blocks, bs) = (cache.shape[0], cache.shape[1]);
        ensure!(
            l > 0 && l <= 512 && l + r <= 1024,
            "{op}: needs 0 < L <= 512 and L + R <= 1024, got L {l}, R {r}"
        );
        hm.check_paged(op, blocks, bs)?;
        let q_lat = &self.f32_of(op, "q_lat", q_lat)?;
        let q_rope = &self.f32_of(op, "q_rope", q_rope)?;
        Self::float_in(op, "cache", cache)?;
        if selected.is_some() && topk == 0 {
            // Nothing selected: no keys (and `mla_attention.wgsl` reads topk 0 as dense).
            return dayone_backend::Backend::zeros(self, &[n, h, l], DType::F32);
        }
        let out = self.alloc(&[n, h, l], DType::F32)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        ensure!(
            h as u64 <= MAX_GROUPS && n as u64 <= MAX_GROUPS,
            "{op}: more than 65535 heads or tokens"
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
        // CPU adapters: one invocation per (token, head), vec4 loads, no barriers; GPUs (and
        // widths the lanes kernel cannot hold): a workgroup per (token, head) sharing key tiles.
        let lanes = selected.is_none()
            && self.cpu_kernels
            && l.is_multiple_of(4)
            && r.is_multiple_of(4)
            && l <= 256
            && r <= 64;
        // The lanes kernel binds q_rope as vec4s: with R == 0 bind q_lat in its place (unread).
        let qr = if r == 0 {
            q_lat.single(op, "q_lat")?
        } else {
            q_rope.single(op, "q_rope")?
        };
        let mut bufs = vec![
            q_lat.single(op, "q_lat")?,
            qr,
            cache.single(op, "cache")?,
            meta.positions.single(op, "positions")?,
            meta.token_seq.single(op, "token_seq")?,
            meta.block_tables.single(op, "block_tables")?,
        ];
        if lanes {
            bufs.push(out.single(op, "output")?);
            let g = Self::grid(op, ((n * h) as u64).div_ceil(8))?;
            self.dispatch(&pipelines::MLA_ATTN_LANES, &p, &bufs, g)?;
        } else {
            // Dense: topk 0, the `selected` binding is unread (positions stand in).
            bufs.push(match selected {
                Some(sel) => sel.single(op, "selected")?,
                None => meta.positions.single(op, "positions")?,
            });
            bufs.push(out.single(op, "output")?);
            self.dispatch(&pipelines::MLA_ATTN, &p, &bufs, [h as u32, n as u32, 1])?;
        }
        Ok(out)
    }
}
