//! Continuous batching under one token budget (the vLLM v1 rule): every running sequence's
//! computed tokens catch up with its known tokens; a step takes as many tokens as the budget
//! allows — one for a decoding sequence, a chunk of a long prompt (chunked prefill) — and admits
//! waiting sequences while the budget and the cache last. Out of cache blocks, the newest running
//! sequence is preempted and later recomputed.

mod sequence;

pub use sequence::{FinishReason, Sequence};

use crate::cache::BlockAllocator;
use anyhow::{bail, Result};
use std::collections::VecDeque;

/// Scheduler limits.
#[derive(Clone, Debug)]
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

/// Waiting and running sequences plus the block allocator.
pub struct Scheduler {
    /// Limits.
    pub config: SchedulerConfig,
    /// Sequences not yet admitted (or preempted), oldest first.
    pub waiting: VecDeque<Sequence>,
    /// Admitted sequences, oldest first.
    pub running: Vec<Sequence>,
    /// Physical cache blocks.
    pub allocator: BlockAllocator,
    /// Free state slots (one per running sequence at most).
    free_slots: Vec<u32>,
}

impl Scheduler {
    /// A scheduler over `num_blocks` cache blocks.
    pub fn new(config: SchedulerConfig, num_blocks: usize) -> Result<Self> {
        let max_num_seqs = config.max_num_seqs;
        if config.max_batched_tokens == 0
            || config.max_prefill_chunk == 0
            || config.max_num_seqs == 0
        {
            bail!("scheduler limits must be positive: {config:?}");
        }
        Ok(Self {
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            allocator: BlockAllocator::new(num_blocks),
            free_slots: (0..max_num_seqs as u32).rev().collect(),
        })
    }

    /// Queues a sequence.
    pub fn add(&mut self, seq: Sequence) {
        self.waiting.push_back(seq);
    }

