#!/usr/bin/env bash
# one short device call on an H200 (≤ 150 s of device time): Llama-8B CUDA batch 1/8/64 and
# WGSL through Vulkan beside CUDA at batch 1 — two of issue [14]'s figures when little device
# time is left. Carry [".bin", ".gl", ".kcache"] (dayone only in .bin).
. benches/gpu/device_env.sh
python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
B=.bin/dayone
bench() { timeout 60 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
echo "== llama8b $(date -u +%T)"; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 64
echo "== llama8b cuda b1, prompt 128 (beside WGSL)"; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 32
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
echo "== llama8b wgsl b1 $(date -u +%T)"; LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
  timeout 60 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 32 --json 2>>$OUT/wgsl_err.txt | bench_summary; tail -2 $OUT/wgsl_err.txt
date -u +%T
