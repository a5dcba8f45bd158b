//! Continuous batching under one token budget (the vLLM v1 rule): every running sequence's
//! computed tokens catch up with its known tokens; a step takes as many tokens as the budget
//! allows — one for a decoding sequence, a chunk of a long prompt (chunked prefill) — and admits
//! waiting sequences while the budget and the cache last. Out of cache blocks, the newest running
//! sequence is preempted and later recomputed.

mod prefix_match;
mod sequence;

pub use sequence::{FinishReason, Sequence, Swapped};

use crate::cache::{BlockPool, HostRows, HostTier, StateCheckpoints};
use anyhow::{bail, Result};
use std::collections::VecDeque;

/// Scheduler limits.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SchedulerConfig {
    /// Most tokens in one step (the token budget).
    pub max_batched_tokens: usize,
    /// Most prompt tokens of one sequence in one step (chunked prefill); ≤ the budget.
    pub max_prefill_chunk: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens per cache block.
    pub block_size: usize,
    /// Prompts longer than this many tokens wait in the long-request queue (0: one queue for all).
    pub long_prefill_threshold: usize,
    /// Most long prompts (see `long_prefill_threshold`) prefilling at once.
    pub max_long_partial_prefills: usize,
    /// Most prompt tokens of long prompts in one step, so that short requests keep their time to
    /// first token while a long prompt prefills (0: no cap beyond `max_prefill_chunk`).
    pub long_prefill_token_cap: usize,
    /// Most requests waiting (both queues together); a full queue refuses new requests at once.
    pub max_queued_requests: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_batched_tokens: 2048,
            max_prefill_chunk: 2048,
            max_num_seqs: 256,
            block_size: 16,
            long_prefill_threshold: 32768,
            max_long_partial_prefills: 1,
            long_prefill_token_cap: 1024,
            max_queued_requests: 1024,
        }
    }
}

/// The most sequences that may run at once (`max_num_seqs`); vLLM's largest default is 1024.
pub const MAX_NUM_SEQS: usize = 1 << 16;

/// One sequence's share of a step: tokens `start..start + len` of `running[index]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledChunk {
    /// Index into [`Scheduler::running`].
    pub index: usize,
    /// First position computed in this step.
    pub start: usize,
    /// Tokens computed in this step.
    pub len: usize,
    /// The chunk reaches the last known token, so a new token is sampled after it.
    pub wants_logits: bool,
}

/// A step's work: the chunks, and the recurrent-state copies to make before the model runs.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    /// What each scheduled sequence computes.
    pub chunks: Vec<ScheduledChunk>,
    /// `(checkpoint slot, running slot)`: prefix hits resuming from a state checkpoint.
    pub restores: Vec<(u32, u32)>,
    /// Blocks paged back from the host tier: `(device block, its bytes per block tensor)`.
    pub host_loads: Vec<(u32, HostRows)>,
    /// Sequences swapped out this step: `(id, their blocks, their running slot)`; the engine
    /// copies these to the host before anything is written, then calls
    /// [`Scheduler::swapped_out`].
    pub swap_out: Vec<(u64, Vec<u32>, Option<u32>)>,
    /// Swapped sequences paged back: `(their new blocks, new running slot, the bytes)`.
    pub swap_in: Vec<(Vec<u32>, Option<u32>, HostRows)>,
    /// State checkpoints paged back from the host tier: `(running slot, bytes per state
    /// tensor)`.
    pub state_loads: Vec<(u32, HostRows)>,
}

/// How an admitted sequence gets its first computed tokens.
enum Resume {
    /// Paged back from the host tier: its reservation and bytes (blocks, then state).
    Swapped(Swapped, HostRows),
    /// From the prefix cache (possibly nothing).
    Fresh(prefix_match::Match),
}

