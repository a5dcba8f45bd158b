#!/usr/bin/env bash
# Soak: `dayone serve` under `dayone bench-serve --duration-minutes` at full concurrency with
# random client aborts, then a clean SIGTERM. Not part of the default test run.
#
#   bash benches/soak.sh                        # 20 min, SmolLM2-135M (default model) on CPU
#   MINUTES=1 CONC=4 bash benches/soak.sh       # a quick smoke run
#   # the GPU machine, Llama-3.1-8B shape (see benches/gpu/run_serve_bench.sh for the model):
#   MODEL=/tmp/llama8b BACKEND=cuda MINUTES=8 CONC=64 IN=1024 OUTLEN=256 VOCAB=128256 \
#     bash benches/soak.sh
#
# Env: DAYONE_BIN (default target/release/dayone), MODEL (default: the default SmolLM2 model),
# BACKEND (cpu), MINUTES (20), ABORT (0.1), CONC (16), IN (128), OUTLEN (32), VOCAB (49152, the
# model's vocabulary size), SEED (0), OUT (/tmp: result JSON and logs), SERVE_ARGS (extra
# `dayone serve` flags; default `--max-num-seqs $CONC`), BENCH_ARGS (extra bench-serve flags).
#
# Exit 0 only when bench-serve passed (no failed request, no KV block held after the run) and
# the server exited 0 after SIGTERM. bench-serve's soak section (stdout and the JSON's `soak`
# key) has: requests completed / aborted / failed, per-minute TTFT/ITL p99 and tok/s, the p99
# drift (last full minute / first), the server's running / waiting requests and KV blocks used
# after the run, and host and device memory at start and end.
set -uo pipefail

BIN=${DAYONE_BIN:-target/release/dayone}
BACKEND=${BACKEND:-cpu}
MINUTES=${MINUTES:-20}
ABORT=${ABORT:-0.1}
CONC=${CONC:-16}
IN=${IN:-128}
OUTLEN=${OUTLEN:-32}
VOCAB=${VOCAB:-49152}
SEED=${SEED:-0}
OUT=${OUT:-/tmp}
SERVE_ARGS=${SERVE_ARGS:---max-num-seqs $CONC}
BENCH_ARGS=${BENCH_ARGS:-}

[ -x "$BIN" ] || { echo "soak: $BIN is not an executable (build: cargo build --release -p dayone-cli, or set DAYONE_BIN)" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
stamp=$(date +%Y%m%d-%H%M%S)
serve_out="$OUT/soak-serve-$stamp.out"
serve_err="$OUT/soak-serve-$stamp.err"
result="soak-$stamp.json"

model_args=()
[ -n "${MODEL:-}" ] && model_args=(--model "$MODEL")
# shellcheck disable=SC2086  # SERVE_ARGS is a list of flags
"$BIN" serve "${model_args[@]}" --backend "$BACKEND" --host 127.0.0.1 --port 0 $SERVE_ARGS \
  >"$serve_out" 2>"$serve_err" &
PID=$!
cleanup() { kill -0 $PID 2>/dev/null && kill -KILL $PID 2>/dev/null; }
trap cleanup EXIT

# Ready when it prints `dayone serve: ready at http://127.0.0.1:PORT (model ...)`; model loads
# (an 8B on the GPU machine) can take minutes.
URL=
for _ in $(seq 1 1200); do
  URL=$(grep -o 'ready at http://[0-9.:]*' "$serve_out" 2>/dev/null | head -1 | sed 's/^ready at //')
  [ -n "$URL" ] && break
  if ! kill -0 $PID 2>/dev/null; then
    echo "soak: dayone serve exited before it was ready:" >&2
    tail -20 "$serve_err" >&2
    exit 1
  fi
  sleep 0.5
done
[ -n "$URL" ] || { echo "soak: dayone serve not ready after 10 min" >&2; tail -20 "$serve_err" >&2; exit 1; }
echo "soak: server pid $PID at $URL (backend $BACKEND, model ${MODEL:-default}); $MINUTES min, concurrency $CONC, abort $ABORT, in $IN, out $OUTLEN"

t0=$(date +%s)
# shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
"$BIN" bench-serve --url "$URL" --duration-minutes "$MINUTES" --abort-fraction "$ABORT" \
  --max-concurrency "$CONC" --random-input-len "$IN" --random-output-len "$OUTLEN" --ignore-eos \
  --random-vocab-size "$VOCAB" --server-pid $PID --seed "$SEED" --disable-tqdm \
  --save-result --result-dir "$OUT" --result-filename "$result" $BENCH_ARGS \
  | tee "$OUT/soak-$stamp.txt"
bench_rc=${PIPESTATUS[0]}
t1=$(date +%s)

kill -TERM $PID
wait $PID
serve_rc=$?
trap - EXIT

echo "================== soak summary =================="
echo "bench-serve exit:  $bench_rc ($((t1 - t0)) s)"
echo "serve exit:        $serve_rc (after SIGTERM)"
echo "result:            $OUT/$result"
echo "logs:              $OUT/soak-$stamp.txt, $serve_err"
if command -v python3 >/dev/null && [ -f "$OUT/$result" ]; then
  python3 - "$OUT/$result" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["soak"]
mib = lambda b: "n/a" if b is None else f"{b / 1048576:.1f} MiB"
na = lambda v, f="{:g}": "n/a" if v is None else f.format(v)
st, en = s["server_start"], s["server_end"]
d = s["p99_drift"] or {}
print(f"requests:          {s['completed']} completed, {s['aborted']} aborted, {s['failed']} failed ({s['sent']} sent)")
if d:
    print(f"p99 drift:         TTFT {na(d['ttft'], '{:.2f}')}, ITL {na(d['itl'], '{:.2f}')} (minute {d['last_minute']} / minute {d['first_minute']})")
else:
    print("p99 drift:         n/a (needs two full minutes)")
print(f"after the run:     running {na(en['num_requests_running'])}, waiting {na(en['num_requests_waiting'])}, leaked blocks {na(s['leaked_blocks'])}")
rss = lambda x: x["resident_memory_bytes"] if x["resident_memory_bytes"] is not None else x["pid_rss_bytes"]
print(f"host RSS:          {mib(rss(st))} -> {mib(rss(en))}")
print(f"device memory:     {mib(st['device_memory_bytes'])} -> {mib(en['device_memory_bytes'])}")
if st["gpu_memory_used_mib"] is not None or en["gpu_memory_used_mib"] is not None:
    print(f"nvidia-smi used:   {na(st['gpu_memory_used_mib'])} -> {na(en['gpu_memory_used_mib'])} MiB")
print("failures:          " + ("; ".join(s["failures"]) or "none"))
PY
fi
if [ "$bench_rc" -eq 0 ] && [ "$serve_rc" -eq 0 ]; then
  echo "soak: PASS"
  exit 0
fi
echo "soak: FAIL" >&2
exit 1
