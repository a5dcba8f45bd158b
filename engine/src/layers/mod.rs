//! Layers, one file per layer type, each written against the [`dayone_backend::Backend`] trait.

mod attention;
mod block;
mod dsa_indexer;
mod kda;
mod linear;
mod mla;
mod mlp;
mod moe;
mod norm;
mod rope;

pub use attention::{Attention, AttentionShape};
pub use block::{Block, BlockFfn, BlockMixer};
pub use dsa_indexer::DsaIndexer;
pub use kda::{Kda, KdaShape};
pub use linear::Linear;
pub use mla::{Mla, MlaShape};
pub use mlp::Mlp;
pub use moe::{ExpertNames, Moe, MoeShape};
pub use norm::RmsNorm;
pub use rope::Rope;
