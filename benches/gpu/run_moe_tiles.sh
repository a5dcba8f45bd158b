#!/usr/bin/env bash
# one device call: [14] the tile variants of the tensor-core grouped expert GEMM — the GPU
# conformance test of every variant, then moe-bench of the DeepSeek-V3 MoE block (docs/perf.md
# "One MoE block") once per DAYONE_MOE_TILE value. Build with build_for_device.sh; carry
# [".bin", ".kcache"].
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env
echo "== grouped_expert_tiles (cuda_conformance)"
timeout 300 .bin/test-kernels-cuda-cuda_conformance grouped_expert_tiles --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|rel err|rror" | head -20 | tee "$OUT/tiles_test.txt"
for t in auto 16 32 64 128 128w; do
  echo "== DAYONE_MOE_TILE=$t"
  DAYONE_MOE_TILE=$t timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 \
    --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens 1,64,512,8192 2>&1 \
    | grep -v "^\s*$"
done 2>&1 | tee "$OUT/moe_tiles.txt"
tar czf "$OUT/kcache.tgz" -C "$kc" .
