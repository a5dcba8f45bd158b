#!/usr/bin/env bash
# Binaries from benches/gpu/build_for_device.sh in .bin/ (gzip or xz), NVRTC cache in .kcache/cuda.tgz;
# carry [".bin", ".kcache"] (and ".gl" with the Vulkan loader debs for the WGSL run).
# one device call: [14] decode graphs (parity, Llama-8B shape with and without, beside PyTorch),
# WGSL through Vulkan with 16-bit weights; [11] gpt-oss attention on the tensor-core kernel
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}; mkdir -p $OUT
for f in .bin/*.xz; do [ -e "$f" ] && unxz -f "$f"; done; for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done; chmod +x .bin/*
kc=$HOME/.cache/dayone; mkdir -p $kc; [ -f .kcache/cuda.tgz ] && tar xzf .kcache/cuda.tgz -C $kc
export NCCL_NVLS_ENABLE=0 DAYONE_FIXTURES=$PWD/tests/fixtures RUST_BACKTRACE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w8b.txt 2>&1
  python3 benches/gpu/write_gpt_oss.py 20b /tmp/gpt-oss-20b > $OUT/w20.txt 2>&1; echo "ckpts $(date -u +%T)" >> $OUT/w8b.txt ) &
w=$!
{
for t in .bin/test-*; do
  case $t in *kernels-cuda*) filter="";; *) filter=cuda;; esac
  echo "== $t"; timeout 150 $t $filter --test-threads 1 2>&1 | grep -E "^test |test result|panicked|rel err|rror|differ" | head -40
done
} > $OUT/tests.txt 2>&1
grep -E "^==|test result|FAILED|panicked|differ|did not" $OUT/tests.txt | head -30
wait $w; tail -2 $OUT/w8b.txt
B=.bin/dayone
j() { python3 -c '
import json,sys
for l in sys.stdin:
    if l.startswith("{"):
        d=json.loads(l); print(d["backend"][:5], d.get("weight_dtype"), d["batch"], d["prompt_len"], "decode %.1f tok/s" % d["decode_tokens_per_s"], "tpot %.2f ms" % (1e3*d["tpot_median_s"]), "roof %.3f" % d["roofline_fraction"], "ttft %.3f s" % d["ttft_median_s"], "ceiling %.0f" % d["roofline_gbps"])'; }
{
echo "== llama8b cuda graphs"; DAYONE_LOG=info timeout 150 $B bench -m /tmp/llama8b --backend cuda --batch 1,8,64 --prompt-len 512 --gen-len 128 --json 2>$OUT/g_err.txt | tee $OUT/llama_graphs.jsonl | j; grep -i "eager\|graph" $OUT/g_err.txt | head -3
echo "== llama8b cuda eager"; timeout 150 $B bench -m /tmp/llama8b --backend cuda --batch 1,8,64 --prompt-len 512 --gen-len 128 --json --enforce-eager 2>/dev/null | tee $OUT/llama_eager.jsonl | j
} 2>&1 | tee $OUT/llama.txt
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
{
echo "== llama8b wgsl (vulkan, auto dtype)"; LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 200 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 32 --json 2>$OUT/wgsl_err.txt | tee $OUT/llama_wgsl.jsonl | j; tail -2 $OUT/wgsl_err.txt
} 2>&1 | tee $OUT/wgsl.txt
{
echo "== gpt-oss-20b"; timeout 150 $B bench -m /tmp/gpt-oss-20b --backend cuda --batch 1,32,64,1 --prompt-len 1024,1024,1024,8192 --gen-len 64 --json 2>/dev/null | tee $OUT/gpt_oss.jsonl | j
} 2>&1 | tee $OUT/gptoss.txt
echo "== torch llama8b sdpa b1"; timeout 120 python3 benches/gpu/torch_llama8b.py --batch 1,8 --attn sdpa --prompt-len 512 --gen-len 64 --json $OUT/torch.json 2>&1 | grep -v Warn | tail -3
tar czf $OUT/kcache.tgz -C $kc .
