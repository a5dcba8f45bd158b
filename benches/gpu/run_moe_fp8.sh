#!/usr/bin/env bash
# one device call: [11] the FP8 expert GEMM (--moe-fp8, kernels/moe_fp8.cu; sm_89+) — its GPU test
# against the FP8-emulating host reference (MXFP4, INT4 g32/g64; 1/3/70/300 tokens; SwiGLU and the
# biased gpt-oss GLU; f32 and bf16), then moe-bench of the Kimi-K2-shaped MoE block, decode vs
# fp8 paths. Build with build_for_device.sh; carry [".bin", ".kcache"].
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env
echo "== fp8_experts_match_the_emulated_reference (cuda_moe_fp8)"
timeout 300 .bin/test-kernels-cuda-cuda_moe_fp8 --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|error|SKIPPED|fp8_experts" | head -20 | tee "$OUT/fp8_test.txt"
for fmt in mxfp4 int4; do
  echo "== $fmt"
  timeout 240 .bin/moe-bench --backend cuda --hidden 7168 --experts 384 --expert-dim 2048 \
    --top-k 8 --experts-format $fmt --quant-path decode,fp8 --tokens 64,512,8192 2>&1 \
    | grep -v "^\s*$"
done 2>&1 | tee "$OUT/moe_fp8.txt"
tar czf "$OUT/kcache.tgz" -C "$kc" .
