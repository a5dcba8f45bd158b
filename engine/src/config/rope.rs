//! RoPE parameters and inverse frequencies, including `llama3` and `linear` scaling.

use anyhow::{bail, Result};
use serde::Deserialize;

/// `rope_parameters` / `rope_scaling` of a `config.json`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct RopeParameters {
    /// `default`, `linear`, `llama3` (older configs call it `type`).
    #[serde(default, alias = "type")]
    pub rope_type: Option<String>,
    /// Base θ of the frequencies.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Context-extension factor (`linear`, `llama3`).
    #[serde(default)]
    pub factor: Option<f64>,
    /// `llama3`: wavelengths longer than `original / low_freq_factor` are divided by `factor`.
    #[serde(default)]
    pub low_freq_factor: Option<f64>,
    /// `llama3`: wavelengths shorter than `original / high_freq_factor` are kept.
    #[serde(default)]
    pub high_freq_factor: Option<f64>,
    /// `llama3`, `yarn`: the pre-extension context length.
    #[serde(default)]
    pub original_max_position_embeddings: Option<f64>,
    /// `yarn`: rotations bounding the extrapolated band (default 32).
    #[serde(default)]
    pub beta_fast: Option<f64>,
    /// `yarn`: rotations bounding the interpolated band (default 1).
    #[serde(default)]
    pub beta_slow: Option<f64>,
    /// `yarn`: numerator scale of the cos/sin attention factor.
    #[serde(default)]
    pub mscale: Option<f64>,
    /// `yarn`: denominator scale of the cos/sin factor; DeepSeek also multiplies the softmax scale
    /// by its square.
    #[serde(default)]
    pub mscale_all_dim: Option<f64>,
    /// `yarn`: explicit cos/sin factor.
    #[serde(default)]
    pub attention_factor: Option<f64>,
    /// `yarn`: round the correction range outwards (default true).
    #[serde(default)]
    pub truncate: Option<bool>,
}

/// A config's RoPE settings from its three possible sources: `rope_parameters` (transformers ≥ 5)
/// when present, else the legacy `rope_scaling`; `rope_theta` at the top level fills a missing θ.
pub(crate) fn merge_rope(
    parameters: Option<&RopeParameters>,
    scaling: Option<&RopeParameters>,
    theta: Option<f64>,
) -> RopeParameters {
    let mut p = parameters.or(scaling).cloned().unwrap_or_default();
    if p.rope_theta.is_none() {
        p.rope_theta = theta;
    }
    p
}

/// Validates the merged RoPE settings and every source, so that a value shadowed by another
/// field can neither be wrong nor silently differ: `rope_scaling` beside `rope_parameters` must
/// say the same (θ aside), a top-level `rope_theta` beside `rope_parameters.rope_theta` must equal
/// it, and each is checked on its own. Errors name the fields.
pub(crate) fn validate_rope_sources(
    parameters: Option<&RopeParameters>,
    scaling: Option<&RopeParameters>,
    theta: Option<f64>,
) -> Result<()> {
    if let Some(t) = theta {
        if !(t.is_finite() && t > 1.0) {
            bail!("rope_theta must be a finite number > 1, got {t}");
        }
    }
    if let Some(s) = scaling {
        s.validate_as("rope_scaling")?;
    }
    if let (Some(p), Some(s)) = (parameters, scaling) {
        let without_theta = |r: &RopeParameters| RopeParameters {
            rope_theta: None,
            ..r.clone()
        };
        if without_theta(p) != without_theta(s) {
            bail!(
                "`rope_parameters` and `rope_scaling` disagree ({p:?} vs {s:?}); keep one of them"
            );
        }
    }
    if let (Some(pt), Some(t)) = (parameters.and_then(|p| p.rope_theta), theta) {
        if pt != t {
            bail!("`rope_theta` ({t}) and `rope_parameters.rope_theta` ({pt}) disagree; keep one");
        }
    }
    merge_rope(parameters, scaling, theta).validate_as(rope_field(parameters.is_some()))
}

