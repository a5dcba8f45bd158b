#!/usr/bin/env bash
# Issue [6] "Measure" on the H200 with the Kimi-Linear-48B-shaped random checkpoint (docs/perf.md,
# "CUDA on the H200: Kimi-Linear-48B-A3B shapes"): TTFT of 64 short requests (512 tokens) arriving
# while one long prompt prefills, long-request queue off vs on; second turn of a 32K-token
# conversation, prefix cache on vs off. Binary: benches/serve_scenarios.rs.
#
# Build here (the GPU machine has no Rust toolchain), then carry .bin: either
# benches/gpu/build_for_device.sh (copies serve-scenarios with the other binaries), or just this one:
#   cargo build --release -p dayone-benches --bin serve-scenarios
#   mkdir -p .bin && cp target/release/serve-scenarios .bin/ && strip .bin/serve-scenarios \
#     && gzip -9 -f .bin/serve-scenarios                       # 4.7 MB gzipped
#
# Usage (device calls: at most 10 min each):
#   bash benches/gpu/run_serving.sh off   # call 1: checkpoint + long-short queue-off + multiturn (1 load)
#   bash benches/gpu/run_serving.sh on    # call 2, machine still warm: long-short queue-on (1 load)
#   bash benches/gpu/run_serving.sh all   # or both in one process/call (2 loads) with the ratio
#   bash benches/gpu/run_serving.sh summary FILE.jsonl...   # here: ratios from the rows of calls 1+2
# Each configuration of the long-request queue is its own engine (scheduler limits are fixed at
# build), so queue off and on cost one model load each; multiturn shares the queue-off engine.
#
# Lengths: the 128K-token prefill alone took 64.1 s on this card (docs/perf.md, 2026-11-30), more
# than the 60 s this plan allows per long prefill (it runs once per queue configuration, slower
# under the queue's per-step cap), so LONG_LEN defaults to 65536 (≈ 18 s estimated from the 32K/128K rows).
# LONG_LEN=131072 gives the issue's figure when a call has room for it.
# Estimated device time after the load: off ≈ 40 s (64K prefill + shorts, 32K turn 1, turn 2
# twice), on ≈ 30 s; the checkpoint write (4 GB of random values) about a minute; the 98 GB
# load is the unknown — the binary prints "loaded … in N s" on stderr.
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
MODEL=${MODEL:-/tmp/kimi48b}
LONG_LEN=${LONG_LEN:-65536}
BIN=${BIN:-.bin/serve-scenarios}
# EXTRA: more flags, after the ones below (a later flag overrides an earlier one), e.g.
# EXTRA="--short-interval-ms 5".
EXTRA=${EXTRA:-}
step=${1:-all}

summary() {
  python3 - "$@" <<'EOF'
import json, sys
rows = [json.loads(l) for f in sys.argv[1:] for l in open(f) if l.startswith("{")]
ls = {r["config"]: r for r in rows if r["scenario"] == "long-short"}
mt = {r["config"]: r for r in rows if r["scenario"] == "multiturn"}
if "queue-off" in ls and "queue-on" in ls:
    off, on = ls["queue-off"], ls["queue-on"]
    for k in ("p50", "p99", "max", "mean"):
        key = f"short_ttft_{k}_ms"
        print(f"short TTFT {k}: queue off {off[key]:.1f} ms, on {on[key]:.1f} ms, off/on {off[key] / on[key]:.2f}x")
    print(f"long TTFT: queue off {off['long_ttft_ms']:.1f} ms, on {on['long_ttft_ms']:.1f} ms")
if "cache-on" in mt and "cache-off" in mt:
    on, off = mt["cache-on"], mt["cache-off"]
    print(f"turn-2 TTFT: cache on {on['turn2_ttft_ms']:.1f} ms ({on['prefix_hit_tokens']} hit tokens), "
          f"off {off['turn2_ttft_ms']:.1f} ms ({off['prefix_hit_tokens']} hit tokens), "
          f"off/on {off['turn2_ttft_ms'] / on['turn2_ttft_ms']:.2f}x")
EOF
}
case "$step" in
  summary) shift; summary "$@"; exit ;;
  off|on|all) ;;
  *) echo "usage: run_serving.sh off|on|all|summary FILE…" >&2; exit 2 ;;
esac

mkdir -p "$OUT"
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
export DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
date -u | tee -a "$OUT/env.txt"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/env.txt"
if [ ! -f "$MODEL/model.safetensors" ]; then
  python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json "$MODEL" | tee "$OUT/kimi_ckpt.txt"
fi

# The issue's sizes (flags' defaults) but for --long-len; --chunk 8192 as the earlier Kimi rows.
common=(--model "$MODEL" --backend "${BACKEND:-cuda}" --dtype bf16 --chunk 8192 --long-len "$LONG_LEN"
        --short-len 512 --shorts 64 --short-gen 16 --long-threshold 32768 --long-cap 2048
        --max-long-partial-prefills 1 --turn1-len 32768 --turn2-extra 64 --gen 32 --json)
run() {  # name, extra flags…
  local name=$1; shift
  # shellcheck disable=SC2086
  timeout 570 "$BIN" "${common[@]}" "$@" $EXTRA 2> >(tee "$OUT/serving_$name.err" >&2) \
    | tee "$OUT/serving_$name.jsonl"
  echo "rc=${PIPESTATUS[0]}" | tee -a "$OUT/serving_$name.err"
  cp "$OUT/serving_$name.jsonl" "/tmp/serving_$name.jsonl"  # kept while the machine stays warm
}
case "$step" in
  off) run off --scenario all --queue off ;;
  on) run on --scenario long-short --queue on
      [ -f /tmp/serving_off.jsonl ] && summary /tmp/serving_off.jsonl "$OUT/serving_on.jsonl" | tee "$OUT/serving_summary.txt" ;;
  all) run all --scenario all --queue both
       summary "$OUT/serving_all.jsonl" | tee "$OUT/serving_summary.txt" ;;
  *) echo "usage: run_serving.sh off|on|all|summary FILE…" >&2; exit 2 ;;
esac
