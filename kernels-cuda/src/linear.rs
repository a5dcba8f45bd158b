//! `linear`: streaming GEMV for decode-sized M, else cuBLAS `GemmEx`, bias fused or added.

use crate::device::drv;
use crate::invariant::InvGemm;
use crate::{
    check_dtype, dtype_suffix, launch, rows_last, to_i32, to_u32, CudaBackend, CudaTensor,
};
use anyhow::{anyhow, bail, Result};
use cudarc::cublas;
use cudarc::driver::result as dr;
use dayone_backend::{Backend, DType};
use std::ffi::c_void;

impl CudaBackend {
    /// cuBLAS GemmEx `out[M, N] = x[M, K] · w[N, K]ᵀ` with f32 compute; `x` and `w` of one
    /// dtype, `out` of that dtype or f32. Row-major `y = x·wᵀ` is column-major `yᵀ[N, M] = wᵀ·xᵀ`
    /// where the row-major buffers of w and x read column-major are `[K, N]` and `[K, M]`:
    /// op(A) = Aᵀ.
    fn gemm_xwt(
        &self,
        op: &str,
        x: &CudaTensor,
        w: &CudaTensor,
        out: &CudaTensor,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        use cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
        let ty = |d: DType| match d {
            DType::F32 => cudaDataType::CUDA_R_32F,
            DType::BF16 => cudaDataType::CUDA_R_16BF,
            _ => cudaDataType::CUDA_R_16F,
        };
        let (dt, ot) = (ty(x.dtype), ty(out.dtype));
        let (mi, ni, ki) = (
            to_i32(op, "M", m)?,
            to_i32(op, "N", n)?,
            to_i32(op, "K", k)?,
        );
        let (alpha, beta) = (1.0f32, 0.0f32);
        let blas = self.blas.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: device pointers of live buffers with the sizes the callers checked.
        self.profiled(
            || format!("cublas_gemm m{m}"),
            || unsafe {
                cublas::result::gemm_ex(
                    *blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    ni,
                    mi,
                    ki,
                    (&alpha) as *const f32 as *const c_void,
                    w.device_ptr() as *const c_void,
                    dt,
                    ki,
                    x.device_ptr() as *const c_void,
                    dt,
                    ki,
                    (&beta) as *const f32 as *const c_void,
                    out.device_ptr() as *mut c_void,
                    ot,
                    ni,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .map_err(|e| anyhow!("{op}: cuBLAS GemmEx [{m}x{k}]·[{n}x{k}]ᵀ failed: {e:?}"))
            },
        )
    }

    /// `x · wᵀ` with an f32 output: cuBLAS GemmEx with 16-bit (or f32) inputs and an f32 C.
    pub(crate) fn linear_f32_impl(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "linear_f32";
        let (m, k) = rows_last(OP, "x [M, K]", x)?;
        if w.shape.len() != 2 || w.shape[1] != k {
            bail!("{OP}: w must be [N, {k}], got {:?}", w.shape);
        }
        check_dtype(OP, "w", w, x.dtype)?;
        let n = w.shape[0];
        self.bind()?;
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("rank >= 2") = n;
        let out = self.alloc(shape, DType::F32)?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        if self.invariant() {
            self.gemm_inv(OP, x, w, &out, &InvGemm::plain(m, n, k))?;
        } else if k == 0 {
            self.memset0(&out)?;
        } else {
            self.gemm_xwt(OP, x, w, &out, (m, n, k))?;
        }
        Ok(out)
    }

    /// One launch of a single-weight decode GEMV `{kernel}_{sfx}_m{mt}_r{rpw}` (kernels/gemv.cu:
    /// `x, w, bias, y, M, N, K, w_const`, then `extra` — a fused op's parameter struct — when
    /// given), `rpw` rows per block from [`launch::gemv_rpw`]. `x` `[M, K]`, `w` `[N, K]`, `y`
    /// `[M, N]`; `smem` bytes of dynamic shared memory.
    ///
    /// Errors: sizes past u32, the kernel's lookup or launch.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemv_launch<E>(
        &self,
        op: &str,
        kernel: &str,
        (x, w, bias, y): (&CudaTensor, &CudaTensor, Option<&CudaTensor>, &CudaTensor),
        (m, n, k, mt): (usize, usize, usize, u32),
        smem: u32,
        extra: Option<&E>,
    ) -> Result<()> {
        let sfx = dtype_suffix(op, x.dtype)?;
        let rpw = launch::gemv_rpw(n, self.info.sms);
        let f = self.func("gemv", sfx, &format!("{kernel}_{sfx}_m{mt}_r{rpw}"))?;
        let grid = to_u32(op, "N / rows per block", n.div_ceil(rpw as usize))?;
        let (xp, wp, bp, yp) = (
            x.device_ptr(),
            w.device_ptr(),
            bias.map_or(0u64, |b| b.device_ptr()),
            y.device_ptr(),
        );
        let (mu, nu, ku, wc) = (
            to_u32(op, "M", m)?,
            to_u32(op, "N", n)?,
            to_u32(op, "K", k)?,
            w.buf.weight as u32,
        );
        fn arg<A>(v: &A) -> *mut c_void {
            v as *const A as *mut c_void
        }
        // On the stack: this runs for every decode projection.
        let mut params = [
            arg(&xp),
            arg(&wp),
            arg(&bp),
            arg(&yp),
            arg(&mu),
            arg(&nu),
            arg(&ku),
            arg(&wc),
            extra.map_or(std::ptr::null_mut(), arg),
        ];
        let used = if extra.is_some() { 9 } else { 8 };
        self.launch(
            op,
            &f,
            (grid, 1, 1),
            (launch::GEMV_THREADS, 1, 1),
            smem,
            &mut params[..used],
        )
    }

