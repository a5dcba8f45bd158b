//! A free list of physical cache blocks with reference counts (so that blocks can later be shared
//! by sequences with a common prefix).

use anyhow::{bail, Result};

/// Hands out block ids `0..num_blocks`.
#[derive(Clone, Debug)]
pub struct BlockAllocator {
    free: Vec<u32>,
    ref_counts: Vec<u32>,
}

impl BlockAllocator {
    /// All `num_blocks` blocks free.
    pub fn new(num_blocks: usize) -> Self {
        // Reversed so that `pop` hands out low ids first (easier to read in traces).
        Self {
            free: (0..num_blocks as u32).rev().collect(),
            ref_counts: vec![0; num_blocks],
        }
    }

    /// Blocks not in use.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// All blocks.
    pub fn num_blocks(&self) -> usize {
        self.ref_counts.len()
    }

    /// Takes `n` blocks, or none (and `None`) when fewer than `n` are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if n > self.free.len() {
            return None;
        }
        let blocks = self.free.split_off(self.free.len() - n);
        for &b in &blocks {
            self.ref_counts[b as usize] = 1;
        }
        Some(blocks)
    }

    /// Drops one reference to each block; a block returns to the free list at zero.
    ///
    /// Errors on a block id out of range or already free (a scheduler bug).
    pub fn release(&mut self, blocks: &[u32]) -> Result<()> {
        for &b in blocks {
            let Some(rc) = self.ref_counts.get_mut(b as usize) else {
                bail!("block {b} out of range");
            };
            if *rc == 0 {
                bail!("block {b} released twice");
            }
            *rc -= 1;
            if *rc == 0 {
                self.free.push(b);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_release_round_trip() {
        let mut a = BlockAllocator::new(4);
        let x = a.allocate(3).unwrap();
        assert_eq!(x.len(), 3);
        assert_eq!(a.num_free(), 1);
        assert!(a.allocate(2).is_none());
        assert_eq!(a.num_free(), 1, "a failed allocation takes nothing");
        a.release(&x).unwrap();
        assert_eq!(a.num_free(), 4);
        assert!(a.release(&x[..1]).is_err(), "double free is caught");
    }
}
