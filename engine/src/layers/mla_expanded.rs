//! MLA prefill in the expanded form (DeepSeek-V2 report §2.1.2; vLLM's MLA prefill path): per
//! head, keys `[k_pe | W_UK,h c_kv]` and values `W_UV,h c_kv` are rebuilt from the latent cache
//! and attended as ordinary multi-head attention. The absorbed form ([`super::Mla`]) scores
//! 576-wide latents against every query head; the expanded one needs about a third of the
//! FLOPs per query once many queries share the keys, so long prefills take it and decode keeps
//! the absorbed form.
//!
//! ```text
//! lat   = cache[slots of every sequence's positions 0..len]        [T, L + R]   (row gather)
//! K     = lat · W_Kᵀ     W_K rows per head: [0 | I_R] (k_pe), [W_UK,h | 0]   [T, H, R + dn]
//! V     = lat · W_Vᵀ     W_V rows per head: [W_UV,h | 0]                        [T, H, dv]
//! q     = RoPE_R(cq · W_qᵀ)   W_q rows per head: q_pe rows then q_nope rows     [N, H, R + dn]
//! o     = paged_attention(q, K, V)  (K and V laid out as blocks of the step's sequences)
//! ```
//! The selection rows are exact (products by 1 and 0), so `K`'s rotary part is the cached
//! `k_pe`, and `q·k` is the absorbed score in real arithmetic. `K` and `V` for the whole context
//! of the step's sequences exist for the duration of one layer.

use super::{Linear, Mla};
use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, HostTensor, StepMeta, TensorInfo};

/// The expanded-form weights of one MLA layer (this rank's heads).
pub struct MlaExpanded<B: Backend> {
    /// `[H·(R + dn), q_in]`: per head the `q_pe` rows, then the `q_nope` rows.
    pub w_q: Linear<B>,
    /// `[H·(R + dn), L + R]`.
    pub w_k: Linear<B>,
    /// `[H·dv, L + R]`.
    pub w_v: Linear<B>,
    /// Steps with at least this many new tokens take the expanded form.
    pub min_tokens: usize,
}

/// Builds the expanded weights from the layer's `q` rows (`[H·(dn+R), q_in]`, per head
/// `[nope | pe]`) and `W_kvb` (`[H·(dn+dv), L]` f32, per head `[W_UK | W_UV]`), in `dtype`.
pub fn expanded_weights(
    q: &HostTensor,
    kvb: &[f32],
    (h, dn, r, dv, l): (usize, usize, usize, usize, usize),
) -> Result<(HostTensor, HostTensor, HostTensor)> {
    let q_in = q.shape[1];
    let qf = q.to_f32();
    let mut wq = Vec::with_capacity(h * (r + dn) * q_in);
    for hh in 0..h {
        let base = hh * (dn + r);
        for row in (base + dn..base + dn + r).chain(base..base + dn) {
            wq.extend_from_slice(&qf[row * q_in..(row + 1) * q_in]);
        }
    }
    let w = l + r;
    let mut wk = vec![0f32; h * (r + dn) * w];
    let mut wv = vec![0f32; h * dv * w];
    for hh in 0..h {
        let out = hh * (r + dn);
        for i in 0..r {
            wk[(out + i) * w + l + i] = 1.0;
        }
        let src = hh * (dn + dv);
        for i in 0..dn {
            wk[(out + r + i) * w..(out + r + i) * w + l]
                .copy_from_slice(&kvb[(src + i) * l..(src + i + 1) * l]);
        }
        for i in 0..dv {
            wv[(hh * dv + i) * w..(hh * dv + i) * w + l]
                .copy_from_slice(&kvb[(src + dn + i) * l..(src + dn + i + 1) * l]);
        }
    }
    Ok((
        HostTensor::from_f32_as(vec![h * (r + dn), q_in], &wq, q.dtype)?,
        HostTensor::from_f32_as(vec![h * (r + dn), w], &wk, q.dtype)?,
        HostTensor::from_f32_as(vec![h * dv, w], &wv, q.dtype)?,
    ))
}

