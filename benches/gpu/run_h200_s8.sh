#!/usr/bin/env bash
# one H200 call (≤ 10 minutes): the CUDA tests of the new fusions (while the checkpoints are
# written), issue [14]'s figures (run_h200_final.sh), the fused decode MoE block's variants
# (run_moe_dec_sweep.sh) and the NVRTC cache for the next call. SKIP_TESTS=1: no tests. Carry [".bin", ".gl", ".kcache"].
. benches/gpu/device_env.sh
# Checkpoints written while the tests run (the tests barely touch the copy engines).
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1
  echo "ckpts $(date -u +%T)" >> $OUT/w.txt; touch /tmp/ckpt.done ) &
w=$!
echo "== tests $(date -u +%T)"; [ -z "${SKIP_TESTS:-}" ] && fusion_tests 200
wait $w; tail -1 $OUT/w.txt
bash benches/gpu/run_h200_final.sh
echo "== moe decode variants $(date -u +%T)"; . benches/gpu/run_moe_dec_sweep.sh
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T
