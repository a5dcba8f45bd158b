//! How many cache blocks to allocate: the requested (or default) token capacity, checked against
//! the memory the device has free once the weights are loaded.

use anyhow::{bail, Result};

/// Bytes left free for activations, scratch buffers and the allocator: a tenth of the free
/// memory, at least this much.
pub const MIN_HEADROOM_BYTES: u64 = 256 << 20;

/// The part of `free` bytes the cache may take: `free − max(free / 10, 256 MiB)`.
pub fn usable_bytes(free: u64) -> u64 {
    free.saturating_sub((free / 10).max(MIN_HEADROOM_BYTES))
}

/// A byte count for messages: `24.0 GiB`, `312.5 MiB`.
pub fn human_bytes(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

/// What the cache costs and what the device offers, for [`cache_blocks`].
#[derive(Clone, Copy, Debug)]
pub struct CacheRequest {
    /// `--kv-cache-tokens`, when the user gave it.
    pub requested_tokens: Option<usize>,
    /// The capacity used when none is requested (before the memory cap).
    pub default_tokens: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Cache bytes per token over all layers.
    pub bytes_per_token: usize,
    /// Recurrent-state bytes per sequence over all layers (0 without recurrent layers).
    pub state_bytes_per_seq: usize,
    /// State slots allocated (the scheduler's `max_num_seqs`).
    pub state_slots: usize,
    /// The device's free bytes after the weights are loaded ([`dayone_backend::Backend::free_memory`]).
    pub free_bytes: Option<u64>,
}

/// Cache blocks to allocate.
///
/// Rule: a requested capacity is `⌈tokens / block_size⌉` blocks and must fit, together with the
/// recurrent state slots, in [`usable_bytes`] of the free memory (an error otherwise, naming
/// both figures). The default capacity is `default_tokens`, lowered to what fits in the usable
/// memory when it does not. When the backend cannot tell its free memory only arithmetic
/// overflow and the 2³² block-id limit are checked.
pub fn cache_blocks(r: &CacheRequest) -> Result<usize> {
    if r.block_size == 0 {
        bail!("the KV cache block size must be positive");
    }
    let state = (r.state_bytes_per_seq as u64).checked_mul(r.state_slots as u64);
    let Some(state) = state else {
        bail!(
            "the recurrent state of {} sequences overflows a 64-bit byte count",
            r.state_slots
        );
    };
    let per_block = (r.bytes_per_token as u64).checked_mul(r.block_size as u64);
    let Some(per_block) = per_block else {
        bail!("the KV cache needs more than 2^64 bytes per block");
    };
    let need = |blocks: usize| {
        (blocks as u64)
            .checked_mul(per_block)
            .and_then(|b| b.checked_add(state))
    };
    let usable = r.free_bytes.map(usable_bytes);
    let max_blocks = u32::MAX as usize;
    match r.requested_tokens {
        Some(0) => bail!("--kv-cache-tokens must be at least 1"),
        Some(tokens) => {
            let blocks = tokens.div_ceil(r.block_size);
            let what = if state > 0 {
                "KV cache and recurrent state"
            } else {
                "KV cache"
            };
            let Some(bytes) = need(blocks).filter(|_| blocks <= max_blocks) else {
                bail!(
                    "--kv-cache-tokens {tokens} is too large (at most {} tokens): lower --kv-cache-tokens",
                    max_blocks.saturating_mul(r.block_size)
                );
            };
            if let (Some(free), Some(usable)) = (r.free_bytes, usable) {
                if bytes > usable {
                    bail!(
                        "--kv-cache-tokens {tokens} needs {} of {what} but the device has {} free \
                         ({} usable after headroom): lower --kv-cache-tokens",
                        human_bytes(bytes),
                        human_bytes(free),
                        human_bytes(usable)
                    );
                }
            }
            Ok(blocks)
        }
        None => {
            let blocks = r.default_tokens.div_ceil(r.block_size).clamp(1, max_blocks);
            let (Some(free), Some(usable)) = (r.free_bytes, usable) else {
                return Ok(blocks);
            };
            if need(blocks).is_some_and(|b| b <= usable) {
                return Ok(blocks);
            }
            if state >= usable {
                bail!(
                    "the recurrent state of {} sequences needs {} but the device has {} free \
                     ({} usable after headroom): allow fewer concurrent sequences",
                    r.state_slots,
                    human_bytes(state),
                    human_bytes(free),
                    human_bytes(usable)
                );
            }
            // A model without per-token cache (per_block 0) keeps the default.
            let fit = (usable - state)
                .checked_div(per_block)
                .map_or(blocks, |f| f.min(blocks as u64) as usize);
            if fit == 0 {
                bail!(
                    "one KV cache block ({} tokens) needs {} but the device has {} free \
                     ({} usable after headroom)",
                    r.block_size,
                    human_bytes(per_block),
                    human_bytes(free),
                    human_bytes(usable)
                );
            }
            tracing::warn!(
                "KV cache lowered from {} to {} tokens to fit the {} the device has free",
                blocks * r.block_size,
                fit * r.block_size,
                human_bytes(free)
            );
            Ok(fit)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn req(tokens: Option<usize>, free: Option<u64>) -> CacheRequest {
        CacheRequest {
            requested_tokens: tokens,
            default_tokens: 4096,
            block_size: 16,
            bytes_per_token: 256,
            state_bytes_per_seq: 0,
            state_slots: 256,
            free_bytes: free,
        }
    }

    #[test]
    fn a_request_that_fits_is_granted() {
        assert_eq!(cache_blocks(&req(Some(1000), Some(GIB))).unwrap(), 63);
        assert_eq!(cache_blocks(&req(None, Some(GIB))).unwrap(), 256);
        assert_eq!(cache_blocks(&req(Some(1000), None)).unwrap(), 63);
    }

    #[test]
    fn a_request_larger_than_free_memory_names_both_sizes() {
        // 100M tokens × 256 B = 23.8 GiB against 11.2 GiB free.
        let free = 11 * GIB + GIB / 5;
        let e = cache_blocks(&req(Some(100_000_000), Some(free)))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--kv-cache-tokens 100000000 needs 23.8 GiB of KV cache"),
            "{e}"
        );
        assert!(e.contains("11.2 GiB free"), "{e}");
        assert!(e.ends_with("lower --kv-cache-tokens"), "{e}");
    }

    #[test]
    fn huge_requests_do_not_overflow() {
        for tokens in [usize::MAX, usize::MAX / 2, 1 << 40] {
            let e = cache_blocks(&req(Some(tokens), None))
                .unwrap_err()
                .to_string();
            assert!(e.contains("too large"), "{e}");
        }
        let mut r = req(Some(1 << 20), Some(GIB));
        r.bytes_per_token = usize::MAX;
        assert!(cache_blocks(&r).is_err());
        let mut r = req(None, Some(GIB));
        r.state_bytes_per_seq = usize::MAX;
        assert!(cache_blocks(&r).is_err());
        assert!(cache_blocks(&req(Some(0), None)).is_err());
    }

    #[test]
    fn the_default_shrinks_to_fit_free_memory() {
        // Usable: 1 GiB − 256 MiB = 768 MiB; 4096 tokens × 1 MiB do not fit.
        let mut r = req(None, Some(GIB));
        r.bytes_per_token = 1 << 20;
        assert_eq!(cache_blocks(&r).unwrap(), 768 / 16);
        // Recurrent state is paid first.
        r.state_bytes_per_seq = 1 << 20;
        assert_eq!(cache_blocks(&r).unwrap(), (768 - 256) / 16);
        // Nothing fits: an error, not a zero-block cache.
        r.bytes_per_token = 1 << 30;
        assert!(cache_blocks(&r).is_err());
    }

    #[test]
    fn headroom_is_a_tenth_or_256_mib() {
        assert_eq!(usable_bytes(100 * GIB), 90 * GIB);
        assert_eq!(usable_bytes(GIB), GIB - (256 << 20));
        assert_eq!(usable_bytes(1 << 20), 0);
        assert_eq!(human_bytes(24 * GIB), "24.0 GiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
    }
}
