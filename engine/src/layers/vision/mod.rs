//! Vision encoder layers (device side): MoonViT with its projector ([`moonvit`]), the
//! position-table resampling it needs ([`pos_emb`]) and attention within each image
//! ([`attention`]). Host preprocessing lives in
//! [`crate::vision`].

pub mod attention;
pub mod moonvit;
pub mod pos_emb;

pub use moonvit::MoonVit;
