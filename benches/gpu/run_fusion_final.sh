#!/usr/bin/env bash
# one device call: [14] decode after the launch fusions (add_rms_norm with the pending residual,
# rope_pair, gemv_glu, short_conv_decode, the small-step MoE routing kernels) on the Llama-8B and
# Kimi-Linear-48B shapes; [11] the direct low-bit expert kernel with staged activations
# (gpt-oss-20b shape); the CUDA tests of all of it.
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1
  python3 benches/gpu/write_gpt_oss.py 20b /tmp/gpt-oss-20b >> $OUT/w.txt 2>&1; echo "ckpts $(date -u +%T)" >> $OUT/w.txt ) &
w=$!
B=.bin/dayone
DAYONE_LOG=info timeout 200 $B generate --backend cuda -m tests/fixtures/llama_tiny --dtype bf16 --prompt-ids 5,9,13 --max-tokens 4 2>&1 | grep -i "compiled\|error" | head -3
cuda_tests 120
wait $w; tail -1 $OUT/w.txt
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
echo "== llama8b"; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128
echo "== kimi48b"; bench -m /tmp/kimi48b --batch 1,16 --prompt-len 512,512 --gen-len 48
echo "== gpt-oss-20b"; bench -m /tmp/gpt-oss-20b --batch 1,32,64 --prompt-len 1024 --gen-len 32
echo "== moe-bench gpt-oss-20b shape"; timeout 60 .bin/moe-bench --backend cuda --hidden 2880 --experts 32 --expert-dim 2880 --top-k 4 --groups 1 --topk-group 1 --shared 0 --experts-format mxfp4 --quant-path direct,decode --tokens 1,8,32,64 2>&1 | grep -v "^\s*$" | tail -9
echo "== kimi48b profile b1 (eager)"; DAYONE_CUDA_PROFILE=1 timeout 60 $B bench --backend cuda -m /tmp/kimi48b --batch 1 --prompt-len 16 --gen-len 32 --enforce-eager 2>&1 >/dev/null | grep -A16 DAYONE_CUDA_PROFILE