    pub(crate) fn linear_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        allow_gemv: bool,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (m, k) = rows_last(OP, "x [M, K]", x)?;
        if w.shape.len() != 2 || w.shape[1] != k {
            bail!(
                "{OP}: w must be [N, K] with K = {k} (x is {:?}), got {:?}",
                x.shape,
                w.shape
            );
        }
        check_dtype(OP, "w", w, x.dtype)?;
        let n = w.shape[0];
        if let Some(b) = bias {
            if b.shape != [n] {
                bail!("{OP}: bias must be [N] = [{n}], got {:?}", b.shape);
            }
            check_dtype(OP, "bias", b, x.dtype)?;
        }
        self.bind()?;
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("rank >= 2") = n;
        let out = self.alloc(shape, x.dtype)?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        let gemv = launch::gemv_mt(m, k).filter(|_| allow_gemv && !self.invariant());
        if let Some(mt) = gemv {
            // Decode-sized M: the streaming GEMV kernel (bias fused).
            self.gemv_launch::<()>(OP, "gemv", (x, w, bias, &out), (m, n, k, mt), 0, None)?;
            return Ok(out);
        }
        let tc = launch::gemv_tc_plan(m, n, k, self.info.sms).filter(|_| {
            allow_gemv
                && !self.invariant()
                && self.info.arch >= 80
                && x.dtype != DType::F32
                && self.gemv_tc.load(std::sync::atomic::Ordering::Relaxed)
        });
        if let Some((nt, rg)) = tc {
            // 5–16 rows: the weights streamed once through the tensor cores (bias fused).
            let f = self.func("gemv", sfx, &format!("gemv_tc_{sfx}_n{nt}_g{rg}"))?;
            self.launch(
                OP,
                &f,
                (
                    to_u32(OP, "N / rows per block", n.div_ceil(16 * rg as usize))?,
                    1,
                    1,
                ),
                (launch::GEMV_THREADS, 1, 1),
                0,
                kparams![
                    x.device_ptr(),
                    w.device_ptr(),
                    bias.map_or(0u64, |b| b.device_ptr()),
                    out.device_ptr(),
                    to_u32(OP, "M", m)?,
                    to_u32(OP, "N", n)?,
                    to_u32(OP, "K", k)?,
                    w.buf.weight as u32
                ],
            )?;
            return Ok(out);
        }
        if self.invariant() {
            // One reduction order per element whatever M (invariant.rs).
            self.gemm_inv(OP, x, w, &out, &InvGemm::plain(m, n, k))?;
        } else if k == 0 {
            // Empty reduction: y = bias (or 0).
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
        } else {
            self.gemm_xwt(OP, x, w, &out, (m, n, k))?;
        }
        if let Some(b) = bias {
            let f = self.func("elementwise", sfx, &format!("bias_add_{sfx}"))?;
            self.launch(
                OP,
                &f,
                (
                    launch::elementwise_grid(m * n, 1, 256, 8 * self.info.sms),
                    1,
                    1,
                ),
                (256, 1, 1),
                0,
                kparams![
                    out.device_ptr(),
                    b.device_ptr(),
                    to_u32(OP, "M", m)?,
                    to_u32(OP, "N", n)?
                ],
            )?;
        }
        Ok(out)
    }
}

