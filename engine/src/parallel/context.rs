//! Context parallelism (CP) for long prefills: every rank holds the whole model and the whole
//! cache, and a step of many tokens is cut into one contiguous slice per rank, which that rank
//! carries through the whole network (Megatron-LM's context parallelism, vLLM's prefill CP,
//! shared/docs/multigpu-perf.md §B; the keys are all-gathered rather than passed in a ring).
//!
//! Per layer kind:
//! - softmax attention, MLA (and the DSA indexer's keys): each rank computes its slice's new
//!   key rows (`k`, `v`; the latent `[c_kv | k_pe]`; indexer keys), an all-gather of unequal
//!   row counts ([`Comm::all_gather_rows`]) gives every rank the step's rows, which it writes
//!   into its own paged cache with the whole step's slot mapping; then the layer runs
//!   unchanged on the rank's queries, whose causal keys (earlier ranks' included) are there.
//! - KDA: the recurrent state and short-convolution history after rank `r − 1`'s slice are the
//!   initial state of rank `r`'s: the ranks run the layer in turn, each broadcasting its
//!   sequences' state rows after its slice, so every rank ends the layer with the state after
//!   the whole step (as one rank would). Cost: the KDA layers of a step take as long as on one
//!   rank (the slices run one after another; the other layers run in parallel), plus `world`
//!   broadcasts of `S · (H·K·V + 3·C·(W−1))` f32 per KDA layer (2.1 MiB per sequence at the
//!   Kimi-Linear-48B shape), a host round trip each (`read_rows`/`write_rows`).
//! - norms, MLP, MoE, hyper-connections: token-local, nothing to exchange.
//! - the LM head: each rank computes the logits rows of its own tokens (the last token of a
//!   prompt lives on the last rank), all-gathered in the step's row order.
//!
//! The split is contiguous, equal token counts per rank, each cut moved back to a position the
//! recurrent kernels split at bit-exactly ([`dayone_backend::Backend::recurrent_split_alignment`])
//! where one lies in the slice. Contiguous rather than zig-zag (rank `r` taking chunks `r` and
//! `2w−1−r`): it balances the token-linear work (projections, experts: most of the FLOPs up to
//! tens of thousands of tokens), keeps one slice per rank so the KDA chain has `world` links,
//! not `2·world`, and keeps each rank's queries of a sequence contiguous as every attention
//! kernel expects. The price: causal attention work grows along the prompt, so rank `r` does
//! `(2r+1)/w²` of it (the last rank `(2w−1)/w²`, nearly twice its share); zig-zag would
//! balance that at very long contexts.
//!
//! Steps of fewer than `max(min_tokens, world)` tokens (decode, short prompts) are not split:
//! every rank computes all of them, which keeps the caches identical and decode as fast as on
//! one device. Every rank holds the whole cache, so any rank can serve the decode that follows.

use anyhow::{bail, ensure, Result};
use dayone_backend::comm::Comm;
use dayone_backend::{Backend, DeviceStepMeta, HostTensor, StepMeta, TensorInfo};
use std::ops::Range;
use std::sync::Arc;

/// A model's context-parallel ranks and when to split a step over them.
pub struct ContextParallel<B: Backend> {
    comm: Arc<dyn Comm<B>>,
    /// Steps of fewer tokens than this (or than the ranks) run whole on every rank.
    min_tokens: usize,
    /// Cuts go at positions that are multiples of this when the slice has one.
    align: usize,
}

/// One step split over the ranks: this rank's slice and what the layers exchange.
pub struct CpStep<'a, B: Backend> {
    comm: Arc<dyn Comm<B>>,
    /// The whole step's metadata (the cache writes of the gathered rows).
    pub full: &'a DeviceStepMeta<B::Tensor>,
    /// This rank's slice as a step of its own ([`local_meta`]).
    pub local: DeviceStepMeta<B::Tensor>,
    /// This rank's tokens `[start, end)` of the step.
    pub range: Range<usize>,
    /// Tokens of each rank.
    counts: Vec<usize>,
    /// Logits rows of each rank.
    logit_counts: Vec<usize>,
    /// Row `i` of the step's logits is row `logit_order[i]` of the gathered rows, when that
    /// is not the identity.
    logit_order: Option<Vec<u32>>,
    /// The step's recurrent-state slots, each once.
    slots: Vec<u32>,
}

