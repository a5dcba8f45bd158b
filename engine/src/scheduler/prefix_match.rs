//! Prefix lookup at admission and where prefill steps end: the longest cached prefix a new
//! sequence can resume after (device blocks, then host-tier blocks, then — for recurrent
//! models — the last state checkpoint within them), and chunk cuts at checkpoint points.

use super::{Scheduler, Sequence};
use crate::cache::HostRows;
use anyhow::Result;

/// What a prefix lookup found for one sequence.
#[derive(Default)]
pub(super) struct Match {
    /// `(checkpoint slot, running slot)` when it resumes from a state checkpoint.
    pub(super) restore: Option<(u32, u32)>,
    /// Blocks to page back from the host tier: `(device block, its bytes)`.
    pub(super) loads: Vec<(u32, HostRows)>,
    /// A state checkpoint paged back from the host tier into `(running slot, its bytes)`.
    pub(super) state_load: Option<(u32, HostRows)>,
}

impl Scheduler {
    /// Looks up the longest cached prefix of a newly admitted `seq` (it holds a running slot and
    /// no blocks): shares its blocks, sets `num_computed`, and returns the state restore when
    /// the model is recurrent. At most `len − 1` tokens hit, so that the step computes at least
    /// the last token and has its logits (vLLM `get_computed_blocks`).
    pub(super) fn match_prefix(&mut self, seq: &mut Sequence) -> Result<Match> {
        let bs = self.config.block_size;
        let mut m = Match::default();
        if !self.prefix.enabled || !seq.blocks.is_empty() || seq.num_computed > 0 {
            return Ok(m);
        }
        crate::cache::prefix::extend_hashes(
            &mut seq.block_hashes,
            &seq.tokens,
            bs,
            &seq.extra_keys,
        );
        let max_blocks = (seq.tokens.len() - 1) / bs;
        let mut hit: Vec<u32> = Vec::new();
        for h in seq.block_hashes.iter().take(max_blocks) {
            match self.pool.lookup(h) {
                Some(b) => hit.push(b),
                None => break,
            }
        }
        // One tier down: blocks evicted to host memory continue the device hit.
        let mut host: Vec<HostRows> = Vec::new();
        if let Some(tier) = &mut self.host {
            for h in seq.block_hashes.iter().take(max_blocks).skip(hit.len()) {
                match tier.get(h) {
                    Some(r) => host.push(r),
                    None => break,
                }
            }
        }
        let kv_blocks = hit.len() + host.len();
        let k = self.resume_blocks(&seq.block_hashes, kv_blocks);
        host.truncate(k.saturating_sub(hit.len()));
        hit.truncate(k);
        for &b in &hit {
            self.pool.acquire(b)?;
        }
        let device_hit = hit.len();
        if !host.is_empty() {
            // Paged back into fresh device blocks, named at once: the copies happen before the
            // step's forward pass, which is the first that can read them.
            match self.pool.allocate(host.len()) {
                Some(blocks) => {
                    for (i, (b, rows)) in blocks.into_iter().zip(host).enumerate() {
                        self.pool.register(b, seq.block_hashes[device_hit + i]);
                        hit.push(b);
                        m.loads.push((b, rows));
                    }
                }
                None => {
                    // No room to page them in: fall back to the device hit (for a recurrent
                    // model, to its last checkpoint within it).
                    let k = self.resume_blocks(&seq.block_hashes, device_hit);
                    self.pool.release(&hit[k..])?;
                    hit.truncate(k);
                }
            }
        }
        if self.prefix.recurrent && !hit.is_empty() {
            let h = seq.block_hashes[hit.len() - 1];
            let slot = seq.slot.expect("admitted sequences hold a slot");
            match self.checkpoints.lookup(&h) {
                Some(from) => m.restore = Some((from, slot)),
                None => {
                    let rows = self.host.as_mut().and_then(|t| t.get_state(&h));
                    m.state_load = Some((slot, rows.expect("checked by has_checkpoint")));
                }
            }
        }
        seq.junction = kv_blocks * bs;
        seq.num_computed = hit.len() * bs;
        seq.num_registered = hit.len();
        seq.blocks = hit;
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(seq.num_computed);
            let c = &mut self.counters;
            c.prefix_query_tokens += seq.tokens.len() as u64;
            c.prefix_hit_tokens += seq.num_computed as u64;
            c.state_miss_tokens += (seq.junction - seq.num_computed) as u64;
            if self.host.is_some() {
                c.host_query_tokens += (seq.tokens.len() - device_hit * bs) as u64;
                c.host_hit_tokens += (m.loads.len() * bs) as u64;
            }
        }
        Ok(m)
    }

    /// Undoes a prefix match whose sequence could not be admitted after all: paged-in blocks
    /// lose their names (their copies are dropped), then every block is released.
    /// How many of the first `blocks` cached blocks a sequence can resume after: all of them
    /// for per-token caches; for a recurrent model the longest aligned prefix with a state
    /// checkpoint (the state exists only where a copy was taken).
    fn resume_blocks(&self, hashes: &[crate::cache::prefix::BlockHash], blocks: usize) -> usize {
        if !self.prefix.recurrent {
            return blocks;
        }
        let step = self.prefix.alignment / self.config.block_size;
        let mut k = blocks / step * step;
        while k > 0 && !self.has_checkpoint(&hashes[k - 1]) {
            k -= step;
        }
        k
    }

    /// Whether a state checkpoint after the prefix named `h` is on the device or the host.
    fn has_checkpoint(&self, h: &crate::cache::prefix::BlockHash) -> bool {
        self.checkpoints.contains(h) || self.host.as_ref().is_some_and(|t| t.contains_state(h))
    }

    /// Keeps a state checkpoint evicted from its device slot in the host tier.
    pub fn store_state(&mut self, h: &crate::cache::prefix::BlockHash, rows: HostRows) -> bool {
        self.host.as_mut().is_some_and(|t| t.store_state(h, rows))
    }

    pub(super) fn unmatch(&mut self, seq: &mut Sequence, m: &Match) -> Result<()> {
        for (b, _) in &m.loads {
            self.pool.forget(*b);
        }
        self.rewind(seq)
    }

    /// Tokens of `seq` to compute now, at most `limit`: cut so that a recurrent model's
    /// prefill steps end where state checkpoints are wanted (block boundaries, the prompt's last
    /// block boundary, the shared-prefix junction, every `checkpoint_interval` tokens).
    pub(super) fn chunk_len(&self, seq: &Sequence, limit: usize) -> usize {
        let s = seq.num_computed;
        let len = (seq.tokens.len() - s)
            .min(limit)
            .min(self.config.max_prefill_chunk);
        if !(self.prefix.recurrent && seq.prefilling()) || len == 0 {
            return len;
        }
        let a = self.prefix.alignment;
        let mut e = s + len;
        // Steps of a recurrent model end at its alignment where they can, with the cache on or
        // off, so that the kernels see the same splits either way (and chunked == one pass).
        if e < seq.prompt_len && e / a * a > s {
            e = e / a * a;
        }
        if !self.prefix.enabled {
            return e - s;
        }
        let mut cut = |p: usize| {
            let p = p / a * a;
            if s < p && p < e {
                e = p;
            }
        };
        // The last aligned point before the prompt end: a repeat of the prompt hits there (hits
        // stop one token short of the prompt), and so does a longer next turn.
        cut(seq.prompt_len - 1);
        cut(seq.junction);
        if self.prefix.checkpoint_interval > 0 {
            let i = self.prefix.checkpoint_interval;
            cut((s / i + 1) * i);
        }
        if e < seq.prompt_len && e / a * a > s {
            e = e / a * a;
        }
        e - s
    }
}
