//! Block-quantized weights: decoding items into a workspace, and the low-bit decode GEMV.

use crate::{pipelines, WTensor, WgslBackend, MAX_GROUPS};
use anyhow::{ensure, Result};
use dayone_backend::{Backend, DType, QuantTensor, TensorInfo};

impl WgslBackend {
    /// The code, scale and min buffers of `q` (the dummy buffer when there is no min).
    fn quant_bufs<'a>(
        &'a self,
        op: &str,
        q: &'a QuantTensor<WTensor>,
    ) -> Result<[&'a wgpu::Buffer; 3]> {
        let one = |t: &'a WTensor, name: &str| -> Result<&'a wgpu::Buffer> {
            Self::u32_in(op, name, t)?;
            ensure!(
                t.st.chunks.len() == 1,
                "{op}: quantized {name} of {} bytes are larger than this adapter's largest storage binding ({} bytes)",
                t.numel() * 4,
                self.max_chunk
            );
            Ok(&t.st.chunks[0].buf)
        };
        let mins = match &q.mins {
            Some(m) => one(m, "mins")?,
            None => &self.dummy,
        };
        Ok([one(&q.codes, "codes")?, one(&q.scales, "scales")?, mins])
    }

    fn quant_params(q: &QuantTensor<WTensor>, m: usize, rows: usize) -> [u32; 8] {
        let [c, s, mn, g] = q.format.kernel_params();
        [
            m as u32,
            rows as u32,
            q.shape[2] as u32,
            q.shape[0] as u32,
            c,
            s,
            mn,
            g,
        ]
    }

    pub(crate) fn dequantize_into_impl(
        &self,
        q: &QuantTensor<WTensor>,
        items: &WTensor,
        out: &WTensor,
    ) -> Result<()> {
        const OP: &str = "dequantize_into";
        let [_, rows, cols] = q.shape;
        Self::u32_in(OP, "items", items)?;
        let m = items.numel();
        ensure!(
            out.dtype == DType::F32
                && out.shape.len() == 3
                && out.shape[1..] == [rows, cols]
                && out.shape[0] >= m,
            "{OP}: out must be f32 [>= {m}, {rows}, {cols}], got {} {:?}",
            out.dtype,
            out.shape
        );
        let bufs = self.quant_bufs(OP, q)?;
        let g = Self::grid(OP, ((m * rows * cols) as u64).div_ceil(256))?;
        self.dispatch(
            &pipelines::DEQUANT,
            &Self::quant_params(q, m, rows),
            &[
                bufs[0],
                bufs[1],
                bufs[2],
                items.single(OP, "items")?,
                out.single(OP, "out")?,
            ],
            g,
        )
    }

    /// Decode (`M < 4`) reads the codes directly; more rows decode the weight once into a
    /// temporary and run the dense kernels.
    pub(crate) fn linear_quant_impl(
        &self,
        x: &WTensor,
        q: &QuantTensor<WTensor>,
        bias: Option<&WTensor>,
    ) -> Result<WTensor> {
        const OP: &str = "linear_quant";
        let [items, n, k] = q.shape;
        ensure!(
            items == 1 && x.shape.len() == 2 && x.shape[1] == k,
            "{OP}: expected x [M, {k}] and one weight [1, {n}, {k}], got x {:?} and w {:?}",
            x.shape,
            q.shape
        );
        let m = x.shape[0];
        if m >= 4 || bias.is_some() || self.invariant() {
            let w = self.alloc(&[1, n, k], DType::F32)?;
            self.dequantize_into_impl(q, &self.upload_u32(&[0])?, &w)?;
            return self.linear_impl(x, &self.reshape(&w, &[n, k])?, bias);
        }
        let x = self.f32_of(OP, "x", x)?;
        let out = self.alloc(&[m, n], DType::F32)?;
        let bufs = self.quant_bufs(OP, q)?;
        let outputs = (m * n) as u64;
        ensure!(outputs <= MAX_GROUPS * MAX_GROUPS, "{OP}: M·N too large");
        // CPU adapters: one invocation per output; GPUs: a workgroup per output.
        let (spec, groups) = if self.cpu_kernels {
            (&pipelines::MATVEC_Q_SEQ, outputs.div_ceil(64))
        } else {
            (&pipelines::MATVEC_Q, outputs)
        };
        self.dispatch(
            spec,
            &Self::quant_params(q, m, n),
            &[
                bufs[0],
                bufs[1],
                bufs[2],
                x.single(OP, "x")?,
                out.single(OP, "out")?,
            ],
            Self::grid(OP, groups)?,
        )?;
        Ok(out)
    }
}
