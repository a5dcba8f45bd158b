#!/usr/bin/env bash
# one device call on an H200 (≤ 10 minutes): issue [14]'s four figures with the current
# binaries — the CUDA tests of the decode fusions (every fusion on and off), Llama-8B batch
# 1/8/64 beside PyTorch, Kimi-Linear-48B batch 1/16 (only where its 98.6 GB fit) with its eager
# per-kernel profile and the fusions before moe_block/conv3 as the baseline (PART=A); the MoE
# block beside torch._grouped_mm at 64/512/8192 tokens, PyTorch's Llama-8B decode and WGSL
# through Vulkan beside CUDA (PART=B, the next call on the warm machine; run_wgsl_sweep.sh has
# the full WGSL sweep). Build with build_for_device.sh; carry [".bin", ".gl"] (and ".kcache").
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests, bench_summary
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
# Kimi-Linear-48B whole (98.6 GB) where it fits, else its first 14 layers (50 GB: the same
# layer shapes and KDA/MLA mix at half the depth; shallow_layout.py).
KIMI=0; [ "${PART:-A}" = A ] && KIMI=1
kl=benches/gpu/kimi48b_layout.json
[ "${mem:-0}" -gt 120000 ] || { python3 benches/gpu/shallow_layout.py $kl 14 /tmp/kimi14.json; kl=/tmp/kimi14.json; }
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  [ "$KIMI" = 1 ] && python3 benches/gpu/write_sparse_safetensors.py $kl /tmp/kimi48b >> $OUT/w.txt 2>&1
  echo "ckpts $(date -u +%T)" >> $OUT/w.txt ) &
w=$!
B=.bin/dayone
[ "${PART:-A}" = A ] && { echo "== tests $(date -u +%T)"; cuda_tests 120; }
wait $w; tail -1 $OUT/w.txt
bench() { timeout 200 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
if [ "${PART:-A}" = A ]; then
echo "== llama8b $(date -u +%T)"; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128
[ -z "${QUICK:-}" ] && echo "== llama8b DAYONE_DECODE_FUSION=0" && DAYONE_DECODE_FUSION=0 bench -m /tmp/llama8b --batch 1 --prompt-len 512 --gen-len 128
[ -z "${QUICK:-}" ] && echo "== llama8b profile b1 (eager)" && DAYONE_CUDA_PROFILE=1 timeout 60 $B bench --backend cuda -m /tmp/llama8b --batch 1 --prompt-len 16 --gen-len 32 --enforce-eager 2>&1 >/dev/null | grep -A14 DAYONE_CUDA_PROFILE
if [ "$KIMI" = 1 ]; then
  echo "== kimi48b $(date -u +%T)"; bench -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48
  echo "== kimi48b DAYONE_DECODE_FUSION=rope_kv,attn_merge (the fusions before moe_block, conv3, router_topk)"; DAYONE_DECODE_FUSION=rope_kv,attn_merge bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48
  echo "== kimi48b DAYONE_DECODE_FUSION=rope_kv,attn_merge,moe_block"; DAYONE_DECODE_FUSION=rope_kv,attn_merge,moe_block bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48
  [ -z "${QUICK:-}" ] && echo "== kimi48b --enforce-eager" && bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48 --enforce-eager
  echo "== kimi48b profile b1 (eager)"; DAYONE_CUDA_PROFILE=1 timeout 90 $B bench --backend cuda -m /tmp/kimi48b --batch 1 --prompt-len 16 --gen-len 32 --enforce-eager 2>&1 >/dev/null | grep -A30 DAYONE_CUDA_PROFILE
  rm -rf /tmp/kimi48b
fi
fi
[ -d "$kc" ] && tar czf "$OUT/kcache.tgz" -C "$kc" .
[ "${PART:-A}" = A ] && { date -u +%T; exit 0; }
echo "== moe $(date -u +%T)"; timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens 64,512,8192 2>&1 | grep -v "^\s*$" | tail -4
echo "== torch grouped_mm"; timeout 100 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm
echo "== torch llama8b $(date -u +%T)"; timeout 150 python3 benches/gpu/torch_llama8b.py --batch 1,8 --attn sdpa --prompt-len 512 --gen-len 32 2>&1 | tail -3
# WGSL through Vulkan beside CUDA on the same card (run_wgsl_sweep.sh has the full sweep).
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
wbench() { timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json "$@" 2>>$OUT/wgsl_err.txt | bench_summary; }
echo "== llama8b cuda b1 (prompt 128, beside WGSL) $(date -u +%T)"; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64
echo "== llama8b wgsl b1 (default variant)"; wbench; tail -2 $OUT/wgsl_err.txt
echo "== wgsl profile"; DAYONE_WGSL_PROFILE=1 timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 16 --gen-len 32 2>&1 >/dev/null | grep -A16 "^DAYONE_WGSL_PROFILE"
for v in ${WGSL_MODEL_VARIANTS:-wg64 r8t256u2sg r4t64u2sg}; do echo "== llama8b wgsl DAYONE_WGSL_MATVEC=$v $(date -u +%T)"; DAYONE_WGSL_MATVEC=$v wbench; done
date -u +%T
exit 0
