//! MoonViT (Kimi-VL / Kimi-K2.5 vision tower) and its patch-merger projector, written against the
//! [`Backend`] trait. Source: transformers 5.24 `modeling_kimi_k25.py`
//! (`Kimi_K25VisionModel`, `Kimi_K25MultimodalProjection`) and vision.md §2:
//!
//! 1. patch embed: `x = W·vec(patch) + b` (the stride-p conv as a linear over `(c, py, px)`);
//! 2. `x += P(h, w)`, the learned table bicubically resampled ([`super::pos_emb`]);
//! 3. blocks (pre-LN, eps 1e-5): `x += Wo·attn(rope(q), rope(k), v) + bo`, bidirectional within
//!    each image ([`Backend::attention_varlen`] with a non-causal [`VarlenMeta`], one sequence per
//!    image: FlashAttention's varlen form, as vLLM runs the tower; on the device where the
//!    backend has a kernel for the head dim, else the host reference);
//!    `x += fc1(gelu_tanh(fc0(LN1(x))))`;
//! 4. final LayerNorm; 2×2 merge (each merged token = its 4 patches `(0,0),(0,1),(1,0),(1,1)`
//!    concatenated); projector `out(gelu(in(LN(x))))` with exact erf-GELU.
//!
//! 2-D RoPE in the original (interleaved) layout: head dims `(2j, 2j+1)` form pair `j`; pair
//! `2i` turns by `col · f_i`, pair `2i + 1` by `row · f_i`, `f_i = θ^(−4i/hd)`. It runs as two
//! interleaved [`Backend::rope`] calls (columns, then rows), each with the other half's
//! frequencies zero — a rotation by 0 is exactly the identity. transformers-5 checkpoints store
//! q/k rows permuted for rotate-half RoPE; they are permuted back at load.

use super::pos_emb::resample_table;
use crate::config::MoonVitConfig;
use crate::vision::PreprocessedImage;
use crate::weights::WeightLoader;
use anyhow::{bail, ensure, Result};
use dayone_backend::VarlenResult;
use dayone_backend::{varlen::upload_varlen, Backend, DType, HostTensor, RopeStyle};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Where a checkpoint keeps the vision tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Naming {
    /// The hub checkpoints (= vLLM's names): `vision_tower.encoder.blocks.N.wqkv`, …
    Original,
    /// transformers 5 `save_pretrained`: `model.vision_tower.layers.N.attn.q_proj`, …
    Transformers,
}

/// The projector's tensor prefixes: `pre_norm`, first and second linear.
fn projector_names(loader_has: &dyn Fn(&str) -> bool) -> Result<[String; 3]> {
    for (pre, a, b) in [
        ("mm_projector", "proj.0", "proj.2"),
        ("model.mm_projector", "in_proj", "out_proj"),
        ("multi_modal_projector", "linear_1", "linear_2"),
        ("model.multi_modal_projector", "linear_1", "linear_2"),
    ] {
        if loader_has(&format!("{pre}.{a}.weight")) {
            return Ok([
                format!("{pre}.pre_norm"),
                format!("{pre}.{a}"),
                format!("{pre}.{b}"),
            ]);
        }
    }
    bail!("no projector tensors (expected mm_projector.proj.0.weight, model.mm_projector.in_proj.weight or multi_modal_projector.linear_1.weight)")
}

/// A linear layer with bias, `[out, in]` + `[out]`.
struct Affine<T> {
    w: T,
    b: T,
}

/// LayerNorm weight and bias `[C]`.
struct Norm<T> {
    w: T,
    b: T,
}

/// One pre-LN encoder block.
struct VitBlock<T> {
    norm0: Norm<T>,
    q: Affine<T>,
    k: Affine<T>,
    v: Affine<T>,
    o: Affine<T>,
    norm1: Norm<T>,
    fc0: Affine<T>,
    fc1: Affine<T>,
}

/// MoonViT + projector weights on one backend.
pub struct MoonVit<B: Backend> {
    cfg: MoonVitConfig,
    dtype: DType,
    patch: Affine<B::Tensor>,
    /// `[th, tw, C]` f32 on the host: resampled per image grid.
    pos_table: Vec<f32>,
    /// Resampled tables `[h·w, C]` by grid `(h, w)`: the bicubic resample costs tens of
    /// milliseconds at K2.5's width and images of one size recur.
    pos_by_grid: Mutex<PosByGrid>,
    blocks: Vec<VitBlock<B::Tensor>>,
    final_norm: Norm<B::Tensor>,
    pre_norm: Norm<B::Tensor>,
    proj_in: Affine<B::Tensor>,
    proj_out: Affine<B::Tensor>,
    /// Head width the attention runs at: the head dim, or a wider one the backend has an
    /// attention kernel for (extra dims are zero in q, k, v and in `Wo`'s columns, so the
    /// scores and outputs are unchanged).
    attn_dim: usize,
    /// `[attn_dim/2]` f32: column frequencies on even pairs, 0 on odd (and on padded pairs).
    inv_freq_col: B::Tensor,
    /// `[attn_dim/2]` f32: row frequencies on odd pairs, 0 on even.
    inv_freq_row: B::Tensor,
}

