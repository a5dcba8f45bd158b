# Sourced by the run_*.sh scripts of one device call: unpacks the binaries that
# build_for_device.sh put in .bin/ (gzip or xz), restores the NVRTC disk cache from
# .kcache/cuda.tgz (or .txz) when carried, sets the environment the CUDA tests expect, and defines
# `cuda_tests` (each .bin/test-* binary, its CUDA cases only; a summary on stdout, the detail
# in $OUT/tests.txt). Carry [".bin", ".kcache"].
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}; mkdir -p "$OUT"
for f in .bin/*.xz; do [ -e "$f" ] && unxz -f "$f"; done
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
kc=$HOME/.cache/dayone; mkdir -p "$kc"
[ -f .kcache/cuda.tgz ] && tar xzf .kcache/cuda.tgz -C "$kc"
[ -f .kcache/cuda.txz ] && tar xJf .kcache/cuda.txz -C "$kc"
export NCCL_NVLS_ENABLE=0 DAYONE_FIXTURES=$PWD/tests/fixtures RUST_BACKTRACE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

# cuda_tests [per-binary timeout s]
cuda_tests() {
  for t in .bin/test-*; do
    case $t in *kernels-cuda*) filter="";; *) filter=cuda;; esac
    echo "== $t"
    timeout "${1:-150}" "$t" $filter --test-threads 1 --nocapture 2>&1 \
      | grep -E "^test |test result|panicked|rel err|rror|differ|captures" | head -40
  done > "$OUT/tests.txt" 2>&1
  grep -E "^==|test result|FAILED|panicked|differ|captures|did not" "$OUT/tests.txt" | head -40
}

# `dayone bench --json ... | bench_summary`: one line per run (batch, prompt, decode tok/s,
# TPOT median/p99, roofline fraction, bytes per decode step, TTFT, copy ceiling).
bench_summary() {
  python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        d = json.loads(l)
        print(d["backend"][:5], d.get("weight_dtype"), d["batch"], d["prompt_len"],
              "decode %.1f tok/s" % d["decode_tokens_per_s"],
              "tpot %.3f/%.3f ms" % (1e3 * d["tpot_median_s"], 1e3 * d["tpot_p99_s"]),
              "roof %.3f" % d["roofline_fraction"], "bytes %.3e" % d["decode_bytes_per_step_avg"],
              "ttft %.3f s" % d["ttft_median_s"], "ceiling %.0f" % d["roofline_gbps"],
              "weights %.2f GB" % (d.get("weight_resident_bytes", 0) / 1e9),
              "devmem %.2f GB" % ((d.get("device_memory_bytes") or 0) / 1e9))'
}

# fusion_tests [conformance timeout s]: the decode fusions' CUDA tests, one filter each (the
# whole conformance suite with every fusion on and off, the router top-k, the MoE routes, graphs
# == eager, Kimi against transformers); one summary line per filter.
fusion_tests() {
  for t in "cuda_conformance conformance_suite ${1:-200}" "cuda_conformance router_topk 30" "cuda_mla_moe moe 60" "decode_graphs cuda 40" "golden_kimi cuda 40"; do
    set -- $t; local b; b=$(ls .bin/test-*-$1 2>/dev/null | head -1); [ -n "$b" ] || continue
    echo "== $1 $2"; timeout $3 $b $2 --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED|differ|not bit" | head -5
  done
}
