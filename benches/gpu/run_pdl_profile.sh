#!/usr/bin/env bash
# one device call: [14] kernel boundaries under programmatic dependent launch (each kernel lets
# the next one's blocks in right after its own wait) and where a decode step's time goes
# (DAYONE_CUDA_PROFILE=1 per-kernel table), Llama-8B and Kimi-Linear-48B shapes; the CUDA checks
# of the changes not yet run on a GPU (decode graphs, gpt-oss, conformance).
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1; echo "ckpts $(date -u +%T)" >> $OUT/w.txt ) &
w=$!
B=.bin/dayone
# the first load compiles every kernel into the disk cache (common.cuh changed)
DAYONE_LOG=info timeout 200 $B generate --backend cuda -m tests/fixtures/llama_tiny --dtype bf16 --prompt-ids 5,9,13 --max-tokens 4 2>&1 | grep -i "compiled\|error" | head -3
cuda_tests 200
wait $w; tail -1 $OUT/w.txt
bench() { timeout 200 $B bench --backend cuda --json "$@" 2>$OUT/err_$RANDOM.txt | bench_summary; }
echo "== llama8b graphs, PDL early trigger"; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128
echo "== llama8b graphs, PDL off"; DAYONE_CUDA_PDL=0 bench -m /tmp/llama8b --batch 1,8 --prompt-len 512 --gen-len 128
echo "== llama8b profile b1 (eager)"; DAYONE_CUDA_PROFILE=1 timeout 120 $B bench --backend cuda -m /tmp/llama8b --batch 1 --prompt-len 16 --gen-len 64 --enforce-eager 2>&1 >/dev/null | grep -A25 DAYONE_CUDA_PROFILE
echo "== kimi48b graphs, PDL early trigger"; bench -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48
echo "== kimi48b profile b1 (eager)"; DAYONE_CUDA_PROFILE=1 timeout 150 $B bench --backend cuda -m /tmp/kimi48b --batch 1 --prompt-len 16 --gen-len 64 --enforce-eager 2>&1 >/dev/null | grep -A40 DAYONE_CUDA_PROFILE
tar czf $OUT/kcache.tgz -C $kc .
