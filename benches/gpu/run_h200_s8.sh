#!/usr/bin/env bash
# one H200 call (≤ 10 minutes): issue [14]'s figures (run_h200_final.sh), then the CUDA
# tests carried in .bin (conformance, graphs == eager, Kimi against transformers) for the same
# binaries, and the NVRTC cache for the next call. Carry [".bin", ".gl", ".kcache"].
bash benches/gpu/run_h200_final.sh
. benches/gpu/device_env.sh >/dev/null
echo "== tests $(date -u +%T)"; cuda_tests 70
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T