/// Projections of one launch of `gemv_many_*` (`GEMV_SEGS` in gemv.cu).
pub(crate) const GEMV_SEGS: usize = 8;

/// The kernel's `GemvSegs` parameter: each projection's weight, bias (0: none), output and
/// rows, and the first block of each (`first[GEMV_SEGS]` = the grid size).
#[repr(C)]
struct GemvSegs {
    x: [u64; GEMV_SEGS],
    w: [u64; GEMV_SEGS],
    bias: [u64; GEMV_SEGS],
    y: [u64; GEMV_SEGS],
    n: [u32; GEMV_SEGS],
    first: [u32; GEMV_SEGS + 1],
}

impl CudaBackend {
    /// Turns the tensor-core skinny product for 5–16 rows of x on or off for later `linear`
    /// calls (tests, benchmarks); the default comes from `DAYONE_CUDA_GEMV_TC`
    /// ([`launch::gemv_tc_plan`]).
    pub fn set_gemv_tc(&self, on: bool) {
        self.gemv_tc.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// [`dayone_backend::Backend::linear_many`]: one `gemv_many` launch when every projection
    /// takes the decode GEMV (same dtype and K, decode-sized M, at most `GEMV_SEGS` of them,
    /// not batch-invariant), else one [`CudaBackend::linear_impl`] each.
    ///
    /// Errors: as `linear` for each projection.
    pub(crate) fn linear_many_impl(
        &self,
        x: &CudaTensor,
        parts: &[(&CudaTensor, Option<&CudaTensor>)],
    ) -> Result<Vec<CudaTensor>> {
        const OP: &str = "linear_many";
        let (m, k) = rows_last(OP, "x [M, K]", x)?;
        if !(parts.len() > 1 && self.gemv_many_fits(x, m, k, parts)) {
            return parts
                .iter()
                .map(|(w, b)| self.linear_impl(x, w, *b, true))
                .collect();
        }
        self.gemv_many(OP, x, m, k, parts, None, None)
    }

    /// [`dayone_backend::Backend::linear_each`]: one `gemv_many` launch whose segments read
    /// their own inputs when every input has one shape and dtype and the weights fit
    /// [`CudaBackend::gemv_many_fits`] (bit-equal to one `linear` each: the same kernel
    /// arithmetic per row), else one [`CudaBackend::linear_impl`] each.
    pub(crate) fn linear_each_impl(
        &self,
        parts: &[(&CudaTensor, &CudaTensor)],
    ) -> Result<Vec<CudaTensor>> {
        const OP: &str = "linear_each";
        let separate = || {
            parts
                .iter()
                .map(|(x, w)| self.linear_impl(x, w, None, true))
                .collect()
        };
        let Some((x0, _)) = parts.first() else {
            return Ok(Vec::new());
        };
        let (m, k) = rows_last(OP, "x [M, K]", x0)?;
        let ws: Vec<_> = parts.iter().map(|(_, w)| (*w, None)).collect();
        let same = parts
            .iter()
            .all(|(x, _)| x.shape == x0.shape && x.dtype == x0.dtype);
        if !(parts.len() > 1 && same && self.gemv_many_fits(x0, m, k, &ws)) {
            return separate();
        }
        let xs: Vec<&CudaTensor> = parts.iter().map(|(x, _)| *x).collect();
        self.gemv_many(OP, x0, m, k, &ws, None, Some(&xs))
    }

    /// Whether `parts` (weights `[N_i, K]` of `x`'s dtype, optional biases `[N_i]`) can be one
    /// `gemv_many` launch for `x` `[M, K]`: decode-sized M, at most `GEMV_SEGS` projections, not
    /// batch-invariant.
    fn gemv_many_fits(
        &self,
        x: &CudaTensor,
        m: usize,
        k: usize,
        parts: &[(&CudaTensor, Option<&CudaTensor>)],
    ) -> bool {
        !parts.is_empty()
            && parts.len() <= GEMV_SEGS
            && m > 0
            && !self.invariant()
            && launch::gemv_mt(m, k).is_some()
            && parts.iter().all(|(w, b)| {
                w.shape.len() == 2
                    && w.shape[1] == k
                    && w.shape[0] > 0
                    && w.dtype == x.dtype
                    && b.is_none_or(|b| b.shape == [w.shape[0]] && b.dtype == x.dtype)
            })
    }

    /// One `gemv_many` launch (`gemv_many_norm` with `norm`: `x` is then the pre-norm input);
    /// the caller checked [`CudaBackend::gemv_many_fits`]. With `xs`, segment i reads `xs[i]`
    /// (same shape as `x`) instead of `x`.
    #[allow(clippy::too_many_arguments)]
    fn gemv_many(
        &self,
        op: &str,
        x: &CudaTensor,
        m: usize,
        k: usize,
        parts: &[(&CudaTensor, Option<&CudaTensor>)],
        norm: Option<(GemvNorm, u32)>,
        xs: Option<&[&CudaTensor]>,
    ) -> Result<Vec<CudaTensor>> {
        const OP: &str = "linear_many";
        let sfx = dtype_suffix(op, x.dtype)?;
        let mt = launch::gemv_mt(m, k).expect("checked above");
        let total: usize = parts.iter().map(|(w, _)| w.shape[0]).sum();
        let rpw = launch::gemv_rpw(total, self.info.sms);
        self.bind()?;
        let mut segs = GemvSegs {
            x: [0; GEMV_SEGS],
            w: [0; GEMV_SEGS],
            bias: [0; GEMV_SEGS],
            y: [0; GEMV_SEGS],
            n: [0; GEMV_SEGS],
            first: [0; GEMV_SEGS + 1],
        };
        let mut outs = Vec::with_capacity(parts.len());
        let mut blocks = 0usize;
        for (i, (w, b)) in parts.iter().enumerate() {
            let n = w.shape[0];
            let mut shape = x.shape.clone();
            *shape.last_mut().expect("rank >= 2") = n;
            let out = self.alloc(shape, x.dtype)?;
            segs.x[i] = xs.map_or(0, |xs| xs[i].device_ptr());
            segs.w[i] = w.device_ptr();
            segs.bias[i] = b.map_or(0, |b| b.device_ptr());
            segs.y[i] = out.device_ptr();
            segs.n[i] = to_u32(OP, "N", n)?;
            segs.first[i] = to_u32(OP, "blocks", blocks)?;
            blocks += n.div_ceil(rpw as usize);
            outs.push(out);
        }
        for f in segs.first.iter_mut().skip(parts.len()) {
            *f = to_u32(OP, "blocks", blocks)?;
        }
        let w_const = parts.iter().all(|(w, _)| w.buf.weight) as u32;
        let grid = (to_u32(OP, "grid", blocks)?, 1, 1);
        let (m32, k32) = (m as u32, to_u32(OP, "K", k)?);
        match norm {
            None => {
                let f = self.func("gemv", sfx, &format!("gemv_many_{sfx}_m{mt}_r{rpw}"))?;
                let block = (launch::GEMV_THREADS, 1, 1);
                let params = kparams![x.device_ptr(), segs, m32, k32, w_const];
                self.launch(op, &f, grid, block, 0, params)?;
            }
            Some((nm, smem)) => {
                let f = self.func("gemv", sfx, &format!("gemv_many_norm_{sfx}_m{mt}_r{rpw}"))?;
                let block = (launch::GEMV_THREADS, 1, 1);
                let params = kparams![x.device_ptr(), segs, m32, k32, w_const, nm];
                self.launch(op, &f, grid, block, smem, params)?;
            }
        }
        Ok(outs)
    }
}

/// The gated-norm input of a fused decode GEMV (`GemvGatedNorm` in gemv.cu): the gate, the
/// norm weight (f32 or the activation dtype), the head width and eps.
#[repr(C)]
#[derive(Clone, Copy)]
struct GemvGatedNorm {
    gate: u64,
    w: u64,
    w_f32: u32,
    hd: u32,
    eps: f32,
    _pad: u32,
}

/// The add-and-norm tail of `gemv_addnorm_*` (`GemvAddNorm` in gemv.cu): the norm's
/// parameters (`r` = the GEMV's output, `sum` = the sum's output), the residual, the normed
/// rows' output and the launch's counter.
#[repr(C)]
#[derive(Clone, Copy)]
struct GemvAddNorm {
    nm: GemvNorm,
    h: u64,
    xn: u64,
    counter: u64,
}

/// The pre-norm input of a fused decode GEMV (`GemvNorm` in gemv.cu): the residual to add
/// (0: none), the norm weight, the sum's output (0: none), the normed rows' output (0: none),
/// eps and the threads of the norm kernel whose sums it reproduces ([`launch::norm_threads`]).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct GemvNorm {
    r: u64,
    g: u64,
    sum: u64,
    x_out: u64,
    eps: f32,
    vt: u32,
}

