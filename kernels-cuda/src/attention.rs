//! Paged KV-cache attention: `write_kv` and `paged_attention` (split-K decode, tensor-core
//! and FMA tiled prefill kernels).

use crate::device::drv;
use crate::{check_dtype, dtype_suffix, launch, to_u32, CudaBackend, CudaTensor};
use anyhow::{anyhow, bail, Result};
use cudarc::driver::result as dr;
use dayone_backend::{DType, DeviceStepMeta, TensorInfo};

impl CudaBackend {
    pub(crate) fn attention(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
    ) -> Result<CudaTensor> {
        self.attention_with(q, k_cache, v_cache, meta, scale, None)
    }

    /// Whether [`Self::attention_with`] takes gpt-oss's extras for these shapes: the
    /// tensor-core kernel (bf16/f16, head dims it covers), outside batch-invariant mode.
    pub(crate) fn attention_ext_on_mma(&self, q: &CudaTensor, hdk: usize, hdv: usize) -> bool {
        q.dtype != DType::F32
            && self.mma_attention
            && !self.invariant()
            && launch::mma_dv(hdk, hdv).is_some()
            && launch::mma_smem_bytes(hdk, hdv) <= self.info.max_smem_optin as usize
    }

    /// Paged attention; with `ext` = (sinks pointer or 0, window or 0) every step (decode too)
    /// runs on the tensor-core kernel with the extras (the caller checked
    /// [`Self::attention_ext_on_mma`]).
    pub(crate) fn attention_with(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
        ext: Option<(u64, u32)>,
    ) -> Result<CudaTensor> {
        const OP: &str = "paged_attention";
        let sfx = dtype_suffix(OP, q.dtype)?;
        if q.shape.len() != 3 {
            bail!("{OP}: q must be [N, H, hd_k], got {:?}", q.shape);
        }
        let (n, h, hdk) = (q.shape[0], q.shape[1], q.shape[2]);
        let hm = &meta.host;
        let bs = hm.block_size;
        if k_cache.shape.len() != 4 || k_cache.shape[1] != bs || k_cache.shape[3] != hdk {
            bail!(
                "{OP}: k_cache must be [blocks, {bs}, Hkv, {hdk}] (block size, hd_k of q), got {:?}",
                k_cache.shape
            );
        }
        let (nblocks, hkv) = (k_cache.shape[0], k_cache.shape[2]);
        if v_cache.shape.len() != 4 || v_cache.shape[..3] != k_cache.shape[..3] {
            bail!(
                "{OP}: v_cache must be [{nblocks}, {bs}, {hkv}, hd_v], got {:?}",
                v_cache.shape
            );
        }
        let hdv = v_cache.shape[3];
        check_dtype(OP, "k_cache", k_cache, q.dtype)?;
        check_dtype(OP, "v_cache", v_cache, q.dtype)?;
        if hkv == 0 || h % hkv != 0 {
            bail!("{OP}: query heads H = {h} must be a multiple of KV heads Hkv = {hkv}");
        }
        let s = hm.num_seqs();
        hm.check_tables(OP, n)?;
        self.bind()?;
        let out = self.alloc(vec![n, h, hdv], q.dtype)?;
        if n == 0 || h == 0 || hdv == 0 {
            return Ok(out);
        }
        let g = h / hkv;
        let max_q = hm
            .query_start
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as usize)
            .max()
            .unwrap_or(0);
        let kv_cap = hm.max_blocks * bs;
        let max_kv = (hm.positions.iter().copied().max().unwrap_or(0) as usize + 1).min(kv_cap);
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        let (hu, hkvu, hdku, hdvu) = (
            to_u32(OP, "H", h)?,
            to_u32(OP, "Hkv", hkv)?,
            to_u32(OP, "hd_k", hdk)?,
            to_u32(OP, "hd_v", hdv)?,
        );
        let (bsu, mbu, nbu) = (
            to_u32(OP, "block_size", bs)?,
            to_u32(OP, "max_blocks", hm.max_blocks)?,
            to_u32(OP, "blocks", nblocks)?,
        );
        if kv_cap == 0 || nblocks == 0 {
            // No cache: every softmax is empty, the output is zero.
            // SAFETY: the buffer holds `num_bytes` bytes.
            unsafe {
                dr::memset_d8_async(
                    out.device_ptr(),
                    0,
                    out.num_bytes(),
                    self.stream.cu_stream(),
                )
            }
            .map_err(drv("memset"))?;
            return Ok(out);
        }
        let tpk = launch::decode_tpk(hdk, hdv);
        // Batch-invariant mode: decode takes the prefill kernels (per-row, keys in tiles from
        // position 0), whose result for a query does not depend on the step's other queries.
        if let Some(tpk) =
            tpk.filter(|_| ext.is_none() && max_q <= 1 && n <= 65535 && !self.invariant())
        {
            let gb = launch::decode_gb(g);
            let gchunks = g.div_ceil(gb as usize);
            let step = (launch::ATTN_THREADS / tpk) * launch::DECODE_UNROLL;
            let plan = launch::plan_decode(
                n * hkv * gchunks,
                max_kv,
                4 * self.info.sms as usize,
                step,
                launch::decode_min_chunk(step),
            );
            let f = self.func(
                "attention_paged",
                sfx,
                &format!("attn_decode_{sfx}_t{tpk}_g{gb}"),
            )?;
            let (part_o, part_ml) = if plan.nsplit > 1 {
                let rows = n * h * plan.nsplit as usize;
                (
                    Some(self.scratch_f32(rows * hdv)?),
                    Some(self.scratch_f32(rows * 2)?),
                )
            } else {
                (None, None)
            };
            let po = part_o.as_ref().map_or(0, |t| t.device_ptr());
            let pml = part_ml.as_ref().map_or(0, |t| t.device_ptr());
            // The last split block of each (token, head group) merges the splits in-kernel
            // when the counters cover the step; else attn_combine does (the same bits).
            let counters = match self.decode_counters()? {
                Some(c)
                    if plan.nsplit > 1
                        && n * hkv * gchunks <= launch::DECODE_COUNTERS
                        && self.fusion(launch::DecodeFusion::AttnMerge) =>
                {
                    c.device_ptr()
                }
                _ => 0,
            };
            self.launch(
                OP,
                &f,
                (plan.nsplit, to_u32(OP, "grid.y", hkv * gchunks)?, n as u32),
                (launch::ATTN_THREADS, 1, 1),
                0,
                kparams![
                    q.device_ptr(),
                    k_cache.device_ptr(),
                    v_cache.device_ptr(),
                    meta.token_seq.device_ptr(),
                    meta.positions.device_ptr(),
                    meta.block_tables.device_ptr(),
                    out.device_ptr(),
                    po,
                    pml,
                    hu,
                    hkvu,
                    hdku,
                    hdvu,
                    bsu,
                    mbu,
                    nbu,
                    plan.chunk,
                    plan.nsplit,
                    scale_log2,
                    counters
                ],
            )?;
            if plan.nsplit > 1 && counters == 0 {
                let f = self.func("attention_paged", sfx, &format!("attn_combine_{sfx}"))?;
                self.launch(
                    OP,
                    &f,
                    (to_u32(OP, "N·H", n * h)?, 1, 1),
                    (hdvu.clamp(32, 256).div_ceil(32) * 32, 1, 1),
                    0,
                    kparams![po, pml, out.device_ptr(), hdvu, plan.nsplit],
                )?;
            }
            return Ok(out);
        }
        if s > 65535 {
            bail!("{OP}: at most 65535 sequences per step, got {s}");
        }
        let common = TiledLaunch {
            q,
            k_cache,
            v_cache,
            meta,
            out: &out,
            dims: [hu, hkvu, hdku, hdvu, bsu, mbu, nbu],
            scale_log2,
            n,
            h,
            hdv,
            s,
            max_q,
            max_kv,
            ext,
        };
        // Tensor-core kernel: prefill, chunked prefill and mixed steps in bf16/f16.
        let mma_smem = launch::mma_smem_bytes(hdk, hdv);
        if let Some(dv) = launch::mma_dv(hdk, hdv).filter(|_| {
            q.dtype != DType::F32
                && self.mma_attention
                && mma_smem <= self.info.max_smem_optin as usize
        }) {
            let (hc, tq) = launch::mma_rows(g);
            let family = if ext.is_some() {
                "attn_mma_ext"
            } else {
                "attn_mma"
            };
            self.launch_tiled(
                &common,
                family,
                sfx,
                &format!("d{dv}"),
                (hc, tq, g),
                mma_smem,
            )?;
            return Ok(out);
        }
        if ext.is_some() {
            bail!("{OP}: the sink/window kernel needs bf16/f16 and head dims the tensor-core kernel takes");
        }
        // Tiled FMA kernel: f32, or head dims the other kernels do not cover.
        let vpl = launch::tiled_vpl(hdv)
            .ok_or_else(|| anyhow!("{OP}: hd_v = {hdv} is above the supported 512"))?;
        let smem = launch::tiled_smem_bytes(hdk, hdv);
        if smem > self.info.max_smem_optin as usize {
            bail!(
                "{OP}: head dims hd_k = {hdk}, hd_v = {hdv} need {smem} bytes of shared memory, \
                 the device allows {}",
                self.info.max_smem_optin
            );
        }
        let (hc, tq) = launch::tiled_rows(g);
        self.launch_tiled(
            &common,
            "attn_tiled",
            sfx,
            &format!("v{vpl}"),
            (hc, tq, g),
            smem,
        )?;
        Ok(out)
    }

    pub(crate) fn write_kv_impl(
        &self,
        k: &CudaTensor,
        v: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<()> {
        const OP: &str = "write_kv";
        let (n, num_slots) = Self::check_write_kv(OP, k, v, k_cache, v_cache, meta)?;
        let (hkv, hdk, hdv) = (k.shape[1], k.shape[2], v.shape[2]);
        if n == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.func("kv_cache", "", "write_kv")?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(n, 65535), 1, 1),
            (128, 1, 1),
            0,
            kparams![
                k.device_ptr(),
                v.device_ptr(),
                k_cache.device_ptr(),
                v_cache.device_ptr(),
                meta.slot_mapping.device_ptr(),
                n as u32,
                num_slots,
                (hkv * hdk * k.dtype.size()) as u64,
                (hkv * hdv * k.dtype.size()) as u64
            ],
        )
    }

    /// Checks `write_kv`'s operands (`op` names the caller in errors): `k` `[N, Hkv, hd_k]`, `v`
    /// `[N, Hkv, hd_v]`, caches `[blocks, bs, Hkv, hd_k|v]` of `k`'s dtype, N slots in `meta`.
    /// Returns N and the number of cache slots (`blocks · bs`).
    pub(crate) fn check_write_kv(
        op: &str,
        k: &CudaTensor,
        v: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<(usize, u32)> {
        dtype_suffix(op, k.dtype)?;
        if k.shape.len() != 3 || v.shape.len() != 3 || k.shape[..2] != v.shape[..2] {
            bail!(
                "{op}: k must be [N, Hkv, hd_k] and v [N, Hkv, hd_v], got {:?} and {:?}",
                k.shape,
                v.shape
            );
        }
        let (n, hkv, hdk, hdv) = (k.shape[0], k.shape[1], k.shape[2], v.shape[2]);
        let bs = meta.host.block_size;
        if k_cache.shape.len() != 4 || k_cache.shape[1..] != [bs, hkv, hdk] {
            bail!(
                "{op}: k_cache must be [blocks, {bs}, {hkv}, {hdk}] (block size, Hkv, hd_k), got {:?}",
                k_cache.shape
            );
        }
        if v_cache.shape.len() != 4
            || v_cache.shape[1..] != [bs, hkv, hdv]
            || v_cache.shape[0] != k_cache.shape[0]
        {
            bail!(
                "{op}: v_cache must be [{}, {bs}, {hkv}, {hdv}], got {:?}",
                k_cache.shape[0],
                v_cache.shape
            );
        }
        for (what, t) in [("v", v), ("k_cache", k_cache), ("v_cache", v_cache)] {
            check_dtype(op, what, t, k.dtype)?;
        }
        if meta.host.slot_mapping.len() != n || meta.slot_mapping.numel() < n {
            bail!(
                "{op}: slot_mapping must have N = {n} entries, has {}",
                meta.host.slot_mapping.len()
            );
        }
        let num_slots = to_u32(op, "blocks·block_size", k_cache.shape[0] * bs)?;
        Ok((n, num_slots))
    }
}