/// Prefix-caching settings the scheduler needs (from [`crate::EngineConfig`] and the model's
/// cache spec).
#[derive(Clone, Copy, Debug, Default)]
pub struct PrefixSettings {
    /// Share cached prefixes between requests.
    pub enabled: bool,
    /// The model has recurrent layers, whose state is resumed only at checkpoints.
    pub recurrent: bool,
    /// Extra checkpoints every this many prompt tokens (multiple of the block size; 0: none).
    pub checkpoint_interval: usize,
    /// Checkpoint slots (state-tensor rows after the running slots).
    pub checkpoints: usize,
    /// Checkpoints sit only at multiples of this many tokens: the block size and the backend's
    /// [`dayone_backend::Backend::recurrent_split_alignment`], so that resuming from one gives
    /// the same bits as computing the prefix in one pass. 0 is read as the block size.
    pub alignment: usize,
}

/// Counters the scheduler keeps for the engine's metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerCounters {
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_query_tokens: u64,
    /// Of those, tokens served from the cache.
    pub prefix_hit_tokens: u64,
    /// Tokens whose per-token cache was found but recomputed for want of a state checkpoint.
    pub state_miss_tokens: u64,
    /// State checkpoints taken.
    pub checkpoints_stored: u64,
    /// Sequences preempted (their cache freed, recomputed later).
    pub preemptions_recompute: u64,
    /// Sequences preempted by swapping to the host tier.
    pub preemptions_swap: u64,
    /// Prompt tokens looked up in the host tier (those the device did not hold).
    pub host_query_tokens: u64,
    /// Of those, tokens paged back from the host tier.
    pub host_hit_tokens: u64,
}

/// Waiting and running sequences, the cache blocks and state slots.
pub struct Scheduler {
    /// Limits.
    pub config: SchedulerConfig,
    /// Short requests not yet admitted (or preempted), oldest first.
    waiting: VecDeque<Sequence>,
    /// Long requests (prompt above `long_prefill_threshold`) not yet admitted, oldest first.
    waiting_long: VecDeque<Sequence>,
    /// Admitted sequences, oldest first.
    pub running: Vec<Sequence>,
    pool: BlockPool,
    checkpoints: StateCheckpoints,
    prefix: PrefixSettings,
    /// Free running state slots (one per running sequence at most).
    free_slots: Vec<u32>,
    /// Metrics counters.
    pub counters: SchedulerCounters,
    /// Host-memory tier for evicted blocks and swapped sequences.
    host: Option<HostTier>,
}

impl Scheduler {
    /// A scheduler over `num_blocks` cache blocks; state slots `0..max_num_seqs` run sequences,
    /// the next `prefix.checkpoints` hold state checkpoints.
    pub fn new(config: SchedulerConfig, num_blocks: usize, prefix: PrefixSettings) -> Result<Self> {
        let max_num_seqs = config.max_num_seqs;
        if config.max_batched_tokens == 0
            || config.max_prefill_chunk == 0
            || config.max_num_seqs == 0
            || config.block_size == 0
        {
            bail!("scheduler limits must be positive: {config:?}");
        }
        // Slot ids are u32 and every slot costs host (and, for recurrent models, device)
        // memory up front: refuse sizes no deployment needs instead of wrapping or allocating GBs.
        if config.max_num_seqs > MAX_NUM_SEQS {
            bail!(
                "--max-num-seqs (max_num_seqs) is {} but at most {MAX_NUM_SEQS} sequences can run at once",
                config.max_num_seqs
            );
        }
        if prefix.checkpoints > MAX_NUM_SEQS {
            bail!(
                "state_checkpoints is {} but at most {MAX_NUM_SEQS} checkpoint slots are kept",
                prefix.checkpoints
            );
        }
        if config.long_prefill_threshold > 0 && config.max_long_partial_prefills == 0 {
            bail!(
                "max_long_partial_prefills must be at least 1 when long_prefill_threshold is set"
            );
        }
        let mut prefix = prefix;
        if prefix.alignment == 0 {
            prefix.alignment = config.block_size;
        }
        if !prefix.alignment.is_multiple_of(config.block_size) {
            bail!(
                "the state checkpoint alignment ({}) must be a multiple of the block size ({})",
                prefix.alignment,
                config.block_size
            );
        }
        if !prefix.checkpoint_interval.is_multiple_of(config.block_size) {
            bail!(
                "state_checkpoint_interval ({}) must be a multiple of the block size ({})",
                prefix.checkpoint_interval,
                config.block_size
            );
        }
        let ckpts = if prefix.enabled && prefix.recurrent {
            prefix.checkpoints
        } else {
            0
        };
        Ok(Self {
            checkpoints: StateCheckpoints::new(max_num_seqs as u32, ckpts),
            config,
            waiting: VecDeque::new(),
            waiting_long: VecDeque::new(),
            running: Vec::new(),
            pool: BlockPool::new(num_blocks),
            prefix,
            free_slots: (0..max_num_seqs as u32).rev().collect(),
            counters: SchedulerCounters::default(),
            host: None,
        })
    }

