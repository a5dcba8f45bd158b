#!/usr/bin/env bash
# gpt-oss and low-bit kernels on the H200 (issue [11]): conformance of the quant and gpt-oss ops,
# the gpt-oss / MXFP4 / INT4 goldens on CUDA, the low-bit GEMV at batch 32 (M <= 32 vs decode +
# cuBLAS), the MoE layer with MXFP4/INT4 experts, then a random gpt-oss-20b-shaped MXFP4
# checkpoint (benches/gpu/write_gpt_oss.py): decode at batch 1 / 32 / 64, TTFT at 8K, memory, for
# experts decoded per step vs decoded at load.
#   usage: bash benches/gpu/run_gpt_oss.sh    (binaries from build_for_device.sh in .bin/)
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
  # The cross-backend test binaries: their CUDA cases only (no Vulkan on this machine).
  case $t in *kernels-cuda*) filter="";; *) filter=cuda;; esac
  timeout 300 $t $filter 2>&1 | grep -E "^test |test result|panicked|FAILED|rror" | tee -a "$OUT/tests.log"
done
for fmt in mxfp4 int4; do
  echo "== moe-bench kimi-k2 shape $fmt" | tee -a "$OUT/moe.log"
  timeout 200 .bin/moe-bench --backend cuda --hidden 7168 --experts 384 --expert-dim 2048 --top-k 8 \
    --groups 1 --topk-group 1 --shared 1 --tokens 1,64,512,8192 --experts-format $fmt 2>&1 | tail -6 | tee -a "$OUT/moe.log"
done
M=/tmp/gpt-oss-20b
[ -d $M ] || python3 benches/gpu/write_gpt_oss.py 20b $M | tee -a "$OUT/gpt_oss.log"
for mode in "" "--dequantize-at-load"; do
  for batch in 1 32 64; do
    echo "== gpt-oss-20b shape bench batch $batch $mode" | tee -a "$OUT/gpt_oss.log"
    timeout 300 $D bench -m $M --backend cuda --batch $batch --prompt-len 1024 --gen-len 64 $mode 2>&1 | tail -9 | tee -a "$OUT/gpt_oss.log"
  done
  echo "== gpt-oss-20b shape TTFT 8K $mode" | tee -a "$OUT/gpt_oss.log"
  timeout 300 $D bench -m $M --backend cuda --batch 1 --prompt-len 8192 --gen-len 8 $mode 2>&1 | tail -9 | tee -a "$OUT/gpt_oss.log"
done