impl<B: Backend> ContextParallel<B> {
    /// The ranks of `comm`; steps of at least `max(min_tokens, world)` tokens are split, with
    /// cuts at multiples of `align` positions where a slice has one.
    pub fn new(comm: Arc<dyn Comm<B>>, min_tokens: usize, align: usize) -> Self {
        Self {
            comm,
            min_tokens,
            align: align.max(1),
        }
    }

    /// Ranks.
    pub fn world(&self) -> usize {
        self.comm.world()
    }

    /// How this rank takes part in the step `meta`: `None` when the step runs whole on every
    /// rank. Errors: a step whose sequences' tokens are not contiguous.
    pub fn plan<'a>(
        &self,
        b: &B,
        meta: &'a DeviceStepMeta<B::Tensor>,
    ) -> Result<Option<CpStep<'a, B>>> {
        let host = &meta.host;
        let (n, w) = (host.num_tokens(), self.world());
        if w == 1 || n < self.min_tokens.max(w) {
            return Ok(None);
        }
        let ranges = split_tokens(host, w, self.align);
        let range = ranges[self.comm.rank()].clone();
        let local = b.upload_meta(local_meta(host, range.clone())?)?;
        let counts = ranges.iter().map(|r| r.len()).collect();
        // The gathered logits come rank by rank, each rank's rows in the step's row order.
        let owner = |row: u32| ranges.iter().position(|r| r.contains(&(row as usize)));
        let mut gathered: Vec<usize> = (0..host.logit_rows.len()).collect();
        gathered.sort_by_key(|&i| owner(host.logit_rows[i]));
        let logit_counts = (0..w)
            .map(|r| {
                host.logit_rows
                    .iter()
                    .filter(|&&row| owner(row) == Some(r))
                    .count()
            })
            .collect();
        let logit_order = gathered.iter().enumerate().any(|(i, &g)| i != g).then(|| {
            let mut order = vec![0u32; gathered.len()];
            for (pos, &i) in gathered.iter().enumerate() {
                order[i] = pos as u32;
            }
            order
        });
        let mut slots = host.state_slots.clone();
        slots.sort_unstable();
        slots.dedup();
        Ok(Some(CpStep {
            comm: self.comm.clone(),
            full: meta,
            local,
            range,
            counts,
            logit_counts,
            logit_order,
            slots,
        }))
    }
}

/// The step's tokens cut into `world` contiguous slices of (nearly) equal counts; a cut moves
/// back, by at most half a slice, to the nearest token that starts a sequence's part of the
/// step or sits at a multiple of `align` positions. Needs `num_tokens ≥ world` (every slice
/// non-empty).
pub fn split_tokens(meta: &StepMeta, world: usize, align: usize) -> Vec<Range<usize>> {
    let n = meta.num_tokens();
    let clean = |t: usize| {
        t == 0
            || meta.token_seq[t] != meta.token_seq[t - 1]
            || (meta.positions[t] as usize).is_multiple_of(align.max(1))
    };
    let mut cuts = vec![0usize];
    for r in 1..world {
        let target = r * n / world;
        // At most half a slice back, and never onto the previous cut.
        let lowest = (*cuts.last().unwrap_or(&0) + 1).max(target - n / world / 2);
        let cut = (lowest..=target)
            .rev()
            .find(|&t| clean(t))
            .unwrap_or(target);
        cuts.push(cut);
    }
    cuts.push(n);
    cuts.windows(2).map(|c| c[0]..c[1]).collect()
}

/// Tokens `range` of the step `meta` as a step of their own: their positions, sequences and
/// slots; the sequences they touch (others left out) with their block tables, state slots and
/// whole-step lengths (the cache holds the whole step's rows before attention reads it);
/// `query_start` over the slice; the logits rows inside it. `max_seq_len` stays the whole
/// step's, so choices made from it (a sliding window, dense or sparse DSA) are the same on
/// every rank as on one. Errors: a sequence whose tokens are not contiguous in the step.
pub fn local_meta(meta: &StepMeta, range: Range<usize>) -> Result<StepMeta> {
    let mb = meta.max_blocks;
    let mut m = StepMeta {
        max_blocks: mb,
        block_size: meta.block_size,
        max_seq_len: meta.max_seq_len,
        query_start: vec![0],
        ..Default::default()
    };
    let mut last: Option<u32> = None;
    let mut seen = Vec::new();
    for t in range.clone() {
        let s = meta.token_seq[t];
        if last != Some(s) {
            ensure!(
                !seen.contains(&s),
                "context parallelism: sequence {s}'s tokens are not contiguous in the step"
            );
            seen.push(s);
            if last.is_some() {
                m.query_start.push(m.positions.len() as u32);
            }
            let si = s as usize;
            m.block_tables
                .extend_from_slice(&meta.block_tables[si * mb..(si + 1) * mb]);
            m.seq_lens.push(meta.seq_lens[si]);
            if let Some(&slot) = meta.state_slots.get(si) {
                m.state_slots.push(slot);
            }
            last = Some(s);
        }
        m.positions.push(meta.positions[t]);
        m.token_seq.push(seen.len() as u32 - 1);
        m.slot_mapping.push(meta.slot_mapping[t]);
    }
    m.query_start.push(m.positions.len() as u32);
    m.logit_rows = meta
        .logit_rows
        .iter()
        .filter(|&&r| range.contains(&(r as usize)))
        .map(|&r| r - range.start as u32)
        .collect();
    Ok(m)
}

