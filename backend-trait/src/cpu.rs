//! A slow, obviously-correct [`Backend`] on the host, built from [`crate::reference`] ops.
//!
//! For engine tests without a GPU and for debugging a model layer by layer on a laptop; not for
//! speed. bf16 activations are computed in f32 (`activation_dtype(BF16) = F32`).

use crate::{
    reference, Backend, DType, DeviceStepMeta, HostTensor, MoeRouting, RopeStyle, TensorInfo,
};
use anyhow::{ensure, Result};
use std::sync::{Arc, RwLock};

/// A host tensor behind a shared lock; clones and reshapes share the storage.
#[derive(Clone, Debug)]
pub struct CpuTensor {
    data: Arc<RwLock<HostTensor>>,
    shape: Vec<usize>,
}

impl TensorInfo for CpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.data.read().expect("lock").dtype
    }
}

impl CpuTensor {
    fn new(t: HostTensor) -> Self {
        Self {
            shape: t.shape.clone(),
            data: Arc::new(RwLock::new(t)),
        }
    }

    /// A copy of the data with this view's shape.
    fn host(&self) -> HostTensor {
        let mut t = self.data.read().expect("lock").clone();
        t.shape = self.shape.clone();
        t
    }
}

/// The reference backend.
#[derive(Clone, Debug, Default)]
pub struct CpuBackend;

impl Backend for CpuBackend {
    type Tensor = CpuTensor;

    fn name(&self) -> String {
        "cpu-reference".into()
    }

    fn activation_dtype(&self, _requested: DType) -> DType {
        DType::F32
    }

    fn free_memory(&self) -> Option<u64> {
        crate::host_available_memory()
    }

    fn upload(&self, host: &HostTensor) -> Result<CpuTensor> {
        let t = match host.dtype {
            DType::BF16 | DType::F16 => HostTensor::from_f32(host.shape.clone(), &host.to_f32())?,
            _ => host.clone(),
        };
        Ok(CpuTensor::new(t))
    }

    fn download(&self, t: &CpuTensor) -> Result<HostTensor> {
        Ok(t.host())
    }

    fn zeros(&self, shape: &[usize], dtype: DType) -> Result<CpuTensor> {
        let n: usize = shape.iter().product();
        Ok(CpuTensor::new(HostTensor::new(
            shape.to_vec(),
            dtype,
            vec![0; n * dtype.size()],
        )?))
    }

