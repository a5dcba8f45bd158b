//! Block hashes for prefix caching: each full block of a sequence is named by a hash chained
//! over every token before it, so equal hashes mean equal prefixes (vLLM v1
//! `kv_cache_utils.hash_block_tokens`; nano-vllm `BlockManager.compute_hash`).
//!
//! `hash_0 = H(NONE ‖ salt ‖ tokens_0)`, `hash_i = H(hash_{i−1} ‖ tokens_i ‖ extra_i)` with
//! `H` = SHA-256 over little-endian token ids, so the names are stable across runs and
//! processes (vLLM's `sha256_cbor` idea) and a collision would need a SHA-256 collision.

use sha2::{Digest, Sha256};

/// The name of one full block together with every token before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; 32]);

/// What besides token ids makes two prefixes differ.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExtraKeys {
    /// A per-request namespace (OpenAI-style `cache_salt`): prefixes are shared only between
    /// requests with the same salt. Mixed into the first block only; the chain carries it on.
    pub cache_salt: Option<String>,
    /// Content hashes of items spliced into the prompt (images), with the token position where
    /// each starts; an item is mixed into every block that overlaps its span `start..end`.
    pub items: Vec<(usize, usize, [u8; 32])>,
}

/// Hash of block `index` (tokens `index·bs .. (index+1)·bs`) given its parent's hash.
pub fn hash_block(
    parent: Option<&BlockHash>,
    index: usize,
    tokens: &[u32],
    block_size: usize,
    extra: &ExtraKeys,
) -> BlockHash {
    let mut h = Sha256::new();
    match parent {
        Some(p) => h.update(p.0),
        None => {
            h.update(b"dayone-none-hash");
            if let Some(salt) = &extra.cache_salt {
                h.update((salt.len() as u64).to_le_bytes());
                h.update(salt.as_bytes());
            }
        }
    }
    for t in tokens {
        h.update(t.to_le_bytes());
    }
    let (lo, hi) = (index * block_size, (index + 1) * block_size);
    for (start, end, item) in &extra.items {
        if *start < hi && *end > lo {
            h.update((*start as u64).to_le_bytes());
            h.update(item);
        }
    }
    BlockHash(h.finalize().into())
}

/// Extends `hashes` to cover every full block of `tokens` (blocks already hashed are kept).
pub fn extend_hashes(
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: usize,
    extra: &ExtraKeys,
) {
    let full = tokens.len() / block_size;
    while hashes.len() < full {
        let i = hashes.len();
        let h = hash_block(
            hashes.last(),
            i,
            &tokens[i * block_size..(i + 1) * block_size],
            block_size,
            extra,
        );
        hashes.push(h);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_depends_on_every_earlier_token_and_the_salt() {
        let none = ExtraKeys::default();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        extend_hashes(&mut a, &[1, 2, 3, 4, 5, 6, 7], 2, &none);
        extend_hashes(&mut b, &[1, 9, 3, 4, 5, 6], 2, &none);
        assert_eq!(a.len(), 3, "only full blocks are hashed");
        assert_ne!(a[0], b[0]);
        assert_ne!(
            a[1], b[1],
            "a different first block changes every later hash"
        );
        let mut c = Vec::new();
        extend_hashes(&mut c, &[1, 2, 3, 4], 2, &none);
        assert_eq!(&a[..2], &c[..]);
        let salted = ExtraKeys {
            cache_salt: Some("tenant".into()),
            ..Default::default()
        };
        let mut d = Vec::new();
        extend_hashes(&mut d, &[1, 2, 3, 4], 2, &salted);
        assert_ne!(c[0], d[0]);
        assert_ne!(c[1], d[1]);
    }

    #[test]
    fn items_change_only_the_blocks_they_overlap() {
        let img = ExtraKeys {
            items: vec![(2, 4, [7; 32])],
            ..Default::default()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        extend_hashes(&mut a, &[1, 2, 3, 4, 5, 6], 2, &ExtraKeys::default());
        extend_hashes(&mut b, &[1, 2, 3, 4, 5, 6], 2, &img);
        assert_eq!(a[0], b[0]);
        assert_ne!(a[1], b[1]);
    }
}
