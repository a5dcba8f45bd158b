#!/usr/bin/env bash
# one short H200 call (≈ 6 minutes) for issue [14]'s four figures when little device time is
# left: Llama-8B batch 1/8/64, Kimi-Linear-48B batch 1, WGSL beside CUDA on the 8B shape, the MoE
# block beside torch._grouped_mm, PyTorch's 8B decode; each line also in $OUT/summary.txt as it
# comes (a cut-off call keeps what ran). Carry [".bin", ".gl", ".kcache"].
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1; echo "kimi ckpt $(date -u +%T)" >> $OUT/w.txt ) &
w=$!
B=.bin/dayone
bench() { timeout 120 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
echo "== llama8b $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128 | say
echo "== moe $(date -u +%T)" | say; timeout 60 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens 64,512,8192 2>&1 | grep -v "^\s*$" | tail -4 | say
echo "== torch grouped_mm" | say; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm | say
wait $w; tail -1 $OUT/w.txt
echo "== kimi48b $(date -u +%T)" | say; bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48 | say
rm -rf /tmp/kimi48b
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
echo "== llama8b cuda b1, prompt 128 (beside WGSL) $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64 | say
echo "== llama8b wgsl b1 $(date -u +%T)" | say; LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary | say; tail -2 $OUT/wgsl_err.txt
echo "== torch llama8b $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_llama8b.py --batch 1 --attn sdpa --prompt-len 512 --gen-len 16 2>&1 | tail -2 | say
date -u +%T | say
exit 0
