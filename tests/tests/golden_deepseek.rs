//! Golden tests for `deepseek_v3` (MLA + sigmoid group-limited MoE; YaRN; FP8 block scales;
//! MXFP4 and INT4 routed experts):
//! tiny checkpoints made by transformers 5.24 (`fixtures/gen_deepseek.py`).

use dayone_backend::DType;
use dayone_tests::{check_golden, on_every_backend};

on_every_backend! {
    deepseek_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_tiny", DType::F32);
    deepseek_bf16 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_tiny", DType::BF16);
    deepseek_nolora_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_nolora", DType::F32);
    deepseek_fp8_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_fp8", DType::F32);
    // Routed experts kept low-bit on the device (compressed-tensors MXFP4 and INT4).
    deepseek_mxfp4_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_mxfp4", DType::F32);
    deepseek_mxfp4_bf16 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_mxfp4", DType::BF16);
    deepseek_int4_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v3_int4", DType::F32);
}