impl GemvNorm {
    /// Block 0 also writes the normed rows to `x` `[M, K]` (the router's launch, whose input
    /// the experts read next).
    pub(crate) fn with_x_out(self, x: &CudaTensor) -> Self {
        Self {
            x_out: x.device_ptr(),
            ..self
        }
    }
}

impl CudaBackend {
    /// The fused-norm parameters and dynamic shared memory (the normed rows, `min(M, MT) · K`
    /// elements) for a pre-norm GEMV of `a` `[M, K]` (+ `r`) with norm weight `g` `[K]`, or
    /// `None` when the inputs do not fit the fused kernel (then the two-step path runs and
    /// reports any shape or dtype error): shapes and dtypes agree and the rows fit in
    /// [`launch::GEMV_NORM_SMEM_MAX`].
    pub(crate) fn gemv_norm_params(
        &self,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        g: &CudaTensor,
        eps: f32,
        sum: Option<&CudaTensor>,
    ) -> Option<(GemvNorm, u32)> {
        self.gemv_norm_params_if(launch::DecodeFusion::Norm, a, r, g, eps, sum)
    }

    /// [`CudaBackend::gemv_norm_params`] where `fusion` (not `Norm`) is what turns it on.
    pub(crate) fn gemv_norm_params_if(
        &self,
        fusion: launch::DecodeFusion,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        g: &CudaTensor,
        eps: f32,
        sum: Option<&CudaTensor>,
    ) -> Option<(GemvNorm, u32)> {
        let (m, k) = rows_last("rms_norm_linear", "a", a).ok()?;
        let mt = launch::gemv_mt(m, k)? as usize;
        let fits = !self.invariant()
            && self.fusion(fusion)
            && r.is_none_or(|r| r.shape == a.shape && r.dtype == a.dtype)
            && g.shape == [k]
            && g.dtype == a.dtype
            && k.is_multiple_of(8);
        let smem = m.min(mt) * k * a.dtype.size();
        (fits && smem <= launch::GEMV_NORM_SMEM_MAX).then(|| {
            (
                GemvNorm {
                    r: r.map_or(0, |r| r.device_ptr()),
                    g: g.device_ptr(),
                    sum: sum.map_or(0, |s| s.device_ptr()),
                    x_out: 0,
                    eps,
                    vt: launch::norm_threads(k),
                },
                smem as u32,
            )
        })
    }

