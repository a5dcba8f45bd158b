#!/usr/bin/env bash
# one device call: [14] the second round of decode fusions — the RMSNorm inside the first
# projections' GEMV (rms_norm_linear_many / rms_norm_linear_silu_mul) and the KV-cache write
# inside RoPE (rope_write_kv) — on the Llama-8B and Kimi-Linear-48B shapes, with
# DAYONE_DECODE_FUSION=0 in the same call as the baseline; the new MoE tile variants at 64–8192
# tokens beside torch._grouped_mm; WGSL through Vulkan (profile and matvec variants when the
# binary has them); the CUDA tests of all of it. Build with build_for_device.sh; carry
# [".bin", ".gl"] (and ".kcache" when there is one). Two calls (10 minutes each at most):
# PART=A tests, Llama-8B and Kimi-48B decode; PART=B the MoE tiles, torch, WGSL beside CUDA.
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
PART=${PART:-A}
# Kimi-48B (98.6 GB of weights) only where it fits: an H200, not an H100.
mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
KIMI=0; [ "$PART" = A ] && [ "${mem:-0}" -gt 120000 ] && KIMI=1
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  [ "$KIMI" = 1 ] && python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1
  echo "ckpts $(date -u +%T)" >> $OUT/w.txt ) &
w=$!
B=.bin/dayone
[ "$PART" = A ] && cuda_tests 150
wait $w; tail -1 $OUT/w.txt
bench() { timeout 200 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
if [ "$PART" = A ]; then
echo "== llama8b fused"; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128
echo "== llama8b DAYONE_DECODE_FUSION=0"; DAYONE_DECODE_FUSION=0 bench -m /tmp/llama8b --batch 1,8 --prompt-len 512 --gen-len 128
for r in 2 4; do echo "== llama8b fused DAYONE_GEMV_RPW=$r"; DAYONE_GEMV_RPW=$r bench -m /tmp/llama8b --batch 1 --prompt-len 512 --gen-len 128; done
echo "== llama8b fused, again"; bench -m /tmp/llama8b --batch 1 --prompt-len 512 --gen-len 128
[ "$KIMI" = 1 ] && echo "== kimi48b" && bench -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48
echo "== llama8b profile b1 (eager)"; DAYONE_CUDA_PROFILE=1 timeout 90 $B bench --backend cuda -m /tmp/llama8b --batch 1 --prompt-len 16 --gen-len 64 --enforce-eager 2>&1 >/dev/null | grep -A14 DAYONE_CUDA_PROFILE
[ -d "$kc" ] && tar czf "$OUT/kcache.tgz" -C "$kc" .
exit 0
fi
# PART=B: the tests of the tile and fusion changes, each fusion's share, the MoE tiles beside torch.
echo "== tests"; for t in "kernels-cuda-cuda_conformance grouped_expert_tiles" "kernels-cuda-cuda_conformance decode_attention" "tests-decode_graphs cuda" "tests-golden cuda"; do
  set -- $t; timeout 150 .bin/test-$1 $2 --test-threads 1 2>&1 | grep -E "test result|panicked|rror" | head -4; done
for f in 0 rope_kv,attn_merge norm,rope_kv,attn_merge; do echo "== llama8b DAYONE_DECODE_FUSION=$f"; DAYONE_DECODE_FUSION=$f bench -m /tmp/llama8b --batch 1 --prompt-len 512 --gen-len 128; done
echo "== llama8b profile b1 (eager)"; DAYONE_CUDA_PROFILE=1 timeout 60 $B bench --backend cuda -m /tmp/llama8b --batch 1 --prompt-len 16 --gen-len 32 --enforce-eager 2>&1 >/dev/null | grep -A10 DAYONE_CUDA_PROFILE
moe() { timeout 120 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 "$@" 2>&1 | grep -v "^\s*$"; }
for t in 128 128k64 128x8 64w; do echo "== DAYONE_MOE_TILE=$t"; DAYONE_MOE_TILE=$t moe --tokens 8192 | tail -2; done 2>&1 | tee $OUT/moe.txt
echo "== torch grouped_mm"; timeout 100 python3 benches/gpu/torch_deepseek.py --tokens 8192 2>&1 | tail -3
[ -d "$kc" ] && tar czf "$OUT/kcache.tgz" -C "$kc" .
# WGSL through Vulkan beside CUDA on the same card (the trimmed run_wgsl_sweep.sh).
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
wbench() { timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json "$@" 2>>$OUT/wgsl_err.txt | bench_summary; }
echo "== llama8b cuda b1 (prompt 128, beside WGSL)"; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64
echo "== llama8b wgsl b1 (default variant)"; wbench
echo "== wgsl profile"; DAYONE_WGSL_PROFILE=1 timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 16 --gen-len 64 2>&1 >/dev/null | grep -A16 "^DAYONE_WGSL_PROFILE"
for v in ${WGSL_VARIANTS:-wg64 r4t128u2sg r8t256u2sg}; do
  echo "== DAYONE_WGSL_MATVEC=$v"; DAYONE_WGSL_PROFILE=1 DAYONE_WGSL_MATVEC=$v timeout 40 .bin/op-bench --matvec-sweep --iters 50 2>&1
done > $OUT/sweep.txt
awk '/^== DAYONE_WGSL_MATVEC=/{v=$2} /^matvec  w bf16/{s=$5" "$6} /^matvec_/{print v, s, $4" us"}' $OUT/sweep.txt | (column -t 2>/dev/null || cat)
echo "== llama8b wgsl DAYONE_WGSL_SUBMIT_OPS=32"; DAYONE_WGSL_SUBMIT_OPS=32 wbench
tail -2 $OUT/wgsl_err.txt
