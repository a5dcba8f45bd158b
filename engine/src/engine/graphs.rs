//! Decode steps as graphs ([`Backend::capture_graph`]; CUDA graphs on CUDA): a step whose every
//! sequence decodes one token is padded to a batch bucket and a block-table width bucket,
//! captured once per `(batch, width)` on tensors that live as long as the graph, and replayed
//! after its inputs are written in place — one launch per step instead of one per kernel
//! (vLLM's CUDA graphs, multigpu-perf.md §D).
//!
//! Why buckets: a replay runs the kernels and grids the capture chose. The batch is padded to
//! the bucket with tokens that write no cache (slot `u32::MAX`) and read block 0; kernel plans
//! that follow the context length (split-K decode attention) are made for the whole width, as
//! if every sequence were `width · block_size` long, so they hold for every shorter context.
//! In batch-invariant mode a replay is bit-exact with the eager step; otherwise the padded
//! batch and the width-sized plans may round differently (within the golden tolerances).
//!
//! Padding sequences of models with recurrent state (KDA) read and write one scratch state row
//! that no sequence owns. What stays eager: prefill and mixed steps, image steps, split models,
//! and any model whose forward reads back or uploads mid-step (its capture fails once, with the
//! reason logged at info, and graphs stay off for it).

use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, HostTensor, StepMeta};
use std::collections::HashMap;

use crate::cache::KvCache;
use crate::models::CausalLm;

/// Largest batch run as a graph; larger decode steps are eager.
pub const MAX_GRAPH_BATCH: usize = 256;

/// Graphs kept at once; the least recently replayed goes first. Each holds its logits
/// `[bucket, V]` (the rest of its memory is shared by all graphs of the backend), so this bounds
/// what graphs take from a long-running server whose batches and contexts keep changing.
pub const MAX_GRAPHS: usize = 24;

/// The batch bucket of `n` tokens: 1, 2, 4, 8, then multiples of 8 (vLLM's capture sizes).
pub fn batch_bucket(n: usize) -> usize {
    if n <= 8 {
        n.next_power_of_two()
    } else {
        n.next_multiple_of(8)
    }
}

/// The block-table width bucket for `blocks` blocks: a power of two, at least 16, at most
/// `max_blocks` (the widest table a sequence can have), so a growing context re-captures
/// only when it doubles.
pub fn width_bucket(blocks: usize, max_blocks: usize) -> usize {
    blocks
        .max(16)
        .next_power_of_two()
        .min(max_blocks.max(blocks))
}

/// One captured decode step: its persistent inputs and the logits `[batch, V]` it writes.
struct Captured<B: Backend> {
    id: u64,
    /// The step counter at its last replay (for eviction).
    used: u64,
    ids: B::Tensor,
    meta: DeviceStepMeta<B::Tensor>,
    logits: B::Tensor,
}

/// The engine's decode graphs.
pub struct DecodeGraphs<B: Backend> {
    by_shape: HashMap<(usize, usize), Captured<B>>,
    /// Why graphs are off for this model (a failed capture), once known.
    off: Option<String>,
    /// Replays and captures so far (tests and `--enforce-eager` comparisons read them).
    pub replays: u64,
    pub captures: u64,
}

impl<B: Backend> Default for DecodeGraphs<B> {
    fn default() -> Self {
        Self {
            by_shape: HashMap::new(),
            off: None,
            replays: 0,
            captures: 0,
        }
    }
}

/// The step `ids`/`meta` padded to `batch` tokens (one per sequence) and `width` blocks; padding
/// sequences use the recurrent-state row `scratch`.
fn pad(
    ids: &[u32],
    meta: &StepMeta,
    batch: usize,
    width: usize,
    scratch: u32,
) -> (Vec<u32>, StepMeta) {
    let n = ids.len();
    let mut ids = ids.to_vec();
    ids.resize(batch, 0);
    let mut m = meta.clone();
    m.positions.resize(batch, 0);
    m.token_seq = (0..batch as u32).collect();
    m.slot_mapping.resize(batch, u32::MAX);
    let mut tables = Vec::with_capacity(batch * width);
    for s in 0..batch {
        let row = if s < n {
            &meta.block_tables[s * meta.max_blocks..(s + 1) * meta.max_blocks]
        } else {
            &[][..]
        };
        tables.extend_from_slice(&row[..row.len().min(width)]);
        tables.resize((s + 1) * width, 0);
    }
    m.block_tables = tables;
    m.max_blocks = width;
    m.seq_lens.resize(batch, 1);
    m.query_start = (0..=batch as u32).collect();
    m.logit_rows = (0..batch as u32).collect();
    m.state_slots.resize(batch, scratch);
    (ids, m)
}

/// Writes `v` over the whole of `t` (a `[len]` u32 tensor of the same length).
fn refresh<B: Backend>(b: &B, t: &B::Tensor, v: &[u32]) -> Result<()> {
    let rows: Vec<u32> = (0..v.len() as u32).collect();
    b.write_rows(t, &rows, &HostTensor::from_u32(vec![v.len()], v)?)
}

impl<B: Backend> DecodeGraphs<B> {
    /// Why graphs are off for this model, if a capture failed.
    pub fn off_reason(&self) -> Option<&str> {
        self.off.as_deref()
    }

