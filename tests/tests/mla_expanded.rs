//! MLA prefill in the expanded form (per-head keys and values rebuilt from the latent cache,
//! `engine/src/layers/mla_expanded.rs`) against the transformers reference on every backend:
//! every step with two or more new tokens takes it, with whole prompts and with prompts split
//! into 7-token chunks (chunk boundaries inside blocks, steps that mix prefill and decode).
//! Dense MLA (deepseek_v3, its q_proj variant without a query LoRA, and one with DeepSeek's real
//! head widths), Kimi's NoPE MLA beside KDA, and DeepSeek-V3.2 with a dense indexer (top-k above
//! the prompt length).

use anyhow::Result;
use dayone_backend::{Backend, DType};
use dayone_engine::layers::MlaPrefill;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::EngineConfig;
use dayone_tests::{check_golden_with, on_every_backend};

fn expanded(dtype: DType, chunk: Option<usize>) -> EngineConfig {
    let mut cfg = EngineConfig {
        dtype,
        kv_cache_tokens: Some(2048),
        mla_prefill: MlaPrefill::Expanded { min_tokens: 2 },
        ..Default::default()
    };
    if let Some(c) = chunk {
        cfg.scheduler = SchedulerConfig {
            max_batched_tokens: c,
            max_prefill_chunk: c,
            ..Default::default()
        };
    }
    cfg
}

fn golden<B: Backend>(mk: impl Fn() -> B, name: &str) -> Result<()> {
    for chunk in [None, Some(7)] {
        for dtype in [DType::F32, DType::BF16] {
            check_golden_with(mk(), name, expanded(dtype, chunk))?;
        }
    }
    Ok(())
}

/// `deepseek_v3_wide` (DeepSeek's real head widths) in the default `Auto` form: on CUDA in bf16
/// the expanded prefill runs on the tensor-core kernel (hd_k 192, hd_v 128), elsewhere the
/// absorbed form; both must match transformers.
fn golden_auto<B: Backend>(mk: impl Fn() -> B) -> Result<()> {
    for chunk in [None, Some(7)] {
        for dtype in [DType::F32, DType::BF16] {
            let mut cfg = expanded(dtype, chunk);
            cfg.mla_prefill = MlaPrefill::Auto { min_tokens: 2 };
            check_golden_with(mk(), "deepseek_v3_wide", cfg)?;
        }
    }
    Ok(())
}

on_every_backend! {
    deepseek_v3 => |mk| golden(mk, "deepseek_v3_tiny");
    deepseek_v3_no_q_lora => |mk| golden(mk, "deepseek_v3_nolora");
    kimi_linear => |mk| golden(mk, "kimi_linear_tiny");
    deepseek_v32_dense => |mk| golden(mk, "deepseek_v32_dense");
    deepseek_v3_wide => |mk| golden(mk, "deepseek_v3_wide");
    deepseek_v3_wide_auto => golden_auto;
}
