//! No compile inside a step (issue [14]): the engine compiles (or loads from the disk cache)
//! every kernel module at load, so serving requests of every kind — prefill, decode, a
//! prefix-cache hit, a batch — loads no new module. CUDA only (the other backends compile no
//! kernels at run time); skipped without a GPU.

use dayone_backend::DType;
use dayone_engine::scheduler::SchedulerConfig;
use dayone_engine::EngineConfig;
use dayone_tests::{engine, greedy};

fn no_module_loaded_by_steps(model: &str, dtype: DType, batch_invariant: bool) {
    if !dayone_cuda::is_available() {
        eprintln!("skipped: no CUDA driver or device");
        return;
    }
    let cfg = EngineConfig {
        dtype,
        kv_cache_tokens: Some(1024),
        scheduler: SchedulerConfig {
            max_batched_tokens: 16,
            max_prefill_chunk: 16,
            max_num_seqs: 4,
            ..Default::default()
        },
        batch_invariant,
        ..Default::default()
    };
    let mut e = engine(dayone_tests::cuda(), model, cfg).unwrap();
    let loaded = e.backend().loaded_modules();
    assert!(loaded > 0, "{model}: the load compiled nothing");
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 200 + 1).collect();
    // Alone (chunked prefill, decode), again (a prefix-cache hit), then four at once.
    for round in [
        vec![prompt.clone()],
        vec![prompt.clone()],
        (0..4).map(|k| prompt[k..].to_vec()).collect(),
    ] {
        for p in round {
            e.add_request(p, greedy(6)).unwrap();
        }
        e.run_to_completion().unwrap();
    }
    assert_eq!(
        e.backend().loaded_modules(),
        loaded,
        "{model} {dtype}: a step loaded a kernel module the load did not"
    );
}

#[test]
fn llama_bf16() {
    no_module_loaded_by_steps("llama_tiny", DType::BF16, false);
}

#[test]
fn deepseek_v32_bf16_batch_invariant() {
    no_module_loaded_by_steps("deepseek_v32_tiny", DType::BF16, true);
}

#[test]
fn kimi_linear_f32() {
    no_module_loaded_by_steps("kimi_linear_tiny", DType::F32, false);
}
