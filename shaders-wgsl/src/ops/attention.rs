//! Paged KV-cache attention: `write_kv` and `paged_attention`.

use crate::{f32_param, pipelines, WTensor, WgslBackend, MAX_GROUPS};
use anyhow::{bail, ensure, Result};
use dayone_backend::{DType, DeviceStepMeta};

impl WgslBackend {
    pub(crate) fn write_kv_impl(
        &self,
        k: &WTensor,
        v: &WTensor,
        k_cache: &WTensor,
        v_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
    ) -> Result<()> {
        const OP: &str = "write_kv";
        let n = meta.host.num_tokens();
        let slots = meta.slot_mapping.single(OP, "slot_mapping")?;
        for (name, src, cache) in [("k", k, k_cache), ("v", v, v_cache)] {
            ensure!(
                src.shape.len() == 3 && src.shape[0] == n,
                "{OP}: {name} must have shape [{n}, Hkv, hd], got {:?}",
                src.shape
            );
            ensure!(
                cache.shape.len() == 4 && cache.shape[2..] == src.shape[1..],
                "{OP}: {name}_cache must have shape [blocks, bs, {}, {}], got {:?}",
                src.shape[1],
                src.shape[2],
                cache.shape
            );
            let src = &self.f32_of(OP, name, src)?;
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
            let row = src.shape[1] * src.shape[2];
            let total = n * row;
            let g = Self::grid(OP, (total as u64).div_ceil(256))?;
            self.dispatch(
                &pipelines::WRITE_KV,
                &[total as u32, row as u32, 0, 0],
                &[src.single(OP, name)?, slots, cache.single(OP, "cache")?],
                g,
            )?;
        }
        Ok(())
    }

    /// Causal attention, optionally over a sliding window and with per-head sinks
    /// ([`dayone_backend::AttentionOptions`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn paged_attention_impl(
        &self,
        q: &WTensor,
        k_cache: &WTensor,
        v_cache: &WTensor,
        meta: &DeviceStepMeta<WTensor>,
        scale: f32,
        window: Option<usize>,
        sinks: Option<&WTensor>,
    ) -> Result<WTensor> {
        const OP: &str = "paged_attention";
        ensure!(window != Some(0), "{OP}: a sliding window must be >= 1");
        let hm = &meta.host;
        let n = hm.num_tokens();
        ensure!(
            q.shape.len() == 3 && q.shape[0] == n,
            "{OP}: q must have shape [{n}, H, hd_k], got {:?}",
            q.shape
        );
        ensure!(
            k_cache.shape.len() == 4 && v_cache.shape.len() == 4,
            "{OP}: caches must have shape [blocks, bs, Hkv, hd], got {:?} and {:?}",
            k_cache.shape,
            v_cache.shape
        );
        let (h, hdk) = (q.shape[1], q.shape[2]);
        let (blocks, bs, hkv) = (k_cache.shape[0], k_cache.shape[1], k_cache.shape[2]);
        let hdv = v_cache.shape[3];
        ensure!(
            k_cache.shape[3] == hdk && v_cache.shape[..3] == k_cache.shape[..3],
            "{OP}: k_cache must be [blocks, bs, Hkv, {hdk}] and v_cache [blocks, bs, Hkv, hd_v] with equal \
             leading dims, got {:?} and {:?}",
            k_cache.shape,
            v_cache.shape
        );
        ensure!(
            hkv > 0 && h % hkv == 0,
            "{OP}: H {h} must be a multiple of Hkv {hkv}"
        );
        ensure!(
            hdk.is_multiple_of(4) && hdk <= 512 && hdv <= 512,
            "{OP}: head dims must satisfy hd_k % 4 == 0, hd_k <= 512, hd_v <= 512; got {hdk}, {hdv}"
        );
        hm.check_paged(OP, blocks, bs)?;
        let q = &self.f32_of(OP, "q", q)?;
        Self::float_in(OP, "k_cache", k_cache)?;
        Self::float_in(OP, "v_cache", v_cache)?;
        let out = self.alloc(&[n, h, hdv], DType::F32)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        ensure!(
            h as u64 <= MAX_GROUPS && n as u64 <= MAX_GROUPS,
            "{OP}: more than 65535 heads or tokens"
        );
        let p = [
            h as u32,
            hkv as u32,
            hdk as u32,
            hdv as u32,
            bs as u32,
            hm.max_blocks as u32,
            (h / hkv) as u32,
            f32_param(scale),
            (n * h) as u32,
            window.unwrap_or(0) as u32,
            sinks.is_some() as u32,
            0,
        ];
        let sinks = match sinks {
            Some(t) => {
                ensure!(
                    t.shape == [h],
                    "{OP}: sinks must be [{h}], got {:?}",
                    t.shape
                );
                Some(self.f32_of(OP, "sinks", t)?)
            }
            None => None,
        };
        let sinks_buf = match &sinks {
            Some(t) => t.single(OP, "sinks")?,
            None => &self.dummy,
        };
        // CPU adapters: one invocation per (token, head), no barriers; GPUs: a workgroup per
        // (token, head) sharing each key tile.
        let lanes = self.cpu_kernels && hdv.is_multiple_of(4) && hdk <= 256 && hdv <= 256;
        let (spec, g) = if lanes {
            (
                &pipelines::ATTN_LANES,
                Self::grid(OP, ((n * h) as u64).div_ceil(8))?,
            )
        } else {
            (&pipelines::ATTN, [h as u32, n as u32, 1])
        };
        self.dispatch(
            spec,
            &p,
            &[
                q.single(OP, "q")?,
                k_cache.single(OP, "k_cache")?,
                v_cache.single(OP, "v_cache")?,
                meta.positions.single(OP, "positions")?,
                meta.token_seq.single(OP, "token_seq")?,
                meta.block_tables.single(OP, "block_tables")?,
                out.single(OP, "output")?,
                sinks_buf,
            ],
            g,
        )?;
        Ok(out)
    }
}
