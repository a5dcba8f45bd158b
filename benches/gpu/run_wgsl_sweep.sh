#!/usr/bin/env bash
# one device call (≤ 10 minutes): where the WGSL backend's batch-1 Llama-8B decode step goes
# (DAYONE_WGSL_PROFILE=1: GPU time per kernel, and the GPU time the submissions spanned), then
# the bf16 decode matvec variants (DAYONE_WGSL_MATVEC) in op-bench with GPU timing, the best
# few in the model, and DAYONE_WGSL_SUBMIT_OPS. Build with build_for_device.sh; carry
# [".bin", ".gl"]. WGSL_VARIANTS narrows the op-bench sweep (default: all), WGSL_MODEL_VARIANTS
# the model runs (default: a guess).
. benches/gpu/device_env.sh   # binaries, env, bench_summary
python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
B=.bin/dayone
wbench() { timeout 150 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json "$@" 2>>$OUT/wgsl_err.txt | bench_summary; }
echo "== llama8b wgsl b1 (default variant)"; wbench; grep "dayone-wgsl" $OUT/wgsl_err.txt | tail -1
# Decode dominates (prompt 16, 64 steps); the table is the last thing on stderr.
echo "== wgsl profile"; DAYONE_WGSL_PROFILE=1 timeout 150 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 16 --gen-len 64 2>&1 >/dev/null | grep -A40 "^DAYONE_WGSL_PROFILE" | tee $OUT/wgsl_profile.txt
echo "== op-bench matvec sweep (GPU-timed tables in $OUT/sweep.txt)"
for v in ${WGSL_VARIANTS:-$(.bin/op-bench --list-matvec)}; do
  echo "== DAYONE_WGSL_MATVEC=$v"
  DAYONE_WGSL_PROFILE=1 DAYONE_WGSL_MATVEC=$v timeout 60 .bin/op-bench --matvec-sweep --iters 50 2>&1
done > $OUT/sweep.txt
# One line per (variant, shape): GPU mean µs of the matvec kernel.
awk '/^== DAYONE_WGSL_MATVEC=/{v=$2} /^matvec  w bf16/{s=$5" "$6} /^matvec_/{print v, s, $4" us"}' $OUT/sweep.txt | (column -t 2>/dev/null || cat)
for v in ${WGSL_MODEL_VARIANTS:-wg64 r4t128u2sg r4t256u2sg r8t128u2sg r8t256u2sg r4t64u2sg}; do
  echo "== llama8b wgsl DAYONE_WGSL_MATVEC=$v"; DAYONE_WGSL_MATVEC=$v wbench
done
for s in 16 64; do echo "== llama8b wgsl DAYONE_WGSL_SUBMIT_OPS=$s"; DAYONE_WGSL_SUBMIT_OPS=$s wbench; done
tail -3 $OUT/wgsl_err.txt
exit 0
