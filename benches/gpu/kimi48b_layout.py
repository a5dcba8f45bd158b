"""Tensor layout (names, shapes, dtypes) of a Kimi-Linear-48B-A3B-shaped checkpoint, from
transformers' own `KimiLinearForCausalLM` built on the meta device (no memory, no weights).

Run here (transformers 5.24 has `kimi_linear`; the GPU machine's 5.17 does not):
    /work/venv/bin/python benches/gpu/kimi48b_layout.py benches/gpu/kimi48b_layout.json
`write_sparse_safetensors.py` turns the layout into a 96 GB checkpoint on the GPU machine whose
large tensors are file holes (zeros; no disk blocks) and whose small ones (norms, gates, biases,
A_log, dt_bias) are random, so routing and gates behave like a real model's while the 64 GB disk
never fills.
"""

import json
import sys

sys.modules["fla"] = None  # keep transformers off fla's Triton kernels
import torch  # noqa: E402
from transformers import KimiLinearConfig, KimiLinearForCausalLM  # noqa: E402

CONFIG = dict(
    model_type="kimi_linear",
    vocab_size=163840,
    hidden_size=2304,
    intermediate_size=9216,
    moe_intermediate_size=1024,
    num_hidden_layers=27,
    num_attention_heads=32,
    num_key_value_heads=32,
    num_experts=256,
    num_experts_per_token=8,
    num_shared_experts=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.446,
    moe_renormalize=True,
    moe_router_activation_func="sigmoid",
    num_expert_group=1,
    topk_group=1,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    mla_use_nope=True,
    rms_norm_eps=1e-5,
    max_position_embeddings=1048576,
    tie_word_embeddings=False,
    bos_token_id=163584,
    eos_token_id=163586,
    pad_token_id=163839,
    linear_attn_config={
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [i for i in range(1, 28) if i not in (4, 8, 12, 16, 20, 24, 27)],
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
    },
)


TINY = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_attention_heads=2,
            num_key_value_heads=2, num_experts=8, num_experts_per_token=2, kv_lora_rank=16,
            qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, vocab_size=256, bos_token_id=1,
            eos_token_id=2, pad_token_id=0, num_hidden_layers=4,
            linear_attn_config={"full_attn_layers": [2, 4], "kda_layers": [1, 3], "num_heads": 2,
                                "head_dim": 16, "short_conv_kernel_size": 4})


def main() -> None:
    global CONFIG
    if "--tiny" in sys.argv:  # same names at toy widths, to check the loader here
        CONFIG = {**CONFIG, **TINY}
    cfg = KimiLinearConfig(**CONFIG)
    with torch.device("meta"):
        model = KimiLinearForCausalLM(cfg).to(torch.bfloat16)
    tensors = []
    for name, t in list(model.state_dict().items()):
        # Gates stay f32 as in the published files; everything else bf16.
        f32 = name.endswith(("gate.weight", "e_score_correction_bias", "dt_bias", "A_log"))
        tensors.append({"name": name, "shape": list(t.shape), "dtype": "F32" if f32 else "BF16"})
    out = {"config": CONFIG, "tensors": tensors}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    n = sum(int(torch.tensor(t["shape"]).prod()) for t in tensors)
    print(f"{len(tensors)} tensors, {n / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main()
