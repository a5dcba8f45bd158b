//! Golden tests: tiny random-weight checkpoints made by transformers 5.24 (`fixtures/gen_tiny.py`);
//! every logits row of prefill + 8 decode steps within tolerance, greedy tokens identical.

use dayone_backend::DType;
use dayone_tests::{check_golden, on_every_backend};

on_every_backend! {
    llama_f32 => |mk: fn() -> _| check_golden(mk(), "llama_tiny", DType::F32);
    llama_bf16 => |mk: fn() -> _| check_golden(mk(), "llama_tiny", DType::BF16);
    qwen2_f32 => |mk: fn() -> _| check_golden(mk(), "qwen2_tiny", DType::F32);
    qwen2_bf16 => |mk: fn() -> _| check_golden(mk(), "qwen2_tiny", DType::BF16);
    qwen3_f32 => |mk: fn() -> _| check_golden(mk(), "qwen3_tiny", DType::F32);
    qwen3_bf16 => |mk: fn() -> _| check_golden(mk(), "qwen3_tiny", DType::BF16);
    // Mistral: a sliding window of 8 on every layer, prompts of 20 and 31 tokens.
    mistral_f32 => |mk: fn() -> _| check_golden(mk(), "mistral_tiny", DType::F32);
    mistral_bf16 => |mk: fn() -> _| check_golden(mk(), "mistral_tiny", DType::BF16);
    llama_sharded_f32 => |mk: fn() -> _| check_golden(mk(), "llama_sharded", DType::F32);
}
