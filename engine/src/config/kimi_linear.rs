//! `config.json` of `kimi_linear` checkpoints (Kimi-Linear-48B-A3B; transformers
//! `KimiLinearConfig`). Published configs and transformers 5 name some fields differently; both
//! spellings are accepted.

use anyhow::{bail, Result};
use serde::Deserialize;

/// `linear_attn_config`: which layers are KDA and the KDA widths. Layer lists are **1-based**.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct LinearAttnConfig {
    /// 1-based indices of the full-attention (MLA) layers.
    #[serde(default)]
    pub full_attn_layers: Vec<usize>,
    /// 1-based indices of the KDA layers.
    #[serde(default)]
    pub kda_layers: Vec<usize>,
    /// KDA heads `H`.
    #[serde(default)]
    pub num_heads: Option<usize>,
    /// KDA head width (`K = V`).
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Short-convolution width (4).
    #[serde(default)]
    pub short_conv_kernel_size: Option<usize>,
    /// Lower bound of the forget gate (newer family members): `g = lb · σ(…)`.
    #[serde(default)]
    pub gate_lower_bound: Option<f64>,
}

/// Fields of a Kimi-Linear `config.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct KimiLinearConfig {
    /// `model_type` as written in `config.json` (picks the architecture's registry row).
    #[serde(default)]
    pub model_type: String,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Residual width `D`.
    pub hidden_size: usize,
    /// Width of the dense MLP layers.
    pub intermediate_size: usize,
    /// Width of each routed expert.
    pub moe_intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// MLA heads.
    pub num_attention_heads: usize,
    /// Routed experts (`num_experts` in published configs).
    #[serde(alias = "num_experts")]
    pub num_local_experts: usize,
    /// Experts per token (`num_experts_per_token`).
    #[serde(alias = "num_experts_per_token")]
    pub num_experts_per_tok: usize,
    /// Shared experts (`num_shared_experts`).
    #[serde(default, alias = "num_shared_experts")]
    pub n_shared_experts: Option<usize>,
    /// Expert groups (`num_expert_group`).
    #[serde(default = "one", alias = "num_expert_group")]
    pub n_group: usize,
    /// Groups kept per token.
    #[serde(default = "one")]
    pub topk_group: usize,
    /// Renormalise the chosen weights (`moe_renormalize`).
    #[serde(default = "yes", alias = "moe_renormalize")]
    pub norm_topk_prob: bool,
    /// Multiplier on routed weights.
    #[serde(default = "one_f")]
    pub routed_scaling_factor: f64,
    /// Router activation (`moe_router_activation_func`); only `sigmoid`.
    #[serde(default = "sigmoid", alias = "moe_router_activation_func")]
    pub scoring_func: String,
    /// Leading dense layers.
    #[serde(default = "one")]
    pub first_k_dense_replace: usize,
    /// KV latent width.
    pub kv_lora_rank: usize,
    /// Query latent width; `None` for a plain `q_proj`.
    #[serde(default)]
    pub q_lora_rank: Option<usize>,
    /// Width of the (unrotated) shared key part.
    pub qk_rope_head_dim: usize,
    /// Per-head non-shared key width.
    pub qk_nope_head_dim: usize,
    /// Value width.
    pub v_head_dim: usize,
    /// MLA without RoPE (Kimi-Linear: true; RoPE is not supported here).
    #[serde(default = "yes")]
    pub mla_use_nope: bool,
    /// RMSNorm epsilon (also the KDA output norm's).
    #[serde(default = "eps")]
    pub rms_norm_eps: f64,
    /// Context window.
    #[serde(default = "max_pos", alias = "model_max_length")]
    pub max_position_embeddings: usize,
    /// Tied LM head.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Which layers are KDA.
    #[serde(default)]
    pub linear_attn_config: LinearAttnConfig,
    /// transformers 5's per-layer kinds (`full_attention` / `linear_attention`), 0-based.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// transformers 5's per-layer FFN kinds (`dense` / `sparse`), 0-based.
    #[serde(default)]
    pub mlp_layer_types: Option<Vec<String>>,
    /// MLP activation; only `silu`.
    #[serde(default = "silu")]
    pub hidden_act: String,
}

