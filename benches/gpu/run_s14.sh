#!/usr/bin/env bash
# The device call after run_s13.sh (≤ 10 minutes) for issue [14]: WGSL through Vulkan beside CUDA
# at batch 1 (the default matvec), where a WGSL step goes (DAYONE_WGSL_PROFILE=1), nine bf16
# decode matvec variants timed alone (op-bench --matvec-sweep, GPU timestamps; WGSL_VARIANTS
# names others, `op-bench --list-matvec` lists all), the three fastest
# in the model, DAYONE_WGSL_SUBMIT_OPS; then, on an H200, an eager per-kernel profile of the
# Kimi-Linear-48B step (DAYONE_CUDA_PROFILE=1). Carry [".bin", ".gl", ".kcache"]; the bundle
# from `TESTS="decode_graphs golden golden_kimi cuda_conformance" BENCH_BINS="moe-bench op-bench"
# bash benches/gpu/build_for_device.sh`.
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
B=.bin/dayone
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1; touch /tmp/llama.done
  [ "$h200" != 0 ] && python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1; touch /tmp/kimi.done ) &
waitf() { while [ ! -f $1 ]; do sleep 1; done; }
for d in .gl/*.deb; do dpkg -x "$d" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
bench() { timeout 150 $B bench --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
wbench() { timeout 120 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary; }
waitf /tmp/llama.done
echo "== llama8b cuda b1 p128 $(date -u +%T)" | say; bench --backend cuda -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64 | say
echo "== llama8b wgsl b1 default $(date -u +%T)" | say; wbench | say; grep "dayone-wgsl" $OUT/wgsl_err.txt | tail -2 | say
echo "== wgsl profile $(date -u +%T)" | say; DAYONE_WGSL_PROFILE=1 timeout 120 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 16 --gen-len 32 2>&1 >/dev/null | grep -A24 "^DAYONE_WGSL_PROFILE" | say
echo "== op-bench matvec sweep $(date -u +%T) (GPU-timed tables in $OUT/sweep.txt)" | say
for v in ${WGSL_VARIANTS:-wg64 r4t64u2sg r4t128u2sg r4t256u2sg r8t64u2sg r8t128u2sg r8t256u2sg r4t128u1sg r8t128u1sg}; do
  echo "== DAYONE_WGSL_MATVEC=$v"
  DAYONE_WGSL_PROFILE=1 DAYONE_WGSL_MATVEC=$v timeout 40 .bin/op-bench --matvec-sweep --iters 50 2>&1
done > $OUT/sweep.txt
# One line per variant: the GPU mean µs of its matvec kernel on each shape, and their sum.
awk '/^== DAYONE_WGSL_MATVEC=/{if(v!="")print v, t, l; v=$2; sub(/.*=/, "", v); t=0; l=""} /^matvec_/{t+=$4; l=l" "$4} END{if(v!="")print v, t, l}' $OUT/sweep.txt \
  | sort -k2 -g > $OUT/sweep_rank.txt; head -8 $OUT/sweep_rank.txt | say; grep -m3 -iE "error|panic|adapter" $OUT/sweep.txt | say
# Only variants that timed every shape (the most fields), fastest first.
for v in $(awk 'NR==FNR {if (NF>m) m=NF; next} NF==m && $2>0 {print $1}' $OUT/sweep_rank.txt $OUT/sweep_rank.txt | head -3); do
  echo "== llama8b wgsl DAYONE_WGSL_MATVEC=$v $(date -u +%T)" | say; DAYONE_WGSL_MATVEC=$v wbench | say; done
for s in 16 64; do echo "== llama8b wgsl DAYONE_WGSL_SUBMIT_OPS=$s $(date -u +%T)" | say; DAYONE_WGSL_SUBMIT_OPS=$s wbench | say; done
tail -3 $OUT/wgsl_err.txt | say
if [ "$h200" != 0 ]; then waitf /tmp/kimi.done
  echo "== kimi48b profile b1 (eager) $(date -u +%T)" | say
  DAYONE_CUDA_PROFILE=1 timeout 150 $B bench --backend cuda -m /tmp/kimi48b --batch 1 --prompt-len 16 --gen-len 32 --enforce-eager 2>&1 >/dev/null | grep -A30 DAYONE_CUDA_PROFILE | say; fi
date -u +%T | say
