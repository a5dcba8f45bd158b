#!/usr/bin/env bash
# Issue [13] on the GPU machine: a reduced-depth glm5_next at the released widths
# (glm5_next_layout.json: KDA, KDA, MLA+indexer full, MLA+indexer shared, KDA, KDA; two MoE
# layers of 288 experts) — decode at batch 1 and 64 with the roofline fraction, prefill at 32K
# and 128K, cache bytes per token. Binaries from build_for_device.sh in .bin/ (carry [".bin"]).
# Each group of runs is its own `dayone bench` under its own time limit, so a slow prefill
# cannot take the decode figures down with it.
#   usage: bash benches/gpu/run_glm5_next.sh
#   GLM_GROUPS="batches/prompts ..." (default "1,64/1024,1024 1,1/32K,128K"), GLM_LIMIT_S (300)
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
for f in .bin/*.xz; do [ -e "$f" ] && unxz -f "$f"; done
chmod +x .bin/* 2>/dev/null
kc=${XDG_CACHE_HOME:-$HOME/.cache}/dayone
[ -f .kcache/cuda.tgz ] && mkdir -p "$kc" && tar xzf .kcache/cuda.tgz -C "$kc"
ckpt=/tmp/glm5_next_shape
[ -f $ckpt/config.json ] || python3 benches/gpu/write_sparse_safetensors.py benches/gpu/glm5_next_layout.json $ckpt > "$OUT/glm5_ckpt.txt"
echo "checkpoint written: $(date -u)"
.bin/dayone info -m $ckpt 2>&1 | tee "$OUT/glm5_info.txt"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 > "$OUT/glm5_mem.csv" &
smi=$!
for group in ${GLM_GROUPS:-1,64/1024,1024 1,1/32K,128K}; do
  echo "== bench --batch ${group%/*} --prompt-len ${group#*/} ($(date -u +%T))"
  DAYONE_LOG=${DAYONE_LOG:-info} timeout "${GLM_LIMIT_S:-300}" .bin/dayone bench --backend cuda \
    --model $ckpt --batch "${group%/*}" --prompt-len "${group#*/}" --gen-len 32 \
    --max-batched-tokens 16384 --kv-cache-tokens 262144 --json 2>>"$OUT/glm5_err.log" \
    | tee -a "$OUT/glm5_next.jsonl"
  echo "exit ${PIPESTATUS[0]}"
done
kill $smi 2>/dev/null
grep -vE "^\s*$" "$OUT/glm5_err.log" | tail -8
echo "peak GPU memory MiB: $(sort -n "$OUT/glm5_mem.csv" | tail -1)"
