//! The gpt-oss extras: `paged_attention_ext` (sliding window, attention sinks) and
//! `moe_experts_ext` (projection biases, the interleaved clamped GLU), as plain kernels
//! (`kernels/attention_ext.cu`, `kernels/moe_ext.cu`); without extras the tuned kernels run.

use crate::{check_dtype, dtype_suffix, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::{AttentionOptions, DType, DeviceStepMeta, ExpertAct, ExpertOptions};

impl CudaBackend {
    pub(crate) fn attention_ext(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        meta: &DeviceStepMeta<CudaTensor>,
        scale: f32,
        opts: &AttentionOptions<CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "paged_attention_ext";
        if opts.window.is_none() && opts.sinks.is_none() {
            return self.attention(q, k_cache, v_cache, meta, scale);
        }
        let sfx = dtype_suffix(OP, q.dtype)?;
        if q.shape.len() != 3 || k_cache.shape.len() != 4 || v_cache.shape.len() != 4 {
            bail!(
                "{OP}: expected q [N, H, hd_k] and caches [blocks, bs, Hkv, hd], got {:?}, {:?}, {:?}",
                q.shape,
                k_cache.shape,
                v_cache.shape
            );
        }
        let (n, h, hdk) = (q.shape[0], q.shape[1], q.shape[2]);
        let hm = &meta.host;
        let (bs, hkv, hdv) = (k_cache.shape[1], k_cache.shape[2], v_cache.shape[3]);
        if k_cache.shape[3] != hdk
            || v_cache.shape[..3] != k_cache.shape[..3]
            || bs != hm.block_size
        {
            bail!(
                "{OP}: caches must be [blocks, {}, Hkv, {hdk}] and [blocks, {}, Hkv, hd_v], got {:?} and {:?}",
                hm.block_size,
                hm.block_size,
                k_cache.shape,
                v_cache.shape
            );
        }
        if hkv == 0 || h % hkv != 0 || hdk > 512 || hdv > 512 {
            bail!("{OP}: needs H a multiple of Hkv and head dims <= 512, got H {h}, Hkv {hkv}, {hdk}/{hdv}");
        }
        if opts.window == Some(0) {
            bail!("{OP}: a sliding window must be >= 1");
        }
        check_dtype(OP, "k_cache", k_cache, q.dtype)?;
        check_dtype(OP, "v_cache", v_cache, q.dtype)?;
        if let Some(s) = opts.sinks {
            if s.shape != [h] || s.dtype != DType::F32 {
                bail!(
                    "{OP}: sinks must be f32 [{h}], got {} {:?}",
                    s.dtype,
                    s.shape
                );
            }
        }
        hm.check_tables(OP, n)?;
        if self.attention_ext_on_mma(q, hdk, hdv) {
            // bf16/f16: the tensor-core kernel with the extras, for prefill and decode alike.
            let sinks = opts.sinks.map_or(0u64, |s| s.device_ptr());
            let window = to_u32(OP, "window", opts.window.unwrap_or(0))?;
            return self.attention_with(q, k_cache, v_cache, meta, scale, Some((sinks, window)));
        }
        self.bind()?;
        let out = self.alloc(vec![n, h, hdv], q.dtype)?;
        if n == 0 || h == 0 {
            return Ok(out);
        }
        // f32, batch-invariant mode, or head dims the tensor-core kernel does not take.
        let f = self.func("attention_ext", sfx, &format!("attn_ext_{sfx}"))?;
        self.launch(
            OP,
            &f,
            (to_u32(OP, "H", h)?, to_u32(OP, "N", n)?, 1),
            (128, 1, 1),
            0,
            kparams![
                q.device_ptr(),
                k_cache.device_ptr(),
                v_cache.device_ptr(),
                meta.positions.device_ptr(),
                meta.token_seq.device_ptr(),
                meta.block_tables.device_ptr(),
                opts.sinks.map_or(0u64, |s| s.device_ptr()),
                out.device_ptr(),
                h as u32,
                hkv as u32,
                hdk as u32,
                hdv as u32,
                to_u32(OP, "block_size", bs)?,
                to_u32(OP, "max_blocks", hm.max_blocks)?,
                scale,
                to_u32(OP, "window", opts.window.unwrap_or(0))?
            ],
        )?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_experts_ext_impl(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &CudaTensor,
        down: &CudaTensor,
        opts: &ExpertOptions<CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "moe_experts_ext";
        // The grouped GEMM/GEMV kernels (one launch per projection, tensor cores from a few
        // tokens per expert) take SwiGLU, clamped or not, and gpt-oss's GLU with its biases;
        // the plain kernels below are left for a SwiGLU with biases (no checkpoint has one).
        let biased = opts.gate_up_bias.is_some() || opts.down_bias.is_some();
        let grouped = match opts.act {
            ExpertAct::Swiglu => !biased,
            ExpertAct::SwigluClamped { limit } => !biased && limit > 0.0,
            ExpertAct::GptOss { .. } => true,
        };
        if grouped {
            return self.moe_experts_impl(x, ids, weights, gate_up, down, opts);
        }
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (n, d, e, f) = crate::mla_moe::check_experts(OP, x, ids, weights, gate_up, down)?;
        crate::mla_moe::check_expert_biases(OP, x, (e, f, d), opts.gate_up_bias, opts.down_bias)?;
        let k = ids.shape[1];
        self.bind()?;
        let out = self.alloc(vec![n, d], x.dtype)?;
        if n == 0 || d == 0 {
            return Ok(out);
        }
        let (act, alpha, limit) = crate::mla_moe::act_code(opts.act);
        let hmid = self.scratch_f32(n * k.max(1) * f)?;
        let warps =
            |units: usize| -> Result<u32> { to_u32(OP, "blocks", (units * 32).div_ceil(256)) };
        let f_act = self.func("moe_ext", sfx, &format!("moe_ext_act_{sfx}"))?;
        let dims = (
            to_u32(OP, "N", n)?,
            to_u32(OP, "k", k)?,
            to_u32(OP, "E", e)?,
            to_u32(OP, "D", d)?,
            to_u32(OP, "F", f)?,
        );
        self.launch(
            OP,
            &f_act,
            (warps(n * k * f)?, 1, 1),
            (256, 1, 1),
            0,
            kparams![
                x.device_ptr(),
                ids.device_ptr(),
                gate_up.device_ptr(),
                opts.gate_up_bias.map_or(0u64, |b| b.device_ptr()),
                hmid.device_ptr(),
                dims.0,
                dims.1,
                dims.2,
                dims.3,
                dims.4,
                act,
                alpha,
                limit
            ],
        )?;
        let f_down = self.func("moe_ext", sfx, &format!("moe_ext_down_{sfx}"))?;
        self.launch(
            OP,
            &f_down,
            (warps(n * d)?, 1, 1),
            (256, 1, 1),
            0,
            kparams![
                hmid.device_ptr(),
                ids.device_ptr(),
                weights.device_ptr(),
                down.device_ptr(),
                opts.down_bias.map_or(0u64, |b| b.device_ptr()),
                out.device_ptr(),
                dims.0,
                dims.1,
                dims.2,
                dims.3,
                dims.4
            ],
        )?;
        Ok(out)
    }
}
