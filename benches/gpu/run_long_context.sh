#!/usr/bin/env bash
# Issue [10] on the GPU machine: the varlen flash-attention kernel (correctness, rate beside
# torch SDPA on the same card), the DSA layer's sparse vs dense prefill, and the
# Kimi-Linear-48B-shaped TTFT curve up to a million tokens. Binaries from build_for_device.sh in
# .bin/ (carry: [".bin"]). Logs under $OUT.
#   usage: bash benches/gpu/run_long_context.sh [flash] [dsa] [kimi]
#   KIMI_PROMPT (default 8K,32K,128K), KIMI_CHUNK (prefill chunk, default 16384)
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
steps=${*:-flash}
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
# Kernels compiled by an earlier call (carried in .kcache/), so that loads skip NVRTC.
kc=${XDG_CACHE_HOME:-$HOME/.cache}/dayone
[ -f .kcache/cuda.tgz ] && mkdir -p "$kc" && tar xzf .kcache/cuda.tgz -C "$kc"
date -u | tee -a "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/env.txt"

if [[ " $steps " == *" flash "* ]]; then
  DAYONE_CUDA_BENCH=1 .bin/test-kernels-cuda-cuda_flash --test-threads 1 --nocapture 2>&1 | tee "$OUT/flash.log" | grep -E "flash_attn|test result|panicked|FAILED"
  # The fastest variant at the longest 192/128 length, for the model runs below.
  best=$(grep -E "N 131072 .*hd_k 192 " "$OUT/flash.log" | sed -E 's/.* (m[0-9]w[0-9](s1)?): .* ([0-9.]+) TFLOP.*/\3 \1/' | sort -n | tail -1 | cut -d' ' -f2)
  export DAYONE_FLASH_VARIANT=${DAYONE_FLASH_VARIANT:-$best}
  echo "flash variant for the model runs: $DAYONE_FLASH_VARIANT" | tee -a "$OUT/flash.log"
  .bin/test-kernels-cuda-cuda_conformance conformance_suite --test-threads 1 2>&1 | tee "$OUT/conformance.log" | grep -E "test result|panicked|Error" | head -5
  [ -n "${SKIP_TORCH:-}" ] || python3 benches/gpu/torch_sdpa.py 2>&1 | grep -v Warning | tee "$OUT/torch_sdpa.log"
fi

if [[ " $steps " == *" dsa "* ]]; then
  .bin/dsa-bench --backend cuda --prefill-chunk 8192 --contexts 8192,32768,131072 --iters 1 2>&1 | tee "$OUT/dsa_prefill.txt"
fi

if [[ " $steps " == *" kimi "* ]]; then
  [ -f /tmp/kimi48b/config.json ] || python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b > "$OUT/kimi_ckpt.txt"
  echo "checkpoint written: $(date -u)"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > /tmp/kimi_mem.csv &
  smi=$!
  prompts=${KIMI_PROMPT:-8K,32K,128K}
  n=$(echo "$prompts" | tr ',' '\n' | wc -l)
  batches=$(yes 1 | head -n "$n" | paste -sd,)
  DAYONE_LOG=${DAYONE_LOG:-info} .bin/dayone bench --backend cuda --model /tmp/kimi48b --batch "$batches" --prompt-len "$prompts" \
    --gen-len 16 --max-batched-tokens ${KIMI_CHUNK:-16384} --kv-cache-tokens ${KIMI_KV:-1048576} \
    --csv "$OUT/kimi_curves.csv" --json 2>"$OUT/kimi_err.log" | tee -a "$OUT/kimi48b.jsonl"
  kill $smi 2>/dev/null
  grep -vE "^\s*$" "$OUT/kimi_err.log" | tail -8; echo "bench done: $(date -u)"
  echo "peak GPU memory MiB: $(sort -n /tmp/kimi_mem.csv | tail -1)"
fi

[ -d "$kc/cuda" ] && tar czf "$OUT/cuda.tgz" -C "$kc" cuda