    /// Queues a sequence (in the long queue when its prompt is above the threshold).
    ///
    /// Errors when `max_queued_requests` are already waiting.
    pub fn add(&mut self, mut seq: Sequence) -> Result<()> {
        let queued = self.num_waiting();
        if queued >= self.config.max_queued_requests {
            return Err(QueueFull {
                waiting: queued,
                max_queued_requests: self.config.max_queued_requests,
            }
            .into());
        }
        let t = self.config.long_prefill_threshold;
        seq.long = t > 0 && seq.prompt_len > t;
        if seq.long {
            self.waiting_long.push_back(seq);
        } else {
            self.waiting.push_back(seq);
        }
        Ok(())
    }

    /// Sequences waiting, both queues.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.waiting_long.len()
    }

    /// Sequences waiting in the long-request queue.
    pub fn num_waiting_long(&self) -> usize {
        self.waiting_long.len()
    }

    /// The block pool (free, cached and total counts).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// State checkpoints held and their capacity.
    pub fn checkpoints(&self) -> &StateCheckpoints {
        &self.checkpoints
    }

    /// Forgets every cached prefix nobody holds (blocks and state checkpoints).
    pub fn reset_prefix_cache(&mut self) {
        self.pool.clear_cached();
        self.checkpoints.clear();
        if let Some(tier) = &mut self.host {
            tier.clear();
        }
    }

    /// Whether any sequence is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        self.num_waiting() > 0 || !self.running.is_empty()
    }

    /// Cached blocks handed out for new data since the last call (see
    /// [`BlockPool::take_evicted`]).
    pub fn take_evicted(&mut self) -> Vec<(u32, crate::cache::prefix::BlockHash)> {
        self.pool.take_evicted()
    }

    fn blocks_needed(&self, seq: &Sequence, upto: usize) -> usize {
        upto.div_ceil(self.config.block_size)
            .saturating_sub(seq.blocks.len())
    }

    /// Frees a sequence's blocks and running slot and rewinds it to be recomputed.
    fn rewind(&mut self, seq: &mut Sequence) -> Result<()> {
        self.pool.release(&seq.blocks)?;
        seq.blocks.clear();
        seq.num_computed = 0;
        seq.num_registered = 0;
        if let Some(slot) = seq.slot.take() {
            self.free_slots.push(slot);
        }
        Ok(())
    }

    /// Preempts the newest running sequence: swapped to the host tier when it has room (its
    /// computed tokens and state are kept and paged back later), else rewound to be
    /// recomputed (vLLM's two preemption modes).
    fn preempt_last(&mut self, plan: &mut StepPlan) -> Result<()> {
        let mut seq = self.running.pop().expect("preempt with nothing running");
        let reserved = match &mut self.host {
            Some(tier) if seq.num_computed > 0 => tier.reserve_swap(seq.blocks.len()),
            _ => None,
        };
        match reserved {
            Some(bytes) => {
                plan.swap_out.push((seq.id, seq.blocks.clone(), seq.slot));
                self.pool.release(&seq.blocks)?;
                seq.blocks.clear();
                seq.num_registered = 0;
                if let Some(slot) = seq.slot.take() {
                    self.free_slots.push(slot);
                }
                seq.swapped = Some(Swapped { bytes, rows: None });
                self.counters.preemptions_swap += 1;
            }
            None => {
                self.rewind(&mut seq)?;
                self.counters.preemptions_recompute += 1;
            }
        }
        if seq.long {
            self.waiting_long.push_front(seq);
        } else {
            self.waiting.push_front(seq);
        }
        Ok(())
    }

    fn release_slot(&mut self, seq: &mut Sequence) {
        if let Some(slot) = seq.slot.take() {
            self.free_slots.push(slot);
        }
    }

    fn requeue_front(&mut self, seq: Sequence) {
        if seq.long {
            self.waiting_long.push_front(seq);
        } else {
            self.waiting.push_front(seq);
        }
    }

    /// The host tier to use for evicted blocks and swaps (the engine sizes it).
    pub fn set_host_tier(&mut self, tier: HostTier) {
        self.host = Some(tier);
    }

    /// The host tier, when there is one.
    pub fn host_tier(&self) -> Option<&HostTier> {
        self.host.as_ref()
    }

    /// Keeps the bytes of a cache block evicted from the device under its name.
    pub fn store_evicted(&mut self, h: crate::cache::prefix::BlockHash, rows: HostRows) -> bool {
        self.host.as_mut().is_some_and(|t| t.store(h, rows))
    }

    /// The bytes of a sequence swapped out in this step's plan (`swap_out`), copied off the
    /// device by the engine: `rows` per block tensor `[blocks, …]`, then per state tensor
    /// `[1, …]`. A sequence aborted meanwhile is ignored.
    pub fn swapped_out(&mut self, id: u64, rows: HostRows) {
        let seq = self
            .waiting
            .iter_mut()
            .chain(self.waiting_long.iter_mut())
            .find(|s| s.id == id);
        if let Some(sw) = seq.and_then(|s| s.swapped.as_mut()) {
            sw.rows = Some(rows);
        }
    }

    /// Whether `seq` may prefill this step under the long-request limits.
    fn long_prefills_running(&self) -> usize {
        self.running
            .iter()
            .filter(|s| s.long && s.prefilling())
            .count()
    }

    /// Picks this step's work. Errors only on allocator inconsistencies.
    pub fn schedule(&mut self) -> Result<StepPlan> {
        let mut budget = self.config.max_batched_tokens;
        let mut plan = StepPlan::default();
        // Long prompts share a per-step cap while anything else is waiting or running, so that
        // short requests keep their time to first token (vLLM `long_prefill_token_threshold`).
        let others = !self.waiting.is_empty() || self.running.iter().any(|s| !s.long);
        let mut long_budget = match self.config.long_prefill_token_cap {
            c if c > 0 && others && self.config.long_prefill_threshold > 0 => c,
            _ => usize::MAX,
        };
        let now = std::time::Instant::now();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let limit = if seq.long && seq.prefilling() {
                budget.min(long_budget)
            } else {
                budget
            };
            let len = self.chunk_len(seq, limit);
            if len == 0 {
                i += 1;
                continue;
            }
            let need = self.blocks_needed(seq, seq.num_computed + len);
            if need > self.pool.num_free() {
                // Free memory by preempting the newest sequence; if that is this one, stop here.
                let last = self.running.len() - 1;
                self.preempt_last(&mut plan)?;
                plan.restores
                    .retain(|&(_, to)| self.running.iter().any(|s| s.slot == Some(to)));
                if last == i {
                    break;
                }
                continue;
            }
            let seq = &mut self.running[i];
            seq.blocks
                .extend(self.pool.allocate(need).expect("checked free blocks"));
            if seq.long && seq.prefilling() {
                long_budget = long_budget.saturating_sub(len);
            }
            plan.chunks.push(ScheduledChunk {
                index: i,
                start: seq.num_computed,
                len,
                wants_logits: seq.num_computed + len == seq.tokens.len(),
            });
            budget -= len;
            i += 1;
        }
        // Admit short requests first, then long ones up to the partial-prefill limit.
        let mut long_slots = self
            .config
            .max_long_partial_prefills
            .saturating_sub(self.long_prefills_running());
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let from_long = self.waiting.is_empty();
            if from_long && (long_slots == 0 || long_budget == 0) {
                break;
            }
            let queue = if from_long {
                &mut self.waiting_long
            } else {
                &mut self.waiting
            };
            let Some(mut seq) = queue.pop_front() else {
                break;
            };
            // `running.len() < max_num_seqs` guarantees a free slot.
            seq.slot = self.free_slots.pop();
            // A swapped-out sequence comes back with its own blocks' bytes and state; any other
            // starts from the longest cached prefix.
            let resume = match seq.swapped.take() {
                Some(sw) => match sw.rows.clone() {
                    Some(rows) if !plan.swap_out.iter().any(|o| o.0 == seq.id) => {
                        Resume::Swapped(sw, rows)
                    }
                    _ => {
                        // Its copy-out is still pending (preempted in this very step).
                        seq.swapped = Some(sw);
                        self.release_slot(&mut seq);
                        self.requeue_front(seq);
                        break;
                    }
                },
                None => Resume::Fresh(self.match_prefix(&mut seq)?),
            };
            let limit = if seq.long {
                budget.min(long_budget)
            } else {
                budget
            };
            let len = self.chunk_len(&seq, limit);
            let need = self.blocks_needed(&seq, seq.num_computed + len);
            if len == 0 || need > self.pool.num_free() {
                // Does not fit now: give back what the lookup took and wait.
                match resume {
                    Resume::Swapped(sw, _) => {
                        seq.swapped = Some(sw);
                        self.release_slot(&mut seq);
                    }
                    Resume::Fresh(m) => self.unmatch(&mut seq, &m)?,
                }
                self.requeue_front(seq);
                break;
            }
            let held = seq.blocks.len();
            seq.blocks
                .extend(self.pool.allocate(need).expect("checked free blocks"));
            seq.first_scheduled.get_or_insert(now);
            match resume {
                Resume::Swapped(sw, rows) => {
                    let back = seq.num_computed.div_ceil(self.config.block_size);
                    plan.swap_in
                        .push((seq.blocks[held..held + back].to_vec(), seq.slot, rows));
                    if let Some(tier) = &mut self.host {
                        tier.release_swap(sw.bytes);
                    }
                }
                Resume::Fresh(m) => {
                    plan.restores.extend(m.restore);
                    plan.host_loads.extend(m.loads);
                    plan.state_loads.extend(m.state_load);
                }
            }
            if seq.long && seq.prefilling() {
                long_slots = long_slots.saturating_sub(1);
                long_budget = long_budget.saturating_sub(len);
            }
            plan.chunks.push(ScheduledChunk {
                index: self.running.len(),
                start: seq.num_computed,
                len,
                wants_logits: seq.num_computed + len == seq.tokens.len(),
            });
            budget -= len;
            self.running.push(seq);
        }
        Ok(plan)
    }

    /// Records a step's progress: each chunk's tokens are now in the cache, newly full blocks
    /// are named in the prefix cache, and a recurrent model's prefill steps that end on a block
    /// boundary leave a state checkpoint. Returns the state copies to make now, in order,
    /// `(running slot, checkpoint slot, the checkpoint that slot held)`: the engine may keep
    /// the old one in the host tier before copying over it.
    pub fn update_from_output(
        &mut self,
        chunks: &[ScheduledChunk],
    ) -> Vec<(u32, u32, Option<crate::cache::prefix::BlockHash>)> {
        let bs = self.config.block_size;
        let mut saves = Vec::new();
        for c in chunks {
            let seq = &mut self.running[c.index];
            seq.num_computed += c.len;
            if !self.prefix.enabled {
                continue;
            }
            crate::cache::prefix::extend_hashes(
                &mut seq.block_hashes,
                &seq.tokens[..seq.num_computed],
                bs,
                &seq.extra_keys,
            );
            while seq.num_registered < seq.num_computed / bs {
                let i = seq.num_registered;
                self.pool.register(seq.blocks[i], seq.block_hashes[i]);
                seq.num_registered += 1;
            }
            let n = seq.num_computed;
            let a = self.prefix.alignment;
            if self.prefix.recurrent && n.is_multiple_of(a) && n > 0 && n <= seq.prompt_len {
                if let Some((to, old)) = self.checkpoints.store(seq.block_hashes[n / bs - 1]) {
                    let from = seq.slot.expect("running sequences hold a slot");
                    saves.push((from, to, old));
                    self.counters.checkpoints_stored += 1;
                }
            }
        }
        saves
    }

    /// Unfinished sequence `id`, waiting or running.
    pub fn sequence(&self, id: u64) -> Option<&Sequence> {
        self.waiting
            .iter()
            .chain(self.waiting_long.iter())
            .chain(self.running.iter())
            .find(|s| s.id == id)
    }

    /// Unfinished sequence `id`, waiting or running, to change.
    pub fn sequence_mut(&mut self, id: u64) -> Option<&mut Sequence> {
        self.waiting
            .iter_mut()
            .chain(self.waiting_long.iter_mut())
            .chain(self.running.iter_mut())
            .find(|s| s.id == id)
    }

    /// Removes sequence `id` wherever it is (waiting or running), freeing its blocks and state
    /// slot at once; `None` when no such sequence is unfinished.
    pub fn abort(&mut self, id: u64) -> Result<Option<Sequence>> {
        for queue in [&mut self.waiting, &mut self.waiting_long] {
            if let Some(i) = queue.iter().position(|s| s.id == id) {
                let mut seq = queue.remove(i).expect("position found");
                seq.finished = Some(FinishReason::Abort);
                if let (Some(sw), Some(tier)) = (seq.swapped.take(), self.host.as_mut()) {
                    tier.release_swap(sw.bytes);
                }
                return Ok(Some(seq));
            }
        }
        let Some(i) = self.running.iter().position(|s| s.id == id) else {
            return Ok(None);
        };
        let mut seq = self.running.remove(i);
        self.rewind(&mut seq)?;
        seq.finished = Some(FinishReason::Abort);
        Ok(Some(seq))
    }

    /// Removes finished sequences from `running`, returning their blocks to the pool (named
    /// blocks stay cached).
    pub fn reap_finished(&mut self) -> Result<Vec<Sequence>> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].finished.is_some() {
                let mut seq = self.running.remove(i);
                self.pool.release(&seq.blocks)?;
                seq.blocks.clear();
                if let Some(slot) = seq.slot.take() {
                    self.free_slots.push(slot);
                }
                done.push(seq);
            } else {
                i += 1;
            }
        }
        Ok(done)
    }

    /// Places `seq` in running with `blocks` freshly allocated for its whole prompt (for
    /// tracing one prompt outside the normal loop); returns its index.
    pub fn run_alone(&mut self, mut seq: Sequence) -> Result<usize> {
        let Some(blocks) = self
            .pool
            .allocate(seq.tokens.len().div_ceil(self.config.block_size))
        else {
            bail!(
                "the prompt ({} tokens) does not fit in the free KV cache blocks",
                seq.tokens.len()
            );
        };
        seq.blocks = blocks;
        seq.slot = self.free_slots.pop();
        self.running.push(seq);
        Ok(self.running.len() - 1)
    }

    /// Checks that every block and slot is accounted for: held by a running sequence, cached,
    /// or free (tests: no leaks after many requests and aborts).
    pub fn check_consistency(&self) -> Result<()> {
        self.pool.check()?;
        let slots =
            self.free_slots.len() + self.running.iter().filter(|s| s.slot.is_some()).count();
        if slots != self.config.max_num_seqs {
            bail!(
                "{slots} state slots accounted for, {} exist",
                self.config.max_num_seqs
            );
        }
        if let Some(tier) = &self.host {
            let swapped: u64 = self
                .waiting
                .iter()
                .chain(&self.waiting_long)
                .filter_map(|s| s.swapped.as_ref().map(|w| w.bytes))
                .sum();
            if tier.used() != tier.entry_bytes() + swapped {
                bail!(
                    "host tier: {} bytes used but {} cached + {swapped} reserved for swaps",
                    tier.used(),
                    tier.entry_bytes()
                );
            }
        }
        if self.running.is_empty() && self.pool.num_free() != self.pool.num_blocks() {
            bail!(
                "nothing runs but only {} of {} blocks are free",
                self.pool.num_free(),
                self.pool.num_blocks()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

/// [`Scheduler::add`]'s error when `max_queued_requests` are already waiting (a server answers
/// 503, like vLLM's `--max-num-queued-reqs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request queue is full ({waiting} waiting, max_queued_requests {max_queued_requests}): retry later")]
pub struct QueueFull {
    /// Requests waiting when this one arrived.
    pub waiting: usize,
    /// The limit.
    pub max_queued_requests: usize,
}
