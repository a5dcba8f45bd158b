//! compressed-tensors' packed Linear weights (`quantization_config.quant_method:
//! "compressed-tensors"`), read into [`QuantHost`] without decoding:
//! - `mxfp4-pack-quantized`: `{p}.weight_packed` U8 `[out, in/2]` (low nibble the even column)
//!   and `{p}.weight_scale` U8 `[out, in/32]` (E8M0).
//! - `pack-quantized` (symmetric INT4, Kimi-K2-Thinking / K2.5): `{p}.weight_packed` I32
//!   `[out, in/8]`, eight values per word, column `8j + i` at bits `4i` of word `j`, offset by
//!   8 (compressed-tensors `pack_to_int32`; its little-endian bytes are the nibble order of the
//!   device layout), `{p}.weight_scale` BF16/F16 `[out, in/group]`, `{p}.weight_shape` I32
//!   `[2]` = `[out, in]` when present.

use super::{RawTensor, TensorSource};
use anyhow::{bail, ensure, Result};
use dayone_backend::quant::ScaleType;
use dayone_backend::{QuantFormat, QuantHost};

/// The packed weight `{prefix}.weight_packed` of logical shape `[out, in]`, `None` when the
/// checkpoint has no such tensor. Errors name the tensor and the shape or dtype expected.
pub fn packed_weight(
    src: &dyn TensorSource,
    prefix: &str,
    out: usize,
    inp: usize,
) -> Result<Option<QuantHost>> {
    let packed = format!("{prefix}.weight_packed");
    if src.shape(&packed).is_none() {
        return Ok(None);
    }
    let origin = src.origin();
    let scale_name = format!("{prefix}.weight_scale");
    if src.shape(&format!("{prefix}.weight_zero_point")).is_some() {
        bail!("{origin}: {prefix} is asymmetric INT4 (weight_zero_point); only symmetric pack-quantized weights are supported");
    }
    let codes = src.load_raw(&packed)?;
    let Some(_) = src.shape(&scale_name) else {
        bail!("{origin}: {packed} has no {scale_name} beside it");
    };
    let scales = src.load_raw(&scale_name)?;
    let expect = |t: &RawTensor, name: &str, dtype: &[&str], shape: [usize; 2]| -> Result<()> {
        ensure!(
            dtype.contains(&t.dtype.as_str()) && t.shape == shape,
            "{origin}: {name} is {} {:?}, expected {} {shape:?} for a [{out}, {inp}] weight",
            t.dtype,
            t.shape,
            dtype.join("/")
        );
        Ok(())
    };
    if let Some(s) = src.shape(&format!("{prefix}.weight_shape")) {
        let ws = src.load_raw(&format!("{prefix}.weight_shape"))?;
        let dims: Vec<i64> = match ws.dtype.as_str() {
            "I32" => bytemuck::pod_collect_to_vec::<u8, i32>(&ws.data)
                .into_iter()
                .map(i64::from)
                .collect(),
            "I64" => bytemuck::pod_collect_to_vec::<u8, i64>(&ws.data),
            other => {
                bail!("{origin}: {prefix}.weight_shape has dtype {other}, expected I32 or I64")
            }
        };
        ensure!(
            s == [2] && dims == [out as i64, inp as i64],
            "{origin}: {prefix}.weight_shape is {dims:?}, expected [{out}, {inp}]"
        );
    }
    let what = format!("{origin}: {prefix} (weight_packed, weight_scale)");
    match codes.dtype.as_str() {
        "U8" => {
            expect(&codes, &packed, &["U8"], [out, inp / 2])?;
            expect(&scales, &scale_name, &["U8"], [out, inp / 32])?;
            QuantHost::new(
                &what,
                QuantFormat::MXFP4,
                [1, out, inp],
                codes.data,
                scales.data,
                vec![],
            )
            .map(Some)
        }
        "I32" => {
            expect(&codes, &packed, &["I32"], [out, inp / 8])?;
            let groups = scales.shape.get(1).copied().unwrap_or(0);
            ensure!(
                groups > 0 && inp.is_multiple_of(groups),
                "{origin}: {scale_name} has shape {:?}, expected [{out}, {inp} / group]",
                scales.shape
            );
            expect(&scales, &scale_name, &["BF16", "F16"], [out, groups])?;
            let st = if scales.dtype == "BF16" {
                ScaleType::BF16
            } else {
                ScaleType::F16
            };
            let f = QuantFormat::int4(inp / groups, st);
            QuantHost::new(&what, f, [1, out, inp], codes.data, scales.data, vec![]).map(Some)
        }
        other => bail!("{origin}: {packed} has dtype {other}, expected U8 (MXFP4) or I32 (INT4)"),
    }
}
