//! `config.json` of `glm5_next` checkpoints (GLM-5.3-Flash; transformers 5.24
//! `Glm5NextConfig` → `text_config: Glm5NextTextConfig`). The text fields sit under
//! `text_config`; a flat (text-only) config keeps them at the top level. Defaults are
//! transformers'; the vision tower is not read.

use anyhow::{bail, Result};
use serde::Deserialize;

/// `linear_attn_config` (optional): overrides the KDA widths and the gate bound. Its layer
/// lists are not read (transformers ignores them).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Glm5LinearAttnConfig {
    /// KDA head width.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// KDA heads.
    #[serde(default)]
    pub num_heads: Option<usize>,
    /// Short-convolution width.
    #[serde(default)]
    pub short_conv_kernel_size: Option<usize>,
    /// Forget-gate lower bound.
    #[serde(default)]
    pub gate_lower_bound: Option<f64>,
    /// With `safe_gate` (default true) a missing bound becomes −5.
    #[serde(default)]
    pub safe_gate: Option<bool>,
}

/// The text fields of a `glm5_next` config (`Glm5NextTextConfig`).
#[derive(Clone, Debug, Deserialize)]
pub struct Glm5NextConfig {
    /// `model_type` of the top-level config (`glm5_next`).
    #[serde(default)]
    pub model_type: String,
    /// Vocabulary size.
    #[serde(default = "d_vocab")]
    pub vocab_size: usize,
    /// Residual width `D`.
    #[serde(default = "d_hidden")]
    pub hidden_size: usize,
    /// Width of the dense MLPs.
    #[serde(default = "d_inter")]
    pub intermediate_size: usize,
    /// Width of each expert (and, × `n_shared_experts`, of the shared expert).
    #[serde(default = "d_moe_inter")]
    pub moe_intermediate_size: usize,
    /// Decoder layers (the MTP layer stored after them is not loaded).
    #[serde(default = "d_layers")]
    pub num_hidden_layers: usize,
    /// Routed experts.
    #[serde(default = "d_experts", alias = "num_local_experts")]
    pub n_routed_experts: usize,
    /// Experts per token.
    #[serde(default = "d_topk")]
    pub num_experts_per_tok: usize,
    /// Shared experts.
    #[serde(default = "one")]
    pub n_shared_experts: usize,
    /// Expert groups.
    #[serde(default = "one")]
    pub n_group: usize,
    /// Groups kept per token.
    #[serde(default = "one")]
    pub topk_group: usize,
    /// Renormalise the chosen weights.
    #[serde(default = "yes")]
    pub norm_topk_prob: bool,
    /// Multiplier on routed weights.
    #[serde(default = "d_scaling")]
    pub routed_scaling_factor: f64,
    /// MLA heads.
    #[serde(default = "d_heads")]
    pub num_attention_heads: usize,
    /// Must equal the heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Query latent width (required).
    #[serde(default = "d_q_lora")]
    pub q_lora_rank: Option<usize>,
    /// KV latent width.
    #[serde(default = "d_kv_lora")]
    pub kv_lora_rank: usize,
    /// Query/key head width (all NoPE).
    #[serde(default = "d_head")]
    pub qk_nope_head_dim: usize,
    /// Must be 0 (NoPE).
    #[serde(default)]
    pub qk_rope_head_dim: usize,
    /// Value head width.
    #[serde(default = "d_head")]
    pub v_head_dim: usize,
    /// Indexer heads.
    #[serde(default = "d_index_heads")]
    pub index_n_heads: usize,
    /// Indexer head width.
    #[serde(default = "d_index_dim")]
    pub index_head_dim: usize,
    /// Indexer top-k (in tokens).
    #[serde(default = "d_index_topk")]
    pub index_topk: usize,
    /// Tokens per indexer pool (transformers' default 16; the released config uses 4).
    #[serde(default = "d_kpool")]
    pub index_kpool: usize,
    /// Always attend to the query's incomplete pool.
    #[serde(default = "yes")]
    pub index_kpool_always_select_tail: bool,
    /// KDA heads.
    #[serde(default = "d_linear_heads")]
    pub linear_num_heads: usize,
    /// KDA head width.
    #[serde(default = "d_linear_dim")]
    pub linear_head_dim: usize,
    /// KDA short-convolution width.
    #[serde(default = "d_conv")]
    pub linear_conv_kernel_dim: usize,
    /// KDA forget-gate lower bound (`None`: the softplus gate).
    #[serde(default = "d_lb")]
    pub linear_lower_bound: Option<f64>,
    /// Optional overrides of the KDA fields.
    #[serde(default)]
    pub linear_attn_config: Option<Glm5LinearAttnConfig>,
    /// Hyper-connection streams `n`.
    #[serde(default = "d_hc")]
    pub hc_mult: usize,
    /// Floor in the HC weights and Sinkhorn denominators.
    #[serde(default = "d_hc_eps")]
    pub hc_eps: f64,
    /// Sinkhorn iterations.
    #[serde(default = "d_sinkhorn")]
    pub hc_sinkhorn_iters: usize,
    /// Clamp of every SwiGLU (`min(g, l)`, `clamp(u, ±l)`).
    #[serde(default = "d_limit")]
    pub swiglu_limit: Option<f64>,
    /// Epsilon of every RMSNorm.
    #[serde(default = "d_eps")]
    pub rms_norm_eps: f64,
    /// Longest context.
    #[serde(default = "d_max_pos")]
    pub max_position_embeddings: usize,
    /// `lm_head` tied to the embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// `linear_attention` (KDA) or `indexed_attention` (MLA + DSA) per layer
    /// (`full_attention` / `deepseek_sparse_attention` are legacy spellings of the latter).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// `full` or `shared` per layer (KDA entries unused).
    #[serde(default)]
    pub indexer_types: Option<Vec<String>>,
    /// `dense` or `sparse` per layer.
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
    /// F/S string (or list) that wins over the freq/offset schedule.
    #[serde(default)]
    pub index_topk_pattern: Option<serde_json::Value>,
    /// Full indexer every this many layers (from the offset).
    #[serde(default)]
    pub index_topk_freq: Option<usize>,
    /// Offset of that schedule.
    #[serde(default)]
    pub index_skip_topk_offset: Option<usize>,
}

