"""Writes a random gpt-oss-shaped checkpoint in the released layout (MXFP4 experts as
`*_blocks` / `*_scales`, everything else bf16) for timing: the expert codes and scales are file
holes (code 0, scale byte 0 = 2^-127: the experts add ~0, their GEMV/decoding time does not depend
on the values); attention, router, embedding and LM head get small random values so that routing
and next tokens vary. For timing only.

    python3 benches/gpu/write_gpt_oss.py 20b /tmp/gpt-oss-20b     # or 120b
"""

import json
import os
import struct
import sys

import numpy as np

SHAPES = {
    # layers, experts (gpt-oss model card; architectures.md §4.1)
    "20b": (24, 32),
    "120b": (36, 128),
}


def config(layers: int, experts: int) -> dict:
    return {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": layers,
        "num_local_experts": experts,
        "num_experts_per_tok": 4,
        "experts_per_token": 4,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
        "rope_theta": 150000,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
        "max_position_embeddings": 131072,
        "swiglu_limit": 7.0,
        "rms_norm_eps": 1e-5,
        "vocab_size": 201088,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "eos_token_id": 200002,
        "quantization_config": {"quant_method": "mxfp4"},
    }


def tensors(c: dict):
    d, f, e, v = c["hidden_size"], c["intermediate_size"], c["num_local_experts"], c["vocab_size"]
    h, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    yield "model.embed_tokens.weight", "BF16", [v, d], 0.02
    yield "lm_head.weight", "BF16", [v, d], 0.02
    yield "model.norm.weight", "BF16", [d], 1.0
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", "BF16", [d], 1.0
        yield f"{p}.post_attention_layernorm.weight", "BF16", [d], 1.0
        for name, rows in [("q_proj", h * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)]:
            yield f"{p}.self_attn.{name}.weight", "BF16", [rows, d], 0.02
            yield f"{p}.self_attn.{name}.bias", "BF16", [rows], 0.02
        yield f"{p}.self_attn.o_proj.weight", "BF16", [d, h * hd], 0.02
        yield f"{p}.self_attn.o_proj.bias", "BF16", [d], 0.02
        yield f"{p}.self_attn.sinks", "BF16", [h], 0.5
        yield f"{p}.mlp.router.weight", "BF16", [e, d], 0.05
        yield f"{p}.mlp.router.bias", "BF16", [e], 0.05
        x = f"{p}.mlp.experts"
        yield f"{x}.gate_up_proj_blocks", "U8", [e, 2 * f, d // 32, 16], None
        yield f"{x}.gate_up_proj_scales", "U8", [e, 2 * f, d // 32], None
        yield f"{x}.gate_up_proj_bias", "BF16", [e, 2 * f], 0.02
        yield f"{x}.down_proj_blocks", "U8", [e, d, f // 32, 16], None
        yield f"{x}.down_proj_scales", "U8", [e, d, f // 32], None
        yield f"{x}.down_proj_bias", "BF16", [e, d], 0.02


def main() -> None:
    size, out = sys.argv[1], sys.argv[2]
    c = config(*SHAPES[size])
    os.makedirs(out, exist_ok=True)
    json.dump(c, open(os.path.join(out, "config.json"), "w"), indent=1)
    items = list(tensors(c))
    header, offset = {}, 0
    for name, dt, shape, _ in items:
        n = int(np.prod(shape)) * (1 if dt == "U8" else 2)
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    rng = np.random.default_rng(0)
    with open(os.path.join(out, "model.safetensors"), "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        base = fh.tell()
        fh.truncate(base + offset)
        for name, dt, shape, scale in items:
            if scale is None:
                continue  # a hole: zeros on disk
            n = int(np.prod(shape))
            if scale == 1.0 and name.endswith("norm.weight"):
                vals = np.ones(n, np.float32)
            else:
                vals = rng.standard_normal(n, dtype=np.float32) * scale
            bf16 = (vals.view(np.uint32) >> 16).astype(np.uint16)
            fh.seek(base + header[name]["data_offsets"][0])
            fh.write(bf16.tobytes())
    print(f"{out}: {offset / 2**30:.1f} GiB, {len(items)} tensors")


if __name__ == "__main__":
    main()
