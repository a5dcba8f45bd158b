#!/usr/bin/env bash
# Issue [6] on the H200, first device call: CUDA parity of the serving core (prefix cache, host
# tier, swap, service, scheduler parity, row-op conformance), the copy ceilings (device-to-device
# and host-to-device, pinned and pageable, torch), then the host tier on a Llama-3.1-8B shape
# (random bf16 weights): a working set 3x the device cache, submitted twice.
#   usage: bash benches/gpu/run_serving_core.sh [tests] [ceilings] [host]
# Binaries from benches/gpu/build_for_device.sh, carried in .bin/.
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export DAYONE_FIXTURES=$PWD/tests/fixtures DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
steps=${*:-tests ceilings host}
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
date -u | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/env.txt"

if [[ " $steps " == *" tests "* ]]; then
  for t in .bin/test-tests-prefix_cache .bin/test-tests-host_tier \
           .bin/test-tests-service .bin/test-tests-scheduler_parity \
           .bin/test-kernels-cuda-cuda_conformance; do
    echo "== $t" | tee -a "$OUT/tests.log"
    timeout 240 "$t" cuda --test-threads 1 2>&1 | grep -vE '^\s*$' | tee -a "$OUT/tests.log" \
      | grep -E 'test result|FAILED|panicked|Error' | head -20
  done
fi

if [[ " $steps " == *" ceilings "* ]]; then
  python3 - <<'PY' 2>&1 | tee "$OUT/ceilings.txt"
import torch, time
def bw(f, nbytes, it=20):
    f(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(it): f()
    torch.cuda.synchronize(); return nbytes * it / (time.perf_counter() - t) / 1e9
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
print(f"device copy 1 GiB: {bw(lambda: b.copy_(a), 2 * n):.0f} GB/s (read + write)")
pinned = torch.empty(n, dtype=torch.uint8).pin_memory(); pageable = torch.empty(n, dtype=torch.uint8)
print(f"host-to-device 1 GiB pinned: {bw(lambda: a.copy_(pinned, non_blocking=True), n, 10):.1f} GB/s")
print(f"host-to-device 1 GiB pageable: {bw(lambda: a.copy_(pageable), n, 5):.1f} GB/s")
print(f"device-to-host 1 GiB pinned: {bw(lambda: pinned.copy_(a, non_blocking=True), n, 10):.1f} GB/s")
PY
fi

if [[ " $steps " == *" host "* ]]; then
  [ -d /tmp/llama8b ] || PYTHONUNBUFFERED=1 python3 benches/gpu/torch_llama8b.py --save /tmp/llama8b \
    --attn sdpa --batch 1 --gen-len 4 2>&1 | grep -v Warning | tail -2
  .bin/serve-scenarios --backend cuda --model /tmp/llama8b --scenario host-tier \
    --host-prompts ${HOST_PROMPTS:-24} --host-prompt-len ${HOST_LEN:-4096} --host-cache-gb ${HOST_GB:-24} \
    --chunk 8192 --json 2>"$OUT/host_err.log" | tee "$OUT/host_tier.jsonl"
  tail -4 "$OUT/host_err.log"
fi
