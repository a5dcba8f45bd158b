#!/usr/bin/env bash
# one H200 call (≤ 9 minutes): issue [14]'s figures (run_h200_final.sh), the fused decode MoE
# block's variants (run_moe_dec_sweep.sh) and the NVRTC cache for the next call (the tests:
# `. benches/gpu/device_env.sh; cuda_tests 200`). Carry [".bin", ".gl", ".kcache"].
bash benches/gpu/run_h200_final.sh
. benches/gpu/device_env.sh >/dev/null
echo "== moe decode variants $(date -u +%T)"; . benches/gpu/run_moe_dec_sweep.sh
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T
