//! `attention_varlen`: attention over one contiguous key segment, continuing a softmax state
//! (`attention_varlen.wgsl`). Used by the vision encoders (bidirectional, per image), the
//! expanded MLA prefill when asked for (`DAYONE_MLA_PREFILL=expanded`) and context parallelism.

use crate::{f32_param, pipelines, WTensor, WgslBackend, MAX_GROUPS};
use anyhow::{ensure, Result};
use dayone_backend::varlen::{check_prior, check_shapes};
use dayone_backend::{DType, DeviceVarlenMeta, VarlenMeta, VarlenResult};

/// The layout the kernel reads, packed into one u32 array (see the shader's header):
/// `query_start`, `key_start`, `key_pos0`, `positions`, then each query row's sequence.
fn packed_layout(m: &VarlenMeta) -> Vec<u32> {
    let n = m.positions.len();
    let mut v = Vec::with_capacity(3 * m.num_seqs() + 2 + 2 * n);
    v.extend_from_slice(&m.query_start);
    v.extend_from_slice(&m.key_start);
    v.extend_from_slice(&m.key_pos0);
    v.extend_from_slice(&m.positions);
    for s in 0..m.num_seqs() {
        let rows = m.query_start[s + 1] - m.query_start[s];
        v.extend(std::iter::repeat_n(s as u32, rows as usize));
    }
    v
}

impl WgslBackend {
    /// [`dayone_backend::Backend::attention_varlen`] on the device for f32 tensors that each fit
    /// one storage binding; `None` when the call is outside that (the caller then takes the host
    /// path). Errors: the shape and layout checks of [`check_shapes`] / [`VarlenMeta::check`] /
    /// [`check_prior`], head dims outside `Dk % 4 == 0`, `Dk ≤ 512`, `Dv ≤ 512`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_varlen_impl(
        &self,
        q: &WTensor,
        k: &WTensor,
        v: &WTensor,
        meta: &DeviceVarlenMeta<WTensor>,
        scale: f32,
        prior: Option<(&WTensor, &WTensor)>,
        final_out: bool,
    ) -> Result<Option<VarlenResult<WTensor>>> {
        const OP: &str = "attention_varlen";
        let (n, h, dk, m, hkv, dv) = check_shapes(
            (&q.shape, q.dtype),
            (&k.shape, k.dtype),
            (&v.shape, v.dtype),
        )?;
        meta.host.check(OP, n, m)?;
        if let Some((o, l)) = prior {
            check_prior((&o.shape, o.dtype), (&l.shape, l.dtype), (n, h, dv))?;
        }
        ensure!(
            dk.is_multiple_of(4) && dk <= 512 && dv <= 512,
            "{OP}: head dims must satisfy Dk % 4 == 0, Dk <= 512, Dv <= 512; got {dk}, {dv}"
        );
        let mut all = vec![q, k, v];
        all.extend(prior.iter().flat_map(|(o, l)| [*o, *l]));
        if q.dtype != DType::F32 || all.iter().any(|t| t.num_chunks() > 1) {
            return Ok(None);
        }
        let out = self.alloc(&[n, h, dv], DType::F32)?;
        let lse = self.alloc(&[n, h], DType::F32)?;
        if n * h > 0 {
            ensure!(
                ((n * h) as u64) <= MAX_GROUPS * MAX_GROUPS,
                "{OP}: {n} rows × {h} heads exceed the 65535² grid"
            );
            let lay = self.upload_u32(&packed_layout(&meta.host))?;
            let (po, pl) = match prior {
                Some((o, l)) => (o.single(OP, "prior o")?, l.single(OP, "prior lse")?),
                None => (&self.dummy, &self.dummy),
            };
            let p = [
                n as u32,
                h as u32,
                hkv as u32,
                dk as u32,
                dv as u32,
                (h / hkv) as u32,
                f32_param(scale),
                meta.host.num_seqs() as u32,
                prior.is_some() as u32,
                meta.host.causal as u32,
                0,
                0,
            ];
            self.dispatch(
                &pipelines::ATTN_VARLEN,
                &p,
                &[
                    q.single(OP, "q")?,
                    k.single(OP, "k")?,
                    v.single(OP, "v")?,
                    lay.single(OP, "layout")?,
                    po,
                    pl,
                    out.single(OP, "output")?,
                    lse.single(OP, "lse")?,
                ],
                Self::grid(OP, (n * h) as u64)?,
            )?;
        }
        Ok(Some(if final_out {
            VarlenResult::Final(out)
        } else {
            VarlenResult::State { o: out, lse }
        }))
    }
}
