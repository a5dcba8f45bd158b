//! Element-wise, normalisation, rotary, lookup and selection ops: `embedding`, `rms_norm`,
//! `rope`, `silu_mul`/`add` (through `binary`), `stream_mix` and `argmax`.

use crate::{check_dtype, dtype_suffix, launch, rows_last, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::{DType, DeviceStepMeta, RopeStyle, TensorInfo};

impl CudaBackend {
    pub(crate) fn binary(
        &self,
        op: &'static str,
        a: &CudaTensor,
        b: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.binary_with(op, a, b, None)
    }

    /// [`Self::binary`] of a kernel that takes one more `float` parameter (`silu_mul_limit`).
    pub(crate) fn binary_with(
        &self,
        op: &'static str,
        a: &CudaTensor,
        b: &CudaTensor,
        param: Option<f32>,
    ) -> Result<CudaTensor> {
        let sfx = dtype_suffix(op, a.dtype)?;
        if a.shape != b.shape {
            bail!(
                "{op}: inputs must have equal shapes, got {:?} and {:?}",
                a.shape,
                b.shape
            );
        }
        check_dtype(op, "second input", b, a.dtype)?;
        self.bind()?;
        let out = self.alloc(a.shape.clone(), a.dtype)?;
        let n = a.numel();
        if n == 0 {
            return Ok(out);
        }
        let f = self.func("elementwise", sfx, &format!("{op}_{sfx}"))?;
        let grid = (
            launch::elementwise_grid(n, 8, 256, 16 * self.info.sms),
            1,
            1,
        );
        let (a, b, o) = (a.device_ptr(), b.device_ptr(), out.device_ptr());
        match param {
            None => self.launch(op, &f, grid, (256, 1, 1), 0, kparams![a, b, o, n as u64])?,
            Some(p) => self.launch(op, &f, grid, (256, 1, 1), 0, kparams![a, b, o, n as u64, p])?,
        }
        Ok(out)
    }

    /// `out[t, m, :] = Σ_s w[t, s, m] · x[t, s, :]` (`elementwise.cu`'s `stream_mix`, one
    /// block per output row): `x` `[N, S, D]` float, `w` `[N, S, M]` f32 → `[N, M, D]` in
    /// `x`'s dtype, f32 accumulation.
    pub(crate) fn stream_mix_impl(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "stream_mix";
        let sfx = dtype_suffix(OP, x.dtype)?;
        if x.shape.len() != 3 {
            bail!("{OP}: x must have shape [N, S, D], got {:?}", x.shape);
        }
        let (n, s, d) = (x.shape[0], x.shape[1], x.shape[2]);
        if w.shape.len() != 3 || w.shape[0] != n || w.shape[1] != s {
            bail!(
                "{OP}: w must have shape [{n}, {s}, M] to match x {:?}, got {:?}",
                x.shape,
                w.shape
            );
        }
        check_dtype(OP, "w", w, DType::F32)?;
        let m = w.shape[2];
        self.bind()?;
        let out = self.alloc(vec![n, m, d], x.dtype)?;
        let total = n * m * d;
        if total == 0 {
            return Ok(out);
        }
        let f = self.func("elementwise", sfx, &format!("{OP}_{sfx}"))?;
        // One block per output row `(t, m)`, up to 65 535 blocks striding over the rows.
        let grid = (launch::row_grid(n * m, 65535), 1, 1);
        self.launch(
            OP,
            &f,
            grid,
            (256, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                w.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "N", n)?,
                to_u32(OP, "S", s)?,
                to_u32(OP, "D", d)?,
                to_u32(OP, "M", m)?
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn embedding_impl(
        &self,
        table: &CudaTensor,
        ids: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "embedding";
        if table.shape.len() != 2 || !table.dtype.is_float() {
            bail!(
                "{OP}: table must be a float [V, D] tensor, got {:?} {}",
                table.shape,
                table.dtype
            );
        }
        if ids.shape.len() != 1 || ids.dtype != DType::U32 {
            bail!(
                "{OP}: ids must be a u32 [N] tensor, got {:?} {}",
                ids.shape,
                ids.dtype
            );
        }
        let (v, d, n) = (table.shape[0], table.shape[1], ids.shape[0]);
        self.bind()?;
        let out = self.alloc(vec![n, d], table.dtype)?;
        if n == 0 || d == 0 {
            return Ok(out);
        }
        let f = self.func("embedding", "", "embedding_rows")?;
        let row_bytes = (d * table.dtype.size()) as u64;
        self.launch(
            OP,
            &f,
            (launch::row_grid(n, 65535), 1, 1),
            (256, 1, 1),
            0,
            kparams![
                table.device_ptr(),
                ids.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "N", n)?,
                to_u32(OP, "V", v)?,
                row_bytes
            ],
        )?;
        Ok(out)
    }

    /// [`Backend::to_f32`]: one elementwise cast (`moe_cast_f32_*`); an f32 `x` is returned as is.
    pub(crate) fn to_f32_impl(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "to_f32";
        if x.dtype == DType::F32 {
            return Ok(x.clone());
        }
        let sfx = dtype_suffix(OP, x.dtype)?;
        self.bind()?;
        let out = self.alloc(x.shape.clone(), DType::F32)?;
        let cnt: usize = x.shape.iter().product();
        if cnt == 0 {
            return Ok(out);
        }
        let f = self.func("moe", sfx, &format!("moe_cast_f32_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (
                launch::elementwise_grid(cnt, 4, 256, 16 * self.info.sms),
                1,
                1,
            ),
            (256, 1, 1),
            0,
            kparams![x.device_ptr(), out.device_ptr(), cnt as u64],
        )?;
        Ok(out)
    }

    /// [`dayone_backend::Backend::add_rms_norm`]: one `add_rms_norm_*` launch (norm.cu) with
    /// `rms_norm`'s grid and block, so the sum and the norm are bit-equal to the two kernels.
    ///
    /// Errors: `a`, `r` not of one shape and dtype; `w` not `[D]` of that dtype.
    pub(crate) fn add_rms_norm_impl(
        &self,
        a: &CudaTensor,
        r: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        const OP: &str = "add_rms_norm";
        let sfx = dtype_suffix(OP, a.dtype)?;
        if r.shape != a.shape {
            bail!("{OP}: a {:?} and r {:?} differ in shape", a.shape, r.shape);
        }
        check_dtype(OP, "r", r, a.dtype)?;
        let (rows, d) = rows_last(OP, "a [R, D]", a)?;
        if w.shape != [d] {
            bail!(
                "{OP}: w must be [D] = [{d}] (a is {:?}), got {:?}",
                a.shape,
                w.shape
            );
        }
        check_dtype(OP, "w", w, a.dtype)?;
        self.bind()?;
        let sum = self.alloc(a.shape.clone(), a.dtype)?;
        let out = self.alloc(a.shape.clone(), a.dtype)?;
        if rows == 0 || d == 0 {
            return Ok((sum, out));
        }
        let f = self.func("norm", sfx, &format!("add_rms_norm_{sfx}"))?;
        let threads = launch::norm_threads(d);
        self.launch(
            OP,
            &f,
            (launch::row_grid(rows, 65535), 1, 1),
            (threads, 1, 1),
            0,
            kparams![
                a.device_ptr(),
                r.device_ptr(),
                w.device_ptr(),
                sum.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "R", rows)?,
                to_u32(OP, "D", d)?,
                eps
            ],
        )?;
        Ok((sum, out))
    }

    pub(crate) fn rms_norm_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "rms_norm";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (r, d) = rows_last(OP, "x [R, D]", x)?;
        if w.shape != [d] {
            bail!(
                "{OP}: w must be [D] = [{d}] (x is {:?}), got {:?}",
                x.shape,
                w.shape
            );
        }
        check_dtype(OP, "w", w, x.dtype)?;
        self.bind()?;
        let out = self.alloc(x.shape.clone(), x.dtype)?;
        if r == 0 || d == 0 {
            return Ok(out);
        }
        let f = self.func("norm", sfx, &format!("rms_norm_{sfx}"))?;
        let threads = launch::norm_threads(d);
        self.launch(
            OP,
            &f,
            (launch::row_grid(r, 65535), 1, 1),
            (threads, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                w.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "R", r)?,
                to_u32(OP, "D", d)?,
                eps
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn rope_impl(
        &self,
        x: &CudaTensor,
        positions: &CudaTensor,
        inv_freq: &CudaTensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<CudaTensor> {
        let (y, _) =
            self.rope_pair_impl(x, None, positions, inv_freq, rot_dim, style, mscale, None)?;
        Ok(y)
    }

    /// `rope` of `q` `[N, H, hd]` and, when given, `k` `[N, Hk, hd]` (same N, hd and dtype) in
    /// one launch ([`dayone_backend::Backend::rope_pair`]; bit-equal to one launch each).
    ///
    /// Errors: shapes, dtypes, `rot_dim` odd or above hd, `inv_freq` not f32 `[rot_dim / 2]`.
    #[allow(clippy::too_many_arguments)]
    /// `rope` of `x` and, in the same launch, of `k` (`rope_pair`); with `cache` the rotated
    /// keys and the values go to the paged cache instead (`rope_write_kv`: then no key tensor is
    /// returned).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_pair_impl(
        &self,
        x: &CudaTensor,
        k: Option<&CudaTensor>,
        positions: &CudaTensor,
        inv_freq: &CudaTensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
        cache: Option<KvWrite>,
    ) -> Result<(CudaTensor, Option<CudaTensor>)> {
        const OP: &str = "rope";
        let sfx = dtype_suffix(OP, x.dtype)?;
        if x.shape.len() != 3 {
            bail!("{OP}: x must be [N, H, hd], got {:?}", x.shape);
        }
        let (n, h, hd) = (x.shape[0], x.shape[1], x.shape[2]);
        let hk = match k {
            Some(k) if k.shape.len() == 3 && k.shape[0] == n && k.shape[2] == hd => {
                check_dtype(OP, "k", k, x.dtype)?;
                k.shape[1]
            }
            Some(k) => bail!("{OP}: k must be [{n}, Hk, {hd}] like x, got {:?}", k.shape),
            None => 0,
        };
        if positions.shape != [n] || positions.dtype != DType::U32 {
            bail!(
                "{OP}: positions must be u32 [N] = [{n}], got {:?} {}",
                positions.shape,
                positions.dtype
            );
        }
        if rot_dim > hd || !rot_dim.is_multiple_of(2) {
            bail!("{OP}: rot_dim must be even and at most hd = {hd}, got {rot_dim}");
        }
        if inv_freq.shape != [rot_dim / 2] || inv_freq.dtype != DType::F32 {
            bail!(
                "{OP}: inv_freq must be f32 [rot_dim/2] = [{}], got {:?} {}",
                rot_dim / 2,
                inv_freq.shape,
                inv_freq.dtype
            );
        }
        let rc = match (&cache, k) {
            (Some(c), Some(k)) => {
                let (_, num_slots) =
                    Self::check_write_kv("rope_write_kv", k, c.v, c.k_cache, c.v_cache, c.meta)?;
                RopeCache {
                    v: c.v.device_ptr(),
                    kc: c.k_cache.device_ptr(),
                    vc: c.v_cache.device_ptr(),
                    slots: c.meta.slot_mapping.device_ptr(),
                    num_slots,
                    hdv: to_u32(OP, "hd_v", c.v.shape[2])?,
                }
            }
            (Some(_), None) => bail!("rope_write_kv: keys are required"),
            (None, _) => RopeCache::default(),
        };
        self.bind()?;
        let out = self.alloc(x.shape.clone(), x.dtype)?;
        let out_k = k
            .filter(|_| cache.is_none())
            .map(|k| self.alloc(k.shape.clone(), k.dtype))
            .transpose()?;
        if n == 0 || hd == 0 || (h == 0 && hk == 0) {
            return Ok((out, out_k));
        }
        let f = self.func("rope", sfx, &format!("rope_{sfx}"))?;
        let style: u32 = match style {
            RopeStyle::HalfSplit => 0,
            RopeStyle::Interleaved => 1,
        };
        let per_token = (h + hk) * hd + cache.as_ref().map_or(0, |c| c.v.numel() / n);
        self.launch(
            OP,
            &f,
            (
                launch::row_grid(n, 65535),
                launch::rope_cols(n, per_token),
                1,
            ),
            (256, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                positions.device_ptr(),
                inv_freq.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "N", n)?,
                to_u32(OP, "H", h)?,
                to_u32(OP, "hd", hd)?,
                rot_dim as u32,
                style,
                mscale,
                k.map_or(0, |k| k.device_ptr()),
                out_k.as_ref().map_or(0, |k| k.device_ptr()),
                to_u32(OP, "Hk", hk)?,
                rc
            ],
        )?;
        Ok((out, out_k))
    }

    pub(crate) fn argmax_impl(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "argmax";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (r, v) = match x.shape.split_last() {
            Some((&v, lead)) => (lead.iter().product::<usize>(), v),
            None => bail!("{OP}: x must be [R, V], got a scalar"),
        };
        self.bind()?;
        let out = self.alloc(x.shape[..x.shape.len() - 1].to_vec(), DType::U32)?;
        if r == 0 {
            return Ok(out);
        }
        if v == 0 {
            bail!("{OP}: rows of x are empty (shape {:?})", x.shape);
        }
        let f = self.func("argmax", sfx, &format!("argmax_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(r, 65535), 1, 1),
            (1024, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                out.device_ptr(),
                r as u32,
                to_u32(OP, "V", v)?
            ],
        )?;
        Ok(out)
    }

    pub(crate) fn token_logprob_rows_impl(
        &self,
        x: &CudaTensor,
        targets: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "token_logprob_rows";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let [r, v] = x.shape[..] else {
            bail!("{OP}: x must be [R, V], got {:?}", x.shape);
        };
        if targets.shape != [r] || targets.dtype != DType::U32 {
            bail!(
                "{OP}: targets must be [{r}] u32, got {:?} {}",
                targets.shape,
                targets.dtype
            );
        }
        self.bind()?;
        let out = self.alloc(vec![r], DType::F32)?;
        if r == 0 {
            return Ok(out);
        }
        if v == 0 {
            bail!("{OP}: rows of x are empty (shape {:?})", x.shape);
        }
        let f = self.func("argmax", sfx, &format!("logprob_rows_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (launch::row_grid(r, 65535), 1, 1),
            (1024, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                targets.device_ptr(),
                out.device_ptr(),
                r as u32,
                to_u32(OP, "V", v)?
            ],
        )?;
        Ok(out)
    }
}

/// The paged-cache write of `rope_write_kv`: values `[N, Hkv, hd_v]`, the caches and the step
/// whose slot mapping places the rows.
pub(crate) struct KvWrite<'a> {
    pub(crate) v: &'a CudaTensor,
    pub(crate) k_cache: &'a CudaTensor,
    pub(crate) v_cache: &'a CudaTensor,
    pub(crate) meta: &'a DeviceStepMeta<CudaTensor>,
}

/// The kernel's `RopeCache` parameter (rope.cu): zero = no cache write.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RopeCache {
    v: u64,
    kc: u64,
    vc: u64,
    slots: u64,
    num_slots: u32,
    hdv: u32,
}
