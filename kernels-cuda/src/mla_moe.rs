//! DeepSeek-V3 ops (MLA + MoE): `head_linear` (cuBLAS strided-batched GEMM), `write_cache`,
//! `paged_latent_attention` (tensor-core split-K kernel, FMA fallback), `moe_route` (gate GEMV
//! or GEMM in f32 + one block per token for the group-limited top-k) and `moe_experts`
//! (device-side counting sort by expert, then one grouped GEMM/GEMV launch per projection and a
//! deterministic weighted combine). Kernels: `kernels/mla.cu`, `kernels/moe.cu`.

use crate::device::drv;
use crate::launch::{self, MoeKernel};
use crate::linear::GemvNorm;
use crate::{check_dtype, dtype_suffix, to_i32, to_u32, CudaBackend, CudaTensor};
use anyhow::{anyhow, bail, Result};
use cudarc::cublas;
use cudarc::driver::result as dr;
use dayone_backend::{
    DType, DeviceStepMeta, ExpertAct, ExpertOptions, MoeRouting, NormedRoute, TensorInfo,
};
use std::ffi::c_void;

fn rank3(op: &str, what: &str, t: &CudaTensor, expect: &str) -> Result<(usize, usize, usize)> {
    match t.shape[..] {
        [a, b, c] => Ok((a, b, c)),
        _ => bail!("{op}: {what} must be {expect}, got {:?}", t.shape),
    }
}

fn rank2(op: &str, what: &str, t: &CudaTensor, expect: &str) -> Result<(usize, usize)> {
    match t.shape[..] {
        [a, b] => Ok((a, b)),
        _ => bail!("{op}: {what} must be {expect}, got {:?}", t.shape),
    }
}

/// An expert activation as the kernels number it (`kernels/moe.cu`, `moe_ext.cu`, `quant.cu`):
/// `(act, alpha, limit)` with act 0 SwiGLU, 1 gpt-oss's GLU (`alpha`, `limit`), 2 the clamped
/// SwiGLU of glm5_next (`limit`).
pub(crate) fn act_code(act: ExpertAct) -> (u32, f32, f32) {
    match act {
        ExpertAct::Swiglu => (0, 0.0, 0.0),
        ExpertAct::GptOss { alpha, limit } => (1, alpha, limit),
        ExpertAct::SwigluClamped { limit } => (2, 0.0, limit),
    }
}

/// The optional per-expert biases of a routed-experts op: `gate_up_bias` `[E, 2F]` and
/// `down_bias` `[E, D]`, both of `x`'s dtype. `(e, f, d)` as [`check_experts`] returns them.
pub(crate) fn check_expert_biases(
    op: &str,
    x: &CudaTensor,
    (e, f, d): (usize, usize, usize),
    gate_up_bias: Option<&CudaTensor>,
    down_bias: Option<&CudaTensor>,
) -> Result<()> {
    for (b, rows, what) in [
        (gate_up_bias, 2 * f, "gate_up_bias"),
        (down_bias, d, "down_bias"),
    ] {
        if let Some(b) = b {
            if b.shape != [e, rows] {
                bail!("{op}: {what} must be [{e}, {rows}], got {:?}", b.shape);
            }
            check_dtype(op, what, b, x.dtype)?;
        }
    }
    Ok(())
}

/// The shapes and dtypes of a routed-experts op (`moe_experts`, `moe_experts_ext`): `x`
/// `[N, D]`, `gate_up` `[E, 2F, D]` and `down` `[E, D, F]` of `x`'s dtype, `ids` `[N, k]` u32,
/// `weights` `[N, k]` f32 → `(N, D, E, F)`.
pub(crate) fn check_experts(
    op: &str,
    x: &CudaTensor,
    ids: &CudaTensor,
    weights: &CudaTensor,
    gate_up: &CudaTensor,
    down: &CudaTensor,
) -> Result<(usize, usize, usize, usize)> {
    let (n, d) = rank2(op, "x", x, "[N, D]")?;
    let (e, f2, gd) = rank3(op, "gate_up", gate_up, "[E, 2F, D]")?;
    if gd != d || !f2.is_multiple_of(2) {
        bail!(
            "{op}: gate_up must be [E, 2F, {d}], got {:?}",
            gate_up.shape
        );
    }
    let f = f2 / 2;
    if down.shape != [e, d, f] {
        bail!("{op}: down must be [{e}, {d}, {f}], got {:?}", down.shape);
    }
    check_dtype(op, "gate_up", gate_up, x.dtype)?;
    check_dtype(op, "down", down, x.dtype)?;
    check_routing(op, n, ids, weights)?;
    Ok((n, d, e, f))
}