/// The `config.json` field the merged RoPE settings come from: `rope_parameters` when present,
/// else `rope_scaling`.
pub(crate) fn rope_field(has_rope_parameters: bool) -> &'static str {
    if has_rope_parameters {
        "rope_parameters"
    } else {
        "rope_scaling"
    }
}

/// YaRN's magnitude correction `0.1 · m · ln(s) + 1` (1 when `s ≤ 1`); Peng et al. 2023.
pub fn yarn_get_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

impl RopeParameters {
    /// The scaling kind (`default` when absent).
    pub fn kind(&self) -> &str {
        self.rope_type.as_deref().unwrap_or("default")
    }

    /// YaRN's factor: `factor`, else `max_position_embeddings / original_max_position_embeddings`.
    fn yarn_factor(&self, max_position_embeddings: usize) -> f64 {
        self.factor.unwrap_or_else(|| {
            max_position_embeddings as f64
                / self
                    .original_max_position_embeddings
                    .unwrap_or(max_position_embeddings as f64)
        })
    }

    /// The factor on cos/sin (HF `attention_scaling`): 1 except YaRN, where it is
    /// `attention_factor`, else `mscale(f, mscale)/mscale(f, mscale_all_dim)` when both are set,
    /// else `mscale(f, 1)`.
    pub fn attention_factor(&self, max_position_embeddings: usize) -> f32 {
        if self.kind() != "yarn" {
            return 1.0;
        }
        if let Some(a) = self.attention_factor {
            return a as f32;
        }
        let f = self.yarn_factor(max_position_embeddings);
        match (self.mscale, self.mscale_all_dim) {
            (Some(m), Some(ma)) if m != 0.0 && ma != 0.0 => {
                (yarn_get_mscale(f, m) / yarn_get_mscale(f, ma)) as f32
            }
            _ => yarn_get_mscale(f, 1.0) as f32,
        }
    }

    /// Errors for an unknown `rope_type`, a missing field it needs, or a value that would give
    /// NaN or infinite frequencies; errors name the field under `rope_parameters`.
    pub fn validate(&self) -> Result<()> {
        self.validate_as("rope_parameters")
    }

    /// [`RopeParameters::validate`] with errors naming the fields under `field` (`rope_parameters`
    /// or `rope_scaling`): `factor`, `rope_theta`, `attention_factor` and
    /// `original_max_position_embeddings` finite and > 0; llama3's
    /// `high_freq_factor > low_freq_factor > 0`; YaRN's `beta_fast ≥ beta_slow > 0`,
    /// `mscale`/`mscale_all_dim` finite and ≥ 0.
    pub fn validate_as(&self, field: &str) -> Result<()> {
        let positive = [
            ("factor", self.factor),
            (
                "original_max_position_embeddings",
                self.original_max_position_embeddings,
            ),
            ("attention_factor", self.attention_factor),
            ("low_freq_factor", self.low_freq_factor),
            ("high_freq_factor", self.high_freq_factor),
            ("beta_fast", self.beta_fast),
            ("beta_slow", self.beta_slow),
        ];
        for (name, v) in positive {
            if let Some(v) = v {
                if !(v.is_finite() && v > 0.0) {
                    bail!("{field}.{name} must be a finite number > 0, got {v}");
                }
            }
        }
        if let Some(t) = self.rope_theta {
            if !(t.is_finite() && t > 1.0) {
                bail!("rope_theta must be a finite number > 1, got {t}");
            }
        }
        for (name, v) in [
            ("mscale", self.mscale),
            ("mscale_all_dim", self.mscale_all_dim),
        ] {
            if let Some(v) = v {
                if !(v.is_finite() && v >= 0.0) {
                    bail!("{field}.{name} must be a finite number ≥ 0, got {v}");
                }
            }
        }
        match self.kind() {
            "default" => Ok(()),
            "linear" => self
                .factor
                .map(|_| ())
                .ok_or_else(|| anyhow::anyhow!("{field}: rope_type linear needs `factor`")),
            "llama3" => {
                let (Some(_), Some(low), Some(high), Some(_)) = (
                    self.factor,
                    self.low_freq_factor,
                    self.high_freq_factor,
                    self.original_max_position_embeddings,
                ) else {
                    bail!("{field}: rope_type llama3 needs factor, low_freq_factor, high_freq_factor and original_max_position_embeddings");
                };
                if high <= low {
                    bail!("{field}.high_freq_factor ({high}) must be greater than {field}.low_freq_factor ({low})");
                }
                Ok(())
            }
            "yarn" => {
                if self.original_max_position_embeddings.is_none() {
                    bail!("{field}: rope_type yarn needs original_max_position_embeddings");
                }
                let (fast, slow) = (self.beta_fast.unwrap_or(32.0), self.beta_slow.unwrap_or(1.0));
                if fast < slow {
                    bail!("{field}.beta_fast ({fast}) must be at least {field}.beta_slow ({slow})");
                }
                Ok(())
            }
            other => bail!(
                "{field}.rope_type '{other}' is not supported (supported: default, linear, llama3, yarn)"
            ),
        }
    }
}

