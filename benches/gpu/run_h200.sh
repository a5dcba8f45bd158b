#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there): binaries built here by
# benches/gpu/build_for_device.sh are carried in .bin/. Writes logs and JSON under $OUT.
#   usage: bash benches/gpu/run_h200.sh [tests] [torch] [bench] [smollm2]
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
steps=${*:-tests torch bench}
date -u | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$OUT/env.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/env.txt"

if [[ " $steps " == *" tests "* ]]; then
  for t in .bin/test-*; do
    echo "== $t" | tee -a "$OUT/tests.log"
    "$t" cuda --test-threads 1 2>&1 | grep -vE '^\s*$' | tee -a "$OUT/tests.log" | grep -E 'test result|FAILED|panicked|failed' 
  done
fi

if [[ " $steps " == *" torch "* ]]; then
  PYTHONUNBUFFERED=1 python3 benches/gpu/torch_llama8b.py --save /tmp/llama8b --batch 1,8,64 \
    --prompt-len 512 --gen-len 128 --json "$OUT/torch_llama8b.json" 2>&1 | tee "$OUT/torch.log" | grep -v Warning
fi

if [[ " $steps " == *" bench "* ]]; then
  for m in /tmp/llama8b; do
    [ -d "$m" ] || { echo "no $m (run the torch step first)"; continue; }
    .bin/dayone bench --backend cuda --model "$m" --batch 1,8,64 --prompt-len 512 --gen-len 128 --json \
      2>"$OUT/bench_err.log" | tee "$OUT/dayone_llama8b.jsonl"
    tail -3 "$OUT/bench_err.log"
  done
fi