    /// Whether any sequence is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    fn blocks_needed(&self, seq: &Sequence, upto: usize) -> usize {
        upto.div_ceil(self.config.block_size)
            .saturating_sub(seq.blocks.len())
    }

    fn preempt_last(&mut self) -> Result<()> {
        let mut seq = self.running.pop().expect("preempt with nothing running");
        self.allocator.release(&seq.blocks)?;
        seq.blocks.clear();
        seq.num_computed = 0;
        if let Some(slot) = seq.slot.take() {
            self.free_slots.push(slot);
        }
        self.waiting.push_front(seq);
        Ok(())
    }

    /// Picks this step's work. Errors only on allocator inconsistencies.
    pub fn schedule(&mut self) -> Result<Vec<ScheduledChunk>> {
        let mut budget = self.config.max_batched_tokens;
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            let want = seq.tokens.len() - seq.num_computed;
            let len = want.min(budget).min(self.config.max_prefill_chunk);
            let need = self.blocks_needed(seq, seq.num_computed + len);
            if need > self.allocator.num_free() {
                // Free memory by preempting the newest sequence; if that is this one, stop here.
                let last = self.running.len() - 1;
                self.preempt_last()?;
                if last == i {
                    break;
                }
                continue;
            }
            let seq = &mut self.running[i];
            seq.blocks
                .extend(self.allocator.allocate(need).expect("checked free blocks"));
            out.push(ScheduledChunk {
                index: i,
                start: seq.num_computed,
                len,
                wants_logits: seq.num_computed + len == seq.tokens.len(),
            });
            budget -= len;
            i += 1;
        }
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(seq) = self.waiting.front() else {
                break;
            };
            let len = (seq.tokens.len() - seq.num_computed)
                .min(budget)
                .min(self.config.max_prefill_chunk);
            let need = self.blocks_needed(seq, seq.num_computed + len);
            if need > self.allocator.num_free() {
                break;
            }
            let mut seq = self.waiting.pop_front().expect("front exists");
            // `running.len() < max_num_seqs` guarantees a free slot.
            seq.slot = self.free_slots.pop();
            seq.blocks
                .extend(self.allocator.allocate(need).expect("checked free blocks"));
            out.push(ScheduledChunk {
                index: self.running.len(),
                start: seq.num_computed,
                len,
                wants_logits: seq.num_computed + len == seq.tokens.len(),
            });
            budget -= len;
            self.running.push(seq);
        }
        Ok(out)
    }

    /// Removes sequence `id` wherever it is (waiting or running), freeing its blocks and state
    /// slot at once; `None` when no such sequence is unfinished.
    pub fn abort(&mut self, id: u64) -> Result<Option<Sequence>> {
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            let mut seq = self.waiting.remove(i).expect("position found");
            self.allocator.release(&seq.blocks)?;
            seq.blocks.clear();
            seq.finished = Some(FinishReason::Abort);
            return Ok(Some(seq));
        }
        let Some(i) = self.running.iter().position(|s| s.id == id) else {
            return Ok(None);
        };
        let mut seq = self.running.remove(i);
        self.allocator.release(&seq.blocks)?;
        seq.blocks.clear();
        if let Some(slot) = seq.slot.take() {
            self.free_slots.push(slot);
        }
        seq.finished = Some(FinishReason::Abort);
        Ok(Some(seq))
    }

    /// Removes finished sequences from `running`, returning their blocks to the allocator.
    pub fn reap_finished(&mut self) -> Result<Vec<Sequence>> {
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].finished.is_some() {
                let mut seq = self.running.remove(i);
                self.allocator.release(&seq.blocks)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn seq(id: u64, len: usize) -> Sequence {
        Sequence::new(id, (0..len as u32).collect(), SamplingParams::default())
    }

    #[test]
    fn prompt_is_chunked_under_the_budget() {
        let cfg = SchedulerConfig {
            max_batched_tokens: 8,
            max_prefill_chunk: 8,
            max_num_seqs: 4,
            block_size: 4,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg, 16).unwrap();
        s.add(seq(0, 20));
        let mut starts = vec![];
        loop {
            let chunks = s.schedule().unwrap();
            let c = chunks[0];
            starts.push((c.start, c.len, c.wants_logits));
            s.running[0].num_computed += c.len;
            if c.wants_logits {
                break;
            }
        }
        assert_eq!(starts, vec![(0, 8, false), (8, 8, false), (16, 4, true)]);
        assert_eq!(s.running[0].blocks.len(), 5);
    }

    #[test]
    fn decode_and_prefill_share_a_step() {
        let cfg = SchedulerConfig {
            max_batched_tokens: 6,
            max_prefill_chunk: 6,
            max_num_seqs: 4,
            block_size: 4,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg, 16).unwrap();
        s.add(seq(0, 3));
        let c = s.schedule().unwrap();
        s.running[0].num_computed += c[0].len;
        s.running[0].tokens.push(9);
        s.add(seq(1, 10));
        let c = s.schedule().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].start, c[0].len), (3, 1), "decode of seq 0");
        assert_eq!(
            (c[1].start, c[1].len, c[1].wants_logits),
            (0, 5, false),
            "first chunk of seq 1"
        );
    }

    #[test]
    fn out_of_blocks_preempts_newest_and_frees_everything_at_the_end() {
        let cfg = SchedulerConfig {
            max_batched_tokens: 64,
            max_prefill_chunk: 64,
            max_num_seqs: 4,
            block_size: 4,
            ..Default::default()
        };
        let mut s = Scheduler::new(cfg, 3).unwrap();
        s.add(seq(0, 4));
        s.add(seq(1, 4));
        s.add(seq(2, 4));
        let c = s.schedule().unwrap();
        assert_eq!(c.len(), 3);
        for (k, ch) in c.iter().enumerate() {
            s.running[k].num_computed += ch.len;
            s.running[k].tokens.push(1);
        }
        // Each now needs a second block; only one sequence can keep going.
        let c = s.schedule().unwrap();
        assert_eq!(c.len(), 1);
        assert_eq!(s.running.len(), 1);
        assert_eq!(s.waiting.len(), 2);
        assert_eq!(
            s.waiting[0].num_computed, 0,
            "preempted sequences recompute"
        );
        for r in s.running.iter_mut() {
            r.finished = Some(FinishReason::Length);
        }
        s.reap_finished().unwrap();
        assert_eq!(s.allocator.num_free(), 3);
    }
}
