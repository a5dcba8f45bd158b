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

    /// Whether bf16 `w` (`[N, K]`, one buffer) may join a fused decode matvec over `x`
    /// (`[.., K]` f32, one buffer, M = `m` rows): the conditions under which `linear` takes the
    /// generated matvec (M ≤ [`WG_MAX_M`], GPU kernels, not batch-invariant), and a variant
    /// with a generated form. Anything else takes the unfused calls.
    fn fusable(&self, x: &WTensor, m: usize, w: &WTensor) -> bool {
        let k = *x.shape.last().unwrap_or(&0);
        x.dtype == DType::F32
            && x.st.chunks.len() == 1
            && (1..=WG_MAX_M).contains(&m)
            && !self.cpu_kernels
            && !self.invariant()
            && matvec::variants()[self.matvec_index()].v.generated
            && w.dtype == DType::BF16
            && w.shape.len() == 2
            && w.shape[1] == k
            && k > 0
            && k.is_multiple_of(8)
            && w.st.chunks.len() == 1
            // Output [M, N] f32 in one buffer.
            && (m * w.shape[0] * 4) as u64 <= self.max_chunk
    }

    /// Whether the device binds `n` storage buffers in one compute stage.
    fn binds(&self, n: u32) -> bool {
        self.device.limits().max_storage_buffers_per_shader_stage >= n
    }

    /// `linear_many`: on the decode path (see [`Self::fusable`]), groups of 2 ..=
    /// [`matvec::MANY_MAX`] parts run as one dispatch of the fused matvec (each part's rows
    /// summed exactly as `linear`'s kernel sums them, so bit-equal); anything else, and a lone
    /// part, runs `linear` per part.
    pub(crate) fn linear_many_impl(
        &self,
        x: &WTensor,
        parts: &[(&WTensor, Option<&WTensor>)],
    ) -> Result<Vec<WTensor>> {
        const OP: &str = "linear_many";
        let m: usize = x.shape[..x.shape.len().saturating_sub(1)].iter().product();
        let ok = |(w, b): &(&WTensor, Option<&WTensor>)| {
            self.fusable(x, m, w)
                && b.is_none_or(|b| {
                    b.dtype == DType::F32 && b.shape == [w.shape[0]] && b.st.chunks.len() == 1
                })
        };
        let mut out = Vec::with_capacity(parts.len());
        if x.shape.is_empty() || !parts.iter().all(ok) {
            for (w, b) in parts {
                out.push(self.linear_impl(x, w, *b)?);
            }
            return Ok(out);
        }
        for group in parts.chunks(matvec::MANY_MAX) {
            let np = group.len() as u32;
            let spec = matvec::fused_spec(self.matvec_index(), matvec::Kind::Many(np));
            let spec = match spec {
                Some(s)
                    if np >= 2 && self.binds(matvec::storage_bindings(matvec::Kind::Many(np))) =>
                {
                    s
                }
                _ => {
                    for (w, b) in group {
                        out.push(self.linear_impl(x, w, *b)?);
                    }
                    continue;
                }
            };
            let k = *x.shape.last().unwrap_or(&0);
            let rows = matvec::variants()[self.matvec_index()].v.rows as usize;
            // Parameters: m, k, tiles, 0, n[4], start[4], has_bias[4] (see the kernel).
            let mut p = [0u32; 16];
            p[0] = m as u32;
            p[1] = k as u32;
            let mut tiles = 0usize;
            let mut ys = Vec::with_capacity(group.len());
            for (j, (w, b)) in group.iter().enumerate() {
                let n = w.shape[0];
                p[4 + j] = n as u32;
                p[8 + j] = tiles as u32;
                p[12 + j] = b.is_some() as u32;
                tiles += n.div_ceil(rows);
                let mut oshape = x.shape[..x.shape.len() - 1].to_vec();
                oshape.push(n);
                ys.push(self.alloc(&oshape, DType::F32)?);
            }
            // Unused slots of the tile table start past the last tile (never chosen).
            for j in group.len()..matvec::MANY_MAX {
                p[8 + j] = tiles as u32;
            }
            p[2] = tiles as u32;
            let mut bufs: Vec<&wgpu::Buffer> = vec![x.single(OP, "x")?];
            for (w, _) in group {
                bufs.push(w.single(OP, "w")?);
            }
            for (_, b) in group {
                bufs.push(match b {
                    Some(b) => b.single(OP, "bias")?,
                    None => &self.dummy,
                });
            }
            for y in &ys {
                bufs.push(y.single(OP, "output")?);
            }
            let g = Self::grid(OP, (tiles * m.div_ceil(4)) as u64)?;
            self.dispatch(&spec, &p, &bufs, g)?;
            out.extend(ys);
        }
        Ok(out)
    }

    /// `linear_silu_mul`: on the decode path (see [`Self::fusable`], `w_gate` and `w_up` of one
    /// shape `[F, K]`), one dispatch whose workgroups sum the same rows of both weights (as
    /// `linear`'s kernel sums them) and store `silu(g)·u` as `silu_mul` computes it, so the
    /// result is bit-equal to the unfused calls, which run otherwise.
    pub(crate) fn linear_silu_mul_impl(
        &self,
        x: &WTensor,
        w_gate: &WTensor,
        w_up: &WTensor,
    ) -> Result<WTensor> {
        const OP: &str = "linear_silu_mul";
        let m: usize = x.shape[..x.shape.len().saturating_sub(1)].iter().product();
        let spec = matvec::fused_spec(self.matvec_index(), matvec::Kind::SiluMul);
        let spec = match spec {
            Some(s)
                if !x.shape.is_empty()
                    && w_gate.shape == w_up.shape
                    && self.fusable(x, m, w_gate)
                    && self.fusable(x, m, w_up) =>
            {
                s
            }
            _ => {
                let g = self.linear_impl(x, w_gate, None)?;
                let u = self.linear_impl(x, w_up, None)?;
                return self.silu_mul_impl(&g, &u);
            }
        };
        let (f, k) = (w_gate.shape[0], w_gate.shape[1]);
        let mut oshape = x.shape[..x.shape.len() - 1].to_vec();
        oshape.push(f);
        let out = self.alloc(&oshape, DType::F32)?;
        if f == 0 {
            return Ok(out);
        }
        let rows = matvec::variants()[self.matvec_index()].v.rows as usize;
        // The single kernel's parameters (n_off 0, n_chunk F, no bias); word 6 is the run-time
        // +0.0 the kernel adds to each projection.
        let p = [m as u32, k as u32, f as u32, 0, f as u32, 0, 0, 0];
        let bufs = [
            x.single(OP, "x")?,
            w_gate.single(OP, "w_gate")?,
            w_up.single(OP, "w_up")?,
            out.single(OP, "output")?,
        ];
        let g = Self::grid(OP, (f.div_ceil(rows) * m.div_ceil(4)) as u64)?;
        self.dispatch(&spec, &p, &bufs, g)?;
        Ok(out)
    }
}
