//! Per-step batch metadata: what one forward step computes, apart from weights and math.

use anyhow::{bail, ensure, Result};

/// Host-side metadata for one forward step over `N` tokens from `S` sequences.
///
/// Tokens are grouped by sequence: sequence `s` owns token rows
/// `query_start[s]..query_start[s+1]`, in increasing position order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepMeta {
    /// `[N]` absolute position of each token in its sequence (0-based).
    pub positions: Vec<u32>,
    /// `[N]` index (into this step's sequences) of the sequence each token belongs to.
    pub token_seq: Vec<u32>,
    /// `[N]` cache slot of each token: `block_id · block_size + offset`.
    pub slot_mapping: Vec<u32>,
    /// `[S, max_blocks]` row-major: physical block ids of each sequence, padded with 0.
    pub block_tables: Vec<u32>,
    /// `[S]` number of tokens in each sequence's cache once this step is written.
    pub seq_lens: Vec<u32>,
    /// `[S + 1]` prefix sums of query tokens per sequence (`cu_seqlens`).
    pub query_start: Vec<u32>,
    /// `[M]` token rows whose logits are wanted (usually the last token of each sequence).
    pub logit_rows: Vec<u32>,
    /// `[S]` recurrent-state slot of each sequence (layers with per-sequence state, e.g. KDA);
    /// empty when the model keeps none. A sequence whose first token in the step is at
    /// position 0 starts from a zero state, whatever the slot holds.
    pub state_slots: Vec<u32>,
    /// Columns of `block_tables`.
    pub max_blocks: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Largest entry of `seq_lens` (bounds kernel launches).
    pub max_seq_len: usize,
}

impl StepMeta {
    /// Number of tokens in the step.
    pub fn num_tokens(&self) -> usize {
        self.positions.len()
    }

    /// Number of sequences in the step.
    pub fn num_seqs(&self) -> usize {
        self.seq_lens.len()
    }

    /// Checks the metadata a paged-cache op reads against a cache of `cache_blocks` blocks of
    /// `block_size` slots: `block_size` equals [`Self::block_size`], `token_seq` has one entry
    /// per token, `block_tables` holds at least `[S, max_blocks]` entries, and for every token
    /// its sequence index is `< S`, the block its position falls in is `< max_blocks`, and every
    /// block id its keys need (blocks `0..=position / block_size` of its row) is
    /// `< cache_blocks`. Errors start with `op`.
    pub fn check_paged(&self, op: &str, cache_blocks: usize, block_size: usize) -> Result<()> {
        let (n, bs, s_count) = (self.num_tokens(), block_size, self.num_seqs());
        ensure!(
            bs == self.block_size,
            "{op}: cache block size {bs} != meta.block_size {}",
            self.block_size
        );
        ensure!(
            self.token_seq.len() == n,
            "{op}: token_seq must have {n} entries"
        );
        ensure!(
            self.block_tables.len() >= s_count * self.max_blocks,
            "{op}: block_tables must have [S = {s_count}, max_blocks = {}] entries",
            self.max_blocks
        );
        for t in 0..n {
            let (s, p) = (self.token_seq[t] as usize, self.positions[t] as usize);
            ensure!(
                s < s_count,
                "{op}: token_seq[{t}] = {s} >= number of sequences {s_count}"
            );
            ensure!(
                p / bs < self.max_blocks,
                "{op}: position {p} of token {t} needs block {} >= max_blocks {}",
                p / bs,
                self.max_blocks
            );
            for b in 0..=p / bs {
                let id = self.block_tables[s * self.max_blocks + b] as usize;
                ensure!(
                    id < cache_blocks,
                    "{op}: block id {id} of sequence {s} >= cache blocks {cache_blocks}"
                );
            }
        }
        Ok(())
    }

    /// Checks the inputs of [`crate::Backend::dsa_topk`] for this step — `q` `[N, H, d]`, `w`
    /// `[N, H]`, `k_cache` `[blocks, bs, d]`, `topk ≥ 1` — and the tables
    /// ([`Self::check_paged`]); returns `(H, d, blocks, bs)`. Errors start with `op`.
    pub fn check_dsa_topk(
        &self,
        op: &str,
        q: &[usize],
        w: &[usize],
        k_cache: &[usize],
        topk: usize,
    ) -> Result<(usize, usize, usize, usize)> {
        let n = self.num_tokens();
        let (h, d) = match *q {
            [qn, h, d] if qn == n => (h, d),
            _ => bail!("{op}: q must have shape [{n}, H, d], got {q:?}"),
        };
        ensure!(w == [n, h], "{op}: w must have shape [{n}, {h}], got {w:?}");
        let (blocks, bs) = match *k_cache {
            [blocks, bs, kd] if kd == d => (blocks, bs),
            _ => bail!("{op}: k_cache must have shape [blocks, bs, {d}], got {k_cache:?}"),
        };
        ensure!(topk >= 1, "{op}: topk must be at least 1");
        self.check_paged(op, blocks, bs)?;
        Ok((h, d, blocks, bs))
    }

