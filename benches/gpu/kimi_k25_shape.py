"""Write a Kimi-K2.5-shaped, reduced-depth random `kimi_k25` checkpoint (issue [12]'s H200 vision run).

  --size k25 (default): the vision tower and projector at K2.5's real config, full depth (MoonViT: 27 layers,
      width 1152, 16 heads of 72, MLP 4304, patch 14, 64x64 position table; projector 4608 -> 4608 -> 7168;
      vision.md §1.1) -- that is what is measured. The text model has Kimi-K2's widths (deepseek_v3: hidden
      7168, MLA q_lora 1536 / kv_lora 512 / nope 128 / rope 64 / v 128, 64 heads, vocab 163840, YaRN) but only
      2 layers (layer 0 dense MLP 18432, layer 1 MoE) and 16 routed experts of 2048 (top-8, 1 shared) instead
      of 61 layers and 384 experts: 4.2 B parameters, 8.4 GB in bf16.
  --size tiny: the same layout at toy widths (vision 2 x 64, text 2 x 64, 4 experts), for a CPU check in seconds.

The model is built with transformers' own classes (`Kimi_K25ForConditionalGeneration`, random init in bf16,
on the GPU when there is one) and written under the ORIGINAL hub tensor names (vision.md §1.3), which both
transformers (`from_pretrained` converts them) and dayone load. `save_pretrained` is not used: transformers 5.24
writes names no real checkpoint has (`language_model.model.blocks.N`, `vision_tower.encoder.patch_embed`,
vision.md §1.3) and dayone would not load them.

Also writes a stub tokenizer both accept: `tokenizer.json` (WordLevel over whitespace-split words: `t0` ... `t163583`
plus a few words, and the K2 special tokens at their ids: `<|media_begin|>` 163602, `<|media_content|>` 163603,
`<|media_end|>` 163604, `<|media_pad|>` 163605 = the config's image placeholder) and `tokenizer_config.json`.

usage: python3 benches/gpu/kimi_k25_shape.py OUT_DIR [--size k25|tiny] [--experts N] [--top-k K] [--device D]
"""

import argparse
import json
import os
import time

import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
from transformers import Kimi_K25Config, Kimi_K25ForConditionalGeneration

VOCAB = 163840
IMAGE_ID, VIDEO_ID, BEGIN_ID, CONTENT_ID, END_ID = 163605, 163840, 163602, 163603, 163604
BOS_ID, EOS_ID, UNK_ID, PAD_ID = 163584, 163585, 163838, 163839
# Kimi-K2's special tokens (ids of the im_* tokens from its tokenizer_config, not verified here).
SPECIALS = {BOS_ID: "[BOS]", EOS_ID: "[EOS]", 163586: "<|im_end|>", 163587: "<|im_user|>",
            163588: "<|im_assistant|>", 163594: "<|im_system|>", 163601: "<|im_middle|>",
            BEGIN_ID: "<|media_begin|>", CONTENT_ID: "<|media_content|>", END_ID: "<|media_end|>",
            IMAGE_ID: "<|media_pad|>", UNK_ID: "[UNK]", PAD_ID: "[PAD]"}
WORDS = ["image", "video", "user", "assistant", "system"]

SIZES = {
    "k25": dict(
        vision=dict(hidden_size=1152, intermediate_size=4304, num_attention_heads=16, num_hidden_layers=27,
                    pos_emb_height=64, pos_emb_width=64),
        text=dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048, num_attention_heads=64,
                  num_key_value_heads=64, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                  qk_rope_head_dim=64, v_head_dim=128),
        experts=16, top_k=8),
    "tiny": dict(
        vision=dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2,
                    pos_emb_height=8, pos_emb_width=8),
        text=dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
                  num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=8,
                  qk_rope_head_dim=8, v_head_dim=8),
        experts=4, top_k=2),
}


