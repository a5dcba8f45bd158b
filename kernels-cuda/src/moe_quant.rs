//! Routed experts read from their low-bit codes (`Backend::moe_experts_quant`, issue [11]'s
//! direct path for decode): the moe family's `moe_sort` groups the (token, choice) pairs by
//! expert, then `moe_q_*_gu` (gate/up with the activation and biases), `moe_q_*_dn` (down and its
//! bias) and `moe_q_combine_*` (routing weights, f32, deterministic) from `kernels/quant.cu`.
//! MXFP4 and symmetric INT4 (E8M0, f16 or bf16 scales per a multiple of 32 columns, no min)
//! with reduction widths a multiple of 32; other formats and shapes decode the step's experts into temporaries instead
//! ([`dayone_backend::quant_moe::moe_experts_decoded_temp`]).

use crate::{dtype_suffix, launch, to_u32, CudaBackend, CudaTensor};
use anyhow::{bail, Result};
use dayone_backend::quant::Codes;
use dayone_backend::{DType, ExpertOptions, QuantFormat, QuantTensor};

/// The average (token, expert) pairs per expert up to which the MoE layers send a step to the
/// direct kernels by default: each tile of up to 8 pairs re-reads its expert's codes, while a
/// decode converts every touched expert once. Measured on the H200 (docs/perf.md, issue [11]),
/// with the m8 kernel that stages a tile's activations in shared memory (2026-12-02 12:31 UTC):
/// gpt-oss-20b-shaped layer (32 experts, top 4, MXFP4) direct 0.73 vs decode 1.92 ms at 32
/// tokens (4 pairs per expert) and 1.22 vs 1.98 ms at 64 (8 pairs). Before that kernel the
/// crossing was ≈ 3.75 pairs (Kimi-K2 shape) and between 4 and 8 (gpt-oss-20b).
pub const MOE_QUANT_DIRECT_PAIRS_PER_EXPERT: usize = 8;

/// `DAYONE_MOE_QUANT_DIRECT_MAX` (tokens; 0: always decode into the workspace) when set; read
/// once. A value that is not a token count is ignored with one warning line on stderr.
fn direct_max_env() -> Option<usize> {
    static MAX: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *MAX.get_or_init(|| {
        let v = std::env::var("DAYONE_MOE_QUANT_DIRECT_MAX").ok();
        parse_direct_max(v.as_deref()).unwrap_or_else(|e| {
            eprintln!("warning: {e}");
            None
        })
    })
}

/// Parses a `DAYONE_MOE_QUANT_DIRECT_MAX` value: `None` → `Ok(None)` (the default limit), a
/// token count → `Ok(Some(n))`; anything else is an error naming the variable and the value.
pub(crate) fn parse_direct_max(v: Option<&str>) -> Result<Option<usize>, String> {
    match v {
        None => Ok(None),
        Some(s) => s.trim().parse().map(Some).map_err(|_| {
            format!(
                "DAYONE_MOE_QUANT_DIRECT_MAX={s:?} is not a token count (0, 1, 2, …); using the \
                 default ({MOE_QUANT_DIRECT_PAIRS_PER_EXPERT} pairs per expert)"
            )
        }),
    }
}

/// The default direct-path limit in tokens for `experts` routed experts, `top_k` per token:
/// [`MOE_QUANT_DIRECT_PAIRS_PER_EXPERT`] pairs per expert on average, at least one token.
pub fn direct_tokens_for(experts: usize, top_k: usize) -> usize {
    (MOE_QUANT_DIRECT_PAIRS_PER_EXPERT * experts / top_k.max(1)).max(1)
}

/// The code tag of the direct kernels for `f` (`fp4`, `int4`), or `None` when they do not
/// take it (other codes, a min, super-block scale records, groups not a multiple of 32).
pub(crate) fn direct_kind(f: &QuantFormat) -> Option<&'static str> {
    if f.has_min || f.scale.is_super_block() || !f.group.is_multiple_of(32) {
        return None;
    }
    match f.codes {
        Codes::Fp4E2M1 => Some("fp4"),
        Codes::U4Offset8 => Some("int4"),
        _ => None,
    }
}

