//! `config.json` of `deepseek_v3` checkpoints (DeepSeek-V3/R1, Kimi-K2; transformers
//! `DeepseekV3Config`).

use super::RopeParameters;
use anyhow::{bail, Result};
use serde::Deserialize;

/// Fields of a DeepSeek-V3-family `config.json`, with the Hugging Face names.
#[derive(Clone, Debug, Deserialize)]
pub struct DeepseekV3Config {
    /// `model_type` as written in `config.json` (picks the architecture's registry row).
    #[serde(default)]
    pub model_type: String,
    /// Rows of `embed_tokens` and of the logits.
    pub vocab_size: usize,
    /// Residual width `D`.
    pub hidden_size: usize,
    /// Width of the dense MLP of the first `first_k_dense_replace` layers.
    pub intermediate_size: usize,
    /// Width `F` of each routed expert (shared experts: `F · n_shared_experts`).
    pub moe_intermediate_size: usize,
    /// Decoder layers (the MTP layers beyond them are not counted here).
    pub num_hidden_layers: usize,
    /// Attention heads `H`.
    pub num_attention_heads: usize,
    /// Shared experts per MoE layer.
    #[serde(default)]
    pub n_shared_experts: Option<usize>,
    /// Routed experts `E` (`num_local_experts` in some copies).
    #[serde(alias = "num_local_experts")]
    pub n_routed_experts: usize,
    /// Multiplier on routed weights.
    #[serde(default = "one")]
    pub routed_scaling_factor: f64,
    /// Width `L` of the compressed KV latent.
    pub kv_lora_rank: usize,
    /// Width of the compressed query latent; `None`: plain `q_proj`.
    #[serde(default)]
    pub q_lora_rank: Option<usize>,
    /// Rotary part of each query/key head.
    pub qk_rope_head_dim: usize,
    /// Value head width.
    pub v_head_dim: usize,
    /// Non-rotary part of each query/key head.
    pub qk_nope_head_dim: usize,
    /// Router kind (`noaux_tc` uses `e_score_correction_bias`).
    #[serde(default)]
    pub topk_method: Option<String>,
    /// Expert groups.
    #[serde(default = "one_usize")]
    pub n_group: usize,
    /// Groups kept per token.
    #[serde(default = "one_usize")]
    pub topk_group: usize,
    /// Experts per token.
    pub num_experts_per_tok: usize,
    /// Leading dense layers.
    #[serde(default)]
    pub first_k_dense_replace: usize,
    /// Every `moe_layer_freq`-th layer after the dense ones is MoE.
    #[serde(default = "one_usize")]
    pub moe_layer_freq: usize,
    /// Renormalise the chosen weights.
    #[serde(default)]
    pub norm_topk_prob: bool,
    /// Router activation; only `sigmoid` is supported.
    #[serde(default = "sigmoid")]
    pub scoring_func: String,
    /// MLP activation; only `silu`.
    #[serde(default = "silu")]
    pub hidden_act: String,
    /// Context window.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Older `rope_theta`.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Older RoPE scaling.
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    /// transformers ≥ 5 RoPE settings.
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// Interleaved RoPE pairs (DeepSeek's layout; default true).
    #[serde(default = "yes")]
    pub rope_interleave: bool,
    /// Tied LM head.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Bias on attention projections (unsupported when true).
    #[serde(default)]
    pub attention_bias: bool,
    /// Multi-token-prediction layers stored after the decoder layers (skipped).
    #[serde(default)]
    pub num_nextn_predict_layers: usize,
    /// FP8 block-scale settings, when present.
    #[serde(default)]
    pub quantization_config: Option<serde_json::Value>,
    /// DeepSeek-V3.2 DSA: lightning-indexer heads.
    #[serde(default)]
    pub index_n_heads: Option<usize>,
    /// DSA: indexer head width (its first `qk_rope_head_dim` dims are rotated, half-split).
    #[serde(default)]
    pub index_head_dim: Option<usize>,
    /// DSA: keys kept per query.
    #[serde(default)]
    pub index_topk: Option<usize>,
    /// transformers 5's per-layer FFN kinds (`dense` / `sparse`), 0-based; when present it
    /// decides which layers are MoE (as in transformers' `DeepseekV32Config`), and
    /// `first_k_dense_replace`/`moe_layer_freq` are not consulted.
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
    /// transformers 5's per-layer attention kinds: every entry must be `indexed_attention` for
    /// `deepseek_v32` (every layer runs DSA) and `full_attention` for `deepseek_v3`.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
}

fn one() -> f64 {
    1.0
}
fn one_usize() -> usize {
    1
}
fn yes() -> bool {
    true
}
fn sigmoid() -> String {
    "sigmoid".into()
}
fn silu() -> String {
    "silu".into()
}
fn default_max_pos() -> usize {
    4096
}
fn default_eps() -> f64 {
    1e-6
}

impl DeepseekV3Config {
    /// RoPE settings merged from `rope_parameters`, `rope_scaling` and `rope_theta`.
    pub fn rope(&self) -> RopeParameters {
        super::rope::merge_rope(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
        )
    }

