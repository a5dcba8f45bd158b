#!/usr/bin/env bash
# The next device call (≤ 10 minutes) for issue [14], in order of need so that a call cut short
# keeps its first parts (every summary line goes to $OUT/summary.txt as it comes):
#   1. the goldens; the wgmma MoE tiles against the reference;
#   2. the MoE block with `wg` beside the default (`128r` from 64 pairs per expert) and
#      torch._grouped_mm at 64 / 512 / 8 192 tokens;
#   3. Llama-8B batch 1 with 64 (default), 128 and 256 keys per decode split at least;
#   4. the tensor-core skinny product against the reference; Llama-8B batch 8 with cuBLAS
#      (default), DAYONE_CUDA_GEMV_TC=1 and DAYONE_CUDA_GEMV_MAX_M=8;
#   5. WGSL beside CUDA at batch 1 (the Vulkan loader with glvnd unpacked into /);
#   6. on an H200, Kimi-Linear-48B batch 1; then the wg128 tiles.
# Carry [".bin", ".gl", ".kcache"]; the bundle from
#   TESTS="decode_graphs golden golden_kimi cuda_conformance" BENCH_BINS="moe-bench op-bench" \
#     bash benches/gpu/build_for_device.sh
# (.gl: `apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2`).
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
B=.bin/dayone
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
moe() { DAYONE_MOE_TILE=$1 timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens $2 2>&1 | grep -v "^\s*$" | tail -5; }
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1; touch /tmp/llama.done
  [ "$h200" != 0 ] && python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1; touch /tmp/kimi.done ) &
waitf() { while [ ! -f $1 ]; do sleep 1; done; }
for t in "golden cuda" "golden_kimi cuda"; do set -- $t
  echo "== $1 $2 $(date -u +%T)" | say; timeout 60 .bin/test-tests-$1 $2 --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED" | head -4 | say; done
conf() { echo "== cuda_conformance $1 $(date -u +%T)" | say
  timeout 100 .bin/test-kernels-cuda-cuda_conformance $1 --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED|rel err|linear|moe_experts" | head -6 | say; }
conf grouped_expert_tiles
for t in wg auto; do echo "== moe $t $(date -u +%T)" | say; moe $t 64,512,8192 | say; done
echo "== torch grouped_mm $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm | say
waitf /tmp/llama.done
for c in 64 128 256; do echo "== llama8b b1 DAYONE_DECODE_MIN_CHUNK=$c $(date -u +%T)" | say
  DAYONE_DECODE_MIN_CHUNK=$c bench -m /tmp/llama8b --batch 1 --prompt-len 512 --gen-len 128 | say; done
conf skinny_tensor_core_product
for v in "DAYONE_CUDA_GEMV_MAX_M=4" "DAYONE_CUDA_GEMV_TC=1" "DAYONE_CUDA_GEMV_MAX_M=8"; do echo "== llama8b b8 $v $(date -u +%T)" | say
  ( export $v; bench -m /tmp/llama8b --batch 8 --prompt-len 512 --gen-len 128 ) | say; done
for d in .gl/*.deb; do dpkg -x "$d" /; done; ldconfig
ls /usr/local/nvidia/share/vulkan/icd.d/ /etc/vulkan/icd.d/ /usr/share/vulkan/icd.d/ 2>&1 | tr '\n' ' ' > $OUT/wgsl_err.txt
echo "== llama8b cuda b1, prompt 128 (beside WGSL) $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64 | say
echo "== llama8b wgsl b1 $(date -u +%T)" | say; VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary | say; tail -3 $OUT/wgsl_err.txt | say
if [ "$h200" != 0 ]; then waitf /tmp/kimi.done
  echo "== kimi48b default $(date -u +%T)" | say; bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48 | say; fi
echo "== moe wg128 $(date -u +%T)" | say; moe wg128 64,512,8192 | say
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T | say
