//! Golden tests for `deepseek_v32` (DSA: lightning indexer + top-k + sparse MLA), tiny
//! checkpoints made by transformers 5.24 (`fixtures/gen_deepseek_v32.py`): with `index_topk` 8
//! the 13- and 31-token prompts (and their decodes, up to ~5× the top-k) are sparse; with
//! `index_topk` 64 the same weights must equal dense MLA.

use dayone_backend::DType;
use dayone_tests::{check_golden, on_every_backend};

on_every_backend! {
    sparse_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v32_tiny", DType::F32);
    sparse_bf16 => |mk: fn() -> _| check_golden(mk(), "deepseek_v32_tiny", DType::BF16);
    dense_f32 => |mk: fn() -> _| check_golden(mk(), "deepseek_v32_dense", DType::F32);
}
