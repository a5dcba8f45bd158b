#!/usr/bin/env bash
# one device call: WGSL through Vulkan on the Llama-8B shape beside CUDA on the same card (the
# trimmed run_wgsl_sweep.sh), finding the NVIDIA Vulkan ICD wherever the machine keeps it.
. benches/gpu/device_env.sh
python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1 &
w=$!
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
icd=$(find /usr/local/nvidia /usr/share/vulkan /etc/vulkan /usr/lib/x86_64-linux-gnu /usr/local/share -name 'nvidia_icd*.json' 2>/dev/null | head -1)
echo "icd: ${icd:-none}"; [ -n "$icd" ] && cat "$icd" | head -8
if [ -z "$icd" ]; then
  lib=$(find / -xdev \( -name 'libGLX_nvidia.so.0' -o -name 'libnvidia-vulkan-producer.so*' \) 2>/dev/null | head -3); echo "libs: $lib"
  glx=$(find / -xdev -name 'libGLX_nvidia.so.0' 2>/dev/null | head -1)
  [ -n "$glx" ] && { icd=/tmp/nvidia_icd.json; printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s","api_version":"1.3.0"}}\n' "$glx" > $icd; }
fi
export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=$icd XDG_RUNTIME_DIR=/tmp
wait $w
B=.bin/dayone
wbench() { timeout 90 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json "$@" 2>>$OUT/wgsl_err.txt | bench_summary; }
echo "== llama8b cuda b1"; timeout 90 $B bench -m /tmp/llama8b --backend cuda --batch 1 --prompt-len 128 --gen-len 64 --json 2>/dev/null | bench_summary
echo "== llama8b wgsl b1 (default variant)"; wbench; tail -1 $OUT/wgsl_err.txt
echo "== wgsl profile"; DAYONE_WGSL_PROFILE=1 timeout 90 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 16 --gen-len 32 2>&1 >/dev/null | grep -A14 "^DAYONE_WGSL_PROFILE"
echo "== llama8b wgsl wg64"; DAYONE_WGSL_MATVEC=wg64 wbench
echo "== llama8b wgsl SUBMIT_OPS=32"; DAYONE_WGSL_SUBMIT_OPS=32 wbench
tail -2 $OUT/wgsl_err.txt
