#!/usr/bin/env bash
# A ≈ 5-minute H200 call when little device time is left: issue [14]'s Llama-8B figure (batch
# 1/8/64, default fusions), the MoE block beside torch._grouped_mm (auto tiles, then the
# rasterised 128r at 8 192 tokens), WGSL beside CUDA on the 8B shape, then Llama-8B batch 1
# with this session's add_norm. No Kimi (its 98.6 GB checkpoint takes minutes to write).
# Each line also in $OUT/summary.txt as it comes. Carry [".bin", ".gl", ".kcache"].
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
B=.bin/dayone
bench() { timeout 120 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
moe() { DAYONE_MOE_TILE=$1 timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens $2 2>&1 | grep -v "^\s*$" | tail -5; }
python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
echo "== llama8b default $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128 | say
echo "== moe auto $(date -u +%T)" | say; moe auto 64,512,8192 | say
echo "== torch grouped_mm $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm | say
echo "== moe 128r 8192 $(date -u +%T)" | say; moe 128r 8192 | say
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
echo "== llama8b cuda b1, prompt 128 (beside WGSL) $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64 | say
echo "== llama8b wgsl b1 $(date -u +%T)" | say; LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 90 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary | say
echo "== llama8b DAYONE_DECODE_FUSION=rope_kv,moe_block,conv3,router_topk,router_norm,add_norm $(date -u +%T)" | say
DAYONE_DECODE_FUSION=rope_kv,moe_block,conv3,router_topk,router_norm,add_norm bench -m /tmp/llama8b --batch 1 --prompt-len 512 --gen-len 128 | say
date -u +%T | say