/// `(F, D)` of low-bit experts `gate_up` `[E, 2F, D]` and `down` `[E, D, F]` (codes and scales
/// in u32 words) for `x` `[N, D]`. Errors name `op` and the mismatching shape or dtype.
pub(crate) fn quant_expert_dims(
    op: &str,
    x: &CudaTensor,
    gate_up: &QuantTensor<CudaTensor>,
    down: &QuantTensor<CudaTensor>,
) -> Result<(usize, usize)> {
    let [e, f2, d] = gate_up.shape;
    let f = f2 / 2;
    if x.shape.len() != 2 || x.shape[1] != d || !f2.is_multiple_of(2) {
        bail!(
            "{op}: expected x [N, {d}] and gate_up [E, 2F, {d}], got x {:?} and gate_up {:?}",
            x.shape,
            gate_up.shape
        );
    }
    if down.shape != [e, d, f] {
        bail!("{op}: down must be [{e}, {d}, {f}], got {:?}", down.shape);
    }
    for (q, what) in [(gate_up, "gate_up"), (down, "down")] {
        for (t, part) in [(&q.codes, "codes"), (&q.scales, "scales")] {
            if t.dtype != DType::U32 {
                bail!("{op}: {what} {part} must be u32 words, got {}", t.dtype);
            }
        }
    }
    Ok((f, d))
}

