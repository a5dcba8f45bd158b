//! Vision encoder layers (device side): MoonViT with its projector ([`moonvit`]) and the
//! position-table resampling it needs ([`pos_emb`]); the GLM-5.3-Flash tower ([`glm5_vit`])
//! and its downsample + merger ([`glm5_merger`]). Host preprocessing lives in
//! [`crate::vision`].

pub mod glm5_merger;
pub mod glm5_vit;
pub mod moonvit;
mod patch_batch;
pub mod pos_emb;

pub use glm5_vit::Glm5Vit;
pub use moonvit::MoonVit;
pub(crate) use patch_batch::PatchBatch;