/// The routing of `n` tokens: `ids` `[n, k]` u32 and `weights` `[n, k]` f32.
pub(crate) fn check_routing(
    op: &str,
    n: usize,
    ids: &CudaTensor,
    weights: &CudaTensor,
) -> Result<()> {
    if ids.dtype != DType::U32
        || ids.shape.len() != 2
        || ids.shape[0] != n
        || weights.shape != ids.shape
        || weights.dtype != DType::F32
    {
        bail!(
            "{op}: ids (u32) and weights (f32) must be [{n}, k], got {} {:?} and {} {:?}",
            ids.dtype,
            ids.shape,
            weights.dtype,
            weights.shape
        );
    }
    Ok(())
}

/// The top-k arguments of `gemv_x*_f32_topk_*` (kernels/gemv.cu `MoeTopkArgs`: four device
/// pointers, the routing's integers and scale, padded to the struct's 8-byte alignment).
#[repr(C)]
#[derive(Clone, Copy)]
struct MoeTopkArgs {
    bias: u64,
    ids: u64,
    weights: u64,
    counter: u64,
    k: u32,
    g: u32,
    topk_group: u32,
    norm: u32,
    scale: f32,
    _pad: u32,
}

/// The router GEMV's fused top-k: its arguments, the launch's dynamic shared memory (bytes)
/// and, for `rms_norm_moe_route`, the pre-norm input's parameters.
#[derive(Clone, Copy)]
struct RouterTopk<'a> {
    args: &'a MoeTopkArgs,
    smem: u32,
    norm: Option<GemvNorm>,
}

impl CudaBackend {
    pub(crate) fn memset0(&self, t: &CudaTensor) -> Result<()> {
        if t.num_bytes() > 0 {
            // SAFETY: the buffer holds `num_bytes` bytes.
            unsafe {
                dr::memset_d8_async(t.device_ptr(), 0, t.num_bytes(), self.stream.cu_stream())
            }
            .map_err(drv("memset"))?;
        }
        Ok(())
    }

    /// `y[n, h] = w[h] · x[n, h]`: `x` `[N, H, K]`, `w` `[H, O, K]` → `[N, H, O]`; one cuBLAS
    /// `GemmStridedBatchedEx` over the heads (f32 compute). Column-major view per head h:
    /// `y_hᵀ [O, N] = op(A) · B` with A = the row-major `[O, K]` weight read as `[K, O]`
    /// (op = transpose, lda K, stride O·K), B = the head's `[N, K]` rows of x read as `[K, N]`
    /// (ldb H·K, stride K), C ldc H·O, stride O.
    pub(crate) fn head_linear_impl(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "head_linear";
        dtype_suffix(OP, x.dtype)?;
        let (n, h, k) = rank3(OP, "x", x, "[N, H, K]")?;
        let (wh, o, wk) = rank3(OP, "w", w, "[H, O, K]")?;
        if wh != h || wk != k {
            bail!("{OP}: w must have shape [{h}, O, {k}], got {:?}", w.shape);
        }
        check_dtype(OP, "w", w, x.dtype)?;
        self.bind()?;
        let out = self.alloc(vec![n, h, o], x.dtype)?;
        if n == 0 || h == 0 || o == 0 {
            return Ok(out);
        }
        if self.invariant() {
            // Head z: rows of x[:, z, :] (stride H·K) times w[z]ᵀ into out[:, z, :].
            let g = crate::invariant::InvGemm {
                m: n,
                n: o,
                k,
                lda: h * k,
                ldw: k,
                ldy: h * o,
                batch: h,
                strides: [k, o * k, o],
            };
            self.gemm_inv(OP, x, w, &out, &g)?;
            return Ok(out);
        }
        if k == 0 {
            self.memset0(&out)?;
            return Ok(out);
        }
        use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
        let dt = match x.dtype {
            DType::F32 => cudaDataType::CUDA_R_32F,
            DType::BF16 => cudaDataType::CUDA_R_16BF,
            _ => cudaDataType::CUDA_R_16F,
        };
        let (oi, ni, ki, hi) = (
            to_i32(OP, "O", o)?,
            to_i32(OP, "N", n)?,
            to_i32(OP, "K", k)?,
            to_i32(OP, "H", h)?,
        );
        let ldb = to_i32(OP, "H·K", h * k)?;
        let ldc = to_i32(OP, "H·O", h * o)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: device pointers of live buffers; every (head, row) access stays inside x, w
        // and out by the shapes checked above.
        unsafe {
            cublas::result::gemm_strided_batched_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                oi,
                ni,
                ki,
                (&alpha) as *const f32 as *const c_void,
                w.device_ptr() as *const c_void,
                dt,
                ki,
                (o * k) as i64,
                x.device_ptr() as *const c_void,
                dt,
                ldb,
                k as i64,
                (&beta) as *const f32 as *const c_void,
                out.device_ptr() as *mut c_void,
                dt,
                ldc,
                o as i64,
                hi,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| anyhow!("{OP}: cuBLAS GemmStridedBatchedEx failed: {e:?}"))?;
        Ok(out)
    }

