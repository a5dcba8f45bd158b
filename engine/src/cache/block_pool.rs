//! Physical cache blocks with reference counts and a prefix cache over them (vLLM v1
//! `block_pool.py`; nano-vllm `block_manager.py`).
//!
//! A block is in exactly one of three states: *in use* (ref count > 0, possibly shared by
//! several sequences when it holds a cached prefix), *cached* (ref count 0 but still named by
//! its [`BlockHash`], findable, kept in least-recently-used order and evicted only when the pool
//! needs room) or *free* (no hash). Freed chains are queued tail first so that a chain's last
//! block is evicted before its first (a shared head outlives the tails that hang off it).

use super::prefix::BlockHash;
use anyhow::{bail, Result};
use std::collections::{BTreeMap, HashMap};

/// Hands out block ids `0..num_blocks` and remembers which hold which prefix.
#[derive(Clone, Debug)]
pub struct BlockPool {
    ref_counts: Vec<u32>,
    hashes: Vec<Option<BlockHash>>,
    by_hash: HashMap<BlockHash, u32>,
    /// Blocks without a hash and no user; handed out first.
    free: Vec<u32>,
    /// Cached blocks no sequence holds, by the tick at which they were released (oldest first).
    lru: BTreeMap<u64, u32>,
    lru_tick: Vec<u64>,
    tick: u64,
    /// Cached blocks given out for new data since the last [`BlockPool::take_evicted`].
    evicted: Vec<(u32, BlockHash)>,
}

impl BlockPool {
    /// All `num_blocks` blocks free.
    pub fn new(num_blocks: usize) -> Self {
        // Reversed so that `pop` hands out low ids first (easier to read in traces).
        Self {
            ref_counts: vec![0; num_blocks],
            hashes: vec![None; num_blocks],
            by_hash: HashMap::new(),
            free: (0..num_blocks as u32).rev().collect(),
            lru: BTreeMap::new(),
            lru_tick: vec![0; num_blocks],
            tick: 0,
            evicted: Vec::new(),
        }
    }