def configs(size, experts, top_k):
    """(transformers Kimi_K25Config kwargs, hub config.json dict) for a size preset."""
    s = SIZES[size]
    vision = dict(s["vision"], patch_size=14, pos_emb_time=4, merge_kernel_size=[2, 2],
                  hidden_act="gelu_pytorch_tanh")
    text = dict(s["text"], model_type="deepseek_v3", vocab_size=VOCAB, num_hidden_layers=2,
                first_k_dense_replace=1, n_routed_experts=experts, num_experts_per_tok=top_k, n_shared_experts=1,
                n_group=1, topk_group=1, routed_scaling_factor=2.827, norm_topk_prob=True, rms_norm_eps=1e-5,
                max_position_embeddings=262144, num_mtp_layers=0, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                pad_token_id=PAD_ID,
                rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 64.0,
                                 "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                                 "mscale": 1.0, "mscale_all_dim": 1.0})
    top = dict(projection_hidden_size=vision["hidden_size"], projection_layer_norm_eps=1e-5,
               image_token_id=IMAGE_ID, video_token_id=VIDEO_ID, vision_start_token_id=BEGIN_ID,
               vision_end_token_id=END_ID, tie_word_embeddings=False)
    # The hub config carries the original `vt_*` names too (transformers 5.24 reads only the others).
    hub_vision = dict(vision, model_type="kimi_k25_vision", vt_hidden_size=vision["hidden_size"],
                      vt_intermediate_size=vision["intermediate_size"],
                      vt_num_attention_heads=vision["num_attention_heads"],
                      vt_num_hidden_layers=vision["num_hidden_layers"], init_pos_emb_height=vision["pos_emb_height"],
                      init_pos_emb_width=vision["pos_emb_width"], init_pos_emb_time=4, merge_type="sd2_tpool",
                      mm_projector_type="patchmerger", mm_hidden_size=vision["hidden_size"],
                      text_hidden_size=text["hidden_size"], projector_hidden_act="gelu", projector_ln_eps=1e-5)
    hub = dict(top, model_type="kimi_k25", architectures=["KimiK25ForConditionalGeneration"], vision_config=hub_vision,
               text_config=text, media_placeholder_token_id=IMAGE_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
               pad_token_id=PAD_ID)
    return dict(vision_config=vision, text_config=text, **top), hub


def build(kwargs, device):
    """transformers' model on `device` in bf16, every parameter redrawn: N(0, 0.02) weights, unit norms, zero biases."""
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(device):
        model = Kimi_K25ForConditionalGeneration(Kimi_K25Config(**kwargs)).eval()
    torch.set_default_dtype(torch.float32)
    g = torch.Generator(device=device).manual_seed(1202)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model


def original_names(model, heads, head_dim):
    """The state dict under the hub names (vision.md §1.3): fused `wqkv` with q/k rows back in the interleaved-RoPE
    order (inverse of transformers' PermuteForRope), per-expert `experts.E.{gate,up,down}_proj`, `proj.{0,2}`."""
    def unpermute(w):
        return w.reshape(heads, 2, head_dim // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)

    sd = dict(model.state_dict())
    out = {}
    renames = [("model.vision_tower.patch_embed.proj.", "vision_tower.patch_embed.proj."),
               ("model.vision_tower.patch_embed.pos_emb.position_embeddings", "vision_tower.patch_embed.pos_emb.weight"),
               ("model.vision_tower.final_layernorm.", "vision_tower.encoder.final_layernorm."),
               ("model.mm_projector.in_proj.", "mm_projector.proj.0."),
               ("model.mm_projector.out_proj.", "mm_projector.proj.2."),
               ("model.mm_projector.pre_norm.", "mm_projector.pre_norm."),
               ("lm_head.", "language_model.lm_head.")]
    block = {"norm1.": "norm0.", "norm2.": "norm1.", "attn.proj.": "wo.", "mlp.fc1.": "mlp.fc0.", "mlp.fc2.": "mlp.fc1."}
    for k, v in sd.items():
        if k.startswith("model.vision_tower.patch_embed.pos_emb.time"):
            continue  # a non-persistent buffer
        if k.startswith("model.vision_tower.layers."):
            n, tail = k[len("model.vision_tower.layers."):].split(".", 1)
            b = f"vision_tower.encoder.blocks.{n}."
            if tail.startswith("attn.q_proj."):
                suf, p = tail[len("attn.q_proj."):], f"model.vision_tower.layers.{n}.attn."
                qkv = [unpermute(sd[p + "q_proj." + suf]), unpermute(sd[p + "k_proj." + suf]), sd[p + "v_proj." + suf]]
                out[b + "wqkv." + suf] = torch.cat(qkv, 0)
            elif not tail.startswith(("attn.k_proj.", "attn.v_proj.")):
                new = next((tail.replace(a, z, 1) for a, z in block.items() if tail.startswith(a)), None)
                if new is None:
                    raise KeyError(k)
                out[b + new] = v
        elif k.startswith("model.language_model."):
            rest = k[len("model.language_model."):]
            if rest.endswith("mlp.experts.gate_up_proj"):  # [E, 2I, H], gate rows first
                pre, inter = rest[: -len("gate_up_proj")], v.shape[1] // 2
                for e in range(v.shape[0]):
                    out[f"language_model.model.{pre}{e}.gate_proj.weight"] = v[e, :inter]
                    out[f"language_model.model.{pre}{e}.up_proj.weight"] = v[e, inter:]
            elif rest.endswith("mlp.experts.down_proj"):  # [E, H, I]
                pre = rest[: -len("down_proj")]
                for e in range(v.shape[0]):
                    out[f"language_model.model.{pre}{e}.down_proj.weight"] = v[e]
            else:
                out["language_model.model." + rest] = v
        else:
            new = next((k.replace(a, z, 1) for a, z in renames if k.startswith(a)), None)
            if new is None:
                raise KeyError(k)
            out[new] = v
    return {k: v.contiguous() for k, v in out.items()}


def save_sharded(tensors, out_dir, shard_bytes):
    """model-0000i-of-0000n.safetensors of at most ~shard_bytes each + model.safetensors.index.json."""
    shards, cur, size = [], {}, 0
    for k in sorted(tensors):
        nbytes = tensors[k].numel() * tensors[k].element_size()
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k], size = tensors[k], size + nbytes
    shards.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, name), metadata={"format": "pt"})
        for k, v in shard.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return total


