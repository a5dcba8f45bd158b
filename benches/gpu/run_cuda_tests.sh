#!/usr/bin/env bash
# Runs the CUDA cases of the test binaries (built by build_for_device.sh, carried in .bin/) in
# priority order under a time budget, so that a call with little device time left still checks
# the newest kernels first. Logs under $OUT.
#   usage: BUDGET_S=400 bash benches/gpu/run_cuda_tests.sh
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
kc=${XDG_CACHE_HOME:-$HOME/.cache}/dayone
[ -f .kcache/cuda.tgz ] && mkdir -p "$kc" && tar xzf .kcache/cuda.tgz -C "$kc"
start=$(date +%s)
budget=${BUDGET_S:-400}
first="kernels-cuda-cuda_conformance kernels-cuda-cuda_flash tests-mla_expanded tests-golden_kimi_k25
  tests-gguf_block_quants tests-golden_gguf tests-quantized tests-golden_deepseek tests-golden_deepseek_v32
  tests-golden_kimi tests-golden tests-golden_glm5_next tests-composition tests-scheduler_parity
  tests-prefix_cache tests-kernel_compile"
rest=$(cd .bin && ls test-* | sed 's/^test-//' | grep -vxF -f <(echo "$first" | tr ' ' '\n' | sed '/^$/d'))
for t in $first $rest; do
  [ -x ".bin/test-$t" ] || continue
  left=$(( budget - ($(date +%s) - start) ))
  if [ "$left" -lt 20 ]; then echo "== $t: not run (budget spent)" | tee -a "$OUT/tests.log"; continue; fi
  echo "== $t" >> "$OUT/tests.log"
  timeout "$left" ".bin/test-$t" ${TEST_FILTER:-cuda} --test-threads 1 2>&1 | grep -vE '^\s*$' >> "$OUT/tests.log"
  echo "$t: $(grep -A0 'test result' "$OUT/tests.log" | tail -1)"
done
grep -E "^test .*(FAILED|failed)|panicked" "$OUT/tests.log" | head -20
