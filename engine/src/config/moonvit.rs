//! MoonViT vision tower + patch-merger projector settings of `model_type: kimi_k25` (Kimi-K2.5 /
//! K2.6) and `kimi_vl`, read from `config.json`'s `vision_config` and top-level projector fields.
//!
//! The hub config uses the original names (`vt_hidden_size`, `init_pos_emb_height`, …);
//! transformers 5.24 reads only its own (`hidden_size`, `pos_emb_height`, …) and silently falls
//! back to K2.5's defaults otherwise (vision.md §1.1). Both are read here, original names first.

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

/// MoonViT encoder and projector sizes. Shapes below: `C` = `hidden_size`, `p` = `patch_size`.
#[derive(Clone, Debug, PartialEq)]
pub struct MoonVitConfig {
    /// Encoder width `C` (`vt_hidden_size` / `hidden_size`; K2.5 1152).
    pub hidden_size: usize,
    /// MLP width (`vt_intermediate_size` / `intermediate_size`; 4304).
    pub intermediate_size: usize,
    /// Attention heads (`vt_num_attention_heads` / `num_attention_heads`; 16, head dim 72).
    pub num_heads: usize,
    /// Encoder blocks (`vt_num_hidden_layers` / `num_hidden_layers`; 27).
    pub num_layers: usize,
    /// Patch side in pixels (`patch_size`; 14).
    pub patch_size: usize,
    /// Learned position table rows (`init_pos_emb_height` / `pos_emb_height`; 64).
    pub pos_emb_height: usize,
    /// Learned position table columns (`init_pos_emb_width` / `pos_emb_width`; 64).
    pub pos_emb_width: usize,
    /// Patches merged per token, (rows, cols) (`merge_kernel_size`; [2, 2]).
    pub merge_kernel: (usize, usize),
    /// 2-D RoPE base (`rope_parameters.rope_theta` / `rope_theta`; 10000).
    pub rope_theta: f32,
    /// Whether the encoder MLP uses tanh-GELU (`hidden_act` `gelu_pytorch_tanh`; else exact).
    pub mlp_gelu_tanh: bool,
    /// Projector LayerNorm eps (`projection_layer_norm_eps` / `projector_ln_eps`; 1e-5).
    pub projector_ln_eps: f32,
    /// Width of the text model the projector feeds (`text_config.hidden_size`).
    pub text_hidden_size: usize,
}

impl MoonVitConfig {
    /// Encoder head dim `C / heads`.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Width of one merged token, `C · mh · mw` (the projector's input).
    pub fn merged_size(&self) -> usize {
        self.hidden_size * self.merge_kernel.0 * self.merge_kernel.1
    }

