//! Golden tests for `kimi_linear` (KDA + NoPE MLA + MoE): a tiny checkpoint made by transformers
//! 5.24 (`fixtures/gen_kimi_linear.py`); its 71-token prompt spans two 64-token KDA chunks.

use dayone_backend::DType;
use dayone_tests::{check_golden, on_every_backend};

on_every_backend! {
    kimi_f32 => |mk: fn() -> _| check_golden(mk(), "kimi_linear_tiny", DType::F32);
    kimi_bf16 => |mk: fn() -> _| check_golden(mk(), "kimi_linear_tiny", DType::BF16);
}