/// The step's sequences laid out contiguously for the expanded keys: the latent cache slots to
/// gather (each sequence padded to whole blocks) and the step's metadata over that layout.
fn context_layout(m: &StepMeta) -> (Vec<u32>, StepMeta) {
    let bs = m.block_size;
    let mut rows = Vec::new();
    let mut tables = Vec::new();
    let mut first_block = Vec::with_capacity(m.num_seqs());
    let nbs: Vec<usize> = m
        .seq_lens
        .iter()
        .map(|&n| (n as usize).div_ceil(bs).max(1))
        .collect();
    let max_blocks = nbs.iter().copied().max().unwrap_or(1);
    for (s, &nb) in nbs.iter().enumerate() {
        let b0 = rows.len() / bs;
        first_block.push(b0);
        let len = m.seq_lens[s] as usize;
        let slot =
            |p: usize| m.block_tables[s * m.max_blocks + p / bs] * bs as u32 + (p % bs) as u32;
        for p in 0..nb * bs {
            // Padding rows repeat a real slot; attention never reads past `len`.
            rows.push(slot(if p < len { p } else { 0 }));
        }
        let mut t: Vec<u32> = (b0..b0 + nb).map(|b| b as u32).collect();
        t.resize(max_blocks, b0 as u32);
        tables.extend(t);
    }
    let slot_mapping = m
        .positions
        .iter()
        .zip(&m.token_seq)
        .map(|(&p, &s)| ((first_block[s as usize] * bs) + p as usize) as u32)
        .collect();
    let meta = StepMeta {
        slot_mapping,
        block_tables: tables,
        max_blocks,
        ..m.clone()
    };
    (rows, meta)
}

impl<B: Backend> Mla<B> {
    /// Whether this step's attention takes the expanded form.
    pub(super) fn expands(&self, meta: &DeviceStepMeta<B::Tensor>) -> bool {
        self.expanded
            .as_ref()
            .is_some_and(|e| meta.host.num_tokens() >= e.min_tokens)
    }

    /// Attention output `[N, H, dv]` of the step in the expanded form (module doc); `cq` is the
    /// query input `[N, q_in]`, `cache` the latent cache `[blocks, bs, L + R]` with this step's
    /// latents already written.
    pub(super) fn expanded_attention(
        &self,
        b: &B,
        cq: &B::Tensor,
        rope: Option<&super::Rope<B>>,
        meta: &DeviceStepMeta<B::Tensor>,
        cache: &B::Tensor,
    ) -> Result<B::Tensor> {
        let e = self.expanded.as_ref().expect("checked by expands");
        let s = self.shape;
        let (h, dn, r, dv) = (s.heads, s.nope_dim, s.rope_dim, s.v_dim);
        let n = meta.host.num_tokens();
        let q = b.reshape(&e.w_q.forward(b, cq)?, &[n, h, r + dn])?;
        let q = match rope {
            Some(rp) => rp.forward(b, &q, &meta.positions)?,
            None => q,
        };
        let (rows, layout) = context_layout(&meta.host);
        let bs = layout.block_size;
        let width = cache.shape().iter().skip(2).product::<usize>();
        let slots = cache.shape()[0] * cache.shape()[1];
        let flat = b.reshape(cache, &[slots, width])?;
        let ids = b.upload(&HostTensor::from_u32(vec![rows.len()], &rows)?)?;
        let lat = b.embedding(&flat, &ids)?;
        let blocks = rows.len() / bs;
        let k = b.reshape(&e.w_k.forward(b, &lat)?, &[blocks, bs, h, r + dn])?;
        let v = b.reshape(&e.w_v.forward(b, &lat)?, &[blocks, bs, h, dv])?;
        let m2 = b.upload_meta(layout)?;
        b.paged_attention(&q, &k, &v, &m2, self.scale)
    }
}