    /// [`dayone_backend::Backend::gated_rms_norm_linear`]: one `gemv_gnorm` launch for
    /// decode-sized M with the `gated_norm` fusion (every block normalises the heads itself,
    /// bit-equal to `gated_rms_norm`, see `gemv_gated_norm_prologue`) where the heads fit it
    /// (`head_dim` 32, 64, 128 or 256; K a multiple of 256, so every warp's lanes run the
    /// prologue's shuffles together), else the norm then `linear`.
    ///
    /// Errors: as `gated_rms_norm` and `linear`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_rms_norm_linear_impl(
        &self,
        x: &CudaTensor,
        gate: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
        head_dim: usize,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "gated_rms_norm_linear";
        if let (Ok((m, k)), Ok(_)) = (rows_last(OP, "x [M, K]", x), dtype_suffix(OP, x.dtype)) {
            let mt = launch::gemv_mt(m, k);
            let smem = m.min(mt.unwrap_or(0) as usize) * k * x.dtype.size();
            let n = w.shape.first().copied().unwrap_or(0);
            let fits = mt.is_some()
                && !self.invariant()
                && self.fusion(launch::DecodeFusion::GatedNorm)
                && [32, 64, 128, 256].contains(&head_dim)
                && k.is_multiple_of(256)
                && gate.shape == x.shape
                && gate.dtype == x.dtype
                && norm_w.shape == [head_dim]
                && (norm_w.dtype == x.dtype || norm_w.dtype == DType::F32)
                && w.shape == [n, k]
                && n > 0
                && w.dtype == x.dtype
                && bias.is_none_or(|b| b.shape == [n] && b.dtype == x.dtype)
                && smem <= launch::GEMV_NORM_SMEM_MAX;
            if let (true, Some(mt)) = (fits, mt) {
                self.bind()?;
                let mut shape = x.shape.clone();
                *shape.last_mut().expect("rank >= 2") = n;
                let out = self.alloc(shape, x.dtype)?;
                let gn = GemvGatedNorm {
                    gate: gate.device_ptr(),
                    w: norm_w.device_ptr(),
                    w_f32: u32::from(norm_w.dtype == DType::F32),
                    hd: head_dim as u32,
                    eps,
                    _pad: 0,
                };
                let dims = (m, n, k, mt);
                let io = (x, w, bias, &out);
                self.gemv_launch(OP, "gemv_gnorm", io, dims, smem as u32, Some(&gn))?;
                return Ok(out);
            }
        }
        dayone_backend::gated_rms_norm_then_linear(self, x, gate, norm_w, eps, head_dim, w, bias)
    }

    /// `(M, K, N, MT)` when `linear_add_rms_norm` of these operands takes the fused
    /// `gemv_addnorm` launch: the `add_norm` fusion on, not batch-invariant, decode-sized M,
    /// shapes and dtypes that agree, N a multiple of 8.
    pub(crate) fn add_norm_fits(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        h: &CudaTensor,
        norm_w: &CudaTensor,
    ) -> Option<(usize, usize, usize, u32)> {
        let (m, k) = rows_last("linear_add_rms_norm", "x [M, K]", x).ok()?;
        let n = w.shape.first().copied().unwrap_or(0);
        let mt = launch::gemv_mt(m, k)?;
        let fits = !self.invariant()
            && self.fusion(launch::DecodeFusion::AddNorm)
            && m > 0
            && w.shape == [n, k]
            && n > 0
            && n.is_multiple_of(8)
            && w.dtype == x.dtype
            && bias.is_none_or(|b| b.shape == [n] && b.dtype == x.dtype)
            && h.shape == [m, n]
            && h.dtype == x.dtype
            && norm_w.shape == [n]
            && norm_w.dtype == x.dtype;
        fits.then_some((m, k, n, mt))
    }

    /// [`dayone_backend::Backend::linear_add_rms_norm`]: one `gemv_addnorm` launch for
    /// decode-sized M with the `add_norm` fusion (the GEMV's last block adds `h` and normalises
    /// the rows, bit-equal to `linear` then `add_rms_norm`, see `gemv_add_norm_impl`) where the
    /// shapes and dtypes agree, else those two calls (which report any error).
    ///
    /// Errors: as `linear` and `add_rms_norm`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn linear_add_rms_norm_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        h: &CudaTensor,
        norm_w: &CudaTensor,
        eps: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        const OP: &str = "linear_add_rms_norm";
        if let Some((m, k, n, mt)) = self.add_norm_fits(x, w, bias, h, norm_w) {
            // y is the GEMV's output, the tail's input (not returned).
            if let Some(counters) = self.decode_counters()? {
                self.bind()?;
                let y = self.alloc(vec![m, n], x.dtype)?;
                let sum = self.alloc(vec![m, n], x.dtype)?;
                let xn = self.alloc(vec![m, n], x.dtype)?;
                let an = GemvAddNorm {
                    nm: GemvNorm {
                        r: y.device_ptr(),
                        g: norm_w.device_ptr(),
                        sum: sum.device_ptr(),
                        x_out: 0,
                        eps,
                        vt: launch::norm_threads(n),
                    },
                    h: h.device_ptr(),
                    xn: xn.device_ptr(),
                    counter: counters.device_ptr(),
                };
                let io = (x, w, bias, &y);
                self.gemv_launch(OP, "gemv_addnorm", io, (m, n, k, mt), 0, Some(&an))?;
                return Ok((sum, xn));
            }
        }
        dayone_backend::linear_then_add_rms_norm(self, x, w, bias, h, norm_w, eps)
    }

    /// [`dayone_backend::Backend::rms_norm_linear_many`]: one `gemv_many_norm` launch for
    /// decode-sized M (the norm computed by every block, bit-equal to `add_rms_norm` /
    /// `rms_norm` then `linear_many`), else those two steps.
    ///
    /// Errors: as `add_rms_norm` (or `rms_norm`) and `linear` for each projection.
    pub(crate) fn rms_norm_linear_many_impl(
        &self,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        g: &CudaTensor,
        eps: f32,
        parts: &[(&CudaTensor, Option<&CudaTensor>)],
    ) -> Result<dayone_backend::NormedProjections<CudaTensor>> {
        const OP: &str = "rms_norm_linear_many";
        if let Ok((m, k)) = rows_last(OP, "a [M, K]", a) {
            if self.gemv_many_fits(a, m, k, parts)
                && self.gemv_norm_params(a, r, g, eps, None).is_some()
            {
                self.bind()?;
                let sum = match r {
                    Some(_) => Some(self.alloc(a.shape.clone(), a.dtype)?),
                    None => None,
                };
                let norm = self.gemv_norm_params(a, r, g, eps, sum.as_ref());
                let ys = self.gemv_many(OP, a, m, k, parts, norm, None)?;
                return Ok((sum, ys));
            }
        }
        let (sum, x) = self.rms_norm_of(a, r, g, eps)?;
        Ok((sum, self.linear_many_impl(&x, parts)?))
    }

    /// [`dayone_backend::Backend::rms_norm_linear_silu_mul`]: one `gemv_glu_norm` launch for
    /// decode-sized M (bit-equal to the norm, the two projections and `silu_mul`), else the
    /// norm then [`CudaBackend::linear_silu_mul_impl`].
    ///
    /// Errors: as `add_rms_norm` (or `rms_norm`) and `linear_silu_mul`.
    pub(crate) fn rms_norm_linear_silu_mul_impl(
        &self,
        a: &CudaTensor,
        r: Option<&CudaTensor>,
        g: &CudaTensor,
        eps: f32,
        w_gate: &CudaTensor,
        w_up: &CudaTensor,
    ) -> Result<(Option<CudaTensor>, CudaTensor)> {
        const OP: &str = "rms_norm_linear_silu_mul";
        if let Ok((m, k)) = rows_last(OP, "a [M, K]", a) {
            if self.gemv_glu_fits(a, m, k, w_gate, w_up)
                && self.gemv_norm_params(a, r, g, eps, None).is_some()
            {
                self.bind()?;
                let sum = match r {
                    Some(_) => Some(self.alloc(a.shape.clone(), a.dtype)?),
                    None => None,
                };
                let norm = self.gemv_norm_params(a, r, g, eps, sum.as_ref());
                let y = self.gemv_glu(OP, a, m, k, w_gate, w_up, norm)?;
                return Ok((sum, y));
            }
        }
        let (sum, x) = self.rms_norm_of(a, r, g, eps)?;
        Ok((sum, self.linear_silu_mul_impl(&x, w_gate, w_up)?))
    }
}