    /// Checks the table shapes a varlen attention kernel reads for `num_tokens` query tokens:
    /// exactly `num_tokens` `positions` and `token_seq` entries, `[S + 1]` `query_start` entries,
    /// exactly `[S, max_blocks]` `block_tables` entries, and every `token_seq` entry `< S`.
    /// Unlike [`Self::check_paged`] it does not look at block ids. Errors start with `op`.
    pub fn check_tables(&self, op: &str, num_tokens: usize) -> Result<()> {
        let (n, s) = (num_tokens, self.num_seqs());
        if self.positions.len() != n || self.token_seq.len() != n {
            bail!(
                "{op}: meta has {} positions and {} token_seq entries, q has N = {n} tokens",
                self.positions.len(),
                self.token_seq.len()
            );
        }
        if self.query_start.len() != s + 1 || self.block_tables.len() != s * self.max_blocks {
            bail!(
                "{op}: meta needs query_start [S+1] = [{}] and block_tables [S, max_blocks] = [{s}, {}], got {} and {}",
                s + 1,
                self.max_blocks,
                self.query_start.len(),
                self.block_tables.len()
            );
        }
        if self.token_seq.iter().any(|&x| x as usize >= s) {
            bail!("{op}: token_seq refers to a sequence index >= S = {s}");
        }
        Ok(())
    }
}

/// [`StepMeta`] uploaded to the device: each field a `[len]` u32 tensor, plus the host copy.
#[derive(Clone)]
pub struct DeviceStepMeta<T> {
    /// See [`StepMeta::positions`].
    pub positions: T,
    /// See [`StepMeta::token_seq`].
    pub token_seq: T,
    /// See [`StepMeta::slot_mapping`].
    pub slot_mapping: T,
    /// See [`StepMeta::block_tables`].
    pub block_tables: T,
    /// See [`StepMeta::seq_lens`].
    pub seq_lens: T,
    /// See [`StepMeta::query_start`].
    pub query_start: T,
    /// See [`StepMeta::logit_rows`].
    pub logit_rows: T,
    /// See [`StepMeta::state_slots`].
    pub state_slots: T,
    /// The host-side values.
    pub host: StepMeta,
}

#[cfg(test)]
mod tests {
    use super::StepMeta;

    /// Two sequences in a cache of blocks of 4: seq 0 at positions 0..=5 (blocks 3, 1), seq 1 at
    /// position 2 (block 2); `max_blocks` 2.
    fn meta() -> StepMeta {
        StepMeta {
            positions: vec![4, 5, 2],
            token_seq: vec![0, 0, 1],
            slot_mapping: vec![4, 5, 10],
            block_tables: vec![3, 1, 2, 0],
            seq_lens: vec![6, 3],
            query_start: vec![0, 2, 3],
            logit_rows: vec![1, 2],
            state_slots: vec![],
            max_blocks: 2,
            block_size: 4,
            max_seq_len: 6,
        }
    }

    fn paged_err(m: &StepMeta, blocks: usize, bs: usize) -> String {
        m.check_paged("op", blocks, bs).unwrap_err().to_string()
    }

    #[test]
    fn check_paged_accepts_valid_meta() {
        meta().check_paged("op", 4, 4).unwrap();
        StepMeta::default().check_paged("op", 0, 0).unwrap();
    }

    #[test]
    fn check_paged_rejects_each_field() {
        let m = meta();
        assert_eq!(
            paged_err(&m, 4, 8),
            "op: cache block size 8 != meta.block_size 4"
        );
        assert_eq!(
            paged_err(&m, 3, 4),
            "op: block id 3 of sequence 0 >= cache blocks 3"
        );
        let mut t = meta();
        t.token_seq.pop();
        assert_eq!(paged_err(&t, 4, 4), "op: token_seq must have 3 entries");
        let mut t = meta();
        t.block_tables.pop();
        assert_eq!(
            paged_err(&t, 4, 4),
            "op: block_tables must have [S = 2, max_blocks = 2] entries"
        );
        let mut t = meta();
        t.token_seq[2] = 2;
        assert_eq!(
            paged_err(&t, 4, 4),
            "op: token_seq[2] = 2 >= number of sequences 2"
        );
        let mut t = meta();
        t.positions[1] = 8;
        assert_eq!(
            paged_err(&t, 4, 4),
            "op: position 8 of token 1 needs block 2 >= max_blocks 2"
        );
        // Padding past a token's last block is not checked.
        let mut t = meta();
        t.block_tables[3] = 99;
        t.check_paged("op", 4, 4).unwrap();
    }

    #[test]
    fn check_tables_accepts_valid_meta_and_rejects_each_field() {
        let m = meta();
        m.check_tables("op", 3).unwrap();
        let err = |m: &StepMeta, n| m.check_tables("op", n).unwrap_err().to_string();
        assert_eq!(
            err(&m, 2),
            "op: meta has 3 positions and 3 token_seq entries, q has N = 2 tokens"
        );
        let mut t = meta();
        t.query_start.pop();
        assert_eq!(
            err(&t, 3),
            "op: meta needs query_start [S+1] = [3] and block_tables [S, max_blocks] = [2, 2], got 2 and 4"
        );
        let mut t = meta();
        t.block_tables.push(0);
        assert!(err(&t, 3).contains("got 3 and 5"));
        let mut t = meta();
        t.token_seq[0] = 5;
        assert_eq!(
            err(&t, 3),
            "op: token_seq refers to a sequence index >= S = 2"
        );
    }
}