impl CudaBackend {
    pub(crate) fn moe_quant_direct_tokens_impl(
        &self,
        f: QuantFormat,
        experts: usize,
        top_k: usize,
    ) -> usize {
        // Batch-invariant mode: one path (decode + the tiled kernels) for every step size.
        if self.invariant() || direct_kind(&f).is_none() {
            0
        } else {
            direct_max_env().unwrap_or_else(|| direct_tokens_for(experts, top_k))
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn moe_experts_quant_impl(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        gate_up: &QuantTensor<CudaTensor>,
        down: &QuantTensor<CudaTensor>,
        opts: &ExpertOptions<CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "moe_experts_quant";
        let sfx = dtype_suffix(OP, x.dtype)?;
        let (f, d) = quant_expert_dims(OP, x, gate_up, down)?;
        let e = gate_up.shape[0];
        let n = x.shape[0];
        crate::mla_moe::check_routing(OP, n, ids, weights)?;
        crate::mla_moe::check_expert_biases(OP, x, (e, f, d), opts.gate_up_bias, opts.down_bias)?;
        for (q, what) in [(gate_up, "gate_up"), (down, "down")] {
            for (t, part) in [(&q.codes, "codes"), (&q.scales, "scales")] {
                if t.dtype != DType::U32 {
                    bail!("{OP}: {what} {part} must be u32 words, got {}", t.dtype);
                }
            }
        }
        let k = ids.shape[1];
        // The kernels index weight rows (E · 2F of gate_up) in u32.
        to_u32(OP, "gate_up rows (experts x 2F)", e * 2 * f)?;
        // The kernels' 16-byte loads: codes rows of 32 values, x rows of 8 values, aligned.
        let aligned = d.is_multiple_of(32)
            && f.is_multiple_of(32)
            && [&gate_up.codes, &down.codes, x]
                .iter()
                .all(|t| t.device_ptr().is_multiple_of(16));
        let (Some(gu_kind), Some(dn_kind), true) = (
            direct_kind(&gate_up.format),
            direct_kind(&down.format),
            aligned,
        ) else {
            return dayone_backend::quant_moe::moe_experts_decoded_temp(
                self, x, ids, weights, gate_up, down, opts,
            );
        };
        let (out, done) = self.experts_output(x, (n, d), (k, e, f))?;
        if done {
            return Ok(out);
        }
        let (act, alpha, limit) = crate::mla_moe::act_code(opts.act);
        // Tiles of at most `mt` pairs of one expert (the GEMV's rows; the m8 kernels skip the
        // rows a tile lacks).
        let mt: usize = if n == 1 { 1 } else { 8 };
        let p = n * k;
        let sp = self.sort_pairs(OP, sfx, ids, (p, e), mt as u32)?;
        let maxt = sp.max_tiles;
        let h = self.scratch_f32(p * f)?;
        let y2 = self.scratch_f32(p * d)?;
        // (input, weight, bias, output, kernel tag, gather k, outputs, reduction width)
        let projections = [
            (
                x.device_ptr(),
                gate_up,
                opts.gate_up_bias,
                &h,
                format!("{gu_kind}_gu"),
                k as u32,
                f,
                d,
            ),
            (
                h.device_ptr(),
                down,
                opts.down_bias,
                &y2,
                format!("{dn_kind}_dn"),
                0u32,
                d,
                f,
            ),
        ];
        // Eight warps per block, each owning `rpw` outputs (the kernels' RPW: 2 gate/up or 4
        // down outputs per warp, m1 and m8 alike).
        for (a, q, bias, o, tag, gather, nout, kdim) in projections {
            let rpw = if tag.ends_with("_gu") { 2 } else { 4 };
            let [_, scale, _, group] = q.format.kernel_params();
            let fun = self.func("quant", sfx, &format!("moe_q_{sfx}_{tag}_m{mt}"))?;
            self.launch(
                OP,
                &fun,
                (to_u32(OP, "grid.x", nout.div_ceil(8 * rpw))?, maxt, 1),
                (256, 1, 1),
                0,
                kparams![
                    a,
                    q.codes.device_ptr(),
                    q.scales.device_ptr(),
                    bias.map_or(0u64, |b| b.device_ptr()),
                    o.device_ptr(),
                    sp.offsets.device_ptr(),
                    sp.sorted.device_ptr(),
                    sp.tiles.device_ptr(),
                    sp.ntiles.device_ptr(),
                    gather,
                    to_u32(OP, "output width", nout)?,
                    to_u32(OP, "reduction width", kdim)?,
                    scale,
                    group,
                    act,
                    alpha,
                    limit
                ],
            )?;
        }
        let comb = self.func("quant", sfx, &format!("moe_q_combine_{sfx}"))?;
        self.launch(
            OP,
            &comb,
            (
                to_u32(OP, "column blocks", d.div_ceil(256).min(65535))?,
                launch::row_grid(n, 65535),
                1,
            ),
            (256, 1, 1),
            0,
            kparams![
                y2.device_ptr(),
                sp.pos.device_ptr(),
                weights.device_ptr(),
                out.device_ptr(),
                to_u32(OP, "N", n)?,
                to_u32(OP, "k", k)?,
                to_u32(OP, "D", d)?
            ],
        )?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::{direct_kind, direct_tokens_for, parse_direct_max};
    use dayone_backend::quant::ScaleType;
    use dayone_backend::QuantFormat;

    #[test]
    fn direct_limit_is_pairs_per_expert() {
        // Kimi-K2 (384 experts, top 8), gpt-oss-20b (32, top 4), gpt-oss-120b (128, top 4).
        assert_eq!(direct_tokens_for(384, 8), 384);
        assert_eq!(direct_tokens_for(32, 4), 64);
        assert_eq!(direct_tokens_for(128, 4), 256);
        assert_eq!(direct_tokens_for(1, 16), 1);
        assert_eq!(direct_tokens_for(8, 0), 64);
    }

    /// `DAYONE_MOE_QUANT_DIRECT_MAX`: unset → the default, a count → it, else an error that
    /// names the variable (the backend warns and keeps the default).
    #[test]
    fn direct_max_env_values() {
        assert_eq!(parse_direct_max(None), Ok(None));
        assert_eq!(parse_direct_max(Some("0")), Ok(Some(0)));
        assert_eq!(parse_direct_max(Some(" 64 ")), Ok(Some(64)));
        for bad in ["", "-1", "4.5", "auto", "64 tokens"] {
            let e = parse_direct_max(Some(bad)).unwrap_err();
            assert!(e.contains("DAYONE_MOE_QUANT_DIRECT_MAX"), "{e}");
        }
    }

    #[test]
    fn direct_kernels_take_mxfp4_and_int4_only() {
        assert_eq!(direct_kind(&QuantFormat::MXFP4), Some("fp4"));
        assert_eq!(
            direct_kind(&QuantFormat::int4(32, ScaleType::BF16)),
            Some("int4")
        );
        assert_eq!(
            direct_kind(&QuantFormat::int4(128, ScaleType::F16)),
            Some("int4")
        );
        assert_eq!(direct_kind(&QuantFormat::int4(16, ScaleType::BF16)), None);
        for f in [QuantFormat::Q4_1, QuantFormat::Q4_K, QuantFormat::Q8_0] {
            assert_eq!(direct_kind(&f), None, "{}", f.name());
        }
    }
}
