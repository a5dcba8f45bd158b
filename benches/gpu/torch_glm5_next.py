"""transformers' glm5_next beside `dayone bench` on the same card: the reduced-depth checkpoint of
run_glm5_next.sh (random weights built in place from its config, bf16; fla kept away, so KDA
runs transformers' own torch chunk/recurrent code), prefill time of a P-token prompt and decode
tok/s at batch 1 over G new tokens (greedy, eager attention, transformers' expert loop).

    PYTHONPATH=<transformers ≥ 5.24> python3 benches/gpu/torch_glm5_next.py CONFIG.json [P] [G]
"""

import json
import sys
import time

sys.modules["fla"] = None  # transformers' own KDA code, not fla's Triton kernels
import torch  # noqa: E402
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration  # noqa: E402


def main() -> None:
    cfg = json.load(open(sys.argv[1]))
    prompt = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    gen = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    config = Glm5NextConfig(**cfg)
    config._attn_implementation = "eager"
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(dev):
        torch.set_default_dtype(torch.bfloat16)
        model = Glm5NextForConditionalGeneration(config).eval()
    vocab = config.text_config.vocab_size
    ids = torch.randint(0, vocab - 1000, (1, prompt), device=dev)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    with torch.no_grad():
        model.generate(ids[:, :16], max_new_tokens=2, do_sample=False)  # warm-up
        sync()
        t0 = time.time()
        model(ids, use_cache=True)
        sync()
        ttft = time.time() - t0
        t0 = time.time()
        out = model.generate(ids, max_new_tokens=gen, min_new_tokens=gen, do_sample=False)
        sync()
        total = time.time() - t0
    decode = (total - ttft) / (gen - 1)
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0
    print(json.dumps({"torch": torch.__version__, "device": dev, "prompt": prompt,
                      "prefill_s": round(ttft, 3), "prefill_tok_s": round(prompt / ttft, 1),
                      "decode_tok_s_batch1": round(1 / decode, 2),
                      "new_tokens": out.shape[1] - prompt, "peak_gib": round(peak, 1)}))


if __name__ == "__main__":
    main()