    fn reshape(&self, t: &CpuTensor, shape: &[usize]) -> Result<CpuTensor> {
        ensure!(
            shape.iter().product::<usize>() == t.numel(),
            "reshape: cannot view {:?} as {shape:?}",
            t.shape
        );
        Ok(CpuTensor {
            data: t.data.clone(),
            shape: shape.to_vec(),
        })
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn embedding(&self, table: &CpuTensor, ids: &CpuTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::embedding(
            &table.host(),
            &ids.host(),
        )?))
    }

    fn linear(&self, x: &CpuTensor, w: &CpuTensor, bias: Option<&CpuTensor>) -> Result<CpuTensor> {
        let bias = bias.map(|b| b.host());
        Ok(CpuTensor::new(reference::linear(
            &x.host(),
            &w.host(),
            bias.as_ref(),
        )?))
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::rms_norm(
            &x.host(),
            &w.host(),
            eps,
        )?))
    }

    fn rope(
        &self,
        x: &CpuTensor,
        positions: &CpuTensor,
        inv_freq: &CpuTensor,
        rot_dim: usize,
        style: RopeStyle,
        mscale: f32,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::rope(
            &x.host(),
            &positions.host(),
            &inv_freq.host(),
            rot_dim,
            style,
            mscale,
        )?))
    }

    fn silu_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::silu_mul(
            &gate.host(),
            &up.host(),
        )?))
    }

    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::add(&a.host(), &b.host())?))
    }

    fn write_kv(
        &self,
        k: &CpuTensor,
        v: &CpuTensor,
        k_cache: &CpuTensor,
        v_cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
    ) -> Result<()> {
        let mut kc = k_cache.host();
        let mut vc = v_cache.host();
        reference::write_kv(&k.host(), &v.host(), &mut kc, &mut vc, &meta.host)?;
        kc.shape = k_cache.data.read().expect("lock").shape.clone();
        vc.shape = v_cache.data.read().expect("lock").shape.clone();
        *k_cache.data.write().expect("lock") = kc;
        *v_cache.data.write().expect("lock") = vc;
        Ok(())
    }

    fn paged_attention(
        &self,
        q: &CpuTensor,
        k_cache: &CpuTensor,
        v_cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
        scale: f32,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::paged_attention(
            &q.host(),
            &k_cache.host(),
            &v_cache.host(),
            &meta.host,
            scale,
        )?))
    }

    fn argmax(&self, x: &CpuTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::argmax(&x.host())?))
    }

    fn head_linear(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::head_linear(
            &x.host(),
            &w.host(),
        )?))
    }

    fn write_cache(
        &self,
        x: &CpuTensor,
        cache: &CpuTensor,
        col: usize,
        meta: &DeviceStepMeta<CpuTensor>,
    ) -> Result<()> {
        let mut c = cache.host();
        reference::write_cache(&x.host(), &mut c, col, &meta.host)?;
        c.shape = cache.data.read().expect("lock").shape.clone();
        *cache.data.write().expect("lock") = c;
        Ok(())
    }

    fn paged_latent_attention(
        &self,
        q_lat: &CpuTensor,
        q_rope: &CpuTensor,
        cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
        scale: f32,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::paged_latent_attention(
            &q_lat.host(),
            &q_rope.host(),
            &cache.host(),
            &meta.host,
            scale,
        )?))
    }

    fn moe_route(
        &self,
        x: &CpuTensor,
        gate_w: &CpuTensor,
        bias: Option<&CpuTensor>,
        routing: &MoeRouting,
    ) -> Result<(CpuTensor, CpuTensor)> {
        let bias = bias.map(|b| b.host());
        let (i, w) = reference::moe_route(&x.host(), &gate_w.host(), bias.as_ref(), routing)?;
        Ok((CpuTensor::new(i), CpuTensor::new(w)))
    }

    fn moe_experts(
        &self,
        x: &CpuTensor,
        ids: &CpuTensor,
        weights: &CpuTensor,
        gate_up: &CpuTensor,
        down: &CpuTensor,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::moe_experts(
            &x.host(),
            &ids.host(),
            &weights.host(),
            &gate_up.host(),
            &down.host(),
        )?))
    }

    fn short_conv(
        &self,
        x: &CpuTensor,
        w: &CpuTensor,
        state: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
    ) -> Result<CpuTensor> {
        let mut st = state.host();
        let y = reference::short_conv(&x.host(), &w.host(), &mut st, &meta.host)?;
        st.shape = state.data.read().expect("lock").shape.clone();
        *state.data.write().expect("lock") = st;
        Ok(CpuTensor::new(y))
    }

    fn kda(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        a: &CpuTensor,
        b: &CpuTensor,
        a_log: &CpuTensor,
        dt_bias: &CpuTensor,
        lower_bound: Option<f32>,
        state: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
    ) -> Result<CpuTensor> {
        let mut st = state.host();
        let o = reference::kda(
            &q.host(),
            &k.host(),
            &v.host(),
            &a.host(),
            &b.host(),
            &a_log.host(),
            &dt_bias.host(),
            lower_bound,
            &mut st,
            &meta.host,
        )?;
        st.shape = state.data.read().expect("lock").shape.clone();
        *state.data.write().expect("lock") = st;
        Ok(CpuTensor::new(o))
    }

    fn gated_rms_norm(
        &self,
        x: &CpuTensor,
        gate: &CpuTensor,
        w: &CpuTensor,
        eps: f32,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::gated_rms_norm(
            &x.host(),
            &gate.host(),
            &w.host(),
            eps,
        )?))
    }

    fn layer_norm(
        &self,
        x: &CpuTensor,
        w: &CpuTensor,
        b: &CpuTensor,
        eps: f32,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::layer_norm(
            &x.host(),
            &w.host(),
            &b.host(),
            eps,
        )?))
    }

    fn dsa_topk(
        &self,
        q: &CpuTensor,
        w: &CpuTensor,
        k_cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
        scale: f32,
        topk: usize,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::dsa_topk(
            &q.host(),
            &w.host(),
            &k_cache.host(),
            &meta.host,
            scale,
            topk,
        )?))
    }

    fn sparse_latent_attention(
        &self,
        q_lat: &CpuTensor,
        q_rope: &CpuTensor,
        cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
        scale: f32,
        selected: &CpuTensor,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::sparse_latent_attention(
            &q_lat.host(),
            &q_rope.host(),
            &cache.host(),
            &meta.host,
            scale,
            &selected.host(),
        )?))
    }
}

#[cfg(test)]
mod tests {
    use super::CpuBackend;
    use crate::conformance;

    /// The reference backend passes the suite (a sanity check of the checks themselves: input
    /// construction, e.g. the routing-margin resampling, and shape bookkeeping).
    #[test]
    fn cpu_conformance() {
        conformance::check_all(&CpuBackend).unwrap();
    }

    /// The DSA checks (not in `check_all`) on the reference backend: input construction (margin
    /// resampling) and selection bookkeeping.
    #[test]
    fn cpu_dsa_ops() {
        conformance::check_dsa_ops(&CpuBackend).unwrap();
    }
}
