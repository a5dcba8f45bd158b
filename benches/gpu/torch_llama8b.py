"""PyTorch baseline on the GPU machine: a Llama-3.1-8B-shaped bf16 model with random weights.

Builds the model on the GPU with transformers (no download), optionally saves it as safetensors
for `dayone bench`, then times `model.generate` (greedy, EOS ignored) with the eager and SDPA
attention implementations at the given batch sizes. TTFT is a separate prefill forward; decode
tokens/s = batch·(gen−1) / (generate time − TTFT).

    python3 benches/gpu/torch_llama8b.py --save /tmp/llama8b --batch 1,8,64 --prompt-len 512 \
        --gen-len 128 --json $OUT/torch.json
"""

import argparse
import json
import time

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM


def config(layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
        pad_token_id=0,
    )


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--save")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--batch", default="1,8,64")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen-len", type=int, default=128)
    ap.add_argument("--attn", default="eager,sdpa")
    ap.add_argument("--json")
    a = ap.parse_args()

    torch.manual_seed(0)
    cfg = config(a.layers)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    # Random weights with a small scale so activations stay finite through 32 layers.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.02)
    if a.save:
        _, dt = timed(lambda: model.save_pretrained(a.save, safe_serialization=True, max_shard_size="5GB"))
        print(f"saved {a.save} in {dt:.1f} s", flush=True)

    results = []
    gen = torch.Generator(device="cuda").manual_seed(1)
    for impl in a.attn.split(","):
        model.set_attn_implementation(impl)
        for b in [int(x) for x in a.batch.split(",")]:
            ids = torch.randint(0, cfg.vocab_size, (b, a.prompt_len), device="cuda", generator=gen)
            mask = torch.ones_like(ids)
            kw = dict(attention_mask=mask, do_sample=False, pad_token_id=0, eos_token_id=None)
            with torch.no_grad():
                model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
                _, ttft = timed(lambda: model(ids, attention_mask=mask, use_cache=True))
                out, total = timed(
                    lambda: model.generate(ids, max_new_tokens=a.gen_len, min_new_tokens=a.gen_len, **kw)
                )
            assert out.shape[1] == a.prompt_len + a.gen_len
            r = {
                "attn": impl,
                "batch": b,
                "prompt_len": a.prompt_len,
                "gen_len": a.gen_len,
                "ttft_s": ttft,
                "total_s": total,
                "output_tokens_per_s": b * a.gen_len / total,
                "decode_tokens_per_s": b * (a.gen_len - 1) / max(total - ttft, 1e-9),
                "prefill_tokens_per_s": b * a.prompt_len / ttft,
            }
            print(json.dumps(r), flush=True)
            results.append(r)
    meta = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(),
        "layers": a.layers,
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
