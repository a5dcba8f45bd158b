//! Per-step batch metadata: what one forward step computes, apart from weights and math.

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
