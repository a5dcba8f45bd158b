//! Multi-head Latent Attention (DeepSeek-V2 report §2.1; HF `DeepseekV3Attention`), run in the
//! absorbed form over a latent cache that keeps only `[c_kv (L) | k_pe (R)]` per token.
//!
//! ```text
//! c_q   = RMSNorm(W_qa x)                 (or x when q_lora_rank is absent)
//! q     = W_qb c_q  → per head [q_nope (dn) | q_pe (R)];  q_pe ← RoPE(q_pe)
//! [c_kv | k_pe] = W_kva x;  c_kv ← RMSNorm(c_kv);  k_pe ← RoPE(k_pe)   (one shared head)
//! q̃_h  = W_UK,hᵀ q_nope,h                 (L)
//! score = τ · (q̃_h · c_kv,s + q_pe,h · k_pe,s),  ō_h = Σ_s softmax · c_kv,s
//! o_h   = W_UV,h ō_h;  y = W_o concat_h o_h
//! ```
//! where `W_kvb` `[H·(dn+dv), L]` holds per head `W_UK,h` (dn rows) then `W_UV,h` (dv rows). This
//! equals the reference's expanded form `k_nope = W_UK c_kv`, `v = W_UV c_kv` exactly in real
//! arithmetic.

use super::{Linear, RmsNorm, Rope, RowLinear, Weight};
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, HostTensor};

