//! The cache manager: per-layer-type cache specs, a block allocator and the device tensors.
//!
//! Attention layers keep keys and values per token in fixed-size blocks (PagedAttention,
//! Kwon et al. 2023); a sequence's block table maps its token positions to physical blocks.

mod block_allocator;

pub use block_allocator::BlockAllocator;

use anyhow::{bail, Result};
use dayone_backend::{Backend, DType};

/// What one layer keeps in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerCacheSpec {
    /// Paged keys `[blocks, block_size, kv_heads, k_dim]` and values `[…, v_dim]`.
    PagedKv {
        /// Key/value heads.
        kv_heads: usize,
        /// Per-head key width.
        k_dim: usize,
        /// Per-head value width.
        v_dim: usize,
    },
}

/// Per-layer cache specs of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSpec {
    /// One entry per layer.
    pub layers: Vec<LayerCacheSpec>,
}

impl CacheSpec {
    /// `layers` identical paged-KV layers.
    pub fn paged_kv(layers: usize, kv_heads: usize, k_dim: usize, v_dim: usize) -> Self {
        Self {
            layers: vec![
                LayerCacheSpec::PagedKv {
                    kv_heads,
                    k_dim,
                    v_dim
                };
                layers
            ],
        }
    }

    /// Elements kept per token over all layers.
    pub fn elements_per_token(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match *l {
                LayerCacheSpec::PagedKv {
                    kv_heads,
                    k_dim,
                    v_dim,
                } => kv_heads * (k_dim + v_dim),
            })
            .sum()
    }
}

/// The device side of the paged cache: one (keys, values) pair of tensors per layer.
pub struct KvCache<B: Backend> {
    layers: Vec<(B::Tensor, B::Tensor)>,
    /// Tokens per block.
    pub block_size: usize,
    /// Physical blocks per layer.
    pub num_blocks: usize,
}

impl<B: Backend> KvCache<B> {
    /// Allocates zeroed caches for `spec` with `num_blocks` blocks of `block_size` tokens in `dtype`.
    pub fn new(
        b: &B,
        spec: &CacheSpec,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
    ) -> Result<Self> {
        if num_blocks == 0 || block_size == 0 {
            bail!("the KV cache needs at least one block of at least one token");
        }
        let layers = spec
            .layers
            .iter()
            .map(|l| match *l {
                LayerCacheSpec::PagedKv {
                    kv_heads,
                    k_dim,
                    v_dim,
                } => Ok((
                    b.zeros(&[num_blocks, block_size, kv_heads, k_dim], dtype)?,
                    b.zeros(&[num_blocks, block_size, kv_heads, v_dim], dtype)?,
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            block_size,
            num_blocks,
        })
    }

    /// The (keys, values) tensors of layer `i`.
    pub fn layer(&self, i: usize) -> &(B::Tensor, B::Tensor) {
        &self.layers[i]
    }
}
