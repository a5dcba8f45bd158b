#!/usr/bin/env bash
# Context parallelism on the one-GPU machine (issue [10]): two (or four) NCCL ranks share the GPU,
# each with its own NCCL_HOSTID (set by dayone when ranks outnumber GPUs), so NCCL runs over
# sockets: correct, not fast. Every step of at least 2 tokens is split over the ranks
# (--context-parallel-min-tokens 2); each model is checked layer by layer against the
# transformers reference (`dayone check --reference`) and its greedy tokens against one rank, in
# f32 (batch-invariant kernels, so a rank's smaller GEMMs give the whole step's bits) and bf16.
#   usage: bash benches/gpu/run_cp.sh          (binaries from build_for_device.sh in .bin/)
# Not yet run on a GPU.
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0 NCCL_NVLS_ENABLE=0
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
D=.bin/dayone
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } | tee "$OUT/env.txt"
ids=$(python3 -c "print(','.join(str((i*29+3)%256) for i in range(37)))")
for m in ${MODELS:-llama_tiny deepseek_v3_tiny deepseek_v32_tiny kimi_linear_tiny}; do
  for s in "-cp 2" "-cp 4"; do
    for dt in f32 bf16; do
      cp="$s --context-parallel-min-tokens 2 --batch-invariant --dtype $dt"
      echo "== $m [$cp]" | tee -a "$OUT/check_cp.log"
      timeout 300 $D check --backends cuda -m tests/fixtures/$m $cp \
        --reference tests/fixtures/$m/reference.json 2>&1 | tail -2 | tee -a "$OUT/check_cp.log"
      one=$(timeout 120 $D generate --backend cuda --batch-invariant --dtype $dt -m tests/fixtures/$m --prompt-ids $ids --max-tokens 16 2>/dev/null)
      many=$(timeout 300 $D generate --backend cuda -m tests/fixtures/$m --prompt-ids $ids --max-tokens 16 $cp 2>>"$OUT/gen_err_cp.log")
      if [ "$one" == "$many" ] && [ -n "$one" ]; then r=same; else r=DIFFERENT; fi
      echo "generate $dt $m [$cp] vs one rank: $r ($many)" | tee -a "$OUT/generate_cp.log"
    done
  done
done
