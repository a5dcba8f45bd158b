//! The GLM-5.3-Flash vision tower (`glm5_next`; transformers 5.24 `Glm5NextVisionModel`,
//! vision.md §6), written against the [`Backend`] trait. Per image (grid `h × w` patches in
//! merge-block order, see [`crate::vision::glm5_preprocess`]):
//!
//! 1. patch embed: Conv3d(3 → C, kernel (T, p, p)) on a still image repeated over T frames =
//!    `x = W_eff·vec(patch) + b` with `W_eff = Σ_t W[:, :, t]` (folded at load); no position
//!    table;
//! 2. blocks (RMSNorm pre-norms, eps `rms_norm_eps`):
//!    `x += proj(attn(rope(k_norm(k)), rope(q_norm(q)), v))` with fused `qkv` (+ bias), per-head
//!    q/k RMSNorm before the RoPE, bidirectional attention within each image
//!    ([`Backend::attention_varlen`], one non-causal sequence per image), scale `hd^−½`;
//!    `x += down(silu(min(gate(h), l)) ⊙ clamp(up(h), −l, l))` (+ biases);
//! 3. `post_layernorm` (RMS), then [`super::glm5_merger`].
//!
//! 2-D RoPE, rotate-half over the whole head: dim `j` pairs with `j + hd/2`; for `j < hd/4` the
//! angle is `row · f_j`, for `hd/4 ≤ j < hd/2` it is `col · f_{j − hd/4}`, `f_i = θ^(−4i/hd)`
//! (transformers `Glm5NextVisionRotaryEmbedding`: `cat([h·f, w·f])` duplicated). It runs as two
//! [`RopeStyle::HalfSplit`] calls (rows, then columns), each with the other quarter's
//! frequencies zero — a rotation by 0 is exactly the identity.

use super::glm5_merger::Glm5Merger;
use crate::config::Glm5NextVisionConfig;
use crate::layers::RmsNorm;
use crate::vision::PreprocessedImage;
use crate::weights::WeightLoader;
use anyhow::{bail, Result};
use dayone_backend::{varlen::upload_varlen, Backend, DType, HostTensor, RopeStyle, VarlenResult};

/// Where transformers saves the tower (`Glm5NextModel.visual`).
const PREFIX: &str = "model.visual";

/// A linear layer `[out, in]` with an optional bias `[out]`.
struct Affine<T> {
    w: T,
    b: Option<T>,
}

/// One encoder block.
struct Glm5VitBlock<B: Backend> {
    norm1: RmsNorm<B>,
    q: Affine<B::Tensor>,
    k: Affine<B::Tensor>,
    v: Affine<B::Tensor>,
    /// Per-head RMSNorm `[hd]` of queries and keys.
    q_norm: RmsNorm<B>,
    k_norm: RmsNorm<B>,
    proj: Affine<B::Tensor>,
    norm2: RmsNorm<B>,
    gate: Affine<B::Tensor>,
    up: Affine<B::Tensor>,
    down: Affine<B::Tensor>,
}

/// GLM-5.3-Flash vision tower + merger weights on one backend.
pub struct Glm5Vit<B: Backend> {
    cfg: Glm5NextVisionConfig,
    dtype: DType,
    /// `[C, 3·p·p]` (the temporal sum of the Conv3d weight) and `[C]`.
    patch: Affine<B::Tensor>,
    blocks: Vec<Glm5VitBlock<B>>,
    post_norm: RmsNorm<B>,
    merger: Glm5Merger<B>,
    /// `[hd/2]` f32: `f_i` on the first quarter, 0 on the second (rows).
    inv_freq_row: B::Tensor,
    /// `[hd/2]` f32: 0 on the first quarter, `f_i` on the second (columns).
    inv_freq_col: B::Tensor,
}

/// Sums a Conv3d weight `[C, 3, T, p, p]` over `T` → `[C, 3·p·p]`.
fn fold_temporal(w: &[f32], c: usize, t: usize, pp: usize) -> Vec<f32> {
    let mut out = vec![0f32; c * 3 * pp];
    for o in 0..c * 3 {
        for k in 0..t {
            let src = &w[(o * t + k) * pp..(o * t + k + 1) * pp];
            for (d, s) in out[o * pp..(o + 1) * pp].iter_mut().zip(src) {
                *d += s;
            }
        }
    }
    out
}