/// What the tiled attention kernels (`attn_tiled_*`, `attn_mma_*`) take, gathered once.
struct TiledLaunch<'a> {
    q: &'a CudaTensor,
    k_cache: &'a CudaTensor,
    v_cache: &'a CudaTensor,
    meta: &'a DeviceStepMeta<CudaTensor>,
    out: &'a CudaTensor,
    /// H, Hkv, hd_k, hd_v, block size, max blocks, pool blocks.
    dims: [u32; 7],
    scale_log2: f32,
    n: usize,
    h: usize,
    hdv: usize,
    s: usize,
    max_q: usize,
    max_kv: usize,
    /// gpt-oss's (sinks pointer or 0, window or 0) for `attn_mma_ext`.
    ext: Option<(u64, u32)>,
}

impl CudaBackend {
    /// Launches `{family}_{sfx}_{variant}` over (query tiles, KV-head groups, sequences). In
    /// batch-invariant mode the `_inv` kernel instead: keys in chunks of
    /// [`launch::INV_ATTN_CHUNK`] folded in order — in registers for prefill steps, over blocks
    /// (one per chunk, then `attn_fold`) for decode steps.
    fn launch_tiled(
        &self,
        c: &TiledLaunch,
        family: &str,
        sfx: &'static str,
        variant: &str,
        (hc, tq, g): (u32, u32, usize),
        smem: usize,
    ) -> Result<()> {
        const OP: &str = "paged_attention";
        let gchunks = g.div_ceil(hc as usize);
        let qtiles = c.max_q.div_ceil(tq as usize).max(1);
        let [hu, hkvu, hdku, hdvu, bsu, mbu, nbu] = c.dims;
        let gy = to_u32(OP, "grid.y", c.dims[1] as usize * gchunks)?;
        let m = &c.meta;
        let inv = self.invariant();
        let chunk = launch::INV_ATTN_CHUNK;
        // Invariant decode steps spread a query's chunks over blocks; prefill folds them in one
        // block.
        let nsplit = if inv && c.max_q <= 1 {
            c.max_kv.div_ceil(chunk).max(1)
        } else {
            1
        };
        let (part_o, part_ml) = if nsplit > 1 {
            let rows = c.n * c.h * nsplit;
            (
                Some(self.scratch_f32(rows * c.hdv)?),
                Some(self.scratch_f32(rows * 2)?),
            )
        } else {
            (None, None)
        };
        let po = part_o.as_ref().map_or(0, |t| t.device_ptr());
        let pml = part_ml.as_ref().map_or(0, |t| t.device_ptr());
        let name = if inv {
            format!("{family}_inv_{sfx}_{variant}")
        } else {
            format!("{family}_{sfx}_{variant}")
        };
        let f = self.func("attention_paged", sfx, &name)?;
        let ptrs = [
            c.q.device_ptr(),
            c.k_cache.device_ptr(),
            c.v_cache.device_ptr(),
            m.query_start.device_ptr(),
            m.positions.device_ptr(),
            m.block_tables.device_ptr(),
            c.out.device_ptr(),
        ];
        let (chunku, nsplitu, qtilesu) = (chunk as u32, nsplit as u32, qtiles as u32);
        let params = kparams![
            ptrs[0],
            ptrs[1],
            ptrs[2],
            ptrs[3],
            ptrs[4],
            ptrs[5],
            ptrs[6],
            hu,
            hkvu,
            hdku,
            hdvu,
            bsu,
            mbu,
            nbu,
            hc,
            tq,
            c.scale_log2,
            chunku,
            nsplitu,
            qtilesu,
            po,
            pml
        ];
        // The default kernels take the first 17 parameters; the `_inv` ones also the chunking;
        // `attn_mma_ext` the sinks and the window in places 17 and 18 instead.
        let (sinks, window) = c.ext.unwrap_or((0, 0));
        let used = if c.ext.is_some() {
            params[17] = (&sinks) as *const u64 as *mut std::ffi::c_void;
            params[18] = (&window) as *const u32 as *mut std::ffi::c_void;
            19
        } else if inv {
            params.len()
        } else {
            17
        };
        self.launch(
            OP,
            &f,
            (to_u32(OP, "grid.x", qtiles * nsplit)?, gy, c.s as u32),
            (launch::ATTN_THREADS, 1, 1),
            smem as u32,
            &mut params[..used],
        )?;
        if nsplit > 1 {
            let f = self.func("attention_paged", sfx, &format!("attn_fold_{sfx}"))?;
            self.launch(
                OP,
                &f,
                (to_u32(OP, "N·H", c.n * c.h)?, 1, 1),
                (hdvu.clamp(32, 256).div_ceil(32) * 32, 1, 1),
                0,
                kparams![po, pml, c.out.device_ptr(), hdvu, nsplit as u32],
            )?;
        }
        Ok(())
    }
}