impl CudaBackend {
    /// [`dayone_backend::Backend::linear_silu_mul`]: one `gemv_glu` launch for decode-sized M
    /// (bit-equal to the two projections then `silu_mul`), else the trait's two-step default.
    ///
    /// Errors: as `linear` for each weight and `silu_mul`.
    pub(crate) fn linear_silu_mul_impl(
        &self,
        x: &CudaTensor,
        w_gate: &CudaTensor,
        w_up: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear_silu_mul";
        let (m, k) = rows_last(OP, "x [M, K]", x)?;
        if !self.gemv_glu_fits(x, m, k, w_gate, w_up) {
            let ys = self.linear_many_impl(x, &[(w_gate, None), (w_up, None)])?;
            return self.binary("silu_mul", &ys[0], &ys[1]);
        }
        self.gemv_glu(OP, x, m, k, w_gate, w_up, None)
    }

    /// Whether gate and up (`[F, K]` of `x`'s dtype) take one `gemv_glu` launch for `x` `[M, K]`.
    fn gemv_glu_fits(
        &self,
        x: &CudaTensor,
        m: usize,
        k: usize,
        w_gate: &CudaTensor,
        w_up: &CudaTensor,
    ) -> bool {
        m > 0
            && !self.invariant()
            && launch::gemv_mt(m, k).is_some()
            && w_gate.shape.len() == 2
            && w_gate.shape[1] == k
            && w_gate.shape[0] > 0
            && w_up.shape == w_gate.shape
            && w_gate.dtype == x.dtype
            && w_up.dtype == x.dtype
    }

