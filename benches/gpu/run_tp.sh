#!/usr/bin/env bash
# Tensor/expert parallelism on the one-GPU machine (issue [8]): two NCCL ranks share the GPU, each
# with its own NCCL_HOSTID (set by dayone when ranks outnumber GPUs), so NCCL runs over sockets:
# correct, not fast. Each split model is checked layer by layer against the transformers
# reference (`dayone check --reference`), in f32 and bf16, and its greedy tokens against one rank.
#   usage: bash benches/gpu/run_tp.sh          (binaries from build_for_device.sh in .bin/)
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0 NCCL_NVLS_ENABLE=0
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
D=.bin/dayone
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } | tee "$OUT/env.txt"
[ -x .bin/test-dayone-cuda-cuda_nccl ] && .bin/test-dayone-cuda-cuda_nccl --nocapture 2>&1 | tail -4 | tee "$OUT/nccl.log"
ids=5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21
# f32: every split checked against the reference; greedy tokens against one rank (f32, where
# the split's reduction order changes only the last bits).
for m in ${MODELS:-llama_tiny qwen3_tiny deepseek_v3_tiny deepseek_v32_tiny kimi_linear_tp}; do
  splits=("-tp 2")
  case $m in deepseek*|kimi*) splits+=("-tp 2 -ep 2");; esac
  for s in "${splits[@]}"; do
    echo "== $m $s f32" | tee -a "$OUT/check.log"
    timeout 300 $D check --backends cuda -m tests/fixtures/$m $s --dtype f32 \
      --reference tests/fixtures/$m/reference.json 2>&1 | tail -2 | tee -a "$OUT/check.log"
    one=$(timeout 120 $D generate --backend cuda --dtype f32 -m tests/fixtures/$m --prompt-ids $ids --max-tokens 16 2>/dev/null)
    many=$(timeout 300 $D generate --backend cuda --dtype f32 -m tests/fixtures/$m --prompt-ids $ids --max-tokens 16 $s 2>>"$OUT/gen_err.log")
    if [ "$one" == "$many" ] && [ -n "$one" ]; then r=same; else r=DIFFERENT; fi
    echo "generate f32 $m [$s] vs one rank: $r ($many)" | tee -a "$OUT/generate.log"
  done
done
# bf16: the split against one rank, both against the reference.
for s in "" "-tp 2"; do
  for m in ${BF16_MODELS:-kimi_linear_tp llama_tiny}; do
    echo "== $m [$s] bf16" | tee -a "$OUT/check_bf16.log"
    timeout 300 $D check --backends cuda -m tests/fixtures/$m $s --dtype bf16 \
      --reference tests/fixtures/$m/reference.json 2>&1 | tail -3 | tee -a "$OUT/check_bf16.log"
  done
done
