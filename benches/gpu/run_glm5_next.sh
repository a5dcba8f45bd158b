#!/usr/bin/env bash
# Issue [13] on the GPU machine: a reduced-depth glm5_next at the released widths
# (glm5_next_layout.json: KDA, KDA, MLA+indexer full, MLA+indexer shared, KDA, KDA; two MoE
# layers of 288 experts) — decode at batch 1 and 64 with the roofline fraction, prefill at 32K
# and 128K, cache bytes per token. Binaries from build_for_device.sh in .bin/ (carry [".bin"]).
#   usage: bash benches/gpu/run_glm5_next.sh        GLM_PROMPTS / GLM_BATCHES override the runs
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
kc=${XDG_CACHE_HOME:-$HOME/.cache}/dayone
[ -f .kcache/cuda.tgz ] && mkdir -p "$kc" && tar xzf .kcache/cuda.tgz -C "$kc"
ckpt=/tmp/glm5_next_shape
[ -f $ckpt/config.json ] || python3 benches/gpu/write_sparse_safetensors.py benches/gpu/glm5_next_layout.json $ckpt | tee "$OUT/glm5_ckpt.txt"
echo "checkpoint written: $(date -u)"
.bin/dayone info -m $ckpt 2>&1 | tee "$OUT/glm5_info.txt"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/glm5_mem.csv" &
smi=$!
DAYONE_LOG=${DAYONE_LOG:-info} .bin/dayone bench --backend cuda --model $ckpt \
  --batch "${GLM_BATCHES:-1,64,1,1}" --prompt-len "${GLM_PROMPTS:-1024,1024,32K,128K}" --gen-len 32 \
  --max-batched-tokens 16384 --kv-cache-tokens 262144 --json 2>"$OUT/glm5_err.log" | tee "$OUT/glm5_next.jsonl"
kill $smi 2>/dev/null
grep -vE "^\s*$" "$OUT/glm5_err.log" | tail -6
echo "peak GPU memory MiB: $(sort -n "$OUT/glm5_mem.csv" | tail -1)"
