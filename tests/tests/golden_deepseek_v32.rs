//! Golden tests for `deepseek_v32` (DSA: lightning indexer + top-k + sparse MLA), tiny
//! checkpoints made by transformers 5.24 (`fixtures/gen_deepseek_v32.py`): with `index_topk` 8
//! the 13- and 31-token prompts (and their decodes, up to ~5× the top-k) are sparse; with
//! `index_topk` 64 the same weights must equal dense MLA. The CUDA backend does not implement
//! the DSA ops yet, so these run on the CPU reference and WGSL only.

use dayone_backend::DType;
use dayone_tests::check_golden;

mod cpu {
    use super::*;

    #[test]
    fn sparse_f32() {
        check_golden(
            dayone_backend::cpu::CpuBackend,
            "deepseek_v32_tiny",
            DType::F32,
        )
        .unwrap();
    }

    #[test]
    fn sparse_bf16() {
        check_golden(
            dayone_backend::cpu::CpuBackend,
            "deepseek_v32_tiny",
            DType::BF16,
        )
        .unwrap();
    }

    #[test]
    fn dense_f32() {
        check_golden(
            dayone_backend::cpu::CpuBackend,
            "deepseek_v32_dense",
            DType::F32,
        )
        .unwrap();
    }
}

mod wgsl {
    use super::*;

    #[test]
    fn sparse_f32() {
        check_golden(dayone_tests::wgsl(), "deepseek_v32_tiny", DType::F32).unwrap();
    }

    #[test]
    fn sparse_bf16() {
        check_golden(dayone_tests::wgsl(), "deepseek_v32_tiny", DType::BF16).unwrap();
    }

    #[test]
    fn dense_f32() {
        check_golden(dayone_tests::wgsl(), "deepseek_v32_dense", DType::F32).unwrap();
    }
}
