#!/usr/bin/env bash
# one device call: [14] decode graphs on recurrent and MLA models (parity), Kimi-Linear-48B
# shape batch-1 decode with graphs and eager
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b > /dev/null 2>&1; echo "ckpt $(date -u +%T)" ) &
w=$!
cuda_tests
wait $w
echo "== kimi48b graphs"; DAYONE_LOG=info timeout 200 .bin/dayone bench --backend cuda -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48 --json 2>$OUT/kg_err.txt | tee $OUT/kimi_graphs.jsonl | bench_summary; grep -i "eager\|graph\|loaded" $OUT/kg_err.txt | head -3
echo "== kimi48b eager"; timeout 200 .bin/dayone bench --backend cuda -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48 --json --enforce-eager 2>/dev/null | tee $OUT/kimi_eager.jsonl | bench_summary