/// Resampled position tables `[h·w, C]` by grid `(h, w)`.
type PosByGrid = HashMap<(usize, usize), Arc<Vec<f32>>>;

/// Grids whose resampled position tables are kept (beyond it the memo starts afresh).
const POS_GRIDS_KEPT: usize = 64;

impl<B: Backend> MoonVit<B> {
    /// The position table resampled to grid `h × w` (`[h·w, C]`), memoised by grid.
    fn resampled_pos(&self, h: usize, w: usize) -> Arc<Vec<f32>> {
        let mut memo = self.pos_by_grid.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = memo.get(&(h, w)) {
            return t.clone();
        }
        let cfg = &self.cfg;
        let t = Arc::new(resample_table(
            &self.pos_table,
            cfg.pos_emb_height,
            cfg.pos_emb_width,
            cfg.hidden_size,
            h,
            w,
        ));
        if memo.len() >= POS_GRIDS_KEPT {
            memo.clear();
        }
        memo.insert((h, w), t.clone());
        t
    }
}

/// Per-head row permutation between the interleaved (original) and rotate-half (transformers)
/// layouts: original row `2j` = transformers row `j`, original `2j + 1` = transformers
/// `hd/2 + j` (inverse of transformers' `PermuteForRope`). `rows` `[heads·hd, cols]` f32.
fn unpermute_rope_rows(rows: &[f32], heads: usize, hd: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows.len()];
    let half = hd / 2;
    for h in 0..heads {
        for j in 0..half {
            for (dst, src) in [(2 * j, j), (2 * j + 1, half + j)] {
                let (d, s) = ((h * hd + dst) * cols, (h * hd + src) * cols);
                out[d..d + cols].copy_from_slice(&rows[s..s + cols]);
            }
        }
    }
    out
}

/// `w` `[heads·hd, cols]` with every head widened to `pad ≥ hd` rows, the new rows zero.
fn pad_head_rows(w: &[f32], heads: usize, hd: usize, pad: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; heads * pad * cols];
    for h in 0..heads {
        out[h * pad * cols..(h * pad + hd) * cols]
            .copy_from_slice(&w[h * hd * cols..(h + 1) * hd * cols]);
    }
    out
}

/// `w` `[rows, heads·hd]` with every head's columns widened to `pad ≥ hd`, the new ones zero.
fn pad_head_cols(w: &[f32], rows: usize, heads: usize, hd: usize, pad: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * heads * pad];
    for r in 0..rows {
        for h in 0..heads {
            let (d, s) = ((r * heads + h) * pad, (r * heads + h) * hd);
            out[d..d + hd].copy_from_slice(&w[s..s + hd]);
        }
    }
    out
}

impl<B: Backend> MoonVit<B> {
    /// Loads the tower and projector from `loader` (either naming; see module docs). The
    /// attention runs at the head dim when the backend has a varlen attention kernel for it
    /// ([`Backend::attention_varlen_native`]), else at the smallest wider one it has (K2.5's
    /// 72 → 128 on CUDA), else on the backend's fallback at the head dim.
    ///
    /// Errors name the checkpoint and the missing or mis-shaped tensor.
    pub fn load(loader: &WeightLoader<'_, B>, cfg: &MoonVitConfig) -> Result<Self> {
        let hd = cfg.head_dim();
        let b = loader.backend();
        let act = b.activation_dtype(loader.dtype());
        let attn_dim = if b.attention_varlen_native(act, hd, hd) {
            hd
        } else {
            [64, 128, 192, 256]
                .into_iter()
                .find(|&d| d >= hd && b.attention_varlen_native(act, d, d))
                .unwrap_or(hd)
        };
        Self::load_with_attention_dim(loader, cfg, attn_dim)
    }

