#!/usr/bin/env bash
# Binaries from benches/gpu/build_for_device.sh in .bin/ (gzip or xz), NVRTC cache in .kcache/cuda.tgz;
# carry [".bin", ".kcache"] (and ".gl" with the Vulkan loader debs for the WGSL run).
# one device call: [14] decode graphs on recurrent and MLA models (parity), Kimi-Linear-48B
# shape batch-1 decode with graphs and eager
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}; mkdir -p $OUT
for f in .bin/*.xz; do [ -e "$f" ] && unxz -f "$f"; done; for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done; chmod +x .bin/*
kc=$HOME/.cache/dayone; mkdir -p $kc; [ -f .kcache/cuda.tgz ] && tar xzf .kcache/cuda.tgz -C $kc
export NCCL_NVLS_ENABLE=0 DAYONE_FIXTURES=$PWD/tests/fixtures RUST_BACKTRACE=0
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b > /dev/null 2>&1; echo "ckpt $(date -u +%T)" ) &
w=$!
{
for t in .bin/test-*; do
  case $t in *kernels-cuda*) filter="";; *) filter=cuda;; esac
  echo "== $t"; timeout 120 $t $filter --test-threads 1 --nocapture 2>&1 | grep -E "^test |test result|panicked|rel err|rror|differ|captures" | head -40
done
} > $OUT/tests.txt 2>&1
cat $OUT/tests.txt | grep -E "^==|test result|FAILED|panicked|differ|captures|did not" | head -40
wait $w
j() { python3 -c '
import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        d=json.loads(l); print(d["batch"], d["prompt_len"], "decode %.1f tok/s" % d["decode_tokens_per_s"], "tpot %.3f/%.3f ms" % (1e3*d["tpot_median_s"], 1e3*d["tpot_p99_s"]), "roof %.3f" % d["roofline_fraction"], "bytes %.3e" % d["decode_bytes_per_step_avg"], "ceiling %.0f" % d["roofline_gbps"])'; }
echo "== kimi48b graphs"; DAYONE_LOG=info timeout 200 .bin/dayone bench --backend cuda -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48 --json 2>$OUT/kg_err.txt | tee $OUT/kimi_graphs.jsonl | j; grep -i "eager\|graph\|loaded" $OUT/kg_err.txt | head -3
echo "== kimi48b eager"; timeout 200 .bin/dayone bench --backend cuda -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48 --json --enforce-eager 2>/dev/null | tee $OUT/kimi_eager.jsonl | j