impl<B: Backend> CpStep<'_, B> {
    /// This rank's token ids out of the step's `ids` `[N]` u32.
    pub fn local_ids(&self, b: &B, ids: &B::Tensor) -> Result<B::Tensor> {
        let all = b.download(ids)?.to_u32()?;
        ensure!(
            all.len() == self.full.host.num_tokens(),
            "context parallelism: {} ids for a step of {} tokens",
            all.len(),
            self.full.host.num_tokens()
        );
        let mine = &all[self.range.clone()];
        b.upload(&HostTensor::from_u32(vec![mine.len()], mine)?)
    }

    /// Every rank's token rows `[n_r, ...]` stacked into the step's `[N, ...]`.
    pub fn gather_tokens(&self, b: &B, x: &B::Tensor) -> Result<B::Tensor> {
        self.comm.all_gather_rows(b, x, &self.counts)
    }

    /// Stores every rank's new keys and values of a softmax-attention layer (`k` `[n_r, Hkv,
    /// hd_k]`, `v` `[n_r, Hkv, hd_v]` of this rank) in the paged caches, as
    /// [`Backend::write_kv`] with the whole step.
    pub fn write_kv(
        &self,
        b: &B,
        k: &B::Tensor,
        v: &B::Tensor,
        k_cache: &B::Tensor,
        v_cache: &B::Tensor,
    ) -> Result<()> {
        let (k, v) = (self.gather_tokens(b, k)?, self.gather_tokens(b, v)?);
        b.write_kv(&k, &v, k_cache, v_cache, self.full)
    }

    /// Stores every rank's rows `x` `[n_r, w]` in columns `col..col + w` of a single-tensor
    /// paged cache (MLA's latent, the DSA indexer's keys), as [`Backend::write_cache`] with the
    /// whole step.
    pub fn write_cache(&self, b: &B, x: &B::Tensor, cache: &B::Tensor, col: usize) -> Result<()> {
        b.write_cache(&self.gather_tokens(b, x)?, cache, col, self.full)
    }

    /// Runs a recurrent layer's `run` on this rank's slice in turn: rank `r` runs once ranks
    /// `0..r` have, starting from the state they left in `state` (each tensor `[slots, ...]`:
    /// the conv histories and the recurrent state); after each rank's turn its rows of the
    /// step's slots are broadcast and written on every other rank. Every rank ends with the
    /// state after the whole step.
    pub fn chain<T>(
        &self,
        b: &B,
        state: &[&B::Tensor],
        run: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if self.slots.is_empty() {
            bail!("context parallelism: a recurrent layer in a step without state slots");
        }
        let me = self.comm.rank();
        let mut run = Some(run);
        let mut out = None;
        for r in 0..self.comm.world() {
            if r == me {
                out = Some((run.take().expect("one turn per rank"))()?);
            }
            for t in state {
                let rows = if r == me {
                    b.upload(&b.read_rows(t, &self.slots)?)?
                } else {
                    let mut shape = t.shape().to_vec();
                    shape[0] = self.slots.len();
                    b.zeros(&shape, t.dtype())?
                };
                let got = self.comm.broadcast(b, &rows, r)?;
                if r != me {
                    b.write_rows(t, &self.slots, &b.download(&got)?)?;
                }
            }
        }
        out.ok_or_else(|| anyhow::anyhow!("internal: rank {me} had no turn"))
    }

    /// The step's logits `[M, V]` in its row order from every rank's rows of its own tokens
    /// (`local` `[max(m_r, 1), V]`: a rank without rows computed one padding row). A step
    /// without logits rows keeps this rank's padding row, as one rank would.
    pub fn gather_logits(&self, b: &B, local: &B::Tensor) -> Result<B::Tensor> {
        if self.logit_counts.iter().all(|&c| c == 0) {
            return Ok(local.clone());
        }
        let all = self.comm.all_gather_rows(b, local, &self.logit_counts)?;
        match &self.logit_order {
            None => Ok(all),
            Some(order) => b.embedding(
                &all,
                &b.upload(&HostTensor::from_u32(vec![order.len()], order)?)?,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two sequences: 5 tokens at positions 3..8 then 4 at 0..4.
    fn meta() -> StepMeta {
        StepMeta {
            positions: vec![3, 4, 5, 6, 7, 0, 1, 2, 3],
            token_seq: vec![0, 0, 0, 0, 0, 1, 1, 1, 1],
            slot_mapping: (10..19).collect(),
            block_tables: vec![7, 8, 9, 0],
            seq_lens: vec![8, 4],
            query_start: vec![0, 5, 9],
            logit_rows: vec![8, 4],
            state_slots: vec![2, 5],
            max_blocks: 2,
            block_size: 4,
            max_seq_len: 8,
        }
    }

    #[test]
    fn equal_slices_and_aligned_cuts() {
        let m = meta();
        let lens = |a: usize| -> Vec<Range<usize>> { split_tokens(&m, 3, a) };
        assert_eq!(lens(1), vec![0..3, 3..6, 6..9]);
        // Token 5 starts sequence 1; position 4 (token 1) is too far back from the first cut.
        assert_eq!(lens(4), vec![0..3, 3..5, 5..9]);
        assert_eq!(split_tokens(&m, 2, 4), vec![0..4, 4..9]);
        assert_eq!(
            split_tokens(&m, 9, 64),
            (0..9).map(|t| t..t + 1).collect::<Vec<_>>()
        );
    }

    #[test]
    fn logits_rows_come_back_in_the_steps_order() {
        use dayone_backend::comm::{thread_group, HostComm};
        use dayone_backend::cpu::CpuBackend;
        let handles: Vec<_> = thread_group(2, std::time::Duration::from_secs(10))
            .into_iter()
            .map(|g| {
                std::thread::spawn(move || {
                    let b = CpuBackend;
                    let cp = ContextParallel::new(Arc::new(HostComm::new(Arc::new(g))), 1, 1);
                    let mut m = meta();
                    // Row 8 (rank 1's) is asked for before row 1 (rank 0's).
                    m.logit_rows = vec![8, 1];
                    let dm = b.upload_meta(m).unwrap();
                    let step = cp.plan(&b, &dm).unwrap().expect("9 tokens over 2 ranks");
                    // Each rank's "logits": its rows' step indices, from its local rows.
                    let rows: Vec<f32> = step
                        .local
                        .host
                        .logit_rows
                        .iter()
                        .map(|&r| (r as usize + step.range.start) as f32)
                        .collect();
                    let local = b
                        .upload(&HostTensor::from_f32(vec![rows.len(), 1], &rows).unwrap())
                        .unwrap();
                    let all = step.gather_logits(&b, &local).unwrap();
                    (step.range.clone(), b.download(&all).unwrap().to_f32())
                })
            })
            .collect();
        let out: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(out[0], (0..4, vec![8.0, 1.0]));
        assert_eq!(out[1], (4..9, vec![8.0, 1.0]));
    }

    #[test]
    fn a_slice_is_a_step_of_its_own() {
        let m = meta();
        let l = local_meta(&m, 3..7).unwrap();
        assert_eq!(l.positions, vec![6, 7, 0, 1]);
        assert_eq!(l.token_seq, vec![0, 0, 1, 1]);
        assert_eq!(l.slot_mapping, vec![13, 14, 15, 16]);
        assert_eq!(l.block_tables, vec![7, 8, 9, 0]);
        assert_eq!(l.seq_lens, vec![8, 4]);
        assert_eq!(l.query_start, vec![0, 2, 4]);
        assert_eq!(l.state_slots, vec![2, 5]);
        assert_eq!(l.logit_rows, vec![1]);
        assert_eq!(l.max_seq_len, 8);
        let l = local_meta(&m, 6..9).unwrap();
        assert_eq!(l.block_tables, vec![9, 0]);
        assert_eq!((l.seq_lens, l.state_slots), (vec![4], vec![5]));
        assert_eq!(l.logit_rows, vec![2]);
        let mut bad = meta();
        bad.token_seq = vec![0, 0, 1, 1, 0, 1, 1, 1, 1];
        let err = local_meta(&bad, 0..9).unwrap_err().to_string();
        assert!(err.contains("not contiguous"), "{err}");
    }
}
