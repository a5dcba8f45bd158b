//! Golden tests for `gpt_oss` (attention sinks, alternating sliding-window / full layers, YaRN,
//! biased softmax-top-k router, clamped interleaved GLU experts stored as MXFP4 and kept
//! low-bit): a tiny checkpoint in the released layout, references from transformers 5.24 with
//! `Mxfp4Config(dequantize=True)` (`fixtures/gen_gpt_oss.py`); prompts longer than the window.

use dayone_backend::DType;
use dayone_engine::EngineConfig;
use dayone_tests::{check_golden, check_golden_with, on_every_backend};

on_every_backend! {
    gpt_oss_f32 => |mk: fn() -> _| check_golden(mk(), "gpt_oss_tiny", DType::F32);
    gpt_oss_bf16 => |mk: fn() -> _| check_golden(mk(), "gpt_oss_tiny", DType::BF16);
    // The experts decoded at load instead of per step: the same references.
    gpt_oss_decoded_at_load_f32 => |mk: fn() -> _| check_golden_with(
        mk(),
        "gpt_oss_tiny",
        EngineConfig {
            dtype: DType::F32,
            kv_cache_tokens: Some(2048),
            dequantize_at_load: true,
            ..Default::default()
        },
    );
}
