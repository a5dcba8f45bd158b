//! `attention_varlen` on tensor cores (`kernels/flash_attn.cu`): FlashAttention-2-style prefill
//! attention over one contiguous key segment, continuing a softmax state.

use crate::{dtype_suffix, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::{varlen, DType, DeviceVarlenMeta, VarlenResult};

/// Keys per tile of `flash_attn_*` (the kernel's FA_BN).
const BN: usize = 64;

/// A compiled shape of `flash_attn_*`: `wm` m-tiles of 16 query rows per warp, `nw` warps (a
/// block owns `16 · wm · nw` query rows), `stages` K/V buffers (2: double-buffered; 1:
/// FlashAttention-2's single-buffered schedule, small enough for two blocks per multiprocessor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashVariant {
    /// 16-row m-tiles per warp (1 or 2).
    pub wm: usize,
    /// Warps per block.
    pub nw: usize,
    /// K/V tile buffers (1 or 2).
    pub stages: usize,
}

impl FlashVariant {
    const fn new(wm: usize, nw: usize, stages: usize) -> Self {
        FlashVariant { wm, nw, stages }
    }

    /// The variants the kernel file instantiates: `m1w8` (also the only one for 256/256: two
    /// m-tiles of 256-wide O would not fit the registers) and `m2w4s1`, the default.
    pub const ALL: [FlashVariant; 2] = [FlashVariant::new(1, 8, 2), FlashVariant::new(2, 4, 1)];

    fn rows(self) -> usize {
        16 * self.wm * self.nw
    }

    /// The kernel-name suffix, also the value `DAYONE_FLASH_VARIANT` takes: `m1w8` or `m2w4s1`.
    pub fn name(self) -> String {
        let s1 = if self.stages == 1 { "s1" } else { "" };
        format!("m{}w{}{s1}", self.wm, self.nw)
    }
}

/// The (hd_k, hd_v) pairs `flash_attn_*` is instantiated for: Llama-style 64/64 and 128/128,
/// DeepSeek / Kimi expanded MLA 192/128, glm5_next's NoPE MLA 256/256.
pub(crate) fn flash_dims(dk: usize, dv: usize) -> bool {
    matches!((dk, dv), (64, 64) | (128, 128) | (192, 128) | (256, 256))
}

/// The variant used for these head dims: `DAYONE_FLASH_VARIANT` (a [`FlashVariant::name`]) where
/// the kernel has it, else the measured default (docs/perf.md, issue [10]).
pub(crate) fn flash_default(dk: usize, dv: usize) -> FlashVariant {
    static FROM_ENV: std::sync::OnceLock<Option<FlashVariant>> = std::sync::OnceLock::new();
    let env = *FROM_ENV.get_or_init(|| {
        let v = std::env::var("DAYONE_FLASH_VARIANT").ok()?;
        FlashVariant::ALL.into_iter().find(|f| f.name() == v)
    });
    match (env, dk, dv) {
        (_, 256, 256) => FlashVariant::ALL[0],
        (Some(v), _, _) => v,
        // H200, 2026-12-02 (docs/perf.md): FlashAttention-2's single-buffered schedule with two
        // blocks per SM: 235 TFLOP/s at 128K tokens for 192/128 (m1w8 193), 215 at 32K for
        // 128/128 (m1w8 177).
        (None, _, _) => FlashVariant::new(2, 4, 1),
    }
}

/// Dynamic shared memory of one block: Q tile, `stages` K tiles and V tiles (rows padded by
/// 8), then the block's position range (two u32, padded to 16 bytes).
pub(crate) fn flash_smem_bytes(dk: usize, dv: usize, elem: usize, var: FlashVariant) -> usize {
    (var.rows() * (dk + 8) + var.stages * BN * (dk + 8 + dv + 8)) * elem + 16
}

impl CudaBackend {
    /// Whether [`CudaBackend::attention_varlen_impl`] runs on the device for these shapes.
    pub(crate) fn varlen_native(&self, dtype: DType, dk: usize, dv: usize) -> bool {
        dtype != DType::F32
            && flash_dims(dk, dv)
            && flash_smem_bytes(dk, dv, 2, flash_default(dk, dv))
                <= self.info.max_smem_optin as usize
    }

