#!/usr/bin/env bash
# The direct low-bit expert GEMV on the H200 (issue [11]): its conformance (`quantized_experts`:
# MXFP4 / INT4 at 1, 3, 8 tokens against the reference on the decoded weights), the low-bit
# goldens that now take it at decode (deepseek_v3 MXFP4 / INT4, gpt-oss), then one
# Kimi-K2-shaped MoE layer timed with each path (direct codes vs decode into the workspace)
# and the bf16 layer beside them.
#   usage: bash benches/gpu/run_moe_direct.sh   (binaries from build_for_device.sh in .bin/)
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=${DAYONE_CACHE:-/tmp/dayone-cache} RUST_BACKTRACE=0
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } | tee "$OUT/env.txt"
for t in .bin/test-kernels-cuda-cuda_conformance .bin/test-tests-golden_deepseek \
  .bin/test-tests-golden_gpt_oss .bin/test-tests-quantized; do
  echo "== $t" | tee -a "$OUT/tests.log"
  timeout 300 $t --test-threads 1 2>&1 | grep -E "^test |test result|panicked|FAILED|Error|error" | tee -a "$OUT/tests.log"
done
SHAPE="--backend cuda --hidden 7168 --experts 384 --expert-dim 2048 --top-k 8 --groups 1 --topk-group 1 --shared 1"
TOKENS=${TOKENS:-1,2,8,16,32,64,128,256}
echo "== moe-bench kimi-k2 shape bf16" | tee -a "$OUT/moe.log"
timeout 200 .bin/moe-bench $SHAPE --tokens $TOKENS --experts-format bf16 2>&1 | tail -10 | tee -a "$OUT/moe.log"
for fmt in mxfp4 int4; do
  echo "== moe-bench kimi-k2 shape $fmt" | tee -a "$OUT/moe.log"
  timeout 300 .bin/moe-bench $SHAPE --tokens $TOKENS --experts-format $fmt --quant-path direct,decode 2>&1 \
    | tail -18 | tee -a "$OUT/moe.log"
done
