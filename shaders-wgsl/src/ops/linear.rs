//! Ops reading weights that may be split over several buffers: `embedding` and `linear`.

use crate::{matvec, pipelines, WTensor, WgslBackend, MAX_GROUPS};
use anyhow::{ensure, Result};
use dayone_backend::DType;

/// Largest step (tokens) whose bf16 `linear` takes the workgroup-reduction kernel on GPU
/// adapters (`matvec_wg_b16`, weights read once per 4 tokens) instead of the 4×4-tile matmul,
/// which splits no sum along K and so launches only `N/256 · M/4` workgroups: too few to fill a
/// large GPU for short steps (decode batches, the tail of a chunked prefill).
const WG_MAX_M: usize = 16;

impl WgslBackend {
    pub(crate) fn embedding_impl(&self, table: &WTensor, ids: &WTensor) -> Result<WTensor> {
        const OP: &str = "embedding";
        ensure!(
            table.shape.len() == 2,
            "{OP}: table must have shape [V, D], got {:?}",
            table.shape
        );
        ensure!(
            ids.shape.len() == 1,
            "{OP}: ids must have shape [N], got {:?}",
            ids.shape
        );
        ensure!(
            matches!(table.dtype, DType::F32 | DType::BF16),
            "{OP}: table must be a float tensor, got {}",
            table.dtype
        );
        Self::u32_in(OP, "ids", ids)?;
        let (v, d, n) = (table.shape[0], table.shape[1], ids.shape[0]);
        let out = self.alloc(&[n, d], DType::F32)?;
        let ob = out.single(OP, "output")?;
        let ib = ids.single(OP, "ids")?;
        let g = Self::grid(OP, ((n * d) as u64).div_ceil(256))?;
        if n * d == 0 {
            return Ok(out);
        }
        let nc = table.st.chunks.len();
        for (i, c) in table.st.chunks.iter().enumerate() {
            ensure!(c.start % d == 0, "{OP}: table chunk not aligned to rows");
            let (r0, r1) = (c.start / d, (c.start + c.len) / d);
            let p = [
                n as u32,
                d as u32,
                r0 as u32,
                r1 as u32,
                v as u32,
                (i + 1 == nc) as u32,
                0,
                0,
            ];
            let spec = if table.dtype == DType::BF16 {
                &pipelines::EMBED_B16
            } else {
                &pipelines::EMBED
            };
            self.dispatch(spec, &p, &[&c.buf, ib, ob], g)?;
        }
        Ok(out)
    }

    pub(crate) fn linear_impl(
        &self,
        x: &WTensor,
        w: &WTensor,
        bias: Option<&WTensor>,
    ) -> Result<WTensor> {
        const OP: &str = "linear";
        ensure!(
            w.shape.len() == 2 && !x.shape.is_empty(),
            "{OP}: expected x [M, K] and w [N, K], got {:?} and {:?}",
            x.shape,
            w.shape
        );
        let x = &self.f32_of(OP, "x", x)?;
        ensure!(
            matches!(w.dtype, DType::F32 | DType::BF16),
            "{OP}: w must be a float tensor, got {}",
            w.dtype
        );
        let (n, k) = (w.shape[0], w.shape[1]);
        ensure!(
            w.dtype != DType::BF16 || k.is_multiple_of(8),
            "{OP}: packed bf16 weights need K % 8 == 0, got {k}"
        );
        ensure!(
            *x.shape.last().unwrap_or(&0) == k,
            "{OP}: x must have shape [M, {k}] to match w [{n}, {k}], got {:?}",
            x.shape
        );
        let m: usize = x.shape[..x.shape.len() - 1].iter().product();
        let mut oshape = x.shape[..x.shape.len() - 1].to_vec();
        oshape.push(n);
        let bias = match bias {
            Some(b) => Some(self.f32_of(OP, "bias", b)?),
            None => None,
        };
        let bb = match &bias {
            Some(b) => {
                ensure!(
                    b.shape == [n],
                    "{OP}: bias must have shape [{n}], got {:?}",
                    b.shape
                );
                b.single(OP, "bias")?
            }
            None => &self.dummy,
        };
        let out = self.alloc(&oshape, DType::F32)?;
        let ob = out.single(OP, "output [M, N]")?;
        let xb = x.single(OP, "x")?;
        if m == 0 || n == 0 {
            return Ok(out);
        }
        ensure!(k > 0, "{OP}: K must be > 0");
        for c in &w.st.chunks {
            ensure!(
                c.start % k == 0 && c.len % k == 0,
                "{OP}: weight chunk not aligned to rows"
            );
            let (n_off, n_chunk) = (c.start / k, c.len / k);
            let p = [
                m as u32,
                k as u32,
                n as u32,
                n_off as u32,
                n_chunk as u32,
                bias.is_some() as u32,
                0,
                0,
            ];
            let bufs = [xb, &c.buf, bb, ob];
            let bf16 = w.dtype == DType::BF16;
            let tiles = (n_chunk as u64).div_ceil(4);
            let mv_spec;
            // (kernel, grid): decode (M < 4; bf16 on GPUs: M ≤ WG_MAX_M) and prefill kernels,
            // f32 or packed-bf16 weights.
            let (spec, g) = if !bf16 && !k.is_multiple_of(4) {
                (
                    &pipelines::MATMUL_S,
                    Self::grid(OP, ((m * n_chunk) as u64).div_ceil(64))?,
                )
            } else if bf16 && m <= WG_MAX_M && !self.cpu_kernels && !self.invariant() {
                // R outputs × up to 4 tokens per workgroup: each weight load serves 4 tokens
                // (R and the kernel: the chosen variant, crate::matvec).
                let i = self.matvec_index();
                let rows = matvec::variants()[i].v.rows as u64;
                mv_spec = matvec::spec(i);
                (
                    &mv_spec,
                    Self::grid(OP, (n_chunk as u64).div_ceil(rows) * (m as u64).div_ceil(4))?,
                )
            } else if m < 4 && !self.cpu_kernels && !self.invariant() {
                (&pipelines::MATVEC_WG, Self::grid(OP, tiles * m as u64)?)
            } else if m < 4 && !self.invariant() {
                let spec = if bf16 {
                    &pipelines::MATVEC_B16
                } else {
                    &pipelines::MATVEC_V4
                };
                (spec, [tiles.div_ceil(64) as u32, m as u32, 1])
            } else {
                let spec = if bf16 {
                    &pipelines::MATMUL_B16
                } else {
                    &pipelines::MATMUL_V4
                };
                let gy = (m as u64).div_ceil(4);
                ensure!(gy <= MAX_GROUPS, "{OP}: M {m} too large for one dispatch");
                (spec, [tiles.div_ceil(64) as u32, gy as u32, 1])
            };
            ensure!(
                tiles.div_ceil(64) <= MAX_GROUPS,
                "{OP}: N {n} too large for one dispatch"
            );
            self.dispatch(spec, &p, &bufs, g)?;
        }
        Ok(out)
    }
}
