//! The GLM-5.3-Flash vision tower's output stage (transformers 5.24 `Glm5NextVisionModel`:
//! `downsample` + `Glm5NextVisionPatchMerger`; vision.md §6), written against the [`Backend`]
//! trait:
//!
//! 1. `downsample`: Conv2d(C → D, kernel = stride = m) over each m×m block — with the tokens in
//!    merge-block order, a linear over the block's m² consecutive rows concatenated
//!    (`[N/m², m²·C]`), its weight `[D, C, m, m]` permuted to `[D, (dy, dx, c)]` at load;
//! 2. merger: `down(silu(min(g, l)) ⊙ clamp(u, −l, l))` with `g, u = gate/up(gelu_erf(LN(proj(x))))`,
//!    no biases but the LayerNorm's (eps 1e-5, `nn.LayerNorm` default).

use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, HostTensor, TensorInfo};

/// `downsample` + merger weights (`{prefix}.downsample.*`, `{prefix}.merger.*`).
pub struct Glm5Merger<B: Backend> {
    /// `[D, m²·C]`, columns in `(dy, dx, c)` order.
    down_w: B::Tensor,
    /// `[D]`.
    down_b: B::Tensor,
    /// `[D, D]`.
    proj: B::Tensor,
    /// LayerNorm weight and bias `[D]`.
    ln_w: B::Tensor,
    ln_b: B::Tensor,
    /// `[F, D]`, `[F, D]`, `[D, F]` (F = `projection_intermediate_size`).
    gate: B::Tensor,
    up: B::Tensor,
    down: B::Tensor,
    /// Patches per merged token `m²`.
    merge_area: usize,
    /// Encoder width `C`.
    hidden: usize,
    limit: f32,
}

/// `w` `[out, c, m, m]` → `[out, m·m·c]` with column `(dy·m + dx)·c_n + c` = `w[o, c, dy, dx]`.
fn permute_block_conv(w: &[f32], out: usize, c_n: usize, m: usize) -> Vec<f32> {
    let mut r = vec![0f32; w.len()];
    for o in 0..out {
        for c in 0..c_n {
            for dy in 0..m {
                for dx in 0..m {
                    let src = ((o * c_n + c) * m + dy) * m + dx;
                    r[o * m * m * c_n + (dy * m + dx) * c_n + c] = w[src];
                }
            }
        }
    }
    r
}

impl<B: Backend> Glm5Merger<B> {
    /// Loads `{prefix}.downsample.{weight,bias}` (`[D, C, m, m]`, `[D]`) and
    /// `{prefix}.merger.{proj, post_projection_norm, gate_proj, up_proj, down_proj}`.
    /// `(c, d, f, m)` = encoder width, output width, merger SwiGLU width, merge size.
    ///
    /// Errors name the file and a missing or mis-shaped tensor.
    pub fn load(
        loader: &WeightLoader<'_, B>,
        prefix: &str,
        (c, d, f, m): (usize, usize, usize, usize),
        limit: f32,
    ) -> Result<Self> {
        let conv = loader
            .host_f32(&format!("{prefix}.downsample.weight"), &[d, c, m, m])?
            .to_f32();
        let mp = format!("{prefix}.merger");
        Ok(Self {
            down_w: loader.upload(HostTensor::from_f32(
                vec![d, m * m * c],
                &permute_block_conv(&conv, d, c, m),
            )?)?,
            down_b: loader.get(&format!("{prefix}.downsample.bias"), &[d])?,
            proj: loader.get(&format!("{mp}.proj.weight"), &[d, d])?,
            ln_w: loader.get(&format!("{mp}.post_projection_norm.weight"), &[d])?,
            ln_b: loader.get(&format!("{mp}.post_projection_norm.bias"), &[d])?,
            gate: loader.get(&format!("{mp}.gate_proj.weight"), &[f, d])?,
            up: loader.get(&format!("{mp}.up_proj.weight"), &[f, d])?,
            down: loader.get(&format!("{mp}.down_proj.weight"), &[d, f])?,
            merge_area: m * m,
            hidden: c,
            limit,
        })
    }

    /// `x` `[N, C]` (post-norm encoder rows, merge-block order, N a multiple of m²) →
    /// (`downsample` `[N/m², D]`, merger output `[N/m², D]`).
    pub fn forward(&self, b: &B, x: &B::Tensor) -> Result<(B::Tensor, B::Tensor)> {
        let n = x.shape()[0] / self.merge_area;
        let blocks = b.reshape(x, &[n, self.merge_area * self.hidden])?;
        let ds = b.linear(&blocks, &self.down_w, Some(&self.down_b))?;
        let h = b.linear(&ds, &self.proj, None)?;
        let h = b.gelu(&b.layer_norm(&h, &self.ln_w, &self.ln_b, 1e-5)?, false)?;
        let g = b.linear(&h, &self.gate, None)?;
        let u = b.linear(&h, &self.up, None)?;
        let act = b.silu_mul_limit(&g, &u, self.limit)?;
        let out = b.linear(&act, &self.down, None)?;
        Ok((ds, out))
    }
}

#[cfg(test)]
mod tests {
    use super::permute_block_conv;

    #[test]
    fn block_conv_columns_follow_token_order() {
        // out 1, c 2, m 2: w[0, c, dy, dx] = 10c + 2dy + dx.
        let w: Vec<f32> = (0..2)
            .flat_map(|c| (0..4).map(move |k| (10 * c + k) as f32))
            .collect();
        // token (dy, dx) block of C columns: [c0, c1].
        assert_eq!(
            permute_block_conv(&w, 1, 2, 2),
            [0., 10., 1., 11., 2., 12., 3., 13.]
        );
    }
}