    /// Registers per thread and local-memory (spill) bytes per thread of the `flash_attn` kernel
    /// for `dtype`, head dims and `variant`: what the compiler gave it, for benchmarks.
    pub fn flash_kernel_resources(
        &self,
        dtype: DType,
        (dk, dv): (usize, usize),
        variant: FlashVariant,
    ) -> Result<(i32, i32)> {
        use cudarc::driver::sys::CUfunction_attribute as A;
        let sfx = dtype_suffix("flash_attn", dtype)?;
        let name = format!("flash_attn_{sfx}_k{dk}_v{dv}_{}", variant.name());
        let f = self.func("flash_attn", sfx, &name)?;
        let get = |a| {
            f.get_attribute(a)
                .map_err(|e| anyhow::anyhow!("{name}: {e:?}"))
        };
        Ok((
            get(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            get(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
        ))
    }

    /// [`dayone_backend::Backend::attention_varlen`] with an explicit kernel variant (`None`:
    /// the default for the head dims); benchmarks compare the variants through it.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_varlen_with(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        meta: &DeviceVarlenMeta<CudaTensor>,
        scale: f32,
        prior: Option<(&CudaTensor, &CudaTensor)>,
        final_out: bool,
        variant: Option<FlashVariant>,
    ) -> Result<VarlenResult<CudaTensor>> {
        const OP: &str = "attention_varlen";
        let sfx = dtype_suffix(OP, q.dtype)?;
        let (n, h, dk, m, _, dv) = varlen::check_shapes(
            (&q.shape, q.dtype),
            (&k.shape, k.dtype),
            (&v.shape, v.dtype),
        )?;
        let hkv = k.shape[1];
        if !self.varlen_native(q.dtype, dk, dv) {
            // f32 or other head dims: the host reference (correct, slow), as the trait's default.
            return varlen::attention_varlen_on_host(self, q, k, v, meta, scale, prior, final_out);
        }
        let var = variant.unwrap_or_else(|| flash_default(dk, dv));
        if (dk, dv) == (256, 256) && var != FlashVariant::ALL[0]
            || !FlashVariant::ALL.contains(&var)
        {
            bail!("{OP}: no kernel variant {var:?} for hd_k = {dk}, hd_v = {dv}");
        }
        let smem = flash_smem_bytes(dk, dv, 2, var);
        if smem > self.info.max_smem_optin as usize {
            bail!(
                "{OP}: variant {var:?} needs {smem} bytes of shared memory, the device allows {}",
                self.info.max_smem_optin
            );
        }
        let hm = &meta.host;
        hm.check(OP, n, m)?;
        if let Some((po, pl)) = prior {
            varlen::check_prior((&po.shape, po.dtype), (&pl.shape, pl.dtype), (n, h, dv))?;
        }
        let s = hm.num_seqs();
        if s > 65535 || h > 65535 {
            bail!("{OP}: at most 65535 sequences and heads per call, got {s} and {h}");
        }
        self.bind()?;
        let (out, out_o, out_lse) = if final_out {
            (Some(self.alloc(vec![n, h, dv], q.dtype)?), None, None)
        } else {
            (
                None,
                Some(self.alloc(vec![n, h, dv], DType::F32)?),
                Some(self.alloc(vec![n, h], DType::F32)?),
            )
        };
        let max_q = hm
            .query_start
            .windows(2)
            .map(|w| (w[1] - w[0]) as usize)
            .max()
            .unwrap_or(0);
        if n > 0 && max_q > 0 {
            let name = format!("flash_attn_{sfx}_k{dk}_v{dv}_{}", var.name());
            let f = self.func("flash_attn", sfx, &name)?;
            let ptr = |t: Option<&CudaTensor>| t.map_or(0u64, |t| t.device_ptr());
            let (hu, hkvu) = (to_u32(OP, "H", h)?, to_u32(OP, "Hkv", hkv)?);
            let scale_log2 = scale * std::f32::consts::LOG2_E;
            let causal = hm.causal as u32;
            self.launch(
                OP,
                &f,
                (
                    to_u32(OP, "query tiles", max_q.div_ceil(var.rows()))?,
                    hu,
                    s as u32,
                ),
                (32 * var.nw as u32, 1, 1),
                smem as u32,
                kparams![
                    q.device_ptr(),
                    k.device_ptr(),
                    v.device_ptr(),
                    meta.query_start.device_ptr(),
                    meta.key_start.device_ptr(),
                    meta.key_pos0.device_ptr(),
                    meta.positions.device_ptr(),
                    ptr(prior.map(|p| p.0)),
                    ptr(prior.map(|p| p.1)),
                    ptr(out.as_ref()),
                    ptr(out_o.as_ref()),
                    ptr(out_lse.as_ref()),
                    hu,
                    hkvu,
                    scale_log2,
                    causal
                ],
            )?;
        }
        Ok(match (out, out_o, out_lse) {
            (Some(o), _, _) => VarlenResult::Final(o),
            (None, Some(o), Some(lse)) => VarlenResult::State { o, lse },
            _ => bail!("{OP}: no output was allocated"),
        })
    }
}
