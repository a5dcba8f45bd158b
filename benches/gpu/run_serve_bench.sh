#!/usr/bin/env bash
# Issue [7] on the H200: `dayone bench-serve` against `dayone serve` (random 1024 in / 256 out,
# EOS ignored, /v1/completions with token-id prompts) at max concurrency 1, 16 and 64, on the
# Llama-3.1-8B-shaped and the Kimi-Linear-48B-shaped random checkpoints (bf16).
#   usage: bash benches/gpu/run_serve_bench.sh llama|kimi|soak
# Binary: target/release/dayone, stripped and gzipped into .bin/ (carry: [".bin"]).
# The shaped checkpoints have no tokenizer; a word-level one ("t0", "t1", …, Fuse decoder) over
# the model's vocabulary is written beside them, so the server can detokenize.
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
export DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0 NCCL_NVLS_ENABLE=0
step=${1:-llama}
date -u | tee -a "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/env.txt"

tokenizer() {  # dir vocab
  python3 - "$1" "$2" <<'PY'
import json, sys, os
d, v = sys.argv[1], int(sys.argv[2])
vocab = {f"t{i}": i for i in range(v)}
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
       "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
       "decoder": {"type": "Fuse"}, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"}}
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
json.dump({"bos_token": None, "eos_token": None}, open(os.path.join(d, "tokenizer_config.json"), "w"))
PY
}

serve() {  # model, name, extra flags… ; sets URL and PID
  local model=$1 name=$2; shift 2
  .bin/dayone serve --model "$model" --backend cuda --dtype bf16 --port 0 --max-num-seqs 64 "$@" \
    >"$OUT/serve_$name.out" 2>"$OUT/serve_$name.err" &
  PID=$!
  for _ in $(seq 1 600); do
    URL=$(grep -o 'http://[0-9.:]*' "$OUT/serve_$name.out" 2>/dev/null | head -1)
    [ -n "$URL" ] && break
    kill -0 $PID 2>/dev/null || { echo "serve died"; tail -5 "$OUT/serve_$name.err"; return 1; }
    sleep 0.5
  done
  echo "ready: $URL ($(date -u +%T))"; tail -2 "$OUT/serve_$name.err"
}

stop() {
  kill -TERM $PID; wait $PID; echo "serve exit: $?"
}

bench() {  # name vocab
  local name=$1 vocab=$2
  for c in 1 16 64; do
    local n=$(( c == 1 ? 8 : 2 * c ))
    [ $c -eq 16 ] && n=64
    echo "== $name concurrency $c, $n prompts"
    timeout 240 .bin/dayone bench-serve --url "$URL" --dataset-name random --random-input-len 1024 \
      --random-output-len 256 --ignore-eos --random-vocab-size "$vocab" --num-prompts $n \
      --max-concurrency $c --seed 0 --disable-tqdm --save-result --result-dir "$OUT" \
      --result-filename "bench_${name}_c$c.json" 2>&1 | tee "$OUT/bench_${name}_c$c.txt" | grep -E "Successful|Failed|duration|Output token|Median|P99|Mean TTFT|Mean TPOT"
  done
  curl -s "$URL/metrics" > "$OUT/metrics_$name.txt"
}

case "$step" in
  llama)
    python3 - <<'PY' 2>&1 | tee "$OUT/ceilings.txt"
import torch, time
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
b.copy_(a); torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20): b.copy_(a)
torch.cuda.synchronize(); print(f"device copy 1 GiB: {2 * n * 20 / (time.perf_counter() - t) / 1e9:.0f} GB/s (read + write)")
PY
    [ -f /tmp/llama8b/config.json ] || PYTHONUNBUFFERED=1 python3 benches/gpu/torch_llama8b.py --save /tmp/llama8b \
      --attn sdpa --batch 1 --gen-len 4 2>&1 | grep -v Warning | tail -2
    tokenizer /tmp/llama8b 128256
    serve /tmp/llama8b llama8b || exit 1
    bench llama8b 128256
    stop ;;
  kimi)
    [ -f /tmp/kimi48b/model.safetensors ] || python3 benches/gpu/write_sparse_safetensors.py \
      benches/gpu/kimi48b_layout.json /tmp/kimi48b | tail -2
    tokenizer /tmp/kimi48b 163840
    serve /tmp/kimi48b kimi48b || exit 1
    bench kimi48b 163840
    stop ;;
  soak)
    [ -f /tmp/llama8b/config.json ] || PYTHONUNBUFFERED=1 python3 benches/gpu/torch_llama8b.py --save /tmp/llama8b \
      --attn sdpa --batch 1 --gen-len 4 2>&1 | grep -v Warning | tail -2
    tokenizer /tmp/llama8b 128256
    serve /tmp/llama8b soak || exit 1
    timeout 560 .bin/dayone bench-serve --url "$URL" --duration-minutes ${MINUTES:-6.5} --abort-fraction 0.1 --timeout 60 \
      --max-concurrency 64 --random-input-len 1024 --random-output-len 256 --ignore-eos \
      --random-vocab-size 128256 --server-pid $PID --seed 0 --disable-tqdm --save-result \
      --result-dir "$OUT" --result-filename soak_llama8b.json 2>&1 | tee "$OUT/soak_llama8b.txt" | tail -30
    echo "bench-serve exit: ${PIPESTATUS[0]}"
    stop ;;
  *) echo "usage: run_serve_bench.sh llama|kimi|soak" >&2; exit 2 ;;
esac
