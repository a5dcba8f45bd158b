//! Qwen3 (Qwen team 2025; HF `modeling_qwen3.py`): the Llama skeleton with an explicit
//! `head_dim` and an RMSNorm over each head of q and k before RoPE (`q_norm`, `k_norm`).

use super::Llama;
use crate::config::LlamaConfig;
use crate::weights::WeightLoader;
use anyhow::Result;
use dayone_backend::Backend;

/// Loads a `qwen3` checkpoint.
pub fn load<B: Backend>(w: &WeightLoader<B>, c: &LlamaConfig) -> Result<Llama<B>> {
    Llama::load_with(w, c, Some(c.rms_norm_eps))
}