    /// Reads a whole `kimi_k25` / `kimi_vl` `config.json` value (`origin` names the file).
    ///
    /// Errors name the field: a missing `vision_config` or `text_config.hidden_size`, a value of
    /// the wrong type, a head dim not divisible by 4 (2-D RoPE splits it in row/column halves of
    /// complex pairs), a projector type other than `patchmerger`.
    pub fn from_json(cfg: &Value, origin: &str) -> Result<Self> {
        let v = cfg
            .get("vision_config")
            .with_context(|| format!("{origin}: field `vision_config` is missing"))?;
        let uint = |keys: &[&str], default: usize| -> Result<usize> {
            for k in keys {
                match v.get(*k) {
                    None | Some(Value::Null) => continue,
                    Some(x) => {
                        return x.as_u64().map(|n| n as usize).with_context(|| {
                            format!(
                            "{origin}: field `vision_config.{k}` must be a non-negative integer"
                        )
                        })
                    }
                }
            }
            Ok(default)
        };
        let float = |obj: &Value, path: &str, key: &str| -> Result<Option<f64>> {
            match obj.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(Some)
                    .with_context(|| format!("{origin}: field `{path}{key}` must be a number")),
            }
        };
        let merge_kernel = match v.get("merge_kernel_size") {
            None | Some(Value::Null) => (2, 2),
            Some(Value::Array(a)) if a.len() == 2 && a.iter().all(|x| x.as_u64().is_some()) => (
                a[0].as_u64().unwrap_or(2) as usize,
                a[1].as_u64().unwrap_or(2) as usize,
            ),
            Some(Value::Number(n)) if n.as_u64().is_some() => {
                let m = n.as_u64().unwrap_or(2) as usize;
                (m, m)
            }
            Some(x) => bail!(
                "{origin}: field `vision_config.merge_kernel_size` is {x}, expected [rows, cols]"
            ),
        };
        let act = |key: &str, default: &str| -> Result<String> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(default.to_string()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(x) => bail!("{origin}: field `vision_config.{key}` is {x}, expected a string"),
            }
        };
        let hidden_act = act("hidden_act", "gelu_pytorch_tanh")?;
        let mlp_gelu_tanh = match hidden_act.as_str() {
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => true,
            "gelu" => false,
            other => bail!(
                "{origin}: field `vision_config.hidden_act` is '{other}' (expected gelu_pytorch_tanh or gelu)"
            ),
        };
        let projector_act = act("projector_hidden_act", "gelu")?;
        ensure!(
            projector_act == "gelu",
            "{origin}: field `vision_config.projector_hidden_act` is '{projector_act}' (only exact 'gelu' is supported)"
        );
        if let Some(t) = v.get("mm_projector_type").and_then(Value::as_str) {
            ensure!(
                t == "patchmerger",
                "{origin}: field `vision_config.mm_projector_type` is '{t}' (only 'patchmerger' is supported)"
            );
        }
        let rope_theta = match v.get("rope_parameters") {
            Some(rp @ Value::Object(_)) => {
                float(rp, "vision_config.rope_parameters.", "rope_theta")?
            }
            _ => float(v, "vision_config.", "rope_theta")?,
        }
        .unwrap_or(10000.0) as f32;
        let projector_ln_eps = match float(cfg, "", "projection_layer_norm_eps")? {
            Some(e) => e,
            None => float(v, "vision_config.", "projector_ln_eps")?.unwrap_or(1e-5),
        } as f32;
        let text_hidden_size = cfg
            .get("text_config")
            .and_then(|t| t.get("hidden_size"))
            .and_then(Value::as_u64)
            .with_context(|| format!("{origin}: field `text_config.hidden_size` is missing"))?
            as usize;
        let c = Self {
            hidden_size: uint(&["vt_hidden_size", "hidden_size"], 1152)?,
            intermediate_size: uint(&["vt_intermediate_size", "intermediate_size"], 4304)?,
            num_heads: uint(&["vt_num_attention_heads", "num_attention_heads"], 16)?,
            num_layers: uint(&["vt_num_hidden_layers", "num_hidden_layers"], 27)?,
            patch_size: uint(&["patch_size"], 14)?,
            pos_emb_height: uint(&["init_pos_emb_height", "pos_emb_height"], 64)?,
            pos_emb_width: uint(&["init_pos_emb_width", "pos_emb_width"], 64)?,
            merge_kernel,
            rope_theta,
            mlp_gelu_tanh,
            projector_ln_eps,
            text_hidden_size,
        };
        for (name, n) in [
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_attention_heads", c.num_heads),
            ("patch_size", c.patch_size),
            ("pos_emb_height", c.pos_emb_height),
            ("pos_emb_width", c.pos_emb_width),
            ("merge_kernel_size", c.merge_kernel.0 * c.merge_kernel.1),
        ] {
            ensure!(n > 0, "{origin}: field `vision_config.{name}` must be > 0");
        }
        ensure!(
            c.hidden_size.is_multiple_of(c.num_heads) && c.head_dim().is_multiple_of(4),
            "{origin}: `vision_config` hidden_size {} / num_attention_heads {} must give a head dim divisible by 4 (2-D RoPE)",
            c.hidden_size,
            c.num_heads
        );
        ensure!(
            c.merge_kernel.0 == c.merge_kernel.1,
            "{origin}: field `vision_config.merge_kernel_size` {:?} must be square (the image processor pads to one multiple)",
            c.merge_kernel
        );
        Ok(c)
    }
}
