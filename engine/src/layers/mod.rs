//! Layers, one file per layer type, each written against the [`dayone_backend::Backend`] trait.

mod addend;
mod attention;
mod block;
mod dsa_indexer;
mod gpt_oss_moe;
mod hyper_connections;
mod kda;
mod linear;
mod mla;
mod mla_expanded;
mod mlp;
mod moe;
mod moe_dispatch;
mod moe_quant;
mod norm;
mod parallel;
mod pooled_indexer;
mod rope;
pub mod vision;

pub use addend::Addend;
pub use attention::{Attention, AttentionShape};
pub use block::{Block, BlockFfn, BlockMixer, BlockResidual, ResidualStream};
pub use dsa_indexer::DsaIndexer;
pub use gpt_oss_moe::{GptOssExperts, GptOssMoe};
pub use hyper_connections::{expand_streams, mean_streams, HcWeights, HyperConnection};
pub use kda::{Kda, KdaShape};
pub use linear::{Linear, Weight};
pub use mla::{Mla, MlaShape, MlaSparse, Selection};
pub use mla_expanded::{MlaExpanded, MlaPrefill};
pub use mlp::Mlp;
pub use moe::{ExpertNames, Moe, MoeShape};
pub use moe_quant::{ExpertWorkspace, QuantExperts, QuantPath};
pub use norm::{PreNorm, RmsNorm};
pub use parallel::RowLinear;
pub use pooled_indexer::PooledDsaIndexer;
pub use rope::Rope;

/// The `N` outputs of a call that returns one per input, as an array; an error naming `op`
/// when the backend returned another count.
pub(crate) fn outputs<T, const N: usize>(op: &str, v: Vec<T>) -> anyhow::Result<[T; N]> {
    v.try_into()
        .map_err(|v: Vec<T>| anyhow::anyhow!("{op}: {} outputs for {N} inputs", v.len()))
}
