//! A slow, obviously-correct [`Backend`] on the host, built from [`crate::reference`] ops.
//!
//! For engine tests without a GPU and for debugging a model layer by layer on a laptop; not for
//! speed. bf16 activations are computed in f32 (`activation_dtype(BF16) = F32`).

use crate::{
    reference, rows, AttentionOptions, Backend, DType, DeviceStepMeta, ExpertOptions, HostTensor,
    MoeRouting, QuantTensor, RopeStyle, TensorInfo,
};
use anyhow::{ensure, Result};
use std::sync::{Arc, RwLock};

/// A host tensor behind a shared lock; clones and reshapes share the storage. Ops that update a
/// tensor (`write_kv`, `write_cache`, `short_conv`, `kda`) write the rows they change under the
/// write lock, and the attention ops read the caches under the read lock, so a step never
/// copies a cache.
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

    /// Runs `f` on the data with this view's shape, borrowed under the read lock (no copy unless
    /// the view's shape differs from the stored one). For the caches, which ops read in part.
    fn read<R>(&self, f: impl FnOnce(&HostTensor) -> R) -> R {
        let g = self.data.read().expect("lock");
        if g.shape == self.shape {
            f(&g)
        } else {
            let mut t = g.clone();
            drop(g);
            t.shape = self.shape.clone();
            f(&t)
        }
    }

    /// Runs `f` on the data with this view's shape under the write lock, so that an op updates
    /// the rows it writes in place (caches, recurrent state) instead of copying the tensor.
    /// The stored shape is put back afterwards; `f` must keep the dtype and element count.
    fn write<R>(&self, f: impl FnOnce(&mut HostTensor) -> Result<R>) -> Result<R> {
        let mut g = self.data.write().expect("lock");
        let stored = std::mem::replace(&mut g.shape, self.shape.clone());
        let r = f(&mut g);
        g.shape = stored;
        r
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
        ensure!(
            !Arc::ptr_eq(&k_cache.data, &v_cache.data),
            "write_kv: k_cache and v_cache must be different tensors"
        );
        let (k, v) = (k.host(), v.host());
        k_cache.write(|kc| v_cache.write(|vc| reference::write_kv(&k, &v, kc, vc, &meta.host)))
    }

    fn paged_attention(
        &self,
        q: &CpuTensor,
        k_cache: &CpuTensor,
        v_cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
        scale: f32,
    ) -> Result<CpuTensor> {
        let q = q.host();
        let out = k_cache.read(|kc| {
            v_cache.read(|vc| reference::paged_attention(&q, kc, vc, &meta.host, scale))
        })?;
        Ok(CpuTensor::new(out))
    }

    fn paged_attention_ext(
        &self,
        q: &CpuTensor,
        k_cache: &CpuTensor,
        v_cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
        scale: f32,
        opts: &AttentionOptions<CpuTensor>,
    ) -> Result<CpuTensor> {
        let q = q.host();
        let sinks = opts.sinks.map(|t| t.host());
        let out = k_cache.read(|kc| {
            v_cache.read(|vc| {
                reference::paged_attention_ext(
                    &q,
                    kc,
                    vc,
                    &meta.host,
                    scale,
                    opts.window,
                    sinks.as_ref(),
                )
            })
        })?;
        Ok(CpuTensor::new(out))
    }

    fn moe_experts_ext(
        &self,
        x: &CpuTensor,
        ids: &CpuTensor,
        weights: &CpuTensor,
        gate_up: &CpuTensor,
        down: &CpuTensor,
        opts: &ExpertOptions<CpuTensor>,
    ) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::moe_experts_ext(
            &x.host(),
            &ids.host(),
            &weights.host(),
            &gate_up.host(),
            &down.host(),
            opts.act,
            opts.gate_up_bias.map(|t| t.host()).as_ref(),
            opts.down_bias.map(|t| t.host()).as_ref(),
        )?))
    }

    fn argmax(&self, x: &CpuTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::argmax(&x.host())?))
    }

    fn stream_mix(&self, x: &CpuTensor, w: &CpuTensor) -> Result<CpuTensor> {
        Ok(CpuTensor::new(reference::stream_mix(&x.host(), &w.host())?))
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
        let x = x.host();
        cache.write(|c| reference::write_cache(&x, c, col, &meta.host))
    }

    fn paged_latent_attention(
        &self,
        q_lat: &CpuTensor,
        q_rope: &CpuTensor,
        cache: &CpuTensor,
        meta: &DeviceStepMeta<CpuTensor>,
        scale: f32,
    ) -> Result<CpuTensor> {
        let (q_lat, q_rope) = (q_lat.host(), q_rope.host());
        let out = cache
            .read(|c| reference::paged_latent_attention(&q_lat, &q_rope, c, &meta.host, scale))?;
        Ok(CpuTensor::new(out))
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
        let (x, w) = (x.host(), w.host());
        let y = state.write(|st| reference::short_conv(&x, &w, st, &meta.host))?;
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
        let inputs = [q, k, v, a, b, a_log, dt_bias].map(CpuTensor::host);
        let [q, k, v, a, b, a_log, dt_bias] = &inputs;
        let o = state.write(|st| {
            reference::kda(q, k, v, a, b, a_log, dt_bias, lower_bound, st, &meta.host)
        })?;
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
        let (q, w) = (q.host(), w.host());
        let out = k_cache.read(|kc| reference::dsa_topk(&q, &w, kc, &meta.host, scale, topk))?;
        Ok(CpuTensor::new(out))
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
        let (q_lat, q_rope, selected) = (q_lat.host(), q_rope.host(), selected.host());
        let out = cache.read(|c| {
            reference::sparse_latent_attention(&q_lat, &q_rope, c, &meta.host, scale, &selected)
        })?;
        Ok(CpuTensor::new(out))
    }

    /// In place in the shared storage, rows of this view's shape ([`rows::copy_rows_bytes`]).
    fn copy_rows(&self, t: &CpuTensor, pairs: &[(u32, u32)]) -> Result<()> {
        let mut g = t.data.write().expect("lock");
        let layout = rows::RowLayout::of("copy_rows", &t.shape, g.dtype)?;
        let plan = rows::plan_copy("copy_rows", pairs, &t.shape)?;
        rows::copy_rows_bytes(&mut g.data, layout.row_bytes, &plan);
        Ok(())
    }

    fn dequantize_into(
        &self,
        q: &QuantTensor<CpuTensor>,
        items: &CpuTensor,
        out: &CpuTensor,
    ) -> Result<()> {
        let host = q.download(self)?;
        let items = items.host().to_u32()?;
        let [_, rows, cols] = q.shape;
        let per = rows * cols;
        ensure!(
            out.shape.len() == 3 && out.shape[1..] == [rows, cols] && out.shape[0] >= items.len(),
            "dequantize_into: out must be [>= {}, {rows}, {cols}], got {:?}",
            items.len(),
            out.shape
        );
        let values = host.dequantize_items(&items);
        out.write(|t| {
            ensure!(
                t.dtype.is_float(),
                "dequantize_into: out must be float, got {}",
                t.dtype
            );
            let dtype = t.dtype;
            let mut head = HostTensor::new(
                vec![items.len() * per],
                dtype,
                t.data[..items.len() * per * dtype.size()].to_vec(),
            )?;
            head.update_f32(dtype, |v| {
                v.copy_from_slice(&values);
                Ok(())
            })?;
            t.data[..head.data.len()].copy_from_slice(&head.data);
            Ok(())
        })
    }

    fn read_rows(&self, t: &CpuTensor, indices: &[u32]) -> Result<HostTensor> {
        let g = t.data.read().expect("lock");
        let layout = rows::RowLayout::of("read_rows", &t.shape, g.dtype)?;
        let runs = rows::plan_read("read_rows", indices, &t.shape)?;
        let mut out = vec![0u8; indices.len() * layout.row_bytes];
        rows::move_rows_bytes(&g.data, &mut out, layout.row_bytes, &runs);
        HostTensor::new(rows::rows_shape(&t.shape, indices.len()), g.dtype, out)
    }

    fn write_rows(&self, t: &CpuTensor, indices: &[u32], src: &HostTensor) -> Result<()> {
        let mut g = t.data.write().expect("lock");
        let layout = rows::RowLayout::of("write_rows", &t.shape, g.dtype)?;
        let runs = rows::plan_write("write_rows", indices, &t.shape, g.dtype, src)?;
        rows::move_rows_bytes(&src.data, &mut g.data, layout.row_bytes, &runs);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{CpuBackend, CpuTensor};
    use crate::{conformance, Backend, DType, HostTensor, StepMeta};

    /// The reference backend passes the suite (a sanity check of the checks themselves: input
    /// construction, e.g. the routing-margin resampling, and shape bookkeeping).
    #[test]
    fn cpu_conformance() {
        conformance::check_all(&CpuBackend).unwrap();
    }

    #[test]
    fn cpu_batch_invariance() {
        assert!(
            CpuBackend.batch_invariant(),
            "the reference is always invariant"
        );
        crate::conformance_invariance::check_batch_invariance(&CpuBackend).unwrap();
    }

    #[test]
    fn cpu_window_sinks_and_biased_experts() {
        crate::conformance_ext::check_ext(&CpuBackend).unwrap();
    }

    /// The default `moe_experts_quant` (decode the step's experts, run the float experts)
    /// against the reference experts on the host-decoded weights.
    #[test]
    fn cpu_quantized_experts() {
        crate::conformance_quant::check_experts_quant(&CpuBackend).unwrap();
    }

    /// The DSA checks (not in `check_all`) on the reference backend: input construction (margin
    /// resampling) and selection bookkeeping.
    #[test]
    fn cpu_dsa_ops() {
        conformance::check_dsa_ops(&CpuBackend).unwrap();
    }

    /// `write_kv` and `write_cache` change only the addressed rows, in the cache's own storage
    /// (no copy of the cache), seen by every view of it; a bad slot leaves the cache unchanged.
    #[test]
    fn cache_writes_are_in_place() {
        let b = CpuBackend;
        let (kc, vc) = (
            b.zeros(&[4, 2, 1, 3], DType::F32).unwrap(),
            b.zeros(&[4, 2, 1, 3], DType::F32).unwrap(),
        );
        let view = b.reshape(&kc, &[8, 3]).unwrap();
        let ptr = |t: &CpuTensor| t.data.read().unwrap().data.as_ptr();
        let before = (ptr(&kc), ptr(&vc));
        let k = b
            .upload(&HostTensor::from_f32(vec![1, 1, 3], &[1.0, 2.0, 3.0]).unwrap())
            .unwrap();
        let v = b
            .upload(&HostTensor::from_f32(vec![1, 1, 3], &[4.0, 5.0, 6.0]).unwrap())
            .unwrap();
        let meta = |slot: u32| {
            b.upload_meta(StepMeta {
                positions: vec![0],
                token_seq: vec![0],
                slot_mapping: vec![slot],
                block_tables: vec![0],
                seq_lens: vec![1],
                query_start: vec![0, 1],
                logit_rows: vec![0],
                state_slots: vec![0],
                max_blocks: 1,
                block_size: 2,
                max_seq_len: 1,
            })
            .unwrap()
        };
        b.write_kv(&k, &v, &kc, &vc, &meta(5)).unwrap();
        assert_eq!((ptr(&kc), ptr(&vc)), before);
        let mut want = vec![0f32; 24];
        want[15..18].copy_from_slice(&[1.0, 2.0, 3.0]);
        assert_eq!(b.download(&view).unwrap().to_f32(), want);
        assert_eq!(b.download(&view).unwrap().shape, [8, 3]);
        assert_eq!(b.download(&kc).unwrap().shape, [4, 2, 1, 3]);
        assert!(b.write_kv(&k, &v, &kc, &vc, &meta(8)).is_err());
        assert!(b.write_kv(&k, &v, &kc, &kc, &meta(0)).is_err());
        assert_eq!(b.download(&kc).unwrap().to_f32(), want);
        // write_cache at a column offset, through the [blocks, bs, W] view of the same storage.
        let lat = b.reshape(&kc, &[4, 2, 3]).unwrap();
        let x = b
            .upload(&HostTensor::from_f32(vec![1, 2], &[7.0, 8.0]).unwrap())
            .unwrap();
        b.write_cache(&x, &lat, 1, &meta(0)).unwrap();
        want[1..3].copy_from_slice(&[7.0, 8.0]);
        assert_eq!(b.download(&kc).unwrap().to_f32(), want);
        assert_eq!(ptr(&kc), before.0);
    }
}