fn one() -> usize {
    1
}
fn one_f() -> f64 {
    1.0
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
fn eps() -> f64 {
    1e-5
}
fn max_pos() -> usize {
    1 << 20
}

impl KimiLinearConfig {
    /// Whether layer `i` (0-based) is a KDA layer: `layer_types` when present, else the 1-based
    /// `linear_attn_config.kda_layers`.
    pub fn is_kda_layer(&self, i: usize) -> bool {
        match &self.layer_types {
            Some(t) => t.get(i).is_some_and(|x| x == "linear_attention"),
            None => self.linear_attn_config.kda_layers.contains(&(i + 1)),
        }
    }

    /// Whether layer `i` uses the MoE block.
    pub fn is_moe_layer(&self, i: usize) -> bool {
        match &self.mlp_layer_types {
            Some(t) => t.get(i).is_some_and(|x| x == "sparse"),
            None => i >= self.first_k_dense_replace,
        }
    }

    /// KDA heads.
    pub fn kda_heads(&self) -> usize {
        self.linear_attn_config
            .num_heads
            .unwrap_or(self.num_attention_heads)
    }

    /// KDA head width.
    pub fn kda_head_dim(&self) -> usize {
        self.linear_attn_config.head_dim.unwrap_or(128)
    }

    /// Short-convolution width.
    pub fn conv_width(&self) -> usize {
        self.linear_attn_config.short_conv_kernel_size.unwrap_or(4)
    }

    /// Checks `linear_attn_config.kda_layers` / `full_attn_layers` (1-based, inside the model,
    /// disjoint, together covering every layer when both are given), `layer_types` and
    /// `mlp_layer_types` (one known entry per layer), and that `layer_types` agrees with the
    /// 1-based lists when both are present.
    fn validate_layer_lists(&self) -> Result<()> {
        let n = self.num_hidden_layers;
        let lists = &self.linear_attn_config;
        for (name, list) in [
            ("kda_layers", &lists.kda_layers),
            ("full_attn_layers", &lists.full_attn_layers),
        ] {
            for (i, &l) in list.iter().enumerate() {
                if l == 0 || l > n {
                    bail!(
                        "field `linear_attn_config.{name}`: layer {l} is outside 1..={n} (the lists are 1-based)"
                    );
                }
                if list[..i].contains(&l) {
                    bail!("field `linear_attn_config.{name}` lists layer {l} twice");
                }
            }
        }
        if let Some(l) = lists
            .kda_layers
            .iter()
            .find(|l| lists.full_attn_layers.contains(l))
        {
            bail!(
                "layer {l} is in both `linear_attn_config.kda_layers` and `linear_attn_config.full_attn_layers`"
            );
        }
        let both_lists = !lists.kda_layers.is_empty() && !lists.full_attn_layers.is_empty();
        if both_lists && self.layer_types.is_none() {
            if let Some(l) = (1..=n)
                .find(|l| !lists.kda_layers.contains(l) && !lists.full_attn_layers.contains(l))
            {
                bail!(
                    "layer {l} is in neither `linear_attn_config.kda_layers` nor `linear_attn_config.full_attn_layers`"
                );
            }
        }
        if let Some(t) = &self.layer_types {
            if t.len() != n {
                bail!(
                    "field `layer_types` has {} entries but num_hidden_layers is {n}",
                    t.len()
                );
            }
            for (i, x) in t.iter().enumerate() {
                let kda = match x.as_str() {
                    "linear_attention" => true,
                    "full_attention" => false,
                    _ => bail!(
                        "field `layer_types`[{i}] is '{x}' (expected 'linear_attention' or 'full_attention')"
                    ),
                };
                let l = i + 1;
                // (list, whether the list makes layer `l` KDA, how it says so)
                let listed = if lists.kda_layers.contains(&l) {
                    Some(("kda_layers", true, "lists"))
                } else if lists.full_attn_layers.contains(&l) {
                    Some(("full_attn_layers", false, "lists"))
                } else if !lists.kda_layers.is_empty() && lists.full_attn_layers.is_empty() {
                    Some(("kda_layers", false, "does not list"))
                } else {
                    None
                };
                if let Some((field, _, verb)) = listed.filter(|&(_, k, _)| k != kda) {
                    bail!(
                        "`layer_types`[{i}] is '{x}' but `linear_attn_config.{field}` {verb} layer {l} \
                         (1-based): the two fields disagree"
                    );
                }
            }
        }
        super::check_mlp_layer_types(self.mlp_layer_types.as_deref(), n)?;
        Ok(())
    }

    /// Checks the invariants the model code relies on; errors name the field.
    pub fn validate(&self) -> Result<()> {
        super::check_norm_eps(self.rms_norm_eps)?;
        if self.scoring_func != "sigmoid" {
            bail!(
                "moe_router_activation_func '{}' is not supported (expected 'sigmoid')",
                self.scoring_func
            );
        }
        if self.hidden_act != "silu" {
            bail!(
                "hidden_act '{}' is not supported (expected 'silu')",
                self.hidden_act
            );
        }
        if !self.mla_use_nope {
            bail!("mla_use_nope = false (MLA with RoPE) is not supported for kimi_linear");
        }
        self.validate_layer_lists()?;
        if self.n_group == 0 || !self.num_local_experts.is_multiple_of(self.n_group) {
            bail!(
                "num_experts ({}) must be a multiple of num_expert_group ({})",
                self.num_local_experts,
                self.n_group
            );
        }
        if self.num_experts_per_tok == 0 || self.num_experts_per_tok > self.num_local_experts {
            bail!(
                "num_experts_per_token ({}) must be in 1..=num_experts ({})",
                self.num_experts_per_tok,
                self.num_local_experts
            );
        }
        if self.conv_width() < 1 {
            bail!("linear_attn_config.short_conv_kernel_size must be at least 1");
        }
        Ok(())
    }
}
