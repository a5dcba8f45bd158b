#!/usr/bin/env bash
# one device call (after run_decode_fusion2.sh PART=B on a warm machine): Llama-8B batch 1/8/64
# with the default fusions beside PyTorch, the MoE block at 64/512/8192 tokens beside
# torch._grouped_mm, and why Vulkan finds no adapter.
. benches/gpu/device_env.sh >/dev/null 2>&1
[ -f /tmp/llama8b/model.safetensors ] || python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
B=.bin/dayone
export DAYONE_DECODE_FUSION=rope_kv,attn_merge
echo "== llama8b b1,8,64"; timeout 120 $B bench --backend cuda -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128 --json 2>/dev/null | bench_summary
echo "== moe auto"; timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens 64,512,8192 2>&1 | grep -v "^\s*$" | tail -4
echo "== torch grouped_mm"; timeout 100 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm
echo "== torch llama8b"; timeout 150 python3 benches/gpu/torch_llama8b.py --batch 1,8 --attn sdpa --prompt-len 512 --gen-len 32 2>&1 | tail -3
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json VK_LOADER_DEBUG=error,warn,driver XDG_RUNTIME_DIR=/tmp timeout 20 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 8 --gen-len 2 2>&1 | grep -v "^\s*$" | head -8
