#!/usr/bin/env bash
# one device call: [11] gpt-oss-20b shape with experts kept MXFP4 (direct GEMV / decode into the
# workspace), decoded at load, and the FP8 expert GEMM for the 8K prefill; gpt-oss-120b shape
# (kept MXFP4); the FP8 expert GEMM's GPU test.
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env
echo "== cuda_moe_fp8"; timeout 200 .bin/test-kernels-cuda-cuda_moe_fp8 --nocapture 2>&1 | grep -E "^test |test result|panicked|rror|worst" | head -12
B=.bin/dayone
bench() { timeout 240 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
M=/tmp/gpt-oss-20b
python3 benches/gpu/write_gpt_oss.py 20b $M > $OUT/w20.txt 2>&1; tail -1 $OUT/w20.txt
echo "== 20b kept mxfp4"; bench -m $M --batch 1,32,64,1 --prompt-len 1024,1024,1024,8192 --gen-len 64
echo "== 20b --moe-fp8 (8K prefill)"; bench -m $M --batch 1 --prompt-len 8192 --gen-len 16 --moe-fp8
echo "== 20b --dequantize-at-load"; bench -m $M --batch 1,32,64,1 --prompt-len 1024,1024,1024,8192 --gen-len 64 --dequantize-at-load
grep -i "resident\|memory\|error" $OUT/bench_err.txt | tail -4
rm -rf $M
M=/tmp/gpt-oss-120b
python3 benches/gpu/write_gpt_oss.py 120b $M > $OUT/w120.txt 2>&1; tail -1 $OUT/w120.txt; df -h /tmp | tail -1
echo "== 120b kept mxfp4"; bench -m $M --batch 1,32,64,1 --prompt-len 1024,1024,1024,8192 --gen-len 64
echo "== 120b --moe-fp8 (8K prefill)"; bench -m $M --batch 1 --prompt-len 8192 --gen-len 16 --moe-fp8
tar czf $OUT/kcache.tgz -C $kc .
