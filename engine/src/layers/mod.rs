//! Layers, one file per layer type, each written against the [`dayone_backend::Backend`] trait.

mod attention;
mod linear;
mod mlp;
mod norm;
mod rope;

pub use attention::{Attention, AttentionShape};
pub use linear::Linear;
pub use mlp::Mlp;
pub use norm::RmsNorm;
pub use rope::Rope;
