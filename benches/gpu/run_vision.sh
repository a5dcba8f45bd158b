#!/usr/bin/env bash
# Issue [12] on the GPU machine: Kimi-K2.5's vision encoder on a 1024x1024 image (images/s, TFLOP/s)
# and the TTFT of that image + 100 text tokens, dayone (CUDA) beside transformers on the same card.
# Checkpoint: benches/gpu/kimi_k25_shape.py (K2.5's full vision tower + projector; a 2-layer
# Kimi-K2-wide text model with 16 routed experts; 8.4 GB bf16), written to $CKPT unless already there.
# Binaries from build_for_device.sh in .bin/ (carry [".bin", ".kcache"]: with the kernel cache no
# NVRTC compile, ≈ 53 s cold). Every step runs under `timeout` (235 s in all). Logs under $OUT.
#   usage: bash benches/gpu/run_vision.sh      ITERS (encoder calls, 20), TTFT_REPEATS (5),
#          TEXT_TOKENS (100), IMAGES_PER_CALL (1), SKIP_TORCH=1 (dayone only). A CPU dry run of the
#          same sequence: SHAPE=tiny BACKEND=cpu SIDE=224 BIN=target/release PYTHON=/work/venv/bin/python
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
export RUST_BACKTRACE=0
CKPT=${CKPT:-/tmp/kimi_k25_shape} IMG=${IMG:-/tmp/vision_1024.png}
ITERS=${ITERS:-20} REPEATS=${TTFT_REPEATS:-5} TEXT=${TEXT_TOKENS:-100} PER_CALL=${IMAGES_PER_CALL:-1}
SHAPE=${SHAPE:-k25} BACKEND=${BACKEND:-cuda} SIDE=${SIDE:-1024} BIN=${BIN:-.bin} PY=${PYTHON:-python3}
for f in "$BIN"/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
[ "$BIN" = .bin ] && chmod +x .bin/* 2>/dev/null
kc=${XDG_CACHE_HOME:-$HOME/.cache}/dayone
[ -f .kcache/cuda.tgz ] && mkdir -p "$kc" && tar xzf .kcache/cuda.tgz -C "$kc"
date -u | tee "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$OUT/env.txt"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/env.txt"

# A deterministic photo-like SIDE x SIDE RGB PNG (gradients, discs, noise); 1024: no resize, grid 74x74, 1369 tokens.
timeout 10 $PY - "$IMG" "$SIDE" <<'EOF'
import sys
import numpy as np
from PIL import Image, ImageDraw
n = int(sys.argv[2])
rng = np.random.default_rng(12)
y, x = np.mgrid[0:n, 0:n].astype(np.float32) * 1024 / n
rgb = np.stack([x / 4, y / 4, (x + y) / 8 % 256], -1) + rng.normal(0, 12, (n, n, 3))
im = Image.fromarray(rgb.clip(0, 255).astype(np.uint8))
d = ImageDraw.Draw(im)
for _ in range(40):
    cx, cy, r = rng.integers(0, n, 2).tolist() + [int(rng.integers(n // 100 + 1, n // 8 + 2))]
    d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=tuple(rng.integers(0, 256, 3).tolist()))
im.save(sys.argv[1])
EOF
echo "image: $IMG ($(stat -c %s "$IMG") bytes)"

if [ ! -f "$CKPT/config.json" ]; then
  timeout 50 $PY benches/gpu/kimi_k25_shape.py "$CKPT" --size "$SHAPE" 2>&1 | grep -v Warning | tee "$OUT/ckpt.json"
fi
echo "checkpoint ready: $(date -u)"

# dayone: the encoder alone, then TTFT of image + text (one run per repeat; the median is below).
timeout 50 "$BIN"/vision-bench --backend "$BACKEND" --model "$CKPT" --image "$IMG" --iters "$ITERS" \
  --images-per-call "$PER_CALL" --json 2>"$OUT/vision_bench_err.log" | tee "$OUT/dayone_encoder.jsonl"
tail -3 "$OUT/vision_bench_err.log"
lens=$(yes "$TEXT" | head -n "$REPEATS" | paste -sd,)
DAYONE_LOG=${DAYONE_LOG:-info} timeout 70 "$BIN"/dayone bench --backend "$BACKEND" --model "$CKPT" --image "$IMG" \
  --prompt-len "$lens" --gen-len 1 --json 2>"$OUT/dayone_bench_err.log" | tee "$OUT/dayone_ttft.jsonl" | cut -c1-200
grep -vE "^\s*$" "$OUT/dayone_bench_err.log" | tail -4
echo "dayone done: $(date -u)"

if [ -z "${SKIP_TORCH:-}" ]; then
  timeout 55 $PY benches/gpu/torch_kimi_k25.py "$CKPT" "$IMG" --iters "$ITERS" --images-per-call "$PER_CALL" \
    --text-tokens "$TEXT" --ttft-repeats "$REPEATS" --json 2>"$OUT/torch_err.log" | tee "$OUT/torch.jsonl"
  grep -vE "^\s*$|Warning|Loading" "$OUT/torch_err.log" | tail -4
fi

# One table: both sides' encoder and TTFT figures (dayone's TTFT = median of the repeats' runs).
$PY - "$OUT" <<'EOF' | tee "$OUT/summary.txt"
import json, os, statistics, sys
out = sys.argv[1]
def rows(name):
    p = os.path.join(out, name)
    return [json.loads(l) for l in open(p) if l.startswith("{")] if os.path.exists(p) else []
enc = rows("dayone_encoder.jsonl")
ttft = [r["ttft_median_s"] for r in rows("dayone_ttft.jsonl")]
torch = {r["measure"]: r for r in rows("torch.jsonl")}
print(f"{'':10}{'images/s':>10}{'TFLOP/s':>9}{'ms/call':>9}{'GFLOP/img':>11}{'TTFT s':>9}{'prompt':>8}")
if enc:
    e, t = enc[0], rows("dayone_ttft.jsonl")
    print(f"{'dayone':10}{e['images_per_s']:>10.2f}{e['tflops']:>9.1f}{e['ms_per_call_median']:>9.2f}"
          f"{e['gflop_per_image']:>11.1f}{statistics.median(ttft) if ttft else float('nan'):>9.4f}"
          f"{t[0]['prompt_tokens'] if t else '-':>8}")
    print(f"dayone host work per image: preprocess {e['preprocess_ms']:.1f} ms, "
          f"position-table resample {e['pos_emb_host_ms']:.1f} ms (first image of a grid size only; memoised)")
if torch:
    e, t = torch.get("encoder", {}), torch.get("ttft", {})
    print(f"{'torch':10}{e.get('images_per_s', float('nan')):>10.2f}{e.get('tflops', float('nan')):>9.1f}"
          f"{e.get('ms_per_call_median', float('nan')):>9.2f}{e.get('gflop_per_image', float('nan')):>11.1f}"
          f"{t.get('ttft_median_s', float('nan')):>9.4f}{t.get('prompt_tokens', '-'):>8}")
EOF
[ -d "$kc/cuda" ] && tar czf "$OUT/cuda.tgz" -C "$kc" cuda
date -u
