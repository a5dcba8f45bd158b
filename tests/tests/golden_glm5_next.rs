//! Golden tests for `glm5_next` (GLM-5.3-Flash text: hyper-connections over 4 streams, KDA with
//! the lower-bound gate, NoPE MLA with the pooled DSA indexer and a `shared` layer, clamped
//! SwiGLU in dense and MoE FFNs): a tiny checkpoint made by transformers 5.24
//! (`fixtures/gen_glm5_next.py`). With `index_kpool` 4 and `index_topk` 8 the 13- and 40-token
//! prompts and their decodes are sparse (2 pools + the tail).

use dayone_backend::DType;
use dayone_tests::{check_golden, on_every_backend};

on_every_backend! {
    glm5_f32 => |mk: fn() -> _| check_golden(mk(), "glm5_next_tiny", DType::F32);
    glm5_bf16 => |mk: fn() -> _| check_golden(mk(), "glm5_next_tiny", DType::BF16);
}
