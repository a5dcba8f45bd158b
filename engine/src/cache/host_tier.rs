//! The host-memory tier: cache blocks evicted from the device and sequences swapped out on
//! preemption, kept in host memory (SGLang HiCache's L2, vLLM's CPU offloading connector).
//!
//! Blocks are named by the same [`BlockHash`] as on the device, so a host hit is a prefix hit
//! one tier down: the block is paged back into a device block before the step that reads it.
//! The bytes are kept verbatim ([`dayone_backend::Backend::rows_to_host`] /
//! [`dayone_backend::Backend::rows_from_host`]; on CUDA in page-locked host memory that the
//! copy kernels reach directly), so a host hit restores exactly what the device held. Least recently used blocks leave first; swapped sequences reserve their bytes until
//! they are paged back (or aborted).

use super::prefix::BlockHash;
use dayone_backend::HostRow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Rows copied off the device ([`dayone_backend::Backend::rows_to_host`]: page-locked,
/// device-mapped memory on CUDA): per cache tensor, in
/// [`crate::cache::KvCache::block_tensors`] (then `state_tensors`) order, its rows (one per
/// block, or the state slot's row).
pub type HostRows = Arc<Vec<Vec<HostRow>>>;

/// Cached blocks and swap reservations in host memory, within a byte budget.
#[derive(Debug)]
pub struct HostTier {
    capacity: u64,
    used: u64,
    /// Bytes one block takes over every per-token cache tensor.
    pub block_bytes: u64,
    /// Bytes one sequence's recurrent state takes (0 without recurrent layers).
    pub state_bytes: u64,
    /// Entries by name: their bytes, size and last use.
    blocks: HashMap<BlockHash, (HostRows, u64, u64)>,
    lru: BTreeMap<u64, BlockHash>,
    tick: u64,
}

impl HostTier {
    /// An empty tier of `capacity` bytes for blocks of `block_bytes` and states of
    /// `state_bytes`.
    pub fn new(capacity: u64, block_bytes: u64, state_bytes: u64) -> Self {
        Self {
            capacity,
            used: 0,
            block_bytes,
            state_bytes,
            blocks: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
        }
    }

    /// The budget in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes held (blocks and swap reservations).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// Bytes of the cached entries (blocks and state checkpoints), without swap reservations.
    pub fn entry_bytes(&self) -> u64 {
        self.blocks.values().map(|e| e.1).sum()
    }

    /// Blocks held.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the block named `h` is held (no use recorded).
    pub fn contains(&self, h: &BlockHash) -> bool {
        self.blocks.contains_key(h)
    }

    /// The bytes of the block named `h`, marked used.
    pub fn get(&mut self, h: &BlockHash) -> Option<HostRows> {
        let (rows, _, t) = self.blocks.get_mut(h)?;
        self.lru.remove(t);
        self.tick += 1;
        *t = self.tick;
        self.lru.insert(self.tick, *h);
        Some(rows.clone())
    }

    /// Evicts least recently used blocks until `bytes` more fit; false when they cannot.
    fn make_room(&mut self, bytes: u64) -> bool {
        while self.used + bytes > self.capacity {
            let Some((_, h)) = self.lru.pop_first() else {
                return false;
            };
            let (_, bytes, _) = self.blocks.remove(&h).expect("lru entries exist");
            self.used -= bytes;
        }
        true
    }

    /// Keeps the block named `h` (already held: marked used). Returns whether it is held now.
    pub fn store(&mut self, h: BlockHash, rows: HostRows) -> bool {
        let bytes = self.block_bytes;
        self.store_sized(h, rows, bytes)
    }

    /// Keeps a recurrent-state checkpoint evicted from the device, named by the block that ends
    /// its prefix (kept apart from that block's own entry).
    pub fn store_state(&mut self, h: &BlockHash, rows: HostRows) -> bool {
        let bytes = self.state_bytes;
        self.store_sized(state_key(h), rows, bytes)
    }

    /// Whether a state checkpoint after the prefix named `h` is held.
    pub fn contains_state(&self, h: &BlockHash) -> bool {
        self.blocks.contains_key(&state_key(h))
    }

    /// The state checkpoint after the prefix named `h`, marked used.
    pub fn get_state(&mut self, h: &BlockHash) -> Option<HostRows> {
        self.get(&state_key(h))
    }

    fn store_sized(&mut self, h: BlockHash, rows: HostRows, bytes: u64) -> bool {
        if self.get(&h).is_some() {
            return true;
        }
        if !self.make_room(bytes) {
            return false;
        }
        self.used += bytes;
        self.tick += 1;
        self.blocks.insert(h, (rows, bytes, self.tick));
        self.lru.insert(self.tick, h);
        true
    }

    /// Reserves room for a swapped-out sequence of `blocks` blocks (evicting cached blocks
    /// when needed); the bytes reserved, or `None` when it does not fit.
    pub fn reserve_swap(&mut self, blocks: usize) -> Option<u64> {
        let bytes = blocks as u64 * self.block_bytes + self.state_bytes;
        if !self.make_room(bytes) {
            return None;
        }
        self.used += bytes;
        Some(bytes)
    }

    /// Returns a swap reservation of `bytes`.
    pub fn release_swap(&mut self, bytes: u64) {
        self.used -= bytes.min(self.used);
    }

    /// Drops every cached block (swap reservations stay).
    pub fn clear(&mut self) {
        self.used -= self.blocks.values().map(|e| e.1).sum::<u64>();
        self.blocks.clear();
        self.lru.clear();
    }
}

/// The host-tier name of the state checkpoint after the prefix named `h`.
fn state_key(h: &BlockHash) -> BlockHash {
    use sha2::{Digest, Sha256};
    let mut d = Sha256::new();
    d.update(b"dayone-state-checkpoint");
    d.update(h.0);
    BlockHash(d.finalize().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(x: u8) -> HostRows {
        Arc::new(vec![vec![HostRow::from_vec(
            dayone_backend::DType::U32,
            vec![1],
            vec![x; 4],
        )]])
    }

    #[test]
    fn least_recently_used_blocks_leave_first_and_swaps_reserve_room() {
        let h = |x: u8| BlockHash([x; 32]);
        let mut t = HostTier::new(30, 10, 5);
        assert!(t.store(h(1), rows(1)));
        assert!(t.store(h(2), rows(2)));
        assert!(t.get(&h(1)).is_some()); // h(2) is now the oldest
        assert!(t.store(h(3), rows(3)));
        assert_eq!(t.used(), 30);
        assert!(t.store(h(4), rows(4)));
        assert!(!t.contains(&h(2)) && t.contains(&h(1)));
        // A swap of one block (10) plus a state (5) evicts two blocks.
        assert_eq!(t.reserve_swap(1), Some(15));
        assert_eq!((t.num_blocks(), t.used()), (1, 25));
        assert_eq!(t.reserve_swap(3), None, "35 bytes never fit in 30");
        t.release_swap(15);
        t.clear();
        assert_eq!(t.used(), 0);
        assert_eq!(t.get(&h(4)).map(|r| r[0][0].bytes()[0]), None);
    }
}
