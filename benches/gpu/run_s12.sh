#!/usr/bin/env bash
# One device call (≈ 6 minutes; in order of need, so a call cut short keeps the first parts) for issue [14] after run_s11.sh's H200 call: the Hopper `wgmma`
# grouped GEMM checked against the reference (its launch lacked the shared-memory opt-in there)
# and timed; Llama-8B batch 1 with more keys per decode split (DAYONE_DECODE_MIN_CHUNK) and
# batch 8 with the GEMV instead of cuBLAS (DAYONE_CUDA_GEMV_MAX_M=8); WGSL beside CUDA with the
# Vulkan loader and glvnd unpacked into / (run_s11's call found no adapter with the loader only);
# the goldens first (the decode attention's split merge changed its loads).
# Carry [".bin", ".gl", ".kcache"]; the bundle as for run_s10.sh.
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
B=.bin/dayone
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
moe() { DAYONE_MOE_TILE=$1 timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens $2 2>&1 | grep -v "^\s*$" | tail -5; }
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1; touch /tmp/llama.done ) &
for t in "golden cuda" "golden_kimi cuda"; do set -- $t
  echo "== $1 $2 $(date -u +%T)" | say; timeout 60 .bin/test-tests-$1 $2 --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED" | head -4 | say; done
echo "== cuda_conformance grouped_expert_tiles (wg, wg128 among the tiles) $(date -u +%T)" | say
timeout 150 .bin/test-kernels-cuda-cuda_conformance grouped_expert_tiles --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED|rel err|moe_experts" | head -6 | say
echo "== moe wg $(date -u +%T)" | say; moe wg 64,512,8192 | say
while [ ! -f /tmp/llama.done ]; do sleep 1; done
for c in 64 128 256; do echo "== llama8b b1 DAYONE_DECODE_MIN_CHUNK=$c $(date -u +%T)" | say
  DAYONE_DECODE_MIN_CHUNK=$c bench -m /tmp/llama8b --batch 1 --prompt-len 512 --gen-len 128 | say; done
for d in .gl/*.deb; do dpkg -x "$d" /; done; ldconfig
ls /usr/local/nvidia/share/vulkan/icd.d/ /etc/vulkan/icd.d/ /usr/share/vulkan/icd.d/ 2>&1 | tr '\n' ' ' > $OUT/wgsl_err.txt
echo "== llama8b cuda b1, prompt 128 (beside WGSL) $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64 | say
echo "== llama8b wgsl b1 $(date -u +%T)" | say; VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary | say; tail -3 $OUT/wgsl_err.txt | say
for m in 4 8; do echo "== llama8b b8 DAYONE_CUDA_GEMV_MAX_M=$m $(date -u +%T)" | say
  DAYONE_CUDA_GEMV_MAX_M=$m bench -m /tmp/llama8b --batch 8 --prompt-len 512 --gen-len 128 | say; done
echo "== moe wg128 $(date -u +%T)" | say; moe wg128 64,512,8192 | say
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T | say