impl<B: Backend> Glm5Vit<B> {
    /// Loads `model.visual.*` as transformers saves it: `patch_embed.proj` `[C, 3, T, p, p]`,
    /// `blocks.{i}.{norm1, norm2, attn.qkv, attn.q_norm, attn.k_norm, attn.proj,
    /// mlp.{gate,up,down}_proj}`, `post_layernorm`, `downsample`, `merger.*`.
    ///
    /// Errors name the file and a missing or mis-shaped tensor.
    pub fn load(loader: &WeightLoader<'_, B>, cfg: &Glm5NextVisionConfig) -> Result<Self> {
        let (c, f, p, t) = (
            cfg.hidden_size,
            cfg.intermediate_size,
            cfg.patch_size,
            cfg.temporal_patch_size,
        );
        let hd = cfg.head_dim();
        let eps = cfg.rms_norm_eps;
        let bias = cfg.attention_bias;
        let affine = |name: &str, out: usize, inp: usize| -> Result<Affine<B::Tensor>> {
            Ok(Affine {
                w: loader.get(&format!("{name}.weight"), &[out, inp])?,
                b: if bias {
                    Some(loader.get(&format!("{name}.bias"), &[out])?)
                } else {
                    None
                },
            })
        };
        let conv = loader
            .host_f32(
                &format!("{PREFIX}.patch_embed.proj.weight"),
                &[c, 3, t, p, p],
            )?
            .to_f32();
        let patch = Affine {
            w: loader.upload(HostTensor::from_f32(
                vec![c, 3 * p * p],
                &fold_temporal(&conv, c, t, p * p),
            )?)?,
            b: Some(loader.get(&format!("{PREFIX}.patch_embed.proj.bias"), &[c])?),
        };
        let mut blocks = Vec::with_capacity(cfg.depth);
        for i in 0..cfg.depth {
            let pre = format!("{PREFIX}.blocks.{i}");
            let qkv_w = loader
                .host_f32(&format!("{pre}.attn.qkv.weight"), &[3 * c, c])?
                .to_f32();
            let qkv_b = if bias {
                Some(
                    loader
                        .host_f32(&format!("{pre}.attn.qkv.bias"), &[3 * c])?
                        .to_f32(),
                )
            } else {
                None
            };
            // Rows `[j·C, (j+1)·C)` of the fused weight are q, k, v (`reshape(N, 3, heads, hd)`).
            let part = |j: usize| -> Result<Affine<B::Tensor>> {
                Ok(Affine {
                    w: loader.upload(HostTensor::from_f32(
                        vec![c, c],
                        &qkv_w[j * c * c..(j + 1) * c * c],
                    )?)?,
                    b: match &qkv_b {
                        Some(v) => Some(
                            loader
                                .upload(HostTensor::from_f32(vec![c], &v[j * c..(j + 1) * c])?)?,
                        ),
                        None => None,
                    },
                })
            };
            blocks.push(Glm5VitBlock {
                norm1: RmsNorm::load(loader, &format!("{pre}.norm1"), c, eps)?,
                q: part(0)?,
                k: part(1)?,
                v: part(2)?,
                q_norm: RmsNorm::load(loader, &format!("{pre}.attn.q_norm"), hd, eps)?,
                k_norm: RmsNorm::load(loader, &format!("{pre}.attn.k_norm"), hd, eps)?,
                proj: affine(&format!("{pre}.attn.proj"), c, c)?,
                norm2: RmsNorm::load(loader, &format!("{pre}.norm2"), c, eps)?,
                gate: affine(&format!("{pre}.mlp.gate_proj"), f, c)?,
                up: affine(&format!("{pre}.mlp.up_proj"), f, c)?,
                down: affine(&format!("{pre}.mlp.down_proj"), c, f)?,
            });
        }
        let merger = Glm5Merger::load(
            loader,
            PREFIX,
            (
                c,
                cfg.out_hidden_size,
                cfg.projection_intermediate_size,
                cfg.spatial_merge_size,
            ),
            cfg.swiglu_limit as f32,
        )?;
        // f_i = 1 / θ^(2i / (hd/2)) in f32, as transformers' `compute_axial_rope_parameters`.
        let (quarter, half) = (hd / 4, hd / 2);
        let theta = cfg.rope_parameters.rope_theta as f32;
        let mut row = vec![0f32; half];
        let mut col = vec![0f32; half];
        for i in 0..quarter {
            let fi = 1.0 / theta.powf((2 * i) as f32 / half as f32);
            row[i] = fi;
            col[quarter + i] = fi;
        }
        let b = loader.backend();
        Ok(Self {
            cfg: cfg.clone(),
            dtype: loader.dtype(),
            patch,
            blocks,
            post_norm: RmsNorm::load(loader, &format!("{PREFIX}.post_layernorm"), c, eps)?,
            merger,
            inv_freq_row: b.upload(&HostTensor::from_f32(vec![half], &row)?)?,
            inv_freq_col: b.upload(&HostTensor::from_f32(vec![half], &col)?)?,
        })
    }

    /// The config the tower was loaded with.
    pub fn config(&self) -> &Glm5NextVisionConfig {
        &self.cfg
    }

