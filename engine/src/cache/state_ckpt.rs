//! Recurrent-state checkpoints for prefix caching of linear-attention layers (KDA).
//!
//! A recurrent layer keeps one fixed-size state per sequence instead of per-token entries, so a
//! cached prefix can only be resumed where a copy of the state was taken. After a step that ends
//! a sequence's prefill at a block boundary, the engine copies the sequence's state slot into a
//! checkpoint slot named by the [`BlockHash`] of the block that ends there; a later prompt with
//! that prefix copies it back into its own slot and computes only the rest (SGLang's Mamba radix
//! cache, vLLM's `mamba_cache_mode=align`). Checkpoint slots are extra rows of the same state
//! tensors (`[running slots + checkpoint slots, …]`); a sequence only ever writes its own
//! running slot, never a checkpoint another reads (tpu-inference PR 3412). Least recently used
//! checkpoints are overwritten first.

use super::prefix::BlockHash;
use std::collections::{BTreeMap, HashMap};

/// Checkpoint slots `first .. first + count` of the state tensors and what each holds.
#[derive(Clone, Debug)]
pub struct StateCheckpoints {
    first: u32,
    by_hash: HashMap<BlockHash, u32>,
    names: Vec<Option<BlockHash>>,
    lru: BTreeMap<u64, u32>,
    used_at: Vec<u64>,
    tick: u64,
}

impl StateCheckpoints {
    /// `count` empty checkpoint slots, numbered from `first` in the state tensors.
    pub fn new(first: u32, count: usize) -> Self {
        Self {
            first,
            by_hash: HashMap::new(),
            names: vec![None; count],
            lru: (0..count as u32).map(|i| (i as u64, i)).collect(),
            used_at: (0..count as u64).collect(),
            tick: count as u64,
        }
    }

    /// Checkpoint slots in all.
    pub fn capacity(&self) -> usize {
        self.names.len()
    }

    /// Checkpoints held.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// Whether no checkpoint is held.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    fn touch(&mut self, i: u32) {
        self.lru.remove(&self.used_at[i as usize]);
        self.tick += 1;
        self.used_at[i as usize] = self.tick;
        self.lru.insert(self.tick, i);
    }

    /// Whether a state after the prefix named `h` is held (no use recorded).
    pub fn contains(&self, h: &BlockHash) -> bool {
        self.by_hash.contains_key(h)
    }

    /// The state-tensor slot holding the state after the prefix named `h`, marked used.
    pub fn lookup(&mut self, h: &BlockHash) -> Option<u32> {
        let i = *self.by_hash.get(h)?;
        self.touch(i);
        Some(self.first + i)
    }

    /// A slot to copy the state after prefix `h` into: `None` when that state is already held
    /// (or there are no checkpoint slots); otherwise the least recently used slot, renamed, with
    /// the name of the checkpoint it held (which the host tier may keep before it is
    /// overwritten).
    pub fn store(&mut self, h: BlockHash) -> Option<(u32, Option<BlockHash>)> {
        if let Some(&i) = self.by_hash.get(&h) {
            self.touch(i);
            return None;
        }
        let (_, i) = self.lru.pop_first()?;
        let old = self.names[i as usize].take();
        if let Some(old) = &old {
            self.by_hash.remove(old);
        }
        self.names[i as usize] = Some(h);
        self.by_hash.insert(h, i);
        self.tick += 1;
        self.used_at[i as usize] = self.tick;
        self.lru.insert(self.tick, i);
        Some((self.first + i, old))
    }

    /// Forgets every checkpoint.
    pub fn clear(&mut self) {
        self.by_hash.clear();
        self.names.iter_mut().for_each(|n| *n = None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_lookup_and_least_recently_used_reuse() {
        let h = |x: u8| BlockHash([x; 32]);
        let mut c = StateCheckpoints::new(10, 2);
        assert_eq!(c.store(h(1)), Some((10, None)));
        assert_eq!(c.store(h(1)), None, "already held");
        assert_eq!(c.store(h(2)), Some((11, None)));
        assert_eq!(c.lookup(&h(1)), Some(10)); // h(2) is now the oldest
        assert_eq!(c.store(h(3)), Some((11, Some(h(2)))));
        assert!(c.lookup(&h(2)).is_none());
        assert_eq!(c.len(), 2);
        assert!(StateCheckpoints::new(0, 0).store(h(1)).is_none());
    }
}
