#!/usr/bin/env bash
# One device call (≤ 10 minutes) for issue [14]'s four figures with the default settings.
#   H200: sanity tests (graphs == eager, the CUDA goldens), Llama-8B batch 1/8/64 beside
#         PyTorch, Kimi-Linear-48B batch 1, WGSL beside CUDA on the 8B shape, the MoE block
#         (auto tiles: the rasterised 128 × 128 from 2 048 tokens) beside torch._grouped_mm.
#   H100 (none of the four figures: the card is the H200): the grouped expert GEMM's
#         tiles test, the MoE block beside torch._grouped_mm.
# Every summary line also goes to $OUT/summary.txt as it comes. Carry [".bin", ".gl", ".kcache"]:
#   TESTS="decode_graphs golden golden_kimi cuda_conformance" BENCH_BINS=moe-bench \
#     bash benches/gpu/build_for_device.sh
# (.gl: `apt-get download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2` there,
# for WGSL through the NVIDIA Vulkan driver).
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
B=.bin/dayone
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
moe() { DAYONE_MOE_TILE=$1 timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens $2 2>&1 | grep -v "^\s*$" | tail -5; }
if [ "$h200" != 0 ]; then KIMI=/tmp/kimi48b; KL=benches/gpu/kimi48b_layout.json
else KIMI=/tmp/kimi14; python3 benches/gpu/shallow_layout.py benches/gpu/kimi48b_layout.json 14 /tmp/kimi14.json; KL=/tmp/kimi14.json; fi
[ "$h200" != 0 ] && ( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  touch /tmp/llama.done
  python3 benches/gpu/write_sparse_safetensors.py $KL $KIMI >> $OUT/w.txt 2>&1
  echo "ckpts $(date -u +%T)" >> $OUT/w.txt; touch /tmp/kimi.done ) &
waitf() { while [ ! -f $1 ]; do sleep 1; done; }
if [ "$h200" != 0 ]; then
  for t in "decode_graphs cuda" "golden cuda" "golden_kimi cuda"; do set -- $t
    echo "== $1 $2 $(date -u +%T)" | say; timeout 60 .bin/test-tests-$1 $2 --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED" | head -4 | say; done
  echo "== moe auto $(date -u +%T)" | say; moe auto 64,512,8192 | say
  echo "== torch grouped_mm $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm | say
  waitf /tmp/llama.done
  echo "== llama8b default $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128 | say
  # The Vulkan loader and glvnd (the NVIDIA ICD's libGLX_nvidia needs libGLdispatch), as the
  # device README says: unpacked into /, then ldconfig.
  for d in .gl/*.deb; do dpkg -x "$d" /; done; ldconfig
  ls /usr/local/nvidia/share/vulkan/icd.d/ /etc/vulkan/icd.d/ 2>&1 | tr '\n' ' ' >> $OUT/wgsl_err.txt
  echo "== llama8b cuda b1, prompt 128 (beside WGSL) $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64 | say
  echo "== llama8b wgsl b1 $(date -u +%T)" | say; VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
    timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary | say; tail -2 $OUT/wgsl_err.txt
  waitf /tmp/kimi.done
  echo "== kimi48b default $(date -u +%T)" | say; bench -m $KIMI --batch 1 --prompt-len 512 --gen-len 48 | say
  echo "== torch llama8b $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_llama8b.py --batch 1 --attn sdpa --prompt-len 512 --gen-len 16 2>&1 | tail -2 | say
  echo "== moe 8192 DAYONE_MOE_TILE=128 (before auto took 128r) $(date -u +%T)" | say; moe 128 8192 | say
else
  echo "== cuda_conformance grouped_expert_tiles" | say; timeout 150 .bin/test-kernels-cuda-cuda_conformance grouped_expert_tiles --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED" | head -3 | say
  echo "== moe auto $(date -u +%T)" | say; moe auto 64,512,8192 | say
  echo "== torch grouped_mm $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm | say
fi
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T | say
