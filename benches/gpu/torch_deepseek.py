"""PyTorch side of the DeepSeek-V3 measurements on the GPU machine (random weights, no download).

1. One DeepSeek-V3-shaped MoE block (transformers `DeepseekV3MoE`: router + 256 experts × 2048,
   top-8, 1 shared; hidden 7168) at several token counts, with transformers' `eager` experts loop
   and its `grouped_mm` implementation (torch._grouped_mm): ms, TFLOP/s, weight GB/s.
2. Optionally saves a reduced-depth DeepSeek-V3-shaped bf16 checkpoint (4 layers: 3 dense, 1 MoE,
   real widths) for `dayone bench`.

    python3 benches/gpu/torch_deepseek.py --tokens 1,64,512,8192 --save /tmp/dsv3_4l --json $OUT/torch_moe.json
"""

import argparse
import json
import time

import torch
import transformers
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM


def config(layers: int) -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=129280,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=layers,
        num_attention_heads=128,
        num_key_value_heads=128,
        n_shared_experts=1,
        n_routed_experts=256,
        routed_scaling_factor=2.5,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        v_head_dim=128,
        qk_nope_head_dim=128,
        n_group=8,
        topk_group=4,
        num_experts_per_tok=8,
        first_k_dense_replace=3,
        norm_topk_prob=True,
        max_position_embeddings=163840,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
    )


def bench(fn, iters):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="1,64,512,8192")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--save")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = config(a.layers)
    with torch.device("cuda"):
        model = DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.normal_(0.0, 0.01)
    moe = model.model.layers[cfg.first_k_dense_replace].mlp
    d, f, k = cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    results = []
    for impl in ["eager", "grouped_mm"]:
        try:
            model.set_experts_implementation(impl)
        except Exception as e:  # older transformers
            print(f"experts implementation {impl}: {e}")
            continue
        for t in [int(x) for x in a.tokens.split(",")]:
            x = torch.randn(1, t, d, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                _, _, ids = moe.gate(x)
                used = int(torch.unique(ids).numel())
                s = bench(lambda: moe(x), 3 if t >= 4096 else 10)
            flops = 2 * 3 * d * f * t * (k + cfg.n_shared_experts)
            wbytes = 3 * d * f * 2 * (used + cfg.n_shared_experts)
            r = {"impl": impl, "tokens": t, "ms": s * 1e3, "tflops": flops / s / 1e12,
                 "weight_gbps": wbytes / s / 1e9, "experts_used": used}
            print(json.dumps(r), flush=True)
            results.append(r)
    if a.save:
        t0 = time.perf_counter()
        model.save_pretrained(a.save, safe_serialization=True, max_shard_size="10GB")
        print(f"saved {a.save} in {time.perf_counter() - t0:.1f} s", flush=True)
    if a.json:
        meta = {"torch": torch.__version__, "transformers": transformers.__version__,
                "device": torch.cuda.get_device_name()}
        with open(a.json, "w") as fh:
            json.dump({"meta": meta, "moe_block": results}, fh, indent=1)


if __name__ == "__main__":
    main()