    /// One `gemv_glu` launch (`gemv_glu_norm` with `norm`: `x` is then the pre-norm input); the
    /// caller checked [`CudaBackend::gemv_glu_fits`].
    #[allow(clippy::too_many_arguments)]
    fn gemv_glu(
        &self,
        op: &str,
        x: &CudaTensor,
        m: usize,
        k: usize,
        w_gate: &CudaTensor,
        w_up: &CudaTensor,
        norm: Option<(GemvNorm, u32)>,
    ) -> Result<CudaTensor> {
        let sfx = dtype_suffix(op, x.dtype)?;
        let mt = launch::gemv_mt(m, k).expect("checked by gemv_glu_fits");
        let n = w_gate.shape[0];
        // Output rows per block: half the rows the plain GEMV would stream for 2N rows.
        let rows = (launch::gemv_rpw(2 * n, self.info.sms) / 2).max(1);
        self.bind()?;
        let mut shape = x.shape.clone();
        *shape.last_mut().expect("rank >= 2") = n;
        let out = self.alloc(shape, x.dtype)?;
        let grid = (to_u32(op, "grid", n.div_ceil(rows as usize))?, 1, 1);
        let block = (launch::GEMV_THREADS, 1, 1);
        let (m32, n32, k32) = (m as u32, to_u32(op, "N", n)?, to_u32(op, "K", k)?);
        let w_const = (w_gate.buf.weight && w_up.buf.weight) as u32;
        let (xp, gp, up, yp) = (
            x.device_ptr(),
            w_gate.device_ptr(),
            w_up.device_ptr(),
            out.device_ptr(),
        );
        match norm {
            None => {
                let f = self.func("gemv", sfx, &format!("gemv_glu_{sfx}_m{mt}_r{rows}"))?;
                let params = kparams![xp, gp, up, yp, m32, n32, k32, w_const];
                self.launch(op, &f, grid, block, 0, params)?;
            }
            Some((nm, smem)) => {
                let f = self.func("gemv", sfx, &format!("gemv_glu_norm_{sfx}_m{mt}_r{rows}"))?;
                let params = kparams![xp, gp, up, yp, m32, n32, k32, w_const, nm];
                self.launch(op, &f, grid, block, smem, params)?;
            }
        }
        Ok(out)
    }
}