    /// `cache[slot_mapping[n], col .. col + w] = x[n]`: `x` `[N, w]`, `cache` `[blocks, bs, W]`.
    pub(crate) fn write_cache_impl(
        &self,
        x: &CudaTensor,
        cache: &CudaTensor,
        col: usize,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<()> {
        const OP: &str = "write_cache";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (n, w) = rank2(OP, "x", x, "[N, w]")?;
        let (blocks, bs, width) = rank3(OP, "cache", cache, "[blocks, bs, W]")?;
        check_dtype(OP, "cache", cache, x.dtype)?;
        if col + w > width {
            bail!(
                "{OP}: columns {col}..{} exceed the cache width {width}",
                col + w
            );
        }
        let slots = &meta.host.slot_mapping;
        if slots.len() != n || meta.slot_mapping.numel() < n {
            bail!(
                "{OP}: slot_mapping must have N = {n} entries, has {}",
                slots.len()
            );
        }
        // u32::MAX marks a padding token (a graph's padded batch): skipped by the kernel.
        if let Some(&s) = slots
            .iter()
            .find(|&&s| s != u32::MAX && s as usize >= blocks * bs)
        {
            bail!("{OP}: slot {s} outside the cache ({blocks}×{bs})");
        }
        if n == 0 || w == 0 {
            return Ok(());
        }
        self.bind()?;
        let f = self.func("mla", sfx, &format!("write_cache_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(n, 65535), 1, 1),
            (128, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                cache.device_ptr(),
                meta.slot_mapping.device_ptr(),
                n as u32,
                to_u32(OP, "w", w)?,
                to_u32(OP, "W", width)?,
                col as u32,
                to_u32(OP, "blocks·bs", blocks * bs)?
            ],
        )
    }

    /// MLA absorbed attention over the latent cache (see the trait doc): dense over every causal
    /// key, or, with `selected` `[N, topk]` u32 (DSA), over the listed positions only.
    pub(crate) fn latent_attention_impl(
        &self,
        q_lat: &CudaTensor,
        q_rope: &CudaTensor,
        cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
        selected: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        let op = if selected.is_some() {
            "sparse_latent_attention"
        } else {
            "paged_latent_attention"
        };
        let sfx = dtype_suffix(op, q_lat.dtype)?;
        let (n, h, l) = rank3(op, "q_lat", q_lat, "[N, H, L]")?;
        let (rn, rh, r) = rank3(op, "q_rope", q_rope, "[N, H, R]")?;
        let (nblocks, bs, wdt) = rank3(op, "cache", cache, "[blocks, bs, L + R]")?;
        if rn != n || rh != h || wdt != l + r {
            bail!(
                "{op}: q_rope must be [{n}, {h}, R] and cache [blocks, bs, {l} + R], got {:?} and {:?}",
                q_rope.shape,
                cache.shape
            );
        }
        check_dtype(op, "q_rope", q_rope, q_lat.dtype)?;
        check_dtype(op, "cache", cache, q_lat.dtype)?;
        let topk = match selected {
            Some(sel) => {
                if sel.dtype != DType::U32 || sel.shape.len() != 2 || sel.shape[0] != n {
                    bail!(
                        "{op}: selected must be u32 [{n}, topk], got {} {:?}",
                        sel.dtype,
                        sel.shape
                    );
                }
                sel.shape[1]
            }
            None => 0,
        };
        let sel_ptr = selected.map_or(0, |t| t.device_ptr());
        let hm = &meta.host;
        let s = hm.num_seqs();
        hm.check_tables(op, n)?;
        self.bind()?;
        let out = self.alloc(vec![n, h, l], q_lat.dtype)?;
        if n == 0 || h == 0 || l == 0 {
            return Ok(out);
        }
        let kv_cap = hm.max_blocks * bs;
        if kv_cap == 0 || nblocks == 0 || (selected.is_some() && topk == 0) {
            self.memset0(&out)?;
            return Ok(out);
        }
        let scale_log2 = scale * std::f32::consts::LOG2_E;
        let (hu, lu, ru) = (
            to_u32(op, "H", h)?,
            to_u32(op, "L", l)?,
            to_u32(op, "R", r)?,
        );
        let (bsu, mbu, nbu) = (
            to_u32(op, "block_size", bs)?,
            to_u32(op, "max_blocks", hm.max_blocks)?,
            to_u32(op, "blocks", nblocks)?,
        );
        let smem = launch::mla_smem_bytes(l, r);
        let mma = launch::mla_dv(l, r).filter(|_| {
            q_lat.dtype != DType::F32
                && self.mma_attention
                && self.info.arch >= 80
                && smem <= self.kernels.max_smem_optin as usize
        });
        if let Some(dv) = mma {
            // Dense: a block per (64 rows of a sequence, key split, sequence); sparse: per
            // (64 heads, key split, token).
            let groups = if selected.is_some() { n } else { s };
            if groups > 65535 {
                bail!("{op}: at most 65535 sequences (sparse: tokens) per step, got {groups}");
            }
            let max_q = hm
                .query_start
                .windows(2)
                .map(|w| w[1].saturating_sub(w[0]) as usize)
                .max()
                .unwrap_or(0);
            let (max_kv, row_tiles) = if selected.is_some() {
                (topk, h.div_ceil(launch::MLA_ROWS as usize))
            } else {
                let max_kv =
                    (hm.positions.iter().copied().max().unwrap_or(0) as usize + 1).min(kv_cap);
                (
                    max_kv,
                    (max_q * h).div_ceil(launch::MLA_ROWS as usize).max(1),
                )
            };
            // Decode splits the keys so that enough blocks run; a sparse step is always one
            // token per block group, so it may split too.
            // Batch-invariant mode never splits: a split depends on the step's batch.
            let plan = if (max_q <= 1 || selected.is_some()) && !self.invariant() {
                launch::plan_decode(
                    groups * row_tiles,
                    max_kv,
                    4 * self.info.sms as usize,
                    launch::MLA_BK,
                    2 * launch::MLA_BK,
                )
            } else {
                launch::DecodePlan {
                    nsplit: 1,
                    chunk: to_u32(op, "max_blocks·bs", kv_cap)?,
                }
            };
            let (part_o, part_ml) = if plan.nsplit > 1 {
                let rows = n * h * plan.nsplit as usize;
                (
                    Some(self.scratch_f32(rows * l)?),
                    Some(self.scratch_f32(rows * 2)?),
                )
            } else {
                (None, None)
            };
            let po = part_o.as_ref().map_or(0, |t| t.device_ptr());
            let pml = part_ml.as_ref().map_or(0, |t| t.device_ptr());
            let f = self.func("mla", sfx, &format!("mla_attn_mma_{sfx}_d{dv}"))?;
            self.launch(
                op,
                &f,
                (
                    to_u32(op, "row tiles", row_tiles)?,
                    plan.nsplit,
                    groups as u32,
                ),
                (256, 1, 1),
                smem as u32,
                kparams![
                    q_lat.device_ptr(),
                    q_rope.device_ptr(),
                    cache.device_ptr(),
                    meta.query_start.device_ptr(),
                    meta.positions.device_ptr(),
                    meta.block_tables.device_ptr(),
                    meta.token_seq.device_ptr(),
                    sel_ptr,
                    to_u32(op, "topk", topk)?,
                    out.device_ptr(),
                    po,
                    pml,
                    hu,
                    lu,
                    ru,
                    bsu,
                    mbu,
                    nbu,
                    plan.chunk,
                    plan.nsplit,
                    scale_log2
                ],
            )?;
            if plan.nsplit > 1 {
                let f = self.func("attention_paged", sfx, &format!("attn_combine_{sfx}"))?;
                self.launch(
                    op,
                    &f,
                    (to_u32(op, "N·H", n * h)?, 1, 1),
                    (lu.clamp(32, 256).div_ceil(32) * 32, 1, 1),
                    0,
                    kparams![po, pml, out.device_ptr(), lu, plan.nsplit],
                )?;
            }
            return Ok(out);
        }
        if l > 1024 {
            bail!("{op}: latent width L = {l} is above the supported 1024");
        }
        let smem = (l + r) * 4;
        if smem > 48 * 1024 {
            bail!("{op}: L + R = {} is above the supported 12288", l + r);
        }
        let f = self.func("mla", sfx, &format!("mla_attn_simple_{sfx}"))?;
        self.launch(
            op,
            &f,
            (launch::row_grid(n * h, 65535), 1, 1),
            (128, 1, 1),
            smem as u32,
            kparams![
                q_lat.device_ptr(),
                q_rope.device_ptr(),
                cache.device_ptr(),
                meta.token_seq.device_ptr(),
                meta.positions.device_ptr(),
                meta.block_tables.device_ptr(),
                sel_ptr,
                to_u32(op, "topk", topk)?,
                out.device_ptr(),
                n as u32,
                hu,
                lu,
                ru,
                bsu,
                mbu,
                nbu,
                scale_log2
            ],
        )?;
        Ok(out)
    }

    /// DeepSeek-V3 routing: logits `x · gate_wᵀ` in f32 through `linear` (GEMV for ≤ 8 tokens,
    /// cuBLAS SGEMM otherwise; bf16/f16 `x` is widened to f32 first, inside the GEMV for decode
    /// sizes: [`CudaBackend::router_logits_16bit`]), then `moe_topk`.
    pub(crate) fn moe_route_impl(
        &self,
        x: &CudaTensor,
        gate_w: &CudaTensor,
        bias: Option<&CudaTensor>,
        routing: &MoeRouting,
    ) -> Result<(CudaTensor, CudaTensor)> {
        match self.moe_route_with(x, gate_w, bias, routing, None)? {
            Some(choice) => Ok(choice),
            None => bail!("moe_route: no launch ran for x {:?}", x.shape),
        }
    }

    /// [`dayone_backend::Backend::rms_norm_moe_route`]: at decode sizes with the `router_topk`
    /// and `router_norm` fusions, one `gemv_x*_f32_topk_norm_*` launch — every block normalises `a + r` itself
    /// (bit-equal to `add_rms_norm`, see `gemv_norm_prologue`), block 0 writes the sum and the
    /// normed rows, the last block picks the experts; else the norm then `moe_route`.
    ///
    /// Errors: as `add_rms_norm` (or `rms_norm`) and `moe_route`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rms_norm_moe_route_impl(
        &self,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        g: &CudaTensor,
        eps: f32,
        gate_w: &CudaTensor,
        bias: Option<&CudaTensor>,
        routing: &MoeRouting,
    ) -> Result<NormedRoute<CudaTensor>> {
        const FUSION: launch::DecodeFusion = launch::DecodeFusion::RouterNorm;
        if self
            .gemv_norm_params_if(FUSION, a, r, g, eps, None)
            .is_some()
        {
            self.bind()?;
            let sum = match r {
                Some(_) => Some(self.alloc(a.shape.clone(), a.dtype)?),
                None => None,
            };
            let x = self.alloc(a.shape.clone(), a.dtype)?;
            if let Some((nm, smem)) = self.gemv_norm_params_if(FUSION, a, r, g, eps, sum.as_ref()) {
                let norm = (nm.with_x_out(&x), smem);
                if let Some((ids, weights)) =
                    self.moe_route_with(a, gate_w, bias, routing, Some(norm))?
                {
                    return Ok(NormedRoute {
                        sum,
                        x,
                        ids,
                        weights,
                    });
                }
            }
        }
        dayone_backend::rms_norm_then_moe_route(self, a, r, g, eps, gate_w, bias, routing)
    }

    /// `moe_route` of `x`, or with `norm` (`x` is then the pre-norm input) only where the
    /// fused router + top-k launch runs: `Ok(None)` when it does not (nothing launched).
    fn moe_route_with(
        &self,
        x: &CudaTensor,
        gate_w: &CudaTensor,
        bias: Option<&CudaTensor>,
        routing: &MoeRouting,
        norm: Option<(GemvNorm, u32)>,
    ) -> Result<Option<(CudaTensor, CudaTensor)>> {
        const OP: &str = "moe_route";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (n, d) = rank2(OP, "x", x, "[N, D]")?;
        let (e, gd) = rank2(OP, "gate_w", gate_w, "[E, D]")?;
        if gd != d || gate_w.dtype != DType::F32 {
            bail!(
                "{OP}: gate_w must be f32 [E, {d}], got {} {:?}",
                gate_w.dtype,
                gate_w.shape
            );
        }
        let k = routing.top_k;
        let g = routing.n_group.max(1);
        if k == 0 || k > e {
            bail!("{OP}: top_k {k} must be in 1..={e}");
        }
        if !e.is_multiple_of(g) || routing.topk_group == 0 || routing.topk_group > g {
            bail!(
                "{OP}: {e} experts, {g} groups, topk_group {}",
                routing.topk_group
            );
        }
        if let Some(b) = bias {
            if b.shape != [e] || b.dtype != DType::F32 {
                bail!(
                    "{OP}: bias must be f32 [{e}], got {} {:?}",
                    b.dtype,
                    b.shape
                );
            }
        }
        let smem = (2 * e + 2 * g + k) * 4;
        if smem > 48 * 1024 {
            bail!("{OP}: {e} experts are above the supported 6000");
        }
        self.bind()?;
        let ids = self.alloc(vec![n, k], DType::U32)?;
        let weights = self.alloc(vec![n, k], DType::F32)?;
        if n == 0 {
            return Ok(norm.is_none().then_some((ids, weights)));
        }
        let fused = launch::gemv_mt(n, d).filter(|_| x.dtype != DType::F32 && !self.invariant());
        // The fused launch's dynamic shared memory serves the top-k and, with the norm, first
        // the normed rows; its static shared memory counts against the same 48 KB.
        let dyn_smem = norm.map_or(smem, |(_, ns)| smem.max(ns as usize));
        let topk_fits = dyn_smem + launch::GEMV_STATIC_SMEM_MAX <= 48 * 1024;
        if let Some(mt) =
            fused.filter(|_| topk_fits && self.fusion(launch::DecodeFusion::RouterTopk))
        {
            if let Some(counters) = self.decode_counters()? {
                let args = MoeTopkArgs {
                    bias: bias.map_or(0, |b| b.device_ptr()),
                    ids: ids.device_ptr(),
                    weights: weights.device_ptr(),
                    counter: counters.device_ptr(),
                    k: k as u32,
                    g: g as u32,
                    topk_group: routing.topk_group as u32,
                    norm: u32::from(routing.norm_topk_prob),
                    scale: routing.routed_scaling_factor,
                    _pad: 0,
                };
                let topk = RouterTopk {
                    args: &args,
                    smem: dyn_smem as u32,
                    norm: norm.map(|(nm, _)| nm),
                };
                self.router_logits_16bit(x, gate_w, mt, Some(topk))?;
                return Ok(Some((ids, weights)));
            }
        }
        if norm.is_some() {
            return Ok(None);
        }
        let logits = match fused {
            Some(mt) => self.router_logits_16bit(x, gate_w, mt, None)?,
            None => {
                let xf = self.to_f32_impl(x)?;
                self.linear_impl(&xf, gate_w, None, true)?
            }
        };
        let f = self.func("moe", sfx, "moe_topk")?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(n, 65535), 1, 1),
            (256, 1, 1),
            smem as u32,
            kparams![
                logits.device_ptr(),
                bias.map_or(0u64, |b| b.device_ptr()),
                ids.device_ptr(),
                weights.device_ptr(),
                to_u32(OP, "N", n)?,
                e as u32,
                k as u32,
                g as u32,
                routing.topk_group as u32,
                u32::from(routing.norm_topk_prob),
                routing.routed_scaling_factor
            ],
        )?;
        Ok(Some((ids, weights)))
    }

    /// Router logits `[N, E]` f32 of a bf16/f16 `x` `[N, D]` and f32 `gate_w` `[E, D]` in one
    /// `gemv_x{dtype}_f32_m{mt}_r*` launch (kernels/gemv.cu): the f32 decode GEMV widening x as
    /// it loads it, bit for bit the sums of `to_f32` then `linear` (same kernel shape: `mt`
    /// from [`launch::gemv_mt`], rows per block from [`launch::gemv_rpw`]), one launch less.
    ///
    /// With `topk` (the kernel's arguments and its dynamic shared memory) the same launch's last
    /// block also runs `moe_topk` (`gemv_x*_f32_topk_*`, bit-equal; [`launch::DecodeFusion`]
    /// `RouterTopk`).
    fn router_logits_16bit(
        &self,
        x: &CudaTensor,
        gate_w: &CudaTensor,
        mt: u32,
        topk: Option<RouterTopk<'_>>,
    ) -> Result<CudaTensor> {
        const OP: &str = "moe_route";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (n, d) = rank2(OP, "x", x, "[N, D]")?;
        let e = gate_w.shape[0];
        let out = self.alloc(vec![n, e], DType::F32)?;
        let rpw = launch::gemv_rpw(e, self.info.sms);
        let grid = (
            to_u32(OP, "E / rows per block", e.div_ceil(rpw as usize))?,
            1,
            1,
        );
        if let Some(t) = topk {
            let (n, e, d) = (
                to_u32(OP, "N", n)?,
                to_u32(OP, "E", e)?,
                to_u32(OP, "D", d)?,
            );
            let (xp, wp, yp, wc) = (
                x.device_ptr(),
                gate_w.device_ptr(),
                out.device_ptr(),
                gate_w.buf.weight as u32,
            );
            let threads = (launch::GEMV_THREADS, 1, 1);
            match t.norm {
                Some(nm) => {
                    let name = format!("gemv_x{sfx}_f32_topk_norm_m{mt}_r{rpw}");
                    let f = self.func("gemv", sfx, &name)?;
                    let params = kparams![xp, wp, yp, n, e, d, wc, *t.args, nm];
                    self.launch(OP, &f, grid, threads, t.smem, params)?;
                }
                None => {
                    let f =
                        self.func("gemv", sfx, &format!("gemv_x{sfx}_f32_topk_m{mt}_r{rpw}"))?;
                    let params = kparams![xp, wp, yp, n, e, d, wc, *t.args];
                    self.launch(OP, &f, grid, threads, t.smem, params)?;
                }
            }
            return Ok(out);
        }
        let f = self.func("gemv", sfx, &format!("gemv_x{sfx}_f32_m{mt}_r{rpw}"))?;
        self.launch(
            OP,
            &f,
            grid,
            (launch::GEMV_THREADS, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                gate_w.device_ptr(),
                0u64,
                out.device_ptr(),
                to_u32(OP, "N", n)?,
                to_u32(OP, "E", e)?,
                to_u32(OP, "D", d)?,
                gate_w.buf.weight as u32
            ],
        )?;
        Ok(out)
    }

    /// Routed SwiGLU experts: sort pairs by expert on the device, grouped gate_up (+ silu·up,
    /// both clamped first when `limit > 0`), grouped down, weighted combine (see
    /// `kernels/moe.cu`).
    pub(crate) fn moe_experts_impl(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &CudaTensor,
        down: &CudaTensor,
        opts: &ExpertOptions<CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "moe_experts";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (n, d, e, f) = check_experts(OP, x, ids, weights, gate_up, down)?;
        let k = ids.shape[1];
        let (out, done) = self.experts_output(x, (n, d), (k, e, f))?;
        if done {
            return Ok(out);
        }
        let p = n * k;
        let gemv_max = if self.invariant() {
            // The tiled kernels for every token count: the GEMV reduces in another order.
            0
        } else {
            moe_gemv_max()
        };
        let plan = launch::moe_plan(
            n,
            k,
            e,
            d,
            f,
            x.dtype != DType::F32,
            gemv_max,
            self.moe_tile_choice(),
            self.kernels.max_smem_optin as usize,
        );
        let sp = self.sort_pairs(OP, sfx, ids, (p, e), plan.bt)?;
        let maxt = sp.max_tiles;
        let h = self.alloc(vec![p, f], x.dtype)?;
        let y2 = self.alloc(vec![p, d], x.dtype)?;
        check_expert_biases(OP, x, (e, f, d), opts.gate_up_bias, opts.down_bias)?;
        let (act, alpha, limit) = act_code(opts.act);
        let bias_ptr = |b: Option<&CudaTensor>| b.map_or(0, |t| t.device_ptr());
        // (A rows, weights, output, gather k, outputs, reduction, weight rows per expert, bias)
        let projections = [
            (
                plan.gate_up,
                x,
                gate_up,
                &h,
                k as u32,
                f,
                d,
                2 * f,
                "gu",
                bias_ptr(opts.gate_up_bias),
            ),
            (
                plan.down,
                &h,
                down,
                &y2,
                0u32,
                d,
                f,
                d,
                "dn",
                bias_ptr(opts.down_bias),
            ),
        ];
        for (kernel, a, w, o, gather, nout, kdim, wrows, tag, bias) in projections {
            let (name, cols, (threads, smem)) = match kernel {
                MoeKernel::Gemv(mt) => (
                    format!("moe_gemv_{sfx}_{tag}_m{mt}"),
                    launch::moe_gemv_outputs(tag == "gu"),
                    (32 * launch::MOE_GEMV_WARPS as u32, 0),
                ),
                MoeKernel::Mma(tile) => {
                    let sh = tile.shape(x.dtype.size());
                    (
                        format!("{}_{sfx}_{tag}", sh.kernel),
                        sh.weight_rows as usize / if tag == "gu" { 2 } else { 1 },
                        (sh.threads, sh.smem),
                    )
                }
                MoeKernel::Fma => (format!("moe_fma_{sfx}_{tag}"), 32, (256, 0)),
            };
            let fun = self.func("moe", sfx, &name)?;
            self.launch(
                OP,
                &fun,
                (to_u32(OP, "grid.x", nout.div_ceil(cols))?, maxt, 1),
                (threads, 1, 1),
                smem as u32,
                kparams![
                    a.device_ptr(),
                    w.device_ptr(),
                    o.device_ptr(),
                    sp.offsets.device_ptr(),
                    sp.sorted.device_ptr(),
                    sp.tiles.device_ptr(),
                    sp.ntiles.device_ptr(),
                    plan.bt,
                    gather,
                    to_u32(OP, "output width", nout)?,
                    to_u32(OP, "reduction width", kdim)?,
                    to_u32(OP, "weight rows", wrows)?,
                    limit,
                    bias,
                    act,
                    alpha
                ],
            )?;
        }
        self.combine_pairs(OP, sfx, &y2, &sp, weights, &out, (n, k, d))?;
        Ok(out)
    }
}

