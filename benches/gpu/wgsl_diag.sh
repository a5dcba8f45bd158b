. benches/gpu/device_env.sh >/dev/null 2>&1
mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
g=$(find / -xdev -name 'libGLX_nvidia.so*' 2>/dev/null | head -3); echo "glx: $g"; ls /usr/local/nvidia/lib64 2>/dev/null | grep -i -E "glx|vulkan|egl" | head
d=$(dirname "$(echo "$g" | head -1)")
export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu:$d:/usr/local/nvidia/lib64 VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
VK_LOADER_DEBUG=error,driver timeout 20 .bin/op-bench --list-matvec 2>&1 | grep -v "^r[48]t" | head -12
[ -n "$g" ] && [ ! -f /tmp/llama8b/model.safetensors ] && python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
if [ -n "$g" ]; then
  B=.bin/dayone
  echo "== wgsl b1"; timeout 90 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>$OUT/e.txt | bench_summary; tail -2 $OUT/e.txt
  echo "== wgsl profile"; DAYONE_WGSL_PROFILE=1 timeout 80 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 16 --gen-len 32 2>&1 >/dev/null | grep -A14 "^DAYONE_WGSL_PROFILE"
fi
