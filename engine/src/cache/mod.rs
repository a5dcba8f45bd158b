//! The cache manager: per-layer-type cache specs, a block allocator and the device tensors.
//!
//! Attention layers keep keys and values per token in fixed-size blocks (PagedAttention,
//! Kwon et al. 2023); a sequence's block table maps its token positions to physical blocks.

mod block_pool;
mod host_tier;
pub mod prefix;
mod sizing;
mod state_ckpt;

pub use block_pool::BlockPool;
pub use host_tier::{HostRows, HostTier};
pub use sizing::{cache_blocks, human_bytes, usable_bytes, CacheRequest};
pub use state_ckpt::StateCheckpoints;

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
    /// One shared row per token, `[blocks, block_size, width]` (MLA's `[c_kv | k_pe]`).
    PagedLatent {
        /// Values per token.
        width: usize,
    },
    /// A latent row plus a DSA indexer key row per token: `[blocks, block_size, width]` and
    /// `[blocks, block_size, index_width]` (DeepSeek-V3.2).
    PagedLatentIndexed {
        /// Latent values per token.
        width: usize,
        /// Indexer key values per token.
        index_width: usize,
    },
    /// Fixed-size state per sequence, in state slots (KDA): `convs` short-convolution histories
    /// `[slots, conv_channels, conv_taps]` f32 and a recurrent state `[slots, heads, k_dim, v_dim]` f32.
    Recurrent {
        /// Short convolutions (q, k, v).
        convs: usize,
        /// Channels of each convolution.
        conv_channels: usize,
        /// Inputs of history kept (kernel width − 1).
        conv_taps: usize,
        /// Heads of the recurrent state.
        heads: usize,
        /// Key width.
        k_dim: usize,
        /// Value width.
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

    /// Whether some layer keeps per-sequence recurrent state.
    pub fn has_recurrent(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l, LayerCacheSpec::Recurrent { .. }))
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
                LayerCacheSpec::PagedLatent { width } => width,
                LayerCacheSpec::PagedLatentIndexed { width, index_width } => width + index_width,
                LayerCacheSpec::Recurrent { .. } => 0,
            })
            .sum()
    }

    /// Elements per token of the largest single cache tensor of any layer, matching how
    /// [`KvCache::new`] allocates: keys (`kv_heads · k_dim`) and values (`kv_heads · v_dim`)
    /// separately, the latent row (`width`) and the indexer key row (`index_width`) separately.
    /// A tensor of `blocks` blocks holds `blocks · block_size` times this many elements.
    pub fn largest_tensor_elements_per_token(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match *l {
                LayerCacheSpec::PagedKv {
                    kv_heads,
                    k_dim,
                    v_dim,
                } => kv_heads * k_dim.max(v_dim),
                LayerCacheSpec::PagedLatent { width } => width,
                LayerCacheSpec::PagedLatentIndexed { width, index_width } => width.max(index_width),
                LayerCacheSpec::Recurrent { .. } => 0,
            })
            .max()
            .unwrap_or(0)
    }

    /// f32 values per sequence of the largest single state tensor of any layer: one
    /// convolution history (`conv_channels · conv_taps`) or the recurrent state
    /// (`heads · k_dim · v_dim`). A tensor of `slots` slots holds `slots` times this many.
    pub fn largest_state_tensor_elements_per_seq(&self) -> usize {
        self.layers
            .iter()
            .filter_map(LayerCacheSpec::state_tensors)
            .map(|(convs, conv, state)| if convs > 0 { conv.max(state) } else { state })
            .max()
            .unwrap_or(0)
    }

    /// f32 values each sequence keeps in state slots over all layers.
    pub fn state_elements_per_seq(&self) -> usize {
        self.layers
            .iter()
            .filter_map(LayerCacheSpec::state_tensors)
            .map(|(convs, conv, state)| convs * conv + state)
            .sum()
    }
}

impl LayerCacheSpec {
    /// A recurrent layer's per-sequence state tensors: (number of convolution histories, f32
    /// values of one history `conv_channels · conv_taps`, f32 values of the recurrent state
    /// `heads · k_dim · v_dim`); `None` for paged layers.
    fn state_tensors(&self) -> Option<(usize, usize, usize)> {
        match *self {
            LayerCacheSpec::Recurrent {
                convs,
                conv_channels,
                conv_taps,
                heads,
                k_dim,
                v_dim,
            } => Some((convs, conv_channels * conv_taps, heads * k_dim * v_dim)),
            _ => None,
        }
    }
}