    /// [`MoonVit::load`] with the attention at head width `attn_dim` (≥ the head dim, even).
    pub fn load_with_attention_dim(
        loader: &WeightLoader<'_, B>,
        cfg: &MoonVitConfig,
        attn_dim: usize,
    ) -> Result<Self> {
        let (c, f, p) = (cfg.hidden_size, cfg.intermediate_size, cfg.patch_size);
        let (heads, hd) = (cfg.num_heads, cfg.head_dim());
        ensure!(
            attn_dim >= hd && attn_dim.is_multiple_of(2),
            "vision attention width {attn_dim} must be even and at least the head dim {hd}"
        );
        let wide = heads * attn_dim;
        // q, k, v rows (and biases) per head widened to `attn_dim`; `Wo` columns likewise.
        let widen = |w: &[f32], bias: &[f32]| -> Result<Affine<B::Tensor>> {
            Ok(Affine {
                w: loader.upload(HostTensor::from_f32(
                    vec![wide, c],
                    &pad_head_rows(w, heads, hd, attn_dim, c),
                )?)?,
                b: loader.upload(HostTensor::from_f32(
                    vec![wide],
                    &pad_head_rows(bias, heads, hd, attn_dim, 1),
                )?)?,
            })
        };
        let naming = if loader.has("vision_tower.encoder.blocks.0.wqkv.weight")
            || loader.has("vision_tower.patch_embed.pos_emb.weight")
        {
            Naming::Original
        } else if loader.has("model.vision_tower.patch_embed.pos_emb.position_embeddings") {
            Naming::Transformers
        } else {
            bail!(
                "{}: no vision tower tensors (expected vision_tower.patch_embed.pos_emb.weight or model.vision_tower.patch_embed.pos_emb.position_embeddings)",
                loader.origin()
            );
        };
        let affine = |name: &str, out: usize, inp: usize| -> Result<Affine<B::Tensor>> {
            Ok(Affine {
                w: loader.get(&format!("{name}.weight"), &[out, inp])?,
                b: loader.get(&format!("{name}.bias"), &[out])?,
            })
        };
        let norm = |name: &str, d: usize| -> Result<Norm<B::Tensor>> {
            Ok(Norm {
                w: loader.get(&format!("{name}.weight"), &[d])?,
                b: loader.get(&format!("{name}.bias"), &[d])?,
            })
        };
        let (tower, pos_name, blocks_prefix, final_name) = match naming {
            Naming::Original => (
                "vision_tower.patch_embed.proj",
                "vision_tower.patch_embed.pos_emb.weight",
                "vision_tower.encoder.blocks",
                "vision_tower.encoder.final_layernorm",
            ),
            Naming::Transformers => (
                "model.vision_tower.patch_embed.proj",
                "model.vision_tower.patch_embed.pos_emb.position_embeddings",
                "model.vision_tower.layers",
                "model.vision_tower.final_layernorm",
            ),
        };
        let conv = loader.host_f32(&format!("{tower}.weight"), &[c, 3, p, p])?;
        let patch = Affine {
            w: loader.upload(HostTensor::from_f32(vec![c, 3 * p * p], &conv.to_f32())?)?,
            b: loader.get(&format!("{tower}.bias"), &[c])?,
        };
        let (th, tw) = (cfg.pos_emb_height, cfg.pos_emb_width);
        let pos_table = loader.host_f32(pos_name, &[th, tw, c])?.to_f32();
        let mut blocks = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let b = format!("{blocks_prefix}.{i}");
            let (q, k, v) = match naming {
                Naming::Original => {
                    let w = loader
                        .host_f32(&format!("{b}.wqkv.weight"), &[3 * c, c])?
                        .to_f32();
                    let bias = loader
                        .host_f32(&format!("{b}.wqkv.bias"), &[3 * c])?
                        .to_f32();
                    let part =
                        |j: usize| widen(&w[j * c * c..(j + 1) * c * c], &bias[j * c..(j + 1) * c]);
                    (part(0)?, part(1)?, part(2)?)
                }
                Naming::Transformers => {
                    let load = |name: &str, permuted: bool| -> Result<Affine<B::Tensor>> {
                        let w = loader.host_f32(&format!("{b}.attn.{name}.weight"), &[c, c])?;
                        let bias = loader.host_f32(&format!("{b}.attn.{name}.bias"), &[c])?;
                        let (w, bias) = (w.to_f32(), bias.to_f32());
                        if permuted {
                            widen(
                                &unpermute_rope_rows(&w, heads, hd, c),
                                &unpermute_rope_rows(&bias, heads, hd, 1),
                            )
                        } else {
                            widen(&w, &bias)
                        }
                    };
                    (
                        load("q_proj", true)?,
                        load("k_proj", true)?,
                        load("v_proj", false)?,
                    )
                }
            };
            let names = match naming {
                Naming::Original => ["norm0", "wo", "norm1", "mlp.fc0", "mlp.fc1"],
                Naming::Transformers => ["norm1", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2"],
            };
            blocks.push(VitBlock {
                norm0: norm(&format!("{b}.{}", names[0]), c)?,
                q,
                k,
                v,
                o: {
                    let o = format!("{b}.{}", names[1]);
                    let w = loader.host_f32(&format!("{o}.weight"), &[c, c])?.to_f32();
                    Affine {
                        w: loader.upload(HostTensor::from_f32(
                            vec![c, wide],
                            &pad_head_cols(&w, c, heads, hd, attn_dim),
                        )?)?,
                        b: loader.get(&format!("{o}.bias"), &[c])?,
                    }
                },
                norm1: norm(&format!("{b}.{}", names[2]), c)?,
                fc0: affine(&format!("{b}.{}", names[3]), f, c)?,
                fc1: affine(&format!("{b}.{}", names[4]), c, f)?,
            });
        }
        let [pre, lin1, lin2] = projector_names(&|n| loader.has(n))
            .map_err(|e| anyhow::anyhow!("{}: {e}", loader.origin()))?;
        let m = cfg.merged_size();
        // f_i = θ^(−4i/hd) for i < hd/4, computed in f32 as transformers does
        // (`1 / base ** (arange(0, hd/2, 2) / (hd/2))`).
        let half = hd / 2;
        let mut col = vec![0f32; attn_dim / 2];
        let mut row = vec![0f32; attn_dim / 2];
        for i in 0..hd / 4 {
            let fi = 1.0 / cfg.rope_theta.powf((2 * i) as f32 / half as f32);
            col[2 * i] = fi;
            row[2 * i + 1] = fi;
        }
        let backend = loader.backend();
        Ok(Self {
            cfg: cfg.clone(),
            dtype: loader.dtype(),
            patch,
            pos_table,
            pos_by_grid: Mutex::default(),
            blocks,
            final_norm: norm(final_name, c)?,
            pre_norm: norm(&pre, c)?,
            proj_in: affine(&lin1, m, m)?,
            proj_out: affine(&lin2, cfg.text_hidden_size, m)?,
            attn_dim,
            inv_freq_col: backend.upload(&HostTensor::from_f32(vec![attn_dim / 2], &col)?)?,
            inv_freq_row: backend.upload(&HostTensor::from_f32(vec![attn_dim / 2], &row)?)?,
        })
    }