    /// Runs the decode step `ids`/`meta` (one token per sequence, every row sampled) as a
    /// graph and returns its logits `[bucket, V]` (rows past `ids.len()` are padding), or
    /// `None` when it must run eagerly (graphs off, batch above [`MAX_GRAPH_BATCH`], or this
    /// backend without graphs). `max_blocks`: the widest block table a sequence can have;
    /// `scratch`: a recurrent-state row no sequence owns (padding reads and writes it).
    pub fn run(
        &mut self,
        b: &B,
        model: &dyn CausalLm<B>,
        cache: &KvCache<B>,
        (ids, meta): (&[u32], &StepMeta),
        max_blocks: usize,
        scratch: u32,
    ) -> Result<Option<B::Tensor>> {
        if self.off.is_some() || ids.is_empty() || ids.len() > MAX_GRAPH_BATCH {
            return Ok(None);
        }
        let batch = batch_bucket(ids.len());
        let width = width_bucket(meta.max_blocks, max_blocks);
        let (ids, meta) = pad(ids, meta, batch, width, scratch);
        if let Some(c) = self.by_shape.get_mut(&(batch, width)) {
            c.used = self.replays;
            refresh(b, &c.ids, &ids)?;
            for (t, v) in [
                (&c.meta.positions, &meta.positions),
                (&c.meta.slot_mapping, &meta.slot_mapping),
                (&c.meta.block_tables, &meta.block_tables),
                (&c.meta.seq_lens, &meta.seq_lens),
                (&c.meta.state_slots, &meta.state_slots),
            ] {
                refresh(b, t, v)?;
            }
            b.replay_graph(c.id)?;
            self.replays += 1;
            return Ok(Some(c.logits.clone()));
        }
        // First step of this shape: inputs uploaded with its values, then captured. The host
        // side of the capture's metadata claims full-width contexts, so that plans made from
        // it (split-K attention) cover every context the width allows.
        let ids_t = b.upload(&HostTensor::from_u32(vec![batch], &ids)?)?;
        let mut dmeta = b.upload_meta(meta)?;
        let full = (width * dmeta.host.block_size) as u32;
        dmeta.host.positions = vec![full - 1; batch];
        dmeta.host.seq_lens = vec![full; batch];
        dmeta.host.max_seq_len = full as usize;
        let captured =
            b.capture_graph(&mut || model.forward_spliced(b, &ids_t, None, &dmeta, cache, None));
        let (id, logits) = match captured {
            Ok(Some(c)) => c,
            Ok(None) => {
                self.off = Some(format!("the {} backend has no graphs", b.name()));
                return Ok(None);
            }
            Err(e) => {
                let why = format!("{e:#}");
                tracing::info!("decode steps stay eager: {why}");
                self.off = Some(why);
                return Ok(None);
            }
        };
        self.captures += 1;
        b.replay_graph(id)?;
        self.replays += 1;
        if self.by_shape.len() >= MAX_GRAPHS {
            let oldest = self
                .by_shape
                .iter()
                .min_by_key(|(_, c)| c.used)
                .map(|(k, _)| *k);
            if let Some(c) = oldest.and_then(|k| self.by_shape.remove(&k)) {
                b.drop_graph(c.id);
            }
        }
        self.by_shape.insert(
            (batch, width),
            Captured {
                id,
                used: self.replays,
                ids: ids_t,
                meta: dmeta,
                logits: logits.clone(),
            },
        );
        Ok(Some(logits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        let b: Vec<usize> = [1, 2, 3, 5, 8, 9, 17, 64, 65].map(batch_bucket).to_vec();
        assert_eq!(b, [1, 2, 4, 8, 8, 16, 24, 64, 72]);
        assert_eq!(width_bucket(1, 4096), 16);
        assert_eq!(width_bucket(17, 4096), 32);
        assert_eq!(width_bucket(300, 400), 400);
        assert_eq!(width_bucket(20, 20), 20);
    }

    #[test]
    fn padding_keeps_the_real_rows_and_writes_no_cache() {
        let meta = StepMeta {
            positions: vec![5, 9],
            token_seq: vec![0, 1],
            slot_mapping: vec![21, 41],
            block_tables: vec![3, 1, 0, 7, 2, 4],
            seq_lens: vec![6, 10],
            query_start: vec![0, 1, 2],
            logit_rows: vec![0, 1],
            state_slots: vec![0, 0],
            max_blocks: 3,
            block_size: 4,
            max_seq_len: 10,
        };
        let (ids, m) = pad(&[11, 12], &meta, 4, 16, 9);
        assert_eq!(ids, [11, 12, 0, 0]);
        assert_eq!(m.positions, [5, 9, 0, 0]);
        assert_eq!(m.slot_mapping, [21, 41, u32::MAX, u32::MAX]);
        assert_eq!(m.block_tables.len(), 4 * 16);
        assert_eq!(m.block_tables[..4], [3, 1, 0, 0]);
        assert_eq!(m.block_tables[16..19], [7, 2, 4]);
        assert!(m.block_tables[32..].iter().all(|&x| x == 0));
        assert_eq!(m.query_start, [0, 1, 2, 3, 4]);
        assert_eq!(m.logit_rows, [0, 1, 2, 3]);
        assert_eq!(m.token_seq, [0, 1, 2, 3]);
        assert_eq!(m.state_slots, [0, 0, 9, 9]);
    }
}