/// Inverse frequencies `[rot_dim / 2]` (f32) for rotary embedding over `rot_dim` dims.
///
/// Base: `inv_freq[i] = θ^(−2i/rot_dim)` (RoFormer; HF `_compute_default_rope_parameters`, computed
/// in f32 like the reference). `linear` divides by `factor`; `llama3` follows HF
/// `_compute_llama3_parameters`: wavelength `λ = 2π/f`; keep `f` when `λ < orig/high`, use
/// `f/factor` when `λ > orig/low`, otherwise blend with `s = (orig/λ − low)/(high − low)`:
/// `(1 − s)·f/factor + s·f`.
///
/// `yarn` follows HF `_compute_yarn_parameters` (Peng et al. 2023): correction dims
/// `d(β) = rot·ln(orig/(2πβ)) / (2 ln θ)` for β = beta_fast (low) and beta_slow (high), rounded
/// outwards and clamped to `[0, rot−1]`; ramp `r_i = clamp((i − low)/(high − low), 0, 1)`;
/// `f_i' = f_i/factor · r_i + f_i · (1 − r_i)`.
pub fn rope_inv_freq(
    p: &RopeParameters,
    rot_dim: usize,
    default_theta: f64,
    max_position_embeddings: usize,
) -> Result<Vec<f32>> {
    p.validate()?;
    let theta = p.rope_theta.unwrap_or(default_theta) as f32;
    let mut f: Vec<f32> = (0..rot_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / rot_dim as f32))
        .collect();
    match p.kind() {
        "linear" => {
            let factor = p.factor.unwrap_or(1.0) as f32;
            f.iter_mut().for_each(|x| *x /= factor);
        }
        "llama3" => {
            let factor = p.factor.unwrap_or(1.0) as f32;
            let low = p.low_freq_factor.unwrap_or(1.0) as f32;
            let high = p.high_freq_factor.unwrap_or(4.0) as f32;
            let orig = p.original_max_position_embeddings.unwrap_or(8192.0) as f32;
            let low_wavelen = orig / low;
            let high_wavelen = orig / high;
            for x in f.iter_mut() {
                let wavelen = 2.0 * std::f32::consts::PI / *x;
                if wavelen > low_wavelen {
                    *x /= factor;
                } else if wavelen >= high_wavelen {
                    let smooth = (orig / wavelen - low) / (high - low);
                    *x = (1.0 - smooth) * *x / factor + smooth * *x;
                }
            }
        }
        "yarn" => {
            let factor = p.yarn_factor(max_position_embeddings) as f32;
            let orig = p
                .original_max_position_embeddings
                .unwrap_or(max_position_embeddings as f64);
            let base = p.rope_theta.unwrap_or(default_theta);
            let dim = rot_dim as f64;
            let corr = |rot: f64| {
                dim * (orig / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
            };
            let (mut low, mut high) = (
                corr(p.beta_fast.unwrap_or(32.0)),
                corr(p.beta_slow.unwrap_or(1.0)),
            );
            if p.truncate.unwrap_or(true) {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0) as f32;
            let mut high = high.min(dim - 1.0) as f32;
            if low == high {
                high += 0.001;
            }
            for (i, x) in f.iter_mut().enumerate() {
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extrapolation = 1.0 - ramp;
                *x = *x / factor * (1.0 - extrapolation) + *x * extrapolation;
            }
        }
        _ => {}
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shadowed_rope_sources_must_agree_and_be_valid() {
        let yarn = |factor| RopeParameters {
            rope_type: Some("yarn".into()),
            factor: Some(factor),
            rope_theta: Some(10000.0),
            original_max_position_embeddings: Some(4096.0),
            ..Default::default()
        };
        let ok = validate_rope_sources(Some(&yarn(4.0)), None, None);
        assert!(ok.is_ok(), "{ok:?}");
        // rope_scaling beside rope_parameters: the same settings (θ aside) pass, others fail.
        let scaling = RopeParameters {
            rope_theta: None,
            ..yarn(4.0)
        };
        assert!(validate_rope_sources(Some(&yarn(4.0)), Some(&scaling), None).is_ok());
        let e = validate_rope_sources(Some(&yarn(4.0)), Some(&yarn(8.0)), None).unwrap_err();
        assert!(e.to_string().contains("disagree"), "{e}");
        // A bad shadowed rope_scaling or top-level rope_theta is an error too.
        let e = validate_rope_sources(None, Some(&yarn(0.0)), None).unwrap_err();
        assert!(e.to_string().contains("rope_scaling.factor"), "{e}");
        let e = validate_rope_sources(Some(&yarn(4.0)), None, Some(-1.0)).unwrap_err();
        assert!(e.to_string().contains("rope_theta"), "{e}");
        let e = validate_rope_sources(Some(&yarn(4.0)), None, Some(500000.0)).unwrap_err();
        assert!(e.to_string().contains("disagree"), "{e}");
        // Legacy configs: rope_theta at the top level with rope_scaling only.
        assert!(validate_rope_sources(None, Some(&scaling), Some(10000.0)).is_ok());
    }

    #[test]
    fn default_frequencies_fall_geometrically() {
        let p = RopeParameters {
            rope_theta: Some(10000.0),
            ..Default::default()
        };
        let f = rope_inv_freq(&p, 8, 1.0, 2048).unwrap();
        assert_eq!(f.len(), 4);
        assert!((f[0] - 1.0).abs() < 1e-7);
        assert!((f[1] - 0.1).abs() < 1e-6);
        assert!((f[3] - 0.001).abs() < 1e-8);
    }

    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let p = RopeParameters {
            rope_type: Some("llama3".into()),
            rope_theta: Some(10000.0),
            factor: Some(8.0),
            low_freq_factor: Some(1.0),
            high_freq_factor: Some(4.0),
            original_max_position_embeddings: Some(64.0),
            ..Default::default()
        };
        let base = rope_inv_freq(
            &RopeParameters {
                rope_theta: Some(10000.0),
                ..Default::default()
            },
            16,
            1.0,
            2048,
        )
        .unwrap();
        let f = rope_inv_freq(&p, 16, 1.0, 2048).unwrap();
        // λ(f0) = 2π < 16: kept. λ(f7) = 2π·10000^(14/16) ≫ 64: divided by 8.
        assert_eq!(f[0], base[0]);
        assert!((f[7] - base[7] / 8.0).abs() < 1e-9);
        // Something in between is blended strictly between the two.
        let mid: Vec<usize> = (0..8)
            .filter(|&i| f[i] != base[i] && (f[i] - base[i] / 8.0).abs() > 1e-9)
            .collect();
        for i in mid {
            assert!(f[i] < base[i] && f[i] > base[i] / 8.0);
        }
    }

    #[test]
    fn yarn_matches_transformers() {
        // transformers 5.24 `_compute_yarn_parameters` on the deepseek_v3_tiny fixture's settings
        // (rot 8, θ 1e4, factor 4, original 64, β 32/1) gives [1, 0.0625, 0.0025, 0.00025].
        let p = RopeParameters {
            rope_type: Some("yarn".into()),
            rope_theta: Some(10000.0),
            factor: Some(4.0),
            original_max_position_embeddings: Some(64.0),
            beta_fast: Some(32.0),
            beta_slow: Some(1.0),
            mscale: Some(1.0),
            mscale_all_dim: Some(1.0),
            ..Default::default()
        };
        let f = rope_inv_freq(&p, 8, 10000.0, 512).unwrap();
        for (got, want) in f.iter().zip([1.0f32, 0.0625, 0.0025, 0.00025]) {
            assert!((got - want).abs() <= want * 1e-6, "{f:?}");
        }
        assert_eq!(p.attention_factor(512), 1.0);
    }

    #[test]
    fn bad_scaling_values_are_errors_naming_the_field() {
        let yarn = || RopeParameters {
            rope_type: Some("yarn".into()),
            rope_theta: Some(10000.0),
            factor: Some(4.0),
            original_max_position_embeddings: Some(64.0),
            ..Default::default()
        };
        assert!(yarn().validate().is_ok());
        let cases: Vec<(RopeParameters, &str)> = vec![
            (
                RopeParameters {
                    factor: Some(0.0),
                    ..yarn()
                },
                "rope_parameters.factor",
            ),
            (
                RopeParameters {
                    factor: Some(-2.0),
                    ..yarn()
                },
                "rope_parameters.factor",
            ),
            (
                RopeParameters {
                    factor: Some(f64::NAN),
                    ..yarn()
                },
                "rope_parameters.factor",
            ),
            (
                RopeParameters {
                    original_max_position_embeddings: Some(0.0),
                    ..yarn()
                },
                "rope_parameters.original_max_position_embeddings",
            ),
            (
                RopeParameters {
                    beta_fast: Some(1.0),
                    beta_slow: Some(32.0),
                    ..yarn()
                },
                "rope_parameters.beta_fast",
            ),
            (
                RopeParameters {
                    beta_slow: Some(0.0),
                    ..yarn()
                },
                "rope_parameters.beta_slow",
            ),
            (
                RopeParameters {
                    mscale: Some(-1.0),
                    ..yarn()
                },
                "rope_parameters.mscale",
            ),
            (
                RopeParameters {
                    mscale_all_dim: Some(f64::INFINITY),
                    ..yarn()
                },
                "rope_parameters.mscale_all_dim",
            ),
            (
                RopeParameters {
                    attention_factor: Some(0.0),
                    ..yarn()
                },
                "rope_parameters.attention_factor",
            ),
            (
                RopeParameters {
                    rope_theta: Some(0.0),
                    ..yarn()
                },
                "rope_theta",
            ),
            (
                RopeParameters {
                    rope_type: Some("llama3".into()),
                    factor: Some(8.0),
                    low_freq_factor: Some(4.0),
                    high_freq_factor: Some(4.0),
                    original_max_position_embeddings: Some(8192.0),
                    ..Default::default()
                },
                "rope_parameters.high_freq_factor",
            ),
            (
                RopeParameters {
                    rope_type: Some("linear".into()),
                    factor: Some(0.0),
                    ..Default::default()
                },
                "rope_parameters.factor",
            ),
        ];
        for (p, field) in cases {
            let e = p.validate().unwrap_err().to_string();
            assert!(e.starts_with(field), "{field}: {e}");
            assert!(rope_inv_freq(&p, 8, 10000.0, 512).is_err());
        }
        let e = RopeParameters {
            factor: Some(0.0),
            ..yarn()
        }
        .validate_as("rope_scaling")
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("rope_scaling.factor must be a finite number > 0, got 0"),
            "{e}"
        );
    }

    #[test]
    fn unknown_rope_type_is_an_error() {
        let p = RopeParameters {
            rope_type: Some("weird".into()),
            ..Default::default()
        };
        assert!(rope_inv_freq(&p, 8, 10000.0, 2048)
            .unwrap_err()
            .to_string()
            .contains("weird"));
    }
}