impl CudaBackend {
    /// Forces the tile rows of the tensor-core MoE kernel for later `moe_experts` calls
    /// ([`launch::MoeTile`]; tests, benchmarks); the default comes from `DAYONE_MOE_TILE`.
    /// Batch-invariant mode always takes the 64-row kernel.
    pub fn set_moe_tile(&self, tile: launch::MoeTile) {
        self.moe_tile
            .store(tile as u8, std::sync::atomic::Ordering::Relaxed);
    }

    /// The tile choice `moe_experts` passes to [`launch::moe_plan`].
    fn moe_tile_choice(&self) -> launch::MoeTile {
        if self.invariant() {
            // One kernel for every token count (the choice would follow the batch).
            return launch::MoeTile::Rows64;
        }
        launch::MoeTile::from_u8(self.moe_tile.load(std::sync::atomic::Ordering::Relaxed))
            .or_without_wgmma(self.kernels.target.has_wgmma("moe"))
    }
}

/// The (token, choice) pairs of a step sorted by expert (`moe_sort`, kernels/moe.cu): `offsets`
/// `[E + 1]`, `pos` `[P]` (sorted position of each pair), `sorted` `[P]` (pair at each sorted
/// position), `tiles` `[max_tiles][2]` = (expert, first row) of tiles of at most `bt` rows,
/// `ntiles` `[1]`, all u32 on the device; `max_tiles` is the grid's tile bound.
pub(crate) struct SortedPairs {
    pub offsets: CudaTensor,
    pub pos: CudaTensor,
    pub sorted: CudaTensor,
    pub tiles: CudaTensor,
    pub ntiles: CudaTensor,
    pub max_tiles: u32,
}