fn one() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn d_vocab() -> usize {
    154880
}
fn d_hidden() -> usize {
    4096
}
fn d_inter() -> usize {
    12288
}
fn d_moe_inter() -> usize {
    2048
}
fn d_layers() -> usize {
    45
}
fn d_experts() -> usize {
    288
}
fn d_topk() -> usize {
    8
}
fn d_scaling() -> f64 {
    2.5
}
fn d_heads() -> usize {
    64
}
fn d_q_lora() -> Option<usize> {
    Some(1536)
}
fn d_kv_lora() -> usize {
    512
}
fn d_head() -> usize {
    256
}
fn d_index_heads() -> usize {
    32
}
fn d_index_dim() -> usize {
    128
}
fn d_index_topk() -> usize {
    2048
}
fn d_kpool() -> usize {
    16
}
fn d_linear_heads() -> usize {
    64
}
fn d_linear_dim() -> usize {
    128
}
fn d_conv() -> usize {
    4
}
fn d_lb() -> Option<f64> {
    Some(-5.0)
}
fn d_hc() -> usize {
    4
}
fn d_hc_eps() -> f64 {
    1e-6
}
fn d_sinkhorn() -> usize {
    20
}
fn d_limit() -> Option<f64> {
    Some(10.0)
}
fn d_eps() -> f64 {
    1e-5
}
fn d_max_pos() -> usize {
    1048576
}

/// A layer's token mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glm5LayerKind {
    /// KDA.
    Linear,
    /// NoPE MLA with its own pooled indexer.
    IndexedFull,
    /// NoPE MLA reusing the previous layer's selection.
    IndexedShared,
}

impl Glm5NextConfig {
    /// Parses the text part of a `glm5_next` config (`text_config`, or the top level when there
    /// is none), keeping the top-level `model_type`.
    pub fn from_value(v: &serde_json::Value) -> serde_json::Value {
        let mut text = match v.get("text_config") {
            Some(t) if t.is_object() => t.clone(),
            _ => v.clone(),
        };
        if let (Some(obj), Some(mt)) = (text.as_object_mut(), v.get("model_type")) {
            obj.insert("model_type".into(), mt.clone());
        }
        text
    }

    /// The per-layer mixer types (transformers' derivation when `layer_types` is absent).
    pub fn layer_types(&self) -> Vec<String> {
        match &self.layer_types {
            Some(t) => t
                .iter()
                .map(|x| match x.as_str() {
                    "full_attention" | "deepseek_sparse_attention" => "indexed_attention".into(),
                    _ => x.clone(),
                })
                .collect(),
            None => (0..self.num_hidden_layers)
                .map(|i| {
                    if i % 4 != 3 {
                        "linear_attention".into()
                    } else {
                        "indexed_attention".into()
                    }
                })
                .collect(),
        }
    }