/// Widths of an MLA layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaShape {
    /// Residual width `D`.
    pub hidden: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Query latent width (`q_lora_rank`), `None` for a plain `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// KV latent width `L` (`kv_lora_rank`).
    pub kv_lora_rank: usize,
    /// Non-rotary query/key width per head `dn`.
    pub nope_dim: usize,
    /// Rotary width `R`.
    pub rope_dim: usize,
    /// Value width per head `dv`.
    pub v_dim: usize,
}

/// One MLA layer's weights, rearranged at load for the absorbed form.
pub struct Mla<B: Backend> {
    /// Widths.
    pub shape: MlaShape,
    /// `W_qa` `[q_lora, D]` and its norm, when the query is compressed.
    pub q_a: Option<(Linear<B>, RmsNorm<B>)>,
    /// Rows of `W_qb` (or `q_proj`) giving `q_nope`: `[H·dn, q_in]`.
    pub q_nope: Linear<B>,
    /// Rows of `W_qb` (or `q_proj`) giving `q_pe`: `[H·R, q_in]`.
    pub q_pe: Linear<B>,
    /// Rows of `W_kva` giving `c_kv`: `[L, D]`.
    pub kv_a: Linear<B>,
    /// Rows of `W_kva` giving `k_pe`: `[R, D]`.
    pub k_pe: Linear<B>,
    /// Norm of `c_kv`, weight `[L]`.
    pub kv_a_norm: RmsNorm<B>,
    /// `W_UK` transposed per head: `[H, L, dn]`.
    pub w_uk_t: B::Tensor,
    /// `W_UV` per head: `[H, dv, L]`.
    pub w_uv: B::Tensor,
    /// `[D, H·dv]`, row-parallel.
    pub o_proj: RowLinear<B>,
    /// Softmax scale τ.
    pub scale: f32,
    /// DeepSeek-V3.2's lightning indexer: attend only to its top-k keys (sparse MLA).
    pub indexer: Option<super::DsaIndexer<B>>,
    /// The expanded-form weights for long prefills ([`super::mla_expanded`]), when enabled.
    pub expanded: Option<super::MlaExpanded<B>>,
}

/// How an MLA layer picks its keys beyond [`Mla::indexer`].
pub enum MlaSparse<B: Backend> {
    /// By its own `indexer` (DeepSeek-V3.2), or dense without one.
    Own,
    /// GLM-5.3-Flash's pooled indexer (pools of keys plus the tail).
    Pooled(super::PooledDsaIndexer<B>),
    /// The previous layer's selection (GLM-5.3-Flash `shared` indexer layers).
    Shared,
}

/// What a sparse MLA layer selected: `None` dense, `Some([N, k] u32)` the attended positions.
pub type Selection<B> = Option<<B as Backend>::Tensor>;

/// Rows `[start, start + len)` of each of `groups` consecutive blocks of `stride` rows.
fn rows_of(
    t: &HostTensor,
    groups: usize,
    stride: usize,
    start: usize,
    len: usize,
) -> Result<HostTensor> {
    let cols = t.shape[1];
    let es = t.dtype.size();
    let mut data = Vec::with_capacity(groups * len * cols * es);
    for g in 0..groups {
        let a = (g * stride + start) * cols * es;
        data.extend_from_slice(&t.data[a..a + len * cols * es]);
    }
    HostTensor::new(vec![groups * len, cols], t.dtype, data)
}

impl<B: Backend> Mla<B> {
    /// Loads `{prefix}.{q_a_proj,q_a_layernorm,q_b_proj | q_proj, kv_a_proj_with_mqa,
    /// kv_a_layernorm, kv_b_proj, o_proj}`. `eps` is the latent norms' epsilon (transformers
    /// builds them with its default 1e-6, not `rms_norm_eps`). `s` is the whole layer's shape;
    /// over several ranks this rank keeps `heads / world` heads of `W_qb`, `W_kvb` and `W_o`
    /// and all of the latent projections (the latent cache is replicated, as in vLLM).
    ///
    /// Errors: missing or misshapen tensors; heads that do not split over the ranks.
    pub fn load(
        w: &WeightLoader<B>,
        prefix: &str,
        s: MlaShape,
        eps: f64,
        scale: f32,
    ) -> Result<Self> {
        let par = w.parallel();
        if !s.heads.is_multiple_of(par.world()) {
            anyhow::bail!(
                "{prefix}: {} MLA heads do not split over tensor_parallel_size {}",
                s.heads,
                par.world()
            );
        }
        let h = s.heads / par.world();
        let heads = par.split(0);
        let qk = s.nope_dim + s.rope_dim;
        let (q_a, q_in, q_name) = match s.q_lora_rank {
            Some(r) => (
                Some((
                    Linear::load(w, &format!("{prefix}.q_a_proj"), r, s.hidden, false)?,
                    RmsNorm::load(w, &format!("{prefix}.q_a_layernorm"), r, eps)?,
                )),
                r,
                format!("{prefix}.q_b_proj.weight"),
            ),
            None => (None, s.hidden, format!("{prefix}.q_proj.weight")),
        };
        let q = w.host_split(&q_name, &[s.heads * qk, q_in], heads)?;
        let kva = w.host(
            &format!("{prefix}.kv_a_proj_with_mqa.weight"),
            &[s.kv_lora_rank + s.rope_dim, s.hidden],
        )?;
        let kvb = w.host_split_f32(
            &format!("{prefix}.kv_b_proj.weight"),
            &[s.heads * (s.nope_dim + s.v_dim), s.kv_lora_rank],
            heads,
        )?;
        let kvb = kvb.to_f32();
        let (l, dn, dv) = (s.kv_lora_rank, s.nope_dim, s.v_dim);
        let mut uk_t = vec![0f32; h * l * dn];
        let mut uv = vec![0f32; h * dv * l];
        for hh in 0..h {
            let base = hh * (dn + dv);
            for i in 0..dn {
                for j in 0..l {
                    uk_t[(hh * l + j) * dn + i] = kvb[(base + i) * l + j];
                }
            }
            for i in 0..dv {
                let src = (base + dn + i) * l;
                uv[(hh * dv + i) * l..(hh * dv + i + 1) * l].copy_from_slice(&kvb[src..src + l]);
            }
        }
        // Auto: only where the backend runs the expanded attention natively (else the weights
        // would sit unused).
        let act = w.backend().activation_dtype(w.dtype());
        let native = w
            .backend()
            .attention_varlen_native(act, dn + s.rope_dim, dv);
        let any_backend = matches!(w.mla_prefill(), super::MlaPrefill::Expanded { .. });
        let expanded = match w
            .mla_prefill()
            .min_tokens()
            .filter(|_| native || any_backend)
        {
            Some(min_tokens) => {
                let (wq, wk, wv) =
                    super::mla_expanded::expanded_weights(&q, &kvb, (h, dn, s.rope_dim, dv, l))?;
                let up = |t: HostTensor| -> Result<Linear<B>> {
                    Ok(Linear {
                        weight: Weight::Dense(w.upload(t)?),
                        bias: None,
                    })
                };
                Some(super::MlaExpanded {
                    w_q: up(wq)?,
                    w_k: up(wk)?,
                    w_v: up(wv)?,
                    min_tokens,
                    any_backend,
                })
            }
            None => None,
        };
        let lin = |t: HostTensor| -> Result<Linear<B>> {
            Ok(Linear {
                weight: Weight::Dense(w.upload(t)?),
                bias: None,
            })
        };
        Ok(Self {
            shape: MlaShape { heads: h, ..s },
            q_a,
            q_nope: lin(rows_of(&q, h, qk, 0, dn)?)?,
            q_pe: lin(rows_of(&q, h, qk, dn, s.rope_dim)?)?,
            kv_a: lin(rows_of(&kva, 1, 0, 0, l)?)?,
            k_pe: lin(rows_of(&kva, 1, 0, l, s.rope_dim)?)?,
            kv_a_norm: RmsNorm::load(w, &format!("{prefix}.kv_a_layernorm"), l, eps)?,
            w_uk_t: w.upload(HostTensor::from_f32(vec![h, l, dn], &uk_t)?)?,
            w_uv: w.upload(HostTensor::from_f32(vec![h, dv, l], &uv)?)?,
            o_proj: RowLinear::load(
                w,
                &format!("{prefix}.o_proj"),
                s.hidden,
                s.heads * dv,
                false,
            )?,
            scale,
            indexer: None,
            expanded,
        })
    }

    /// `x` `[N, D]` → `[N, D]`; writes `[c_kv | k_pe]` of this step into `cache` `[blocks, bs, L+R]`.
    /// `rope: None` is Kimi-Linear's NoPE MLA (the `k_pe` part stays unrotated). With an indexer,
    /// its keys go to `index_cache` `[blocks, bs, d]` and attention is sparse.
    pub fn forward(
        &self,
        b: &B,
        x: &B::Tensor,
        rope: Option<&Rope<B>>,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &B::Tensor,
        index_cache: Option<&B::Tensor>,
    ) -> Result<B::Tensor> {
        let sparse = MlaSparse::Own;
        let (y, _) = self.forward_sparse(b, x, rope, meta, cache, index_cache, &sparse, None)?;
        Ok(y)
    }

    /// This step's new latent cache rows of `x` `[N, D]`: `c_kv` `[N, L]` (normed) and `k_pe`
    /// `[N, R]` (rotated unless NoPE), which [`Mla::forward_sparse`] writes at columns `0` and
    /// `L` (context parallelism gathers them from every rank first).
    pub fn latent_rows(
        &self,
        b: &B,
        x: &B::Tensor,
        rope: Option<&Rope<B>>,
        meta: &DeviceStepMeta<B::Tensor>,
    ) -> Result<(B::Tensor, B::Tensor)> {
        let [c_kv, k_pe] = Linear::forward_n(b, x, [&self.kv_a, &self.k_pe])?;
        self.latent_rows_of(b, c_kv, k_pe, rope, meta)
    }

    /// [`Mla::latent_rows`] from the projections `c_kv` `[N, L]` (not yet normed) and `k_pe`
    /// `[N, R]` (not yet rotated).
    fn latent_rows_of(
        &self,
        b: &B,
        c_kv: B::Tensor,
        k_pe: B::Tensor,
        rope: Option<&Rope<B>>,
        meta: &DeviceStepMeta<B::Tensor>,
    ) -> Result<(B::Tensor, B::Tensor)> {
        let (n, r) = (meta.host.num_tokens(), self.shape.rope_dim);
        let c_kv = self.kv_a_norm.forward(b, &c_kv)?;
        let k_pe = b.reshape(&k_pe, &[n, 1, r])?;
        let k_pe = match rope {
            Some(rope) => rope.forward(b, &k_pe, &meta.positions)?,
            None => k_pe,
        };
        Ok((c_kv, b.reshape(&k_pe, &[n, r])?))
    }

    /// [`Mla::forward`] with the key choice `sparse`: `prev` is the previous layer's selection
    /// (read by [`MlaSparse::Shared`]); the second result is this layer's selection when it ran
    /// an indexer (its own or the pooled one).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_sparse(
        &self,
        b: &B,
        x: &B::Tensor,
        rope: Option<&Rope<B>>,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &B::Tensor,
        index_cache: Option<&B::Tensor>,
        sparse: &MlaSparse<B>,
        prev: Option<&Selection<B>>,
    ) -> Result<(B::Tensor, Option<Selection<B>>)> {
        let s = self.shape;
        let n = meta.host.num_tokens();
        // The projections of x at once (one decode GEMV launch on CUDA). Without a query
        // low-rank (Kimi-Linear) the queries are projections of x too, taken in the same call
        // where the absorbed form will use them.
        let mut projs = vec![&self.kv_a, &self.k_pe];
        if let Some((proj, _)) = &self.q_a {
            projs.push(proj);
        }
        let queries_of_x = self.q_a.is_none() && !self.expands(b, x, meta);
        if queries_of_x {
            projs.extend([&self.q_nope, &self.q_pe]);
        }
        let mut ys = Linear::forward_many(b, x, &projs)?.into_iter();
        let mut next = || {
            ys.next()
                .ok_or_else(|| anyhow::anyhow!("linear_many: too few outputs"))
        };
        let (c_kv, k_pe) = (next()?, next()?);
        let cq = match &self.q_a {
            Some((_, norm)) => norm.forward(b, &next()?)?,
            None => x.clone(),
        };
        let queries = if queries_of_x {
            Some((next()?, next()?))
        } else {
            None
        };
        let (c_kv, k_pe) = self.latent_rows_of(b, c_kv, k_pe, rope, meta)?;
        b.write_cache(&c_kv, cache, 0, meta)?;
        b.write_cache(&k_pe, cache, s.kv_lora_rank, meta)?;
        let need_cache =
            || anyhow::anyhow!("an MLA layer with a DSA indexer needs its indexer key cache");
        let selected: Option<Selection<B>> = if let Some(ix) = &self.indexer {
            Some(ix.select(b, x, &cq, meta, index_cache.ok_or_else(need_cache)?)?)
        } else if let MlaSparse::Pooled(ix) = sparse {
            Some(ix.select(b, x, &cq, meta, index_cache.ok_or_else(need_cache)?)?)
        } else {
            None
        };
        let attend = if let MlaSparse::Shared = sparse {
            match prev {
                Some(sel) => sel.clone(),
                None => anyhow::bail!(
                    "a shared-indexer MLA layer needs the selection of a preceding indexer layer"
                ),
            }
        } else {
            selected.clone().flatten()
        };
        let o = if attend.is_none() && self.expands(b, &cq, meta) {
            self.expanded_attention(b, &cq, rope, meta, cache)?
        } else {
            let (q_nope, q_pe) = match queries {
                Some(q) => q,
                None => (self.q_nope.forward(b, &cq)?, self.q_pe.forward(b, &cq)?),
            };
            let q_nope = b.reshape(&q_nope, &[n, s.heads, s.nope_dim])?;
            let q_pe = b.reshape(&q_pe, &[n, s.heads, s.rope_dim])?;
            let q_pe = match rope {
                Some(r) => r.forward(b, &q_pe, &meta.positions)?,
                None => q_pe,
            };
            let q_lat = b.head_linear(&q_nope, &self.w_uk_t)?;
            let o_lat = match &attend {
                Some(sel) => {
                    b.sparse_latent_attention(&q_lat, &q_pe, cache, meta, self.scale, sel)?
                }
                None => b.paged_latent_attention(&q_lat, &q_pe, cache, meta, self.scale)?,
            };
            b.head_linear(&o_lat, &self.w_uv)?
        };
        let y = self
            .o_proj
            .forward(b, &b.reshape(&o, &[n, s.heads * s.v_dim])?)?;
        Ok((y, selected))
    }
}
