"""transformers' gpt-oss on the GPU, random bf16 weights of a gpt-oss-20b shape (the config of
write_gpt_oss.py, experts dequantised: bf16), for the side-by-side with `dayone bench`:
prefill time of a 1024-token prompt and decode tok/s at batch 1 over 64 new tokens (greedy,
static cache off, eager attention, transformers' own expert loop).

    python3 benches/gpu/torch_gpt_oss.py /tmp/gpt-oss-20b/config.json
"""

import json
import sys
import time

import torch
from transformers import GptOssConfig, GptOssForCausalLM


def main() -> None:
    cfg = json.load(open(sys.argv[1]))
    cfg.pop("quantization_config", None)
    config = GptOssConfig(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = GptOssForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (1, 1024), device="cuda")
    with torch.no_grad():
        model.generate(ids[:, :32], max_new_tokens=4, do_sample=False)  # warm-up
        torch.cuda.synchronize()
        t0 = time.time()
        out = model(ids, use_cache=True)
        torch.cuda.synchronize()
        ttft = time.time() - t0
        t0 = time.time()
        gen = model.generate(ids, max_new_tokens=64, do_sample=False, min_new_tokens=64)
        torch.cuda.synchronize()
        total = time.time() - t0
    decode = (total - ttft) / 63
    print(json.dumps({"torch": torch.__version__, "prefill_1024_s": round(ttft, 3),
                      "decode_tok_s_batch1": round(1 / decode, 2), "new_tokens": gen.shape[1] - 1024,
                      "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}))
    del out


if __name__ == "__main__":
    main()
