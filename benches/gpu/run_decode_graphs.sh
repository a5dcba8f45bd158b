#!/usr/bin/env bash
# one device call: [14] decode graphs (parity, Llama-8B shape with and without, beside PyTorch),
# WGSL through Vulkan with 16-bit weights; [11] gpt-oss attention on the tensor-core kernel
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w8b.txt 2>&1
  python3 benches/gpu/write_gpt_oss.py 20b /tmp/gpt-oss-20b > $OUT/w20.txt 2>&1; echo "ckpts $(date -u +%T)" >> $OUT/w8b.txt ) &
w=$!
cuda_tests
wait $w; tail -2 $OUT/w8b.txt
B=.bin/dayone
{
echo "== llama8b cuda graphs"; DAYONE_LOG=info timeout 150 $B bench -m /tmp/llama8b --backend cuda --batch 1,8,64 --prompt-len 512 --gen-len 128 --json 2>$OUT/g_err.txt | tee $OUT/llama_graphs.jsonl | bench_summary; grep -i "eager\|graph" $OUT/g_err.txt | head -3
echo "== llama8b cuda eager"; timeout 150 $B bench -m /tmp/llama8b --backend cuda --batch 1,8,64 --prompt-len 512 --gen-len 128 --json --enforce-eager 2>/dev/null | tee $OUT/llama_eager.jsonl | bench_summary
} 2>&1 | tee $OUT/llama.txt
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
{
echo "== llama8b wgsl (vulkan, auto dtype)"; LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 200 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 32 --json 2>$OUT/wgsl_err.txt | tee $OUT/llama_wgsl.jsonl | bench_summary; tail -2 $OUT/wgsl_err.txt
} 2>&1 | tee $OUT/wgsl.txt
{
echo "== gpt-oss-20b"; timeout 150 $B bench -m /tmp/gpt-oss-20b --backend cuda --batch 1,32,64,1 --prompt-len 1024,1024,1024,8192 --gen-len 64 --json 2>/dev/null | tee $OUT/gpt_oss.jsonl | bench_summary
} 2>&1 | tee $OUT/gptoss.txt
echo "== torch llama8b sdpa b1"; timeout 120 python3 benches/gpu/torch_llama8b.py --batch 1,8 --attn sdpa --prompt-len 512 --gen-len 64 --json $OUT/torch.json 2>&1 | grep -v Warn | tail -3
tar czf $OUT/kcache.tgz -C $kc .