    /// All blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Blocks that an allocation may take: free ones plus cached ones no sequence holds.
    pub fn num_free(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Cached blocks no sequence holds (a subset of [`BlockPool::num_free`]).
    pub fn num_evictable(&self) -> usize {
        self.lru.len()
    }

    /// Blocks named by a hash, held or not.
    pub fn num_cached(&self) -> usize {
        self.by_hash.len()
    }

    /// The cached block holding the prefix named `h`, if any.
    pub fn lookup(&self, h: &BlockHash) -> Option<u32> {
        self.by_hash.get(h).copied()
    }

    /// Takes `n` blocks for new data (free ones first, then the least recently used cached
    /// ones, which lose their hash), or none (and `None`) when fewer than `n` are available.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.num_free() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let b = match self.free.pop() {
                Some(b) => b,
                None => {
                    let (_, b) = self.lru.pop_first().expect("counted above");
                    let h = self.hashes[b as usize]
                        .take()
                        .expect("lru blocks are hashed");
                    self.by_hash.remove(&h);
                    self.evicted.push((b, h));
                    b
                }
            };
            self.ref_counts[b as usize] = 1;
            out.push(b);
        }
        Some(out)
    }

    /// Adds a user to a cached block (a prefix hit), taking it off the eviction order.
    pub fn acquire(&mut self, b: u32) -> Result<()> {
        let Some(rc) = self.ref_counts.get_mut(b as usize) else {
            bail!("block {b} out of range");
        };
        if *rc == 0 {
            if self.hashes[b as usize].is_none() {
                bail!("block {b} is free: only cached blocks can be shared");
            }
            self.lru.remove(&self.lru_tick[b as usize]);
        }
        *rc += 1;
        Ok(())
    }

    /// Drops one user of each block of a sequence's table `blocks` (in position order); blocks
    /// left without users become cached (if hashed, queued tail first) or free.
    ///
    /// Errors on a block id out of range or already free (a scheduler bug).
    pub fn release(&mut self, blocks: &[u32]) -> Result<()> {
        for &b in blocks.iter().rev() {
            let Some(rc) = self.ref_counts.get_mut(b as usize) else {
                bail!("block {b} out of range");
            };
            if *rc == 0 {
                bail!("block {b} released twice");
            }
            *rc -= 1;
            if *rc == 0 {
                if self.hashes[b as usize].is_some() {
                    self.tick += 1;
                    self.lru_tick[b as usize] = self.tick;
                    self.lru.insert(self.tick, b);
                } else {
                    self.free.push(b);
                }
            }
        }
        Ok(())
    }

    /// Names the in-use block `b` by `h` once its tokens are all in the cache. Returns false
    /// (and leaves `b` unnamed) when another block already holds that prefix or `b` has a name.
    pub fn register(&mut self, b: u32, h: BlockHash) -> bool {
        if self.by_hash.contains_key(&h) || self.hashes[b as usize].is_some() {
            return false;
        }
        self.hashes[b as usize] = Some(h);
        self.by_hash.insert(h, b);
        true
    }

    /// Takes the name off block `b` (a block paged in from the host whose copy was dropped,
    /// so that nothing finds bytes that never arrived).
    pub fn forget(&mut self, b: u32) {
        if let Some(h) = self.hashes[b as usize].take() {
            self.by_hash.remove(&h);
        }
    }

    /// Drops every cached block no sequence holds (they become free); returns how many.
    pub fn clear_cached(&mut self) -> usize {
        let n = self.lru.len();
        while let Some((_, b)) = self.lru.pop_first() {
            let h = self.hashes[b as usize]
                .take()
                .expect("lru blocks are hashed");
            self.by_hash.remove(&h);
            self.free.push(b);
        }
        n
    }

    /// The cached blocks reused for new data since the last call, with the hash each held
    /// (for the host tier, which keeps a copy before the block is overwritten).
    pub fn take_evicted(&mut self) -> Vec<(u32, BlockHash)> {
        std::mem::take(&mut self.evicted)
    }

    /// Checks the invariants (tests and debug checks): every block is in exactly one state and
    /// the hash index matches the blocks' names.
    pub fn check(&self) -> Result<()> {
        let mut seen = vec![0u8; self.num_blocks()];
        for &b in &self.free {
            seen[b as usize] += 1;
            if self.ref_counts[b as usize] != 0 || self.hashes[b as usize].is_some() {
                bail!("free block {b} is held or named");
            }
        }
        for (&t, &b) in &self.lru {
            seen[b as usize] += 1;
            if self.ref_counts[b as usize] != 0 || self.lru_tick[b as usize] != t {
                bail!("cached block {b} is held or out of order");
            }
        }
        for (b, &rc) in self.ref_counts.iter().enumerate() {
            if rc > 0 {
                seen[b] += 1;
            }
            if seen[b] != 1 {
                bail!("block {b} is in {} states", seen[b]);
            }
        }
        let named = self.hashes.iter().filter(|h| h.is_some()).count();
        if named != self.by_hash.len()
            || self
                .by_hash
                .iter()
                .any(|(h, &b)| self.hashes[b as usize] != Some(*h))
        {
            bail!("hash index out of step with the blocks' names");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: u8) -> BlockHash {
        BlockHash([x; 32])
    }

    #[test]
    fn allocate_release_round_trip() {
        let mut a = BlockPool::new(4);
        let x = a.allocate(3).unwrap();
        assert_eq!(x.len(), 3);
        assert_eq!(a.num_free(), 1);
        assert!(a.allocate(2).is_none());
        assert_eq!(a.num_free(), 1, "a failed allocation takes nothing");
        a.release(&x).unwrap();
        assert_eq!(a.num_free(), 4);
        assert!(a.release(&x[..1]).is_err(), "double free is caught");
        a.check().unwrap();
    }

    #[test]
    fn cached_blocks_are_shared_then_evicted_tail_first() {
        let mut a = BlockPool::new(3);
        let x = a.allocate(2).unwrap();
        assert!(a.register(x[0], h(1)));
        assert!(a.register(x[1], h(2)));
        assert!(!a.register(x[1], h(3)), "a named block keeps its name");
        a.release(&x).unwrap();
        assert_eq!((a.num_free(), a.num_evictable(), a.num_cached()), (3, 2, 2));
        // A hit shares the head block.
        let head = a.lookup(&h(1)).unwrap();
        a.acquire(head).unwrap();
        assert_eq!(a.num_free(), 2);
        // Two new blocks: the free one, then the cached tail (h(2)), never the held head.
        let y = a.allocate(2).unwrap();
        assert!(!y.contains(&head));
        assert_eq!(a.lookup(&h(2)), None, "the tail was evicted");
        assert_eq!(a.take_evicted(), vec![(x[1], h(2))]);
        assert_eq!(a.lookup(&h(1)), Some(head));
        a.release(&y).unwrap();
        a.release(&[head]).unwrap();
        a.check().unwrap();
        assert_eq!(a.clear_cached(), 1);
        assert_eq!((a.num_free(), a.num_cached()), (3, 0));
        assert!(a.acquire(head).is_err(), "a free block cannot be shared");
    }
}
