//! Encoder outputs kept by image content hash (vLLM's `EncoderCacheManager` idea, sized in
//! embedding rows): the same image in a later request — or later chunks of the same request —
//! skips the vision tower. Pure host code.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use dayone_backend::HostTensor;
use sha2::{Digest, Sha256};

use super::PreprocessedImage;

/// The content hash of a preprocessed image: SHA-256 over its grid and its f32 pixels, so equal
/// hashes mean the encoder sees equal inputs (vLLM hashes the decoded pixels the same way).
pub fn image_hash(img: &PreprocessedImage) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"dayone-image-v1");
    h.update((img.grid_h as u64).to_le_bytes());
    h.update((img.grid_w as u64).to_le_bytes());
    for v in &img.pixels {
        h.update(v.to_le_bytes());
    }
    h.finalize().into()
}

/// Projected rows per image hash, evicted oldest first past `capacity_rows`.
#[derive(Debug)]
pub struct EncoderCache {
    entries: HashMap<[u8; 32], Arc<HostTensor>>,
    order: VecDeque<[u8; 32]>,
    rows: usize,
    capacity_rows: usize,
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that ran the encoder.
    pub misses: u64,
}

impl EncoderCache {
    /// An empty cache holding up to `capacity_rows` rows (the newest entry is always kept).
    pub fn new(capacity_rows: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            rows: 0,
            capacity_rows,
            hits: 0,
            misses: 0,
        }
    }

    /// The rows of `hash`, counting a hit or a miss.
    pub fn get(&mut self, hash: &[u8; 32]) -> Option<Arc<HostTensor>> {
        match self.entries.get(hash) {
            Some(t) => {
                self.hits += 1;
                Some(t.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Stores `rows` `[n, D]` for `hash`, evicting the oldest entries past the capacity.
    pub fn insert(&mut self, hash: [u8; 32], rows: Arc<HostTensor>) {
        if self.entries.contains_key(&hash) {
            return;
        }
        self.rows += rows.shape.first().copied().unwrap_or(0);
        self.entries.insert(hash, rows);
        self.order.push_back(hash);
        while self.rows > self.capacity_rows && self.order.len() > 1 {
            if let Some(old) = self.order.pop_front() {
                if let Some(t) = self.entries.remove(&old) {
                    self.rows -= t.shape.first().copied().unwrap_or(0);
                }
            }
        }
    }

    /// Number of cached images.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Arc<HostTensor> {
        Arc::new(HostTensor::from_f32(vec![n, 2], &vec![0.0; n * 2]).unwrap())
    }

    #[test]
    fn hits_misses_and_eviction() {
        let mut c = EncoderCache::new(10);
        assert!(c.get(&[1; 32]).is_none());
        c.insert([1; 32], rows(6));
        assert!(c.get(&[1; 32]).is_some());
        c.insert([2; 32], rows(6)); // 12 > 10: the oldest goes
        assert!(c.get(&[1; 32]).is_none());
        assert!(c.get(&[2; 32]).is_some());
        assert_eq!((c.hits, c.misses, c.len()), (2, 2, 1));
    }

    #[test]
    fn hash_depends_on_pixels_and_grid() {
        let a = PreprocessedImage {
            grid_h: 2,
            grid_w: 2,
            pixels: vec![0.5; 4],
            resized: (28, 28),
        };
        let mut b = a.clone();
        b.pixels[3] = 0.25;
        let mut c = a.clone();
        (c.grid_h, c.grid_w) = (1, 4);
        assert_ne!(image_hash(&a), image_hash(&b));
        assert_ne!(image_hash(&a), image_hash(&c));
        assert_eq!(image_hash(&a), image_hash(&a.clone()));
    }
}
