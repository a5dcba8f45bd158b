"""Tensor layout of a Llama-3.1-8B-shaped checkpoint (the config of torch_llama8b.py: hidden
4096, 32 layers, 32 heads / 8 KV heads, MLP 14336, vocabulary 128256, bf16), from transformers'
own `LlamaForCausalLM` on the meta device. `write_sparse_safetensors.py` turns it into a
checkpoint of random values in seconds (no expert holes here: every tensor is written), for
`dayone bench` on the GPU machine without building the model in PyTorch first.

    /work/venv/bin/python benches/gpu/llama8b_layout.py benches/gpu/llama8b_layout.json
"""

import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main() -> None:
    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                      tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    tensors = [{"name": n, "shape": list(t.shape), "dtype": "BF16"}
               for n, t in model.state_dict().items()]
    config = cfg.to_dict()
    config["architectures"] = ["LlamaForCausalLM"]
    config["torch_dtype"] = "bfloat16"
    with open(sys.argv[1], "w") as f:
        json.dump({"config": config, "tensors": tensors}, f)
    n = sum(int(torch.tensor(t["shape"]).prod()) for t in tensors)
    print(f"{len(tensors)} tensors, {n / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main()