impl CudaBackend {
    /// The `[n, d]` output of a routed-experts op in `x`'s dtype, and whether it is already
    /// final: empty, or zeros when no expert can contribute (`k`, `E` or `F` is 0).
    pub(crate) fn experts_output(
        &self,
        x: &CudaTensor,
        (n, d): (usize, usize),
        (k, e, f): (usize, usize, usize),
    ) -> Result<(CudaTensor, bool)> {
        self.bind()?;
        let out = self.alloc(vec![n, d], x.dtype)?;
        if n == 0 || d == 0 {
            return Ok((out, true));
        }
        if k == 0 || e == 0 || f == 0 {
            self.memset0(&out)?;
            return Ok((out, true));
        }
        Ok((out, false))
    }

    /// Sorts the `p` pairs of `ids` `[N, k]` u32 over `e` experts into tiles of at most `bt`
    /// rows (one `moe_sort` launch). Errors: more than 4 096 experts (the sort's shared
    /// memory) or more than 65 535 tiles (the grid).
    pub(crate) fn sort_pairs(
        &self,
        op: &str,
        sfx: &'static str,
        ids: &CudaTensor,
        (p, e): (usize, usize),
        bt: u32,
    ) -> Result<SortedPairs> {
        if 3 * e * 4 > 48 * 1024 {
            bail!("{op}: {e} experts are above the supported 4096");
        }
        let max_tiles = p.div_ceil(bt as usize) + e.min(p);
        let maxt = to_u32(op, "tiles", max_tiles)?;
        if maxt > 65535 {
            bail!("{op}: {p} (token, expert) pairs need {maxt} tiles, above 65535");
        }
        let out = SortedPairs {
            offsets: self.alloc(vec![e + 1], DType::U32)?,
            pos: self.alloc(vec![p], DType::U32)?,
            sorted: self.alloc(vec![p], DType::U32)?,
            tiles: self.alloc(vec![2 * max_tiles], DType::U32)?,
            ntiles: self.alloc(vec![1], DType::U32)?,
            max_tiles: maxt,
        };
        let sort = self.func("moe", sfx, "moe_sort")?;
        self.launch(
            op,
            &sort,
            (1, 1, 1),
            (launch::moe_sort_threads(p, e), 1, 1),
            (3 * e * 4) as u32,
            kparams![
                ids.device_ptr(),
                to_u32(op, "N·k", p)?,
                e as u32,
                bt,
                out.offsets.device_ptr(),
                out.pos.device_ptr(),
                out.sorted.device_ptr(),
                out.tiles.device_ptr(),
                out.ntiles.device_ptr()
            ],
        )?;
        Ok(out)
    }

