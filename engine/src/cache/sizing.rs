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
    /// Bytes per token of the largest single cache tensor of one layer (e.g. the keys
    /// `[blocks, block_size, kv_heads, k_dim]` of a layer: `kv_heads · k_dim · dtype size`);
    /// see [`crate::cache::CacheSpec::largest_tensor_elements_per_token`].
    pub largest_tensor_bytes_per_token: usize,
    /// Recurrent-state bytes per sequence over all layers (0 without recurrent layers).
    pub state_bytes_per_seq: usize,
    /// Bytes per sequence of the largest single state tensor of one layer (`[slots, …]` f32);
    /// see [`crate::cache::CacheSpec::largest_state_tensor_elements_per_seq`].
    pub largest_state_tensor_bytes_per_seq: usize,
    /// State slots allocated (the scheduler's `max_num_seqs`).
    pub state_slots: usize,
    /// The device's free bytes after the weights are loaded ([`dayone_backend::Backend::free_memory`]).
    pub free_bytes: Option<u64>,
    /// The largest bytes one cache tensor may take on this backend
    /// ([`dayone_backend::Backend::max_buffer_bytes`]); `None`: no limit but the memory.
    pub max_tensor_bytes: Option<u64>,
}

/// Cache blocks to allocate.
///
/// Rule: a requested capacity is `⌈tokens / block_size⌉` blocks and must fit, together with the
/// recurrent state slots, in [`usable_bytes`] of the free memory, and each single cache tensor
/// (`blocks · block_size · largest_tensor_bytes_per_token` bytes) must fit in
/// `max_tensor_bytes` (an error otherwise, naming the figures and the largest capacity that
/// works). The default capacity is `default_tokens`, lowered (with a warning) to what fits
/// both limits when it does not. When the backend cannot tell its free memory only the tensor
/// limit, arithmetic overflow and the 2³² block-id limit are checked.
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
    if let Some(max_tensor) = r.max_tensor_bytes {
        let one = (r.largest_state_tensor_bytes_per_seq as u64).checked_mul(r.state_slots as u64);
        if one.is_none_or(|b| b > max_tensor) {
            bail!(
                "the recurrent state of {} sequences needs {} in one tensor but one cache tensor \
                 may not exceed {} on this backend: allow fewer concurrent sequences",
                r.state_slots,
                one.map_or_else(|| "more than 2^64 bytes".into(), human_bytes),
                byte_count(max_tensor)
            );
        }
    }
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
    // Blocks the largest cache tensor allows, with the limit, when the backend has one and the
    // model keeps per-token cache.
    let tensor_cap = r.max_tensor_bytes.and_then(|max_tensor| {
        let largest_per_block =
            (r.largest_tensor_bytes_per_token as u64).saturating_mul(r.block_size as u64);
        let blocks = max_tensor.checked_div(largest_per_block)?;
        Some((blocks.min(max_blocks as u64) as usize, max_tensor))
    });
    let one_block_too_large = |max_tensor: u64| {
        anyhow::anyhow!(
            "one KV cache block ({} tokens) needs {} in its largest cache tensor but one cache \
             tensor may not exceed {} on this backend",
            r.block_size,
            human_bytes(
                (r.largest_tensor_bytes_per_token as u64).saturating_mul(r.block_size as u64)
            ),
            byte_count(max_tensor)
        )
    };
    match r.requested_tokens {
        Some(0) => bail!("--kv-cache-tokens must be at least 1"),
        Some(tokens) => {
            let blocks = tokens.div_ceil(r.block_size);
            let what = if state > 0 {
                "KV cache and recurrent state"
            } else {
                "KV cache"
            };
            if let Some((0, max_tensor)) = tensor_cap {
                return Err(one_block_too_large(max_tensor));
            }
            // One limit, stated the same way whichever of the three a request exceeds: the
            // smallest of the 2^32 block ids, the largest bindable tensor and the free memory.
            let mut limit = (max_blocks, "block ids are 32-bit".to_string());
            if let Some((cap, max_tensor)) = tensor_cap {
                if cap < limit.0 {
                    limit = (
                        cap,
                        format!(
                            "one cache tensor may not exceed {} ({} per token in the largest)",
                            byte_count(max_tensor),
                            byte_count(r.largest_tensor_bytes_per_token as u64)
                        ),
                    );
                }
            }
            if let (Some(free), Some(usable)) = (r.free_bytes, usable) {
                let fit = usable
                    .checked_sub(state)
                    .map_or(0, |u| u.checked_div(per_block).unwrap_or(u64::MAX));
                if fit < limit.0 as u64 {
                    limit = (
                        fit as usize,
                        format!(
                            "the device has {} free, {} usable after headroom, for {} per token{}",
                            human_bytes(free),
                            human_bytes(usable),
                            byte_count(r.bytes_per_token as u64),
                            if state > 0 {
                                format!(" after {} of recurrent state", human_bytes(state))
                            } else {
                                String::new()
                            }
                        ),
                    );
                }
            }
            let bytes = need(blocks);
            if blocks > limit.0 || bytes.is_none() {
                let needs = bytes.map_or_else(|| "more than 2^64 bytes".into(), human_bytes);
                bail!(
                    "--kv-cache-tokens {tokens} is too large (needs {needs} of {what}): at most {} \
                     tokens on this backend ({}): lower --kv-cache-tokens",
                    limit.0.saturating_mul(r.block_size),
                    limit.1
                );
            }
            if !tokens.is_multiple_of(r.block_size) {
                tracing::info!(
                    "--kv-cache-tokens {tokens} rounded up to {} ({blocks} blocks of {} tokens)",
                    blocks * r.block_size,
                    r.block_size
                );
            }
            Ok(blocks)
        }
        None => {
            let default = r.default_tokens.div_ceil(r.block_size).clamp(1, max_blocks);
            let mut blocks = default;
            let mut reason = String::new();
            if let Some((cap, max_tensor)) = tensor_cap {
                if cap == 0 {
                    return Err(one_block_too_large(max_tensor));
                }
                if cap < blocks {
                    blocks = cap;
                    reason = format!(
                        "so that no cache tensor exceeds {}, the largest this backend can bind",
                        byte_count(max_tensor)
                    );
                }
            }
            if let (Some(free), Some(usable)) = (r.free_bytes, usable) {
                if need(blocks).is_none_or(|b| b > usable) {
                    if state >= usable {
                        bail!(
                            "the recurrent state of {} sequences needs {} but the device has {} \
                             free ({} usable after headroom): allow fewer concurrent sequences",
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
                    blocks = fit;
                    reason = format!("to fit the {} the device has free", human_bytes(free));
                }
            }
            if blocks < default {
                tracing::warn!(
                    "KV cache lowered from {} to {} tokens {reason}",
                    default * r.block_size,
                    blocks * r.block_size
                );
            }
            Ok(blocks)
        }
    }
}

/// An exact byte count for small sizes: `128 B`, `2.0 KiB`, else [`human_bytes`].
fn byte_count(b: u64) -> String {
    if b < 1 << 10 {
        format!("{b} B")
    } else if b < 1 << 20 {
        format!("{:.1} KiB", b as f64 / 1024.0)
    } else {
        human_bytes(b)
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
            largest_tensor_bytes_per_token: 64,
            state_bytes_per_seq: 0,
            largest_state_tensor_bytes_per_seq: 0,
            state_slots: 256,
            free_bytes: free,
            max_tensor_bytes: None,
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
            e.starts_with("--kv-cache-tokens 100000000 is too large (needs 23.8 GiB of KV cache)"),
            "{e}"
        );
        assert!(e.contains("11.2 GiB free"), "{e}");
        assert!(e.ends_with("lower --kv-cache-tokens"), "{e}");
        // The limit: (11.2 GiB − 1.12 GiB headroom) / (256 B × 16) blocks of 16 tokens.
        let usable = free - free / 10;
        let at_most = usable / (256 * 16) * 16;
        assert!(e.contains(&format!("at most {at_most} tokens")), "{e}");
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

    /// llama_tiny on lavapipe: K and V are `[blocks, 16, 2, 16]` f32 each, 128 B per token,
    /// and one storage binding holds 128 MiB.
    fn binding_limited(tokens: Option<usize>) -> CacheRequest {
        CacheRequest {
            bytes_per_token: 2 * 2 * 128,
            largest_tensor_bytes_per_token: 128,
            max_tensor_bytes: Some(128 << 20),
            ..req(tokens, Some(64 * GIB))
        }
    }

    #[test]
    fn a_request_larger_than_one_tensor_names_the_largest_that_works() {
        // 3M tokens fit in 64 GiB free but one K tensor would be 366 MiB.
        let e = cache_blocks(&binding_limited(Some(3_000_000)))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--kv-cache-tokens 3000000 is too large"),
            "{e}"
        );
        assert!(e.contains("at most 1048576 tokens on this backend"), "{e}");
        assert!(
            e.contains("one cache tensor may not exceed 128.0 MiB (128 B per token"),
            "{e}"
        );
        assert!(e.ends_with("lower --kv-cache-tokens"), "{e}");
        // The largest that works is granted; one more block is not.
        assert_eq!(
            cache_blocks(&binding_limited(Some(1 << 20))).unwrap(),
            (1 << 20) / 16
        );
        assert!(cache_blocks(&binding_limited(Some((1 << 20) + 1))).is_err());
        // Without a per-tensor limit only the memory counts.
        let mut r = binding_limited(Some(3_000_000));
        r.max_tensor_bytes = None;
        assert_eq!(cache_blocks(&r).unwrap(), 3_000_000 / 16);
    }

    #[test]
    fn the_default_shrinks_to_the_largest_tensor() {
        let mut r = binding_limited(None);
        r.default_tokens = 3_000_000;
        assert_eq!(cache_blocks(&r).unwrap(), (1 << 20) / 16);
        // The tighter of the two limits wins: 512 MiB free leave 256 MiB, 524288 tokens.
        r.free_bytes = Some(512 << 20);
        assert_eq!(cache_blocks(&r).unwrap(), (256 << 20) / 512 / 16);
        // A default under both limits is kept.
        r.default_tokens = 4096;
        assert_eq!(cache_blocks(&r).unwrap(), 256);
    }

    #[test]
    fn a_block_or_a_state_tensor_above_the_limit_is_an_error() {
        for tokens in [None, Some(16)] {
            let mut r = binding_limited(tokens);
            r.largest_tensor_bytes_per_token = 16 << 20; // 16 tokens: 256 MiB
            let e = cache_blocks(&r).unwrap_err().to_string();
            assert!(
                e.contains("one KV cache block (16 tokens) needs 256.0 MiB"),
                "{e}"
            );
            assert!(e.contains("may not exceed 128.0 MiB"), "{e}");
        }
        let mut r = binding_limited(None);
        r.state_bytes_per_seq = 2 << 20;
        r.largest_state_tensor_bytes_per_seq = 1 << 20; // 256 slots: 256 MiB
        let e = cache_blocks(&r).unwrap_err().to_string();
        assert!(
            e.contains("recurrent state of 256 sequences needs 256.0 MiB"),
            "{e}"
        );
        r.state_slots = 128;
        assert!(cache_blocks(&r).is_ok());
        r.largest_state_tensor_bytes_per_seq = usize::MAX;
        assert!(cache_blocks(&r).is_err());
    }

    #[test]
    fn every_too_large_request_states_the_same_limit() {
        // The binding limit (1048576 tokens) is tighter than the block ids and the memory:
        // a request just past it and one past the 2^32 block ids name the same figure.
        let limit = |tokens| {
            cache_blocks(&binding_limited(Some(tokens)))
                .unwrap_err()
                .to_string()
        };
        for tokens in [3_000_000, 1 << 40, usize::MAX] {
            let e = limit(tokens);
            assert!(e.contains("at most 1048576 tokens on this backend"), "{e}");
        }
        // Memory tighter than the binding: 512 MiB free leave 256 MiB, 524288 tokens.
        let mut r = binding_limited(Some(600_000));
        r.free_bytes = Some(512 << 20);
        let e = cache_blocks(&r).unwrap_err().to_string();
        assert!(e.contains("at most 524288 tokens"), "{e}");
        r.requested_tokens = Some(1 << 40);
        let e = cache_blocks(&r).unwrap_err().to_string();
        assert!(e.contains("at most 524288 tokens"), "{e}");
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