    /// Whether layer `i` uses the MoE block (HF: `i >= first_k_dense_replace` and
    /// `i % moe_layer_freq == 0`).
    ///
    /// `mlp_layer_types`, when present, decides instead (`sparse` = MoE).
    pub fn is_moe_layer(&self, i: usize) -> bool {
        match &self.mlp_layer_types {
            Some(t) => t.get(i).is_some_and(|x| x == "sparse"),
            None => i >= self.first_k_dense_replace && i.is_multiple_of(self.moe_layer_freq.max(1)),
        }
    }

    /// Checks `layer_types` (every entry `want`) and `mlp_layer_types` (`dense`/`sparse`): one
    /// entry per layer.
    fn validate_layer_lists(&self, want: &str) -> Result<()> {
        let n = self.num_hidden_layers;
        if let Some(t) = &self.layer_types {
            if t.len() != n {
                bail!(
                    "field `layer_types` has {} entries but num_hidden_layers is {n}",
                    t.len()
                );
            }
            if let Some((i, x)) = t.iter().enumerate().find(|(_, x)| *x != want) {
                bail!("field `layer_types`[{i}] is '{x}', but this model runs every layer as '{want}'");
            }
        }
        super::check_mlp_layer_types(self.mlp_layer_types.as_deref(), n)?;
        Ok(())
    }

    /// Softmax scale `(d_nope + d_rope)^−½`, times `mscale(factor, mscale_all_dim)²` under YaRN
    /// (HF `yarn_apply_mscale`; DeepSeek-V3 `inference/model.py`).
    pub fn softmax_scale(&self) -> f32 {
        let mut s = 1.0 / ((self.qk_nope_head_dim + self.qk_rope_head_dim) as f64).sqrt();
        let p = self.rope();
        if p.kind() != "default" {
            if let (Some(ma), Some(f)) = (p.mscale_all_dim, p.factor) {
                if ma != 0.0 {
                    let m = super::rope::yarn_get_mscale(f, ma);
                    s *= m * m;
                }
            }
        }
        s as f32
    }

    /// The DSA indexer's (heads, head width, top-k), when the config has one.
    pub fn indexer(&self) -> Option<(usize, usize, usize)> {
        Some((self.index_n_heads?, self.index_head_dim?, self.index_topk?))
    }

    /// `validate` for `deepseek_v32`: the V3 checks plus the indexer fields it needs.
    pub fn validate_v32(&self) -> Result<()> {
        self.validate_common()?;
        self.validate_layer_lists("indexed_attention")?;
        let Some((h, d, k)) = self.indexer() else {
            bail!("deepseek_v32 needs index_n_heads, index_head_dim and index_topk");
        };
        if h == 0 || k == 0 || d < self.qk_rope_head_dim {
            bail!("index_n_heads ({h}) and index_topk ({k}) must be positive and index_head_dim ({d}) ≥ qk_rope_head_dim");
        }
        if self.q_lora_rank.is_none() {
            bail!("deepseek_v32's indexer reads the query latent: q_lora_rank must be set");
        }
        Ok(())
    }

    /// Checks the invariants the model code relies on; errors name the field.
    ///
    /// transformers' `DeepseekV3Config` has no `mlp_layer_types`; when a `deepseek_v3` config
    /// carries one anyway it must agree with `first_k_dense_replace` and `moe_layer_freq`.
    pub fn validate(&self) -> Result<()> {
        self.validate_common()?;
        self.validate_layer_lists("full_attention")?;
        if let Some(t) = &self.mlp_layer_types {
            for (i, x) in t.iter().enumerate() {
                let derived =
                    i >= self.first_k_dense_replace && i.is_multiple_of(self.moe_layer_freq.max(1));
                if (x == "sparse") != derived {
                    bail!(
                        "field `mlp_layer_types`[{i}] is '{x}' but first_k_dense_replace ({}) and \
                         moe_layer_freq ({}) make layer {i} {}",
                        self.first_k_dense_replace,
                        self.moe_layer_freq,
                        if derived { "sparse (MoE)" } else { "dense" }
                    );
                }
            }
        }
        Ok(())
    }

    /// The checks shared by `deepseek_v3` and `deepseek_v32`.
    fn validate_common(&self) -> Result<()> {
        super::check_norm_eps(self.rms_norm_eps)?;
        if self.scoring_func != "sigmoid" {
            bail!(
                "scoring_func '{}' is not supported (expected 'sigmoid')",
                self.scoring_func
            );
        }
        if self.hidden_act != "silu" {
            bail!(
                "hidden_act '{}' is not supported (expected 'silu')",
                self.hidden_act
            );
        }
        if self.attention_bias {
            bail!("attention_bias = true is not supported for deepseek_v3");
        }
        if self.n_group == 0 || !self.n_routed_experts.is_multiple_of(self.n_group) {
            bail!(
                "n_routed_experts ({}) must be a multiple of n_group ({})",
                self.n_routed_experts,
                self.n_group
            );
        }
        if self.topk_group == 0 || self.topk_group > self.n_group {
            bail!(
                "topk_group ({}) must be in 1..=n_group ({})",
                self.topk_group,
                self.n_group
            );
        }
        if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.n_routed_experts {
            bail!(
                "num_experts_per_tok ({}) must be in 1..=n_routed_experts",
                self.num_experts_per_tok
            );
        }
        if !self.qk_rope_head_dim.is_multiple_of(2) {
            bail!("qk_rope_head_dim ({}) must be even", self.qk_rope_head_dim);
        }
        super::rope::validate_rope_sources(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
        )
    }
}
