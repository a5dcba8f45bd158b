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
//! `k_pe`, and `q·k` is the absorbed score in real arithmetic. The context is never expanded at
//! once: keys and values are rebuilt one segment of at most ≈ 1 GiB at a time, and
//! [`Backend::attention_varlen`] carries the softmax state from segment to segment (vLLM's
//! chunked-context MLA prefill with `merge_attn_states`; FlashAttention-2 §3.1).

use super::{Linear, Mla};
use anyhow::Result;
use dayone_backend::varlen::upload_varlen_keys;
use dayone_backend::{
    Backend, DeviceStepMeta, HostTensor, StepMeta, TensorInfo, VarlenMeta, VarlenResult,
};

/// Which form MLA layers compute prefill steps in (decode steps below the threshold always take
/// the absorbed form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MlaPrefill {
    /// Always the absorbed form.
    Absorbed,
    /// The expanded form for steps of at least `min_tokens` new tokens where the backend runs
    /// [`Backend::attention_varlen`] natively for the layer's head dims and dtype (the default).
    Auto {
        /// New tokens per step from which the expanded form is taken.
        min_tokens: usize,
    },
    /// The expanded form for steps of at least `min_tokens` new tokens on every backend (through
    /// the host default where no kernel exists): comparisons and tests.
    Expanded {
        /// New tokens per step from which the expanded form is taken.
        min_tokens: usize,
    },
}

impl MlaPrefill {
    /// Default threshold: below ≈ 240 new tokens rebuilding keys from the latent (2·(L+R)·H·(dk+dv)
    /// FLOPs per key) costs more than the absorbed form's extra 2·H·(L+R+L−dk−dv) FLOPs per
    /// (query, key) saves (DeepSeek/Kimi widths).
    pub const DEFAULT_MIN_TOKENS: usize = 256;

    /// The threshold, or `None` for [`MlaPrefill::Absorbed`].
    pub fn min_tokens(self) -> Option<usize> {
        match self {
            MlaPrefill::Absorbed => None,
            MlaPrefill::Auto { min_tokens } | MlaPrefill::Expanded { min_tokens } => {
                Some(min_tokens)
            }
        }
    }
}

impl Default for MlaPrefill {
    fn default() -> Self {
        MlaPrefill::Auto {
            min_tokens: Self::DEFAULT_MIN_TOKENS,
        }
    }
}

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
    /// Also where the backend has no native [`Backend::attention_varlen`] ([`MlaPrefill::Expanded`]).
    pub any_backend: bool,
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

/// Bytes of rebuilt keys and values one segment may hold (the transient memory of the form).
const SEGMENT_BYTES: usize = 1 << 30;

/// Cuts the step's contexts into key segments of at most `max_rows` rows: each segment is a list
/// of `(sequence, first position, end position)`, at most one range per sequence, together
/// covering positions `0..seq_lens[s]` of every sequence once.
fn key_segments(seq_lens: &[u32], max_rows: usize) -> Vec<Vec<(usize, usize, usize)>> {
    let mut segs = Vec::new();
    let mut cur = Vec::new();
    let mut room = max_rows;
    for (s, &len) in seq_lens.iter().enumerate() {
        let mut p = 0;
        while p < len as usize {
            let take = room.min(len as usize - p);
            cur.push((s, p, p + take));
            p += take;
            room -= take;
            if room == 0 {
                segs.push(std::mem::take(&mut cur));
                room = max_rows;
            }
        }
    }
    if !cur.is_empty() || segs.is_empty() {
        segs.push(cur);
    }
    segs
}

/// Cache slots of one segment's keys (in segment row order) and its [`VarlenMeta`].
fn segment_layout(m: &StepMeta, seg: &[(usize, usize, usize)]) -> (Vec<u32>, VarlenMeta) {
    let bs = m.block_size;
    let ns = m.num_seqs();
    let mut rows = Vec::new();
    let mut key_start = vec![0u32; ns + 1];
    let mut key_pos0 = vec![0u32; ns];
    let mut range = vec![None; ns];
    for &(s, a, e) in seg {
        range[s] = Some((a, e));
    }
    for s in 0..ns {
        if let Some((a, e)) = range[s] {
            key_pos0[s] = a as u32;
            rows.extend(
                (a..e).map(|p| {
                    m.block_tables[s * m.max_blocks + p / bs] * bs as u32 + (p % bs) as u32
                }),
            );
        }
        key_start[s + 1] = rows.len() as u32;
    }
    let meta = VarlenMeta {
        query_start: m.query_start.clone(),
        key_start,
        key_pos0,
        positions: m.positions.clone(),
        causal: true,
    };
    (rows, meta)
}

