//! A KDA decode step from its projections in one launch (`kda_step_g*` in `kernels/kda.cu`,
//! [`dayone_backend::Backend::kda_from_projections`]): the short convolutions of q, k, v, the
//! two gates' second factors and the token-recurrent update, bit-equal to
//! `short_conv_decode3`, the decode GEMV and `kda_recurrent`.

use crate::kda::{check_meta, one_row_each, KdaPath};
use crate::{dtype_suffix, launch, to_u32, CudaBackend, CudaTensor};
use anyhow::Result;
use dayone_backend::{DType, DeviceStepMeta, KdaProjections};
use std::sync::atomic::Ordering;

/// The kernel's `KdaStepArgs` (kernels/kda.cu): device pointers, then the sizes.
#[repr(C)]
#[derive(Clone, Copy)]
struct KdaStepArgs {
    x: [u64; 3],
    cw: [u64; 3],
    cst: [u64; 3],
    f: u64,
    wfb: u64,
    g: u64,
    wgb: u64,
    gate: u64,
    b: u64,
    a_log: u64,
    dt_bias: u64,
    state: u64,
    o: u64,
    qs: u64,
    pos: u64,
    slots: u64,
    h: u32,
    k: u32,
    v: u32,
    r: u32,
    width: u32,
    use_lb: u32,
    lb: f32,
    scale: f32,
}

/// Groups of 128 threads of the launch for head width `k` (one per 32 value columns; the
/// kernels exist for 1, 2 and 4).
fn groups(k: usize) -> u32 {
    match k.div_ceil(32) {
        0 | 1 => 1,
        2 => 2,
        _ => 4,
    }
}

impl CudaBackend {
    /// [`dayone_backend::Backend::kda_from_projections`]: one `kda_step_g*` launch for a decode
    /// step (one token per sequence) with the `kda_step` fusion where the shapes fit it (K ≤
    /// 128, gate rank R ≤ 256 with R % 8 == 0, convolution width 2..=9, one dtype, the
    /// recurrent path, not batch-invariant, few enough sequences for the decode GEMV whose sums
    /// the gate factors repeat), else the separate ops, which also report any shape error.
    ///
    /// Errors: as `short_conv_many`, `linear_each` and `kda`.
    pub(crate) fn kda_from_projections_impl(
        &self,
        p: &KdaProjections<'_, CudaTensor>,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Result<(CudaTensor, CudaTensor)> {
        const OP: &str = "kda_from_projections";
        if let Some(args) = self.kda_step_args(p, meta) {
            let (n, c) = (meta.host.num_tokens(), p.heads * p.head_dim);
            let dt = p.qkv[0].dtype;
            let sfx = dtype_suffix(OP, dt)?;
            self.bind()?;
            let o = self.alloc(vec![n, p.heads, p.head_dim], dt)?;
            let gate = self.alloc(vec![n, c], dt)?;
            let args = KdaStepArgs {
                gate: gate.device_ptr(),
                o: o.device_ptr(),
                ..args
            };
            let g = groups(p.head_dim);
            let f = self.func("kda", sfx, &format!("kda_step_g{g}_{sfx}"))?;
            self.launch(
                OP,
                &f,
                (args.h, to_u32(OP, "sequences", n)?, 1),
                (128 * g, 1, 1),
                0,
                kparams![args],
            )?;
            return Ok((o, gate));
        }
        dayone_backend::kda_from_projections_each(self, p, meta)
    }

    /// The launch's arguments (outputs not yet set) when the fused step applies.
    fn kda_step_args(
        &self,
        p: &KdaProjections<'_, CudaTensor>,
        meta: &DeviceStepMeta<CudaTensor>,
    ) -> Option<KdaStepArgs> {
        let (h, k) = (p.heads, p.head_dim);
        let (n, c) = (meta.host.num_tokens(), h * k);
        let dt = p.qkv[0].dtype;
        let r = p.f.shape.last().copied().unwrap_or(0);
        let width = p.conv_w[0].shape.get(1).copied().unwrap_or(0);
        let path = KdaPath::from_u8(self.kda_path.load(Ordering::Relaxed));
        let slots = p.state.shape.first().copied().unwrap_or(0);
        let fits = self.fusion(launch::DecodeFusion::KdaStep)
            && !self.invariant()
            && path != KdaPath::Chunked
            && n > 0
            && one_row_each(&meta.host)
            && matches!(dt, DType::BF16 | DType::F16 | DType::F32)
            && (1..=128).contains(&k)
            && h > 0
            && r > 0
            && r <= 256
            && r.is_multiple_of(8)
            // The factors in the decode GEMV's order: where linear_each takes that GEMV too.
            && launch::gemv_mt(n, r).is_some()
            && (2..=9).contains(&width)
            && (0..3).all(|i| {
                p.qkv[i].shape == [n, c]
                    && p.qkv[i].dtype == dt
                    && p.conv_w[i].shape == [c, width]
                    && p.conv_w[i].dtype == DType::F32
                    && p.conv_state[i].shape == [slots, c, width - 1]
                    && p.conv_state[i].dtype == DType::F32
            })
            && [p.f, p.g]
                .iter()
                .all(|t| t.shape == [n, r] && t.dtype == dt)
            && [p.w_fb, p.w_gb]
                .iter()
                .all(|t| t.shape == [c, r] && t.dtype == dt)
            && p.beta.shape == [n, h]
            && p.beta.dtype == dt
            && p.a_log.dtype == DType::F32
            && p.a_log.shape.iter().product::<usize>() == h
            && p.dt_bias.dtype == DType::F32
            && p.dt_bias.shape.iter().product::<usize>() == c
            && p.state.shape == [slots, h, k, k]
            && p.state.dtype == DType::F32
            && check_meta("kda_from_projections", &meta.host, n, slots).is_ok();
        if !fits {
            return None;
        }
        let ptr = |t: &CudaTensor| t.device_ptr();
        Some(KdaStepArgs {
            x: p.qkv.map(ptr),
            cw: p.conv_w.map(ptr),
            cst: p.conv_state.map(ptr),
            f: ptr(p.f),
            wfb: ptr(p.w_fb),
            g: ptr(p.g),
            wgb: ptr(p.w_gb),
            gate: 0,
            b: ptr(p.beta),
            a_log: ptr(p.a_log),
            dt_bias: ptr(p.dt_bias),
            state: ptr(p.state),
            o: 0,
            qs: meta.query_start.device_ptr(),
            pos: meta.positions.device_ptr(),
            slots: meta.state_slots.device_ptr(),
            h: h as u32,
            k: k as u32,
            v: k as u32,
            r: r as u32,
            width: width as u32,
            use_lb: u32::from(p.lower_bound.is_some()),
            lb: p.lower_bound.unwrap_or(0.0),
            scale: 1.0 / (k as f32).sqrt(),
        })
    }
}