    /// Encodes images into token rows: `[Σ h·w/m², D]` in the storage dtype, image after image,
    /// merged tokens in raster order of each merged grid (the order of the `<|image|>` run).
    pub fn encode(&self, b: &B, images: &[PreprocessedImage]) -> Result<B::Tensor> {
        self.encode_traced(b, images, &mut |_, _| Ok(()))
    }

    /// [`Glm5Vit::encode`] reporting intermediates to `trace(name, tensor)`: `patch_embed`,
    /// `block_{i}` and `post_layernorm` `[N, C]`, `downsample` and `merger` `[N/m², D]`.
    ///
    /// Errors: no images, an image whose pixel count or grid does not fit the config.
    pub fn encode_traced(
        &self,
        b: &B,
        images: &[PreprocessedImage],
        trace: &mut dyn FnMut(&str, &B::Tensor) -> Result<()>,
    ) -> Result<B::Tensor> {
        let cfg = &self.cfg;
        let (c, p, m) = (cfg.hidden_size, cfg.patch_size, cfg.spatial_merge_size);
        let (heads, hd) = (cfg.num_heads, cfg.head_dim());
        let batch = super::PatchBatch::new(images, p, (m, m))?;
        let n = batch.n;
        let (mut rows, mut cols) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for im in images {
            // Merge-block order (transformers `get_vision_position_ids`).
            for by in 0..im.grid_h / m {
                for bx in 0..im.grid_w / m {
                    for dy in 0..m {
                        for dx in 0..m {
                            rows.push((by * m + dy) as u32);
                            cols.push((bx * m + dx) as u32);
                        }
                    }
                }
            }
        }
        let up_u32 = |v: &[u32]| b.upload(&HostTensor::from_u32(vec![v.len()], v)?);
        let x = b.upload(&HostTensor::from_f32_as(
            vec![n, 3 * p * p],
            &batch.pixels,
            self.dtype,
        )?)?;
        let mut x = b.linear(&x, &self.patch.w, self.patch.b.as_ref())?;
        trace("patch_embed", &x)?;
        let (rows, cols) = (up_u32(&rows)?, up_u32(&cols)?);
        let meta = upload_varlen(b, batch.meta, n, n)?;
        let scale = 1.0 / (hd as f32).sqrt();
        let limit = cfg.swiglu_limit as f32;
        let lin = |x: &B::Tensor, a: &Affine<B::Tensor>| b.linear(x, &a.w, a.b.as_ref());
        for (i, blk) in self.blocks.iter().enumerate() {
            let h = blk.norm1.forward(b, &x)?;
            // [N, C] → per-head RMSNorm on [N·H, hd] → 2-D RoPE on [N, H, hd].
            let qk = |a: &Affine<B::Tensor>, norm: &RmsNorm<B>| -> Result<B::Tensor> {
                let t = norm.forward(b, &b.reshape(&lin(&h, a)?, &[n * heads, hd])?)?;
                let t = b.reshape(&t, &[n, heads, hd])?;
                let t = b.rope(&t, &rows, &self.inv_freq_row, hd, RopeStyle::HalfSplit, 1.0)?;
                b.rope(&t, &cols, &self.inv_freq_col, hd, RopeStyle::HalfSplit, 1.0)
            };
            let q = qk(&blk.q, &blk.q_norm)?;
            let k = qk(&blk.k, &blk.k_norm)?;
            let v = b.reshape(&lin(&h, &blk.v)?, &[n, heads, hd])?;
            let o = match b.attention_varlen(&q, &k, &v, &meta, scale, None, true)? {
                VarlenResult::Final(o) => o,
                VarlenResult::State { .. } => bail!("attention_varlen returned a state"),
            };
            x = b.add(&x, &lin(&b.reshape(&o, &[n, c])?, &blk.proj)?)?;
            let h = blk.norm2.forward(b, &x)?;
            let act = b.silu_mul_limit(&lin(&h, &blk.gate)?, &lin(&h, &blk.up)?, limit)?;
            x = b.add(&x, &lin(&act, &blk.down)?)?;
            trace(&format!("block_{i}"), &x)?;
        }
        let x = self.post_norm.forward(b, &x)?;
        trace("post_layernorm", &x)?;
        let (ds, out) = self.merger.forward(b, &x)?;
        trace("downsample", &ds)?;
        trace("merger", &out)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::fold_temporal;

    #[test]
    fn temporal_fold_sums_frames() {
        // c 1, 3 channels, T 2, p² 1: w[0, ch, t] = 10·ch + t.
        let w = [0., 1., 10., 11., 20., 21.];
        assert_eq!(fold_temporal(&w, 1, 2, 1), [1., 21., 41.]);
    }
}