impl<B: Backend> Mla<B> {
    /// Whether this step's attention takes the expanded form: enough new tokens, and a native
    /// kernel for `cq`'s dtype unless [`MlaPrefill::Expanded`] asked for every backend. `Auto`
    /// never expands in batch-invariant mode, where a token's result must not depend on how many
    /// tokens share its step (the form is chosen by that count).
    pub(super) fn expands(&self, b: &B, cq: &B::Tensor, meta: &DeviceStepMeta<B::Tensor>) -> bool {
        let s = self.shape;
        self.expanded.as_ref().is_some_and(|e| {
            meta.host.num_tokens() >= e.min_tokens
                && (e.any_backend
                    || !b.batch_invariant()
                        && b.attention_varlen_native(cq.dtype(), s.nope_dim + s.rope_dim, s.v_dim))
        })
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
        let Some(e) = self.expanded.as_ref() else {
            anyhow::bail!("this MLA layer has no expanded-form weights (MlaPrefill::Absorbed)");
        };
        let s = self.shape;
        let (h, dn, r, dv) = (s.heads, s.nope_dim, s.rope_dim, s.v_dim);
        let n = meta.host.num_tokens();
        let q = b.reshape(&e.w_q.forward(b, cq)?, &[n, h, r + dn])?;
        let q = match rope {
            Some(rp) => rp.forward(b, &q, &meta.positions)?,
            None => q,
        };
        let width = cache.shape().iter().skip(2).product::<usize>();
        let slots = cache.shape()[0] * cache.shape()[1];
        let flat = b.reshape(cache, &[slots, width])?;
        let row_bytes = h * (r + dn + dv) * q.dtype().size();
        let max_rows = (SEGMENT_BYTES / row_bytes.max(1)).max(meta.host.block_size);
        let segs = key_segments(&meta.host.seq_lens, max_rows);
        let last = segs.len() - 1;
        let mut state: Option<(B::Tensor, B::Tensor)> = None;
        for (i, seg) in segs.iter().enumerate() {
            let (rows, layout) = segment_layout(&meta.host, seg);
            let m = rows.len();
            let ids = b.upload(&HostTensor::from_u32(vec![m], &rows)?)?;
            let lat = b.embedding(&flat, &ids)?;
            let k = b.reshape(&e.w_k.forward(b, &lat)?, &[m, h, r + dn])?;
            let v = b.reshape(&e.w_v.forward(b, &lat)?, &[m, h, dv])?;
            // The step's query offsets and positions are on the device already.
            let queries = (meta.query_start.clone(), meta.positions.clone());
            let vm = upload_varlen_keys(b, layout, queries, n, m)?;
            let prior = state.as_ref().map(|(o, l)| (o, l));
            match b.attention_varlen(&q, &k, &v, &vm, self.scale, prior, i == last)? {
                VarlenResult::Final(o) => return Ok(o),
                VarlenResult::State { o, lse } => state = Some((o, lse)),
            }
        }
        anyhow::bail!("attention_varlen returned a state for the last key segment")
    }
}

#[cfg(test)]
mod tests {
    use super::key_segments;

    #[test]
    fn segments_cover_every_position_once_within_the_budget() {
        let lens = [5u32, 0, 17, 3];
        for max in [1, 4, 16, 64] {
            let segs = key_segments(&lens, max);
            let mut seen = vec![vec![0u8; 17]; 4];
            for seg in &segs {
                assert!(seg.iter().map(|&(_, a, e)| e - a).sum::<usize>() <= max);
                let mut seqs: Vec<usize> = seg.iter().map(|x| x.0).collect();
                seqs.dedup();
                assert_eq!(seqs.len(), seg.len(), "one range per sequence and segment");
                for &(s, a, e) in seg {
                    (a..e).for_each(|p| seen[s][p] += 1);
                }
            }
            for (s, &len) in lens.iter().enumerate() {
                assert!(
                    seen[s][..len as usize].iter().all(|&c| c == 1),
                    "max {max} seq {s}"
                );
            }
        }
        assert_eq!(key_segments(&[], 8).len(), 1);
    }
}
