#!/usr/bin/env bash
# one device call: [14] the small-step MoE path (moe_sort's block scan and stable rank, the
# warp-per-row grouped GEMV, the column-split combine, the router GEMV reading bf16 x): its GPU
# tests, moe-bench of the Kimi-Linear-48B MoE block at decode sizes, and the kimi48b batch-1
# per-kernel profile (moe_sort / moe_gemv_*_m1 / moe_combine / gemv_xbf16_f32 rows). Build with
# build_for_device.sh; carry [".bin", ".kcache"].
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env
echo "== cuda_mla_moe: decode steps, fused router cast, every expert path, routing"
timeout 300 .bin/test-kernels-cuda-cuda_mla_moe moe_ --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|rel err|rror" | head -30 | tee "$OUT/moe_tests.txt"
echo "== cuda_conformance: grouped_expert_tiles, biased experts, batch-invariant mode, the suite"
timeout 300 .bin/test-kernels-cuda-cuda_conformance --nocapture 2>&1 \
  | grep -E "^test |test result|panicked|rel err|rror" | head -30 | tee -a "$OUT/moe_tests.txt"
echo "== moe-bench, Kimi-Linear-48B MoE block"
timeout 120 .bin/moe-bench --backend cuda --hidden 2304 --experts 256 --expert-dim 1024 \
  --top-k 8 --groups 1 --topk-group 1 --shared 1 --tokens 1,2,4,8 2>&1 | grep -v "^\s*$" \
  | tee "$OUT/moe_bench.txt"
if [ -d /tmp/kimi48b ] || python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b > "$OUT/w.txt" 2>&1; then
  echo "== kimi48b graphs b1"
  timeout 200 .bin/dayone bench --backend cuda -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48 2>&1 | tail -5
  echo "== kimi48b profile b1 (eager)"
  DAYONE_CUDA_PROFILE=1 timeout 150 .bin/dayone bench --backend cuda -m /tmp/kimi48b --batch 1 \
    --prompt-len 16 --gen-len 64 --enforce-eager 2>&1 >/dev/null | grep -A40 DAYONE_CUDA_PROFILE
fi 2>&1 | tee "$OUT/kimi48b.txt"
tar czf "$OUT/kcache.tgz" -C "$kc" .
