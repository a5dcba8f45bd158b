#!/usr/bin/env bash
# one device call on an H200 (≈ 7 minutes): issue [14]'s figures in order of need — Llama-8B
# batch 1/8/64, Kimi-Linear-48B batch 1/16 (baseline: the fusions before router_norm), WGSL beside CUDA on the 8B shape, PyTorch's 8B decode, the MoE
# block beside torch._grouped_mm. Build with build_for_device.sh; carry [".bin", ".gl",
# ".kcache"].
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, bench_summary
# The checkpoints, unless a caller (run_h200_s8.sh) wrote them already: /tmp/llama8b then
# /tmp/kimi48b in the background, /tmp/ckpt.done when both are complete.
if [ ! -f /tmp/ckpt.done ]; then
  python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  ( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1; echo "kimi ckpt $(date -u +%T)" >> $OUT/w.txt ) &
  w=$!
else
  w=
fi
B=.bin/dayone
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
# SKIP_LLAMA=1 (a caller measured it), SKIP_KIMI_BASE=1 (no baseline line): a shorter call.
[ -z "${SKIP_LLAMA:-}" ] && { echo "== llama8b $(date -u +%T)"; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128; }
[ -n "$w" ] && wait $w; tail -1 $OUT/w.txt
echo "== kimi48b $(date -u +%T)"; bench -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48
# The MoE layer's norm in the router's launch (router_norm) against the separate add_rms_norm.
[ -z "${SKIP_KIMI_BASE:-}" ] && { echo "== kimi48b DAYONE_DECODE_FUSION=rope_kv,moe_block,conv3,router_topk $(date -u +%T)"; DAYONE_DECODE_FUSION=rope_kv,moe_block,conv3,router_topk bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48; }
rm -rf /tmp/kimi48b
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
echo "== llama8b cuda b1, prompt 128 (beside WGSL) $(date -u +%T)"; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64
echo "== llama8b wgsl b1 $(date -u +%T)"; LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary; tail -2 $OUT/wgsl_err.txt
echo "== torch llama8b $(date -u +%T)"; timeout 100 python3 benches/gpu/torch_llama8b.py --batch 1 --attn sdpa --prompt-len 512 --gen-len 32 2>&1 | tail -2
echo "== moe $(date -u +%T)"; timeout 60 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens 64,512,8192 2>&1 | grep -v "^\s*$" | tail -4
echo "== torch grouped_mm"; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm
date -u +%T
exit 0