    /// The config the tower was loaded with.
    pub fn config(&self) -> &MoonVitConfig {
        &self.cfg
    }

    /// Encodes images into projected token rows: `[Σ (h/mh)·(w/mw), text_hidden]` in the storage
    /// dtype, image after image, merged tokens in raster order of each merged grid.
    pub fn encode(&self, b: &B, images: &[PreprocessedImage]) -> Result<B::Tensor> {
        self.encode_traced(b, images, &mut |_, _| Ok(()))
    }

    /// [`MoonVit::encode`] reporting intermediates to `trace(name, tensor)`: `patch_embed_conv`
    /// and `patch_embed` `[N, C]`, `block_{i}` `[N, C]`, `final_norm` `[N, C]`, `merged`
    /// `[N, C]` (= transformers' `[N/4, 4, C]` pooler output), `projector` `[n, D]`.
    pub fn encode_traced(
        &self,
        b: &B,
        images: &[PreprocessedImage],
        trace: &mut dyn FnMut(&str, &B::Tensor) -> Result<()>,
    ) -> Result<B::Tensor> {
        let cfg = &self.cfg;
        let (c, p) = (cfg.hidden_size, cfg.patch_size);
        let (heads, hd) = (cfg.num_heads, cfg.head_dim());
        let (mh, mw) = cfg.merge_kernel;
        let batch = super::PatchBatch::new(images, p, (mh, mw))?;
        let n = batch.n;
        let mut pos = Vec::with_capacity(n * c);
        let (mut rows, mut cols) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut merge_ids = Vec::with_capacity(n);
        let mut offset = 0usize;
        for im in images {
            let (h, w) = (im.grid_h, im.grid_w);
            pos.extend_from_slice(&self.resampled_pos(h, w));
            for r in 0..h {
                for col in 0..w {
                    rows.push(r as u32);
                    cols.push(col as u32);
                }
            }
            for r in 0..h / mh {
                for col in 0..w / mw {
                    for dr in 0..mh {
                        for dc in 0..mw {
                            merge_ids.push((offset + (r * mh + dr) * w + col * mw + dc) as u32);
                        }
                    }
                }
            }
            offset += h * w;
        }
        let dt = self.dtype;
        let up_u32 = |v: &[u32]| b.upload(&HostTensor::from_u32(vec![v.len()], v)?);
        let x = b.upload(&HostTensor::from_f32_as(
            vec![n, 3 * p * p],
            &batch.pixels,
            dt,
        )?)?;
        let mut x = b.linear(&x, &self.patch.w, Some(&self.patch.b))?;
        trace("patch_embed_conv", &x)?;
        x = b.add(
            &x,
            &b.upload(&HostTensor::from_f32_as(vec![n, c], &pos, dt)?)?,
        )?;
        trace("patch_embed", &x)?;
        let (rows, cols) = (up_u32(&rows)?, up_u32(&cols)?);
        let meta = upload_varlen(b, batch.meta, n, n)?;
        // The true head dim's scale, whatever width the attention runs at.
        let scale = 1.0 / (hd as f32).sqrt();
        let ad = self.attn_dim;
        for (i, blk) in self.blocks.iter().enumerate() {
            let h = b.layer_norm(&x, &blk.norm0.w, &blk.norm0.b, 1e-5)?;
            let rope2d = |t: B::Tensor| -> Result<B::Tensor> {
                let t = b.reshape(&t, &[n, heads, ad])?;
                let t = b.rope(
                    &t,
                    &cols,
                    &self.inv_freq_col,
                    ad,
                    RopeStyle::Interleaved,
                    1.0,
                )?;
                b.rope(
                    &t,
                    &rows,
                    &self.inv_freq_row,
                    ad,
                    RopeStyle::Interleaved,
                    1.0,
                )
            };
            let q = rope2d(b.linear(&h, &blk.q.w, Some(&blk.q.b))?)?;
            let k = rope2d(b.linear(&h, &blk.k.w, Some(&blk.k.b))?)?;
            let v = b.reshape(&b.linear(&h, &blk.v.w, Some(&blk.v.b))?, &[n, heads, ad])?;
            let o = match b.attention_varlen(&q, &k, &v, &meta, scale, None, true)? {
                VarlenResult::Final(o) => o,
                VarlenResult::State { .. } => bail!("attention_varlen returned a state"),
            };
            let o = b.linear(&b.reshape(&o, &[n, heads * ad])?, &blk.o.w, Some(&blk.o.b))?;
            x = b.add(&x, &o)?;
            let h = b.layer_norm(&x, &blk.norm1.w, &blk.norm1.b, 1e-5)?;
            let h = b.gelu(
                &b.linear(&h, &blk.fc0.w, Some(&blk.fc0.b))?,
                cfg.mlp_gelu_tanh,
            )?;
            x = b.add(&x, &b.linear(&h, &blk.fc1.w, Some(&blk.fc1.b))?)?;
            trace(&format!("block_{i}"), &x)?;
        }
        let x = b.layer_norm(&x, &self.final_norm.w, &self.final_norm.b, 1e-5)?;
        trace("final_norm", &x)?;
        let merged = b.embedding(&x, &up_u32(&merge_ids)?)?;
        trace("merged", &merged)?;
        let y = b.layer_norm(
            &merged,
            &self.pre_norm.w,
            &self.pre_norm.b,
            cfg.projector_ln_eps,
        )?;
        let y = b.reshape(&y, &[n / (mh * mw), cfg.merged_size()])?;
        let y = b.gelu(
            &b.linear(&y, &self.proj_in.w, Some(&self.proj_in.b))?,
            false,
        )?;
        let y = b.linear(&y, &self.proj_out.w, Some(&self.proj_out.b))?;
        trace("projector", &y)?;
        Ok(y)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rows_unpermute_inverts_transformers_permute() {
        // transformers PermuteForRope: new row j = old 2j, new hd/2 + j = old 2j + 1.
        let (heads, hd) = (2, 8);
        let orig: Vec<f32> = (0..heads * hd).map(|i| i as f32).collect();
        let mut permuted = vec![0f32; orig.len()];
        for h in 0..heads {
            for j in 0..hd / 2 {
                permuted[h * hd + j] = orig[h * hd + 2 * j];
                permuted[h * hd + hd / 2 + j] = orig[h * hd + 2 * j + 1];
            }
        }
        assert_eq!(unpermute_rope_rows(&permuted, heads, hd, 1), orig);
    }
}
