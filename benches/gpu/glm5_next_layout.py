"""Tensor layout (names, shapes, dtypes) of a reduced-depth glm5_next checkpoint at the released
widths (glm5_next.md §1: hidden 4096, 64 MLA heads of 256/256 on a 512-wide latent, 64 KDA heads
of 128, 288 experts of 2048, top 8, hyper-connections ×4, indexer 32 × 128 with pools of 4), from
transformers' own `Glm5NextForConditionalGeneration` built on the meta device (no memory, no weights).

Six layers: KDA, KDA, MLA+indexer (full), MLA+indexer (shared: reuses layer 2's selection, which
transformers allows only right after a full one), KDA, KDA; MLPs dense, dense, dense, sparse, dense, sparse — so one
layer in three is MLA, as in the released 45 (11 MLA), and two MoE layers (14.5 GB each) keep the
file near 37 GB. Text only (the vision tower is not timed here).

    /work/venv/bin/python benches/gpu/glm5_next_layout.py benches/gpu/glm5_next_layout.json [--tiny]
`write_sparse_safetensors.py` turns it into a checkpoint whose experts are file holes.
"""

import json
import sys

sys.modules["fla"] = None  # keep transformers off fla's Triton kernels
import torch  # noqa: E402
from transformers import Glm5NextConfig, Glm5NextForConditionalGeneration  # noqa: E402

TEXT = dict(
    vocab_size=154880, hidden_size=4096, intermediate_size=12288, moe_intermediate_size=2048,
    num_hidden_layers=6,
    layer_types=["linear_attention", "linear_attention", "indexed_attention", "indexed_attention",
                 "linear_attention", "linear_attention"],
    indexer_types=["full", "full", "full", "shared", "full", "full"],
    mlp_layer_types=["dense", "dense", "dense", "sparse", "dense", "sparse"],
    num_attention_heads=64, num_key_value_heads=64, q_lora_rank=1536, kv_lora_rank=512,
    qk_nope_head_dim=256, qk_rope_head_dim=0, v_head_dim=256, index_n_heads=32, index_head_dim=128,
    index_kpool=4, index_topk=2048, linear_num_heads=64, linear_head_dim=128,
    linear_conv_kernel_dim=4, linear_lower_bound=-5.0, n_routed_experts=288, num_experts_per_tok=8,
    n_shared_experts=1, n_group=1, topk_group=1, norm_topk_prob=True, routed_scaling_factor=2.5,
    hc_mult=4, hc_eps=1e-6, hc_sinkhorn_iters=20, swiglu_limit=10.0, rms_norm_eps=1e-5,
    pad_token_id=154820, bos_token_id=None, eos_token_id=[154820, 154827, 154829],
    tie_word_embeddings=False, max_position_embeddings=1048576,
)


# Same names at toy widths, to check the layout → checkpoint → dayone path on a CPU.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
            qk_nope_head_dim=16, v_head_dim=16, index_n_heads=4, index_head_dim=16, index_topk=16,
            linear_num_heads=2, linear_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
            pad_token_id=0, eos_token_id=[2])


def main() -> None:
    text = {**TEXT, **TINY} if "--tiny" in sys.argv else TEXT
    cfg = Glm5NextConfig(text_config=text, vision_config=dict(out_hidden_size=4096))
    with torch.device("meta"):
        model = Glm5NextForConditionalGeneration(cfg).to(torch.bfloat16)
    tensors = []
    for name, t in model.state_dict().items():
        if ".visual." in name or name.startswith("model.visual"):
            continue
        # Gates, HC mixing parameters and KDA decay parameters stay f32 as in the published files.
        f32 = name.endswith(("gate.weight", "e_score_correction_bias", "dt_bias", "A_log", "hc.base",
                             "hc.scale"))
        tensors.append({"name": name, "shape": list(t.shape), "dtype": "F32" if f32 else "BF16"})
    config = cfg.to_dict()
    config.pop("vision_config", None)
    out = {"config": config, "tensors": tensors}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f)
    n = sum(int(torch.tensor(t["shape"]).prod()) for t in tensors)
    print(f"{len(tensors)} tensors, {n / 1e9:.2f} B parameters")


if __name__ == "__main__":
    main()