    /// The per-layer indexer modes (`full` / `shared`).
    pub fn indexer_types(&self) -> Vec<String> {
        if let Some(t) = &self.indexer_types {
            return t.clone();
        }
        match &self.index_topk_pattern {
            Some(serde_json::Value::String(s)) => s
                .chars()
                .map(|c| if c == 'S' { "shared" } else { "full" }.to_string())
                .collect(),
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .map(|x| x.as_str().unwrap_or("full").to_string())
                .collect(),
            _ => {
                let freq = self.index_topk_freq.unwrap_or(1).max(1);
                let off = self.index_skip_topk_offset.unwrap_or(2) as i64;
                (0..self.num_hidden_layers as i64)
                    .map(|i| {
                        if ((i - off + 1).max(0) as usize).is_multiple_of(freq) {
                            "full".into()
                        } else {
                            "shared".into()
                        }
                    })
                    .collect()
            }
        }
    }

    /// Layer `i`'s mixer.
    pub fn layer_kind(&self, i: usize) -> Glm5LayerKind {
        if self.layer_types()[i] == "linear_attention" {
            Glm5LayerKind::Linear
        } else if self.indexer_types().get(i).map(|s| s.as_str()) == Some("shared") {
            Glm5LayerKind::IndexedShared
        } else {
            Glm5LayerKind::IndexedFull
        }
    }

    /// Whether layer `i`'s FFN is MoE.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        match &self.mlp_layer_types {
            Some(t) => t[i] == "sparse",
            None => i >= 3,
        }
    }

    /// KDA heads, head width, conv width and gate bound (with `linear_attn_config` applied).
    pub fn kda(&self) -> (usize, usize, usize, Option<f64>) {
        let mut r = (
            self.linear_num_heads,
            self.linear_head_dim,
            self.linear_conv_kernel_dim,
            self.linear_lower_bound,
        );
        if let Some(l) = &self.linear_attn_config {
            r.0 = l.num_heads.unwrap_or(r.0);
            r.1 = l.head_dim.unwrap_or(r.1);
            r.2 = l.short_conv_kernel_size.unwrap_or(r.2);
            r.3 = l.gate_lower_bound.or(r.3);
            if l.safe_gate.unwrap_or(true) && r.3.is_none() {
                r.3 = Some(-5.0);
            }
        }
        r
    }

    /// Checks what transformers validates, plus the list lengths and the `shared` rule.
    pub fn validate(&self) -> Result<()> {
        super::check_norm_eps(self.rms_norm_eps)?;
        let n = self.num_hidden_layers;
        if let Some(kv) = self.num_key_value_heads {
            if kv != self.num_attention_heads {
                bail!(
                    "num_attention_heads ({}) must equal num_key_value_heads ({kv})",
                    self.num_attention_heads
                );
            }
        }
        if self.q_lora_rank.is_none() {
            bail!("field `q_lora_rank` is required (DSA reads the query latent)");
        }
        if self.qk_rope_head_dim != 0 {
            bail!(
                "field `qk_rope_head_dim` must be 0 (glm5_next is NoPE), got {}",
                self.qk_rope_head_dim
            );
        }
        if self.index_kpool == 0 || !self.index_topk.is_multiple_of(self.index_kpool) {
            bail!(
                "index_topk ({}) must be a multiple of index_kpool ({})",
                self.index_topk,
                self.index_kpool
            );
        }
        if self.hc_mult == 0 || self.hc_sinkhorn_iters == 0 {
            bail!("fields `hc_mult` and `hc_sinkhorn_iters` must be > 0");
        }
        let lt = self.layer_types();
        if lt.len() != n {
            bail!(
                "field `layer_types` has {} entries but num_hidden_layers is {n}",
                lt.len()
            );
        }
        if let Some((i, x)) = lt
            .iter()
            .enumerate()
            .find(|(_, x)| *x != "linear_attention" && *x != "indexed_attention")
        {
            bail!("field `layer_types`[{i}] is '{x}' (expected 'linear_attention' or 'indexed_attention')");
        }
        let it = self.indexer_types();
        if it.len() < n {
            bail!(
                "field `indexer_types` has {} entries but num_hidden_layers is {n}",
                it.len()
            );
        }
        for i in 0..n {
            if lt[i] == "indexed_attention" && it[i] == "shared" {
                let prev_full = i > 0 && lt[i - 1] == "indexed_attention" && it[i - 1] == "full";
                if !prev_full {
                    bail!("layer {i}: a `shared` indexer layer must follow a `full` indexed_attention layer");
                }
            }
        }
        super::check_mlp_layer_types(self.mlp_layer_types.as_deref(), n)?;
        Ok(())
    }
}