/// One layer's cache tensors.
pub enum LayerCache<B: Backend> {
    /// Keys and values.
    Kv(B::Tensor, B::Tensor),
    /// One latent row per token.
    Latent(B::Tensor),
    /// A latent row and an indexer key row per token.
    LatentIndexed(B::Tensor, B::Tensor),
    /// Per-sequence state: convolution histories and the recurrent state.
    Recurrent {
        /// `[slots, channels, taps]` f32 per convolution.
        conv: Vec<B::Tensor>,
        /// `[slots, heads, k_dim, v_dim]` f32.
        state: B::Tensor,
    },
}

/// The device side of the paged cache: each layer's tensors, indexed by block.
pub struct KvCache<B: Backend> {
    layers: Vec<LayerCache<B>>,
    /// Tokens per block.
    pub block_size: usize,
    /// Physical blocks per layer.
    pub num_blocks: usize,
}

impl<B: Backend> KvCache<B> {
    /// Allocates zeroed caches for `spec` with `num_blocks` blocks of `block_size` tokens in
    /// `dtype`, and `num_slots` state slots (f32) for recurrent layers.
    pub fn new(
        b: &B,
        spec: &CacheSpec,
        num_blocks: usize,
        block_size: usize,
        dtype: DType,
        num_slots: usize,
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
                } => Ok(LayerCache::Kv(
                    b.zeros(&[num_blocks, block_size, kv_heads, k_dim], dtype)?,
                    b.zeros(&[num_blocks, block_size, kv_heads, v_dim], dtype)?,
                )),
                LayerCacheSpec::PagedLatent { width } => Ok(LayerCache::Latent(
                    b.zeros(&[num_blocks, block_size, width], dtype)?,
                )),
                LayerCacheSpec::PagedLatentIndexed { width, index_width } => {
                    Ok(LayerCache::LatentIndexed(
                        b.zeros(&[num_blocks, block_size, width], dtype)?,
                        b.zeros(&[num_blocks, block_size, index_width], dtype)?,
                    ))
                }
                LayerCacheSpec::Recurrent {
                    convs,
                    conv_channels,
                    conv_taps,
                    heads,
                    k_dim,
                    v_dim,
                } => Ok(LayerCache::Recurrent {
                    conv: (0..convs)
                        .map(|_| b.zeros(&[num_slots, conv_channels, conv_taps], DType::F32))
                        .collect::<Result<_>>()?,
                    state: b.zeros(&[num_slots, heads, k_dim, v_dim], DType::F32)?,
                }),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            layers,
            block_size,
            num_blocks,
        })
    }

    /// The (keys, values) tensors of layer `i`; errors if that layer keeps another kind of cache.
    pub fn kv(&self, i: usize) -> Result<(&B::Tensor, &B::Tensor)> {
        match self.layers.get(i) {
            Some(LayerCache::Kv(k, v)) => Ok((k, v)),
            _ => bail!("layer {i} has no key/value cache"),
        }
    }

    /// The convolution histories and recurrent state of layer `i`; errors if that layer keeps
    /// another kind of cache.
    pub fn recurrent(&self, i: usize) -> Result<(&[B::Tensor], &B::Tensor)> {
        match self.layers.get(i) {
            Some(LayerCache::Recurrent { conv, state }) => Ok((conv, state)),
            _ => bail!("layer {i} has no recurrent state"),
        }
    }

    /// The latent tensor of layer `i`; errors if that layer keeps another kind of cache.
    pub fn latent(&self, i: usize) -> Result<&B::Tensor> {
        match self.layers.get(i) {
            Some(LayerCache::Latent(c)) | Some(LayerCache::LatentIndexed(c, _)) => Ok(c),
            _ => bail!("layer {i} has no latent cache"),
        }
    }

    /// Every recurrent-state tensor (`[slots, …]` f32: convolution histories and states) of
    /// every layer, for copying slots.
    pub fn state_tensors(&self) -> Vec<&B::Tensor> {
        self.layers
            .iter()
            .flat_map(|l| match l {
                LayerCache::Recurrent { conv, state } => {
                    conv.iter().chain(std::iter::once(state)).collect()
                }
                _ => Vec::new(),
            })
            .collect()
    }

    /// Every per-token cache tensor (`[blocks, block_size, …]`) of every layer, for copying
    /// blocks to and from the host tier.
    pub fn block_tensors(&self) -> Vec<&B::Tensor> {
        self.layers
            .iter()
            .flat_map(|l| match l {
                LayerCache::Kv(k, v) | LayerCache::LatentIndexed(k, v) => vec![k, v],
                LayerCache::Latent(c) => vec![c],
                LayerCache::Recurrent { .. } => Vec::new(),
            })
            .collect()
    }

    /// The DSA indexer key cache of layer `i`, `None` when the layer has none.
    pub fn index_keys(&self, i: usize) -> Option<&B::Tensor> {
        match self.layers.get(i) {
            Some(LayerCache::LatentIndexed(_, k)) => Some(k),
            _ => None,
        }
    }
}
