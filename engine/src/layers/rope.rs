//! Rotary position embedding (Su et al. 2021, RoFormer).

use anyhow::Result;
use dayone_backend::{Backend, DeviceStepMeta, HostTensor, RopeArgs, RopeStyle};

/// Precomputed inverse frequencies and the pairing style.
pub struct Rope<B: Backend> {
    /// `[rot_dim / 2]` f32.
    pub inv_freq: B::Tensor,
    /// Dims rotated at the start of each head.
    pub rot_dim: usize,
    /// How dims are paired.
    pub style: RopeStyle,
    /// Multiplier on cos/sin (YaRN attention factor; 1 otherwise).
    pub mscale: f32,
}

impl<B: Backend> Rope<B> {
    /// Uploads `inv_freq` (see [`crate::config::rope_inv_freq`]).
    pub fn new(b: &B, inv_freq: &[f32], style: RopeStyle, mscale: f32) -> Result<Self> {
        let t = b.upload(&HostTensor::from_f32(vec![inv_freq.len()], inv_freq)?)?;
        Ok(Self {
            inv_freq: t,
            rot_dim: inv_freq.len() * 2,
            style,
            mscale,
        })
    }

    /// Queries `q` `[N, H, hd]` and keys `k` `[N, Hk, hd]` rotated at the same positions, in one
    /// backend call ([`Backend::rope_pair`]; each as [`Rope::forward`]).
    pub fn forward_pair(
        &self,
        b: &B,
        q: &B::Tensor,
        k: &B::Tensor,
        positions: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor)> {
        b.rope_pair(
            q,
            k,
            positions,
            &self.inv_freq,
            self.rot_dim,
            self.style,
            self.mscale,
        )
    }

    /// Queries `q` `[N, H, hd]` rotated at `meta.positions` (returned), and keys `k`
    /// `[N, Hkv, hd]` rotated and stored with values `v` `[N, Hkv, hd_v]` in the paged caches
    /// `kv`, in one backend call ([`Backend::rope_write_kv`]; as [`Rope::forward_pair`] then
    /// [`Backend::write_kv`]).
    pub fn forward_write_kv(
        &self,
        b: &B,
        q: &B::Tensor,
        k: &B::Tensor,
        v: &B::Tensor,
        meta: &DeviceStepMeta<B::Tensor>,
        kv: (&B::Tensor, &B::Tensor),
    ) -> Result<B::Tensor> {
        let args = RopeArgs {
            inv_freq: &self.inv_freq,
            rot_dim: self.rot_dim,
            style: self.style,
            mscale: self.mscale,
        };
        b.rope_write_kv(q, k, v, args, kv.0, kv.1, meta)
    }

    /// `x` `[N, H, hd]`, `positions` `[N]` u32 → rotated `[N, H, hd]`.
    pub fn forward(&self, b: &B, x: &B::Tensor, positions: &B::Tensor) -> Result<B::Tensor> {
        b.rope(
            x,
            positions,
            &self.inv_freq,
            self.rot_dim,
            self.style,
            self.mscale,
        )
    }
}
