//! Vision encoder layers (device side): MoonViT with its projector ([`moonvit`]) and the
//! position-table resampling it needs ([`pos_emb`]). Host preprocessing lives in
//! [`crate::vision`].

pub mod moonvit;
pub mod pos_emb;

pub use moonvit::MoonVit;