def write_tokenizer(out_dir):
    """A WordLevel tokenizer over the whole 163840-id vocabulary (every id has a token, so any id decodes)."""
    vocab = {w: i for i, w in enumerate(WORDS)}
    for i in range(len(WORDS), VOCAB):
        vocab[SPECIALS.get(i, f"t{i}" if i < BOS_ID else f"<|reserved_token_{i}|>")] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for _, s in sorted(SPECIALS.items())])
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]", "eos_token": "[EOS]",
           "unk_token": "[UNK]", "pad_token": "[PAD]", "add_bos_token": False, "model_max_length": 262144}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=sorted(SIZES), default="k25")
    ap.add_argument("--experts", type=int, help="routed experts of the MoE layer (k25: 16, tiny: 4)")
    ap.add_argument("--top-k", type=int, help="experts per token (k25: 8, tiny: 2)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shard-gb", type=float, default=4.0)
    a = ap.parse_args()
    t0 = time.time()
    s = SIZES[a.size]
    experts, top_k = a.experts or s["experts"], a.top_k or s["top_k"]
    if not 1 <= top_k <= experts:
        ap.error(f"--top-k {top_k} must be between 1 and --experts {experts}")
    kwargs, hub = configs(a.size, experts, top_k)
    os.makedirs(a.out_dir, exist_ok=True)
    model = build(kwargs, a.device)
    v = kwargs["vision_config"]
    tensors = original_names(model, v["num_attention_heads"], v["hidden_size"] // v["num_attention_heads"])
    params = {"vision": sum(t.numel() for k, t in tensors.items() if k.startswith(("vision_tower.", "mm_projector."))),
              "text": sum(t.numel() for k, t in tensors.items() if k.startswith("language_model."))}
    built = time.time() - t0
    total = save_sharded(tensors, a.out_dir, int(a.shard_gb * 2**30))
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(hub, f, indent=1)
    write_tokenizer(a.out_dir)
    print(json.dumps({"out_dir": a.out_dir, "size": a.size, "device": a.device, "routed_experts": experts,
                      "top_k": top_k, "tensors": len(tensors), "params": params, "bytes": total,
                      "build_s": round(built, 1), "total_s": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