    /// The last step of a routed-experts op (`moe_combine`, kernels/moe.cu): `out[t, c]` =
    /// Σ_j `weights[t, j]` · `y2[pos[t·k + j], c]` in f32, j in order, over the `k` choices of
    /// each of the `n` tokens (pairs without a sorted position skipped); `y2` `[P, d]` and `out`
    /// `[n, d]` in the activation dtype, `weights` `[n, k]` f32, `pos` from `sp`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn combine_pairs(
        &self,
        op: &str,
        sfx: &'static str,
        y2: &CudaTensor,
        sp: &SortedPairs,
        weights: &CudaTensor,
        out: &CudaTensor,
        (n, k, d): (usize, usize, usize),
    ) -> Result<()> {
        let comb = self.func("moe", sfx, &format!("moe_combine_{sfx}"))?;
        let (cx, cy) = launch::moe_combine_grid(n, d);
        self.launch(
            op,
            &comb,
            (cx, cy, 1),
            (256, 1, 1),
            0,
            kparams![
                y2.device_ptr(),
                sp.pos.device_ptr(),
                weights.device_ptr(),
                out.device_ptr(),
                n as u32,
                k as u32,
                to_u32(op, "D", d)?
            ],
        )
    }
}

/// Tokens up to which `moe_experts` takes the grouped GEMV: `DAYONE_MOE_GEMV_MAX` (read once;
/// a value that is not a token count warns), else [`launch::MOE_GEMV_MAX_TOKENS`].
fn moe_gemv_max() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        launch::env_knob("DAYONE_MOE_GEMV_MAX", |_| true, "a token count")
            .unwrap_or(launch::MOE_GEMV_MAX_TOKENS)
    })
}
