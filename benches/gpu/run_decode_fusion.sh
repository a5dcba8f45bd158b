#!/usr/bin/env bash
# one device call: [14] decode after linear_many (one GEMV launch per group of projections of one
# x) and the GEMV's weight prefetch before griddepcontrol.wait (Llama-8B, Kimi-Linear-48B shapes);
# the grouped expert GEMM tile variants beside torch._grouped_mm; [11] the FP8 expert GEMM; the
# CUDA tests of all of it.
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1; echo "ckpts $(date -u +%T)" >> $OUT/w.txt ) &
w=$!
B=.bin/dayone
DAYONE_LOG=info timeout 200 $B generate --backend cuda -m tests/fixtures/llama_tiny --dtype bf16 --prompt-ids 5,9,13 --max-tokens 4 2>&1 | grep -i "compiled\|error" | head -3
cuda_tests 200
wait $w; tail -1 $OUT/w.txt
bench() { timeout 200 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
echo "== llama8b graphs"; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128
echo "== kimi48b graphs"; bench -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48
echo "== kimi48b profile b1 (eager)"; DAYONE_CUDA_PROFILE=1 timeout 150 $B bench --backend cuda -m /tmp/kimi48b --batch 1 --prompt-len 16 --gen-len 64 --enforce-eager 2>&1 >/dev/null | grep -A24 DAYONE_CUDA_PROFILE
rm -rf /tmp/kimi48b /tmp/llama8b
for t in auto 16 32 64 128 128w; do
  echo "== moe DAYONE_MOE_TILE=$t"
  DAYONE_MOE_TILE=$t timeout 60 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens 1,64,512,8192 2>&1 | grep -v "^\s*$" | tail -6
done
echo "== fp8 mxfp4"; timeout 120 .bin/moe-bench --backend cuda --hidden 7168 --experts 384 --expert-dim 2048 --top-k 8 --experts-format mxfp4 --quant-path decode,fp8 --tokens 64,512,8192 2>&1 | grep -v "^\s*$" | tail -8
echo "== torch grouped_mm"; timeout 150 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm
tar czf $OUT/kcache.tgz -C $kc .
