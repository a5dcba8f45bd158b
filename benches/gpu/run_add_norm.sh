#!/usr/bin/env bash
# one call (≤ 10 minutes) for the add_norm fusion (Backend::linear_add_rms_norm: o_proj / down,
# the residual add and the next norm in one GEMV launch): its CUDA tests (the conformance suite
# with every fusion on and off, graphs == eager, the goldens against transformers), then the
# Llama-8B shape at batch 1 and 8 with and without it, alternating. On an H200 the rest of
# issue [14]'s figures follow (run_h200_final.sh). Carry [".bin", ".gl", ".kcache"].
. benches/gpu/device_env.sh
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
# The checkpoints while the tests run: Llama-8B's, then on an H200 Kimi-Linear-48B's.
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  touch /tmp/llama.done
  if [ "$h200" != 0 ]; then
    python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b >> $OUT/w.txt 2>&1
    echo "ckpts $(date -u +%T)" >> $OUT/w.txt; touch /tmp/ckpt.done
  fi ) &
echo "== tests $(date -u +%T)"
if [ "$h200" = 0 ]; then
  fusion_tests 200; tests="golden cuda 60,decode_graphs cuda 40,cuda_conformance grouped_expert_tiles 60"
else
  tests="decode_graphs cuda 40"  # an H200 call keeps its minutes for the figures
fi
IFS=, read -ra tl <<< "$tests"
for t in "${tl[@]}"; do
  set -- $t; b=$(ls .bin/test-*-$1 2>/dev/null | head -1); [ -n "$b" ] || continue
  echo "== $1 $2"; timeout $3 $b $2 --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED|differ|not bit" | head -5
done
while [ ! -f /tmp/llama.done ]; do sleep 1; done
B=.bin/dayone
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
NO_ADD=rope_kv,moe_block,conv3,router_topk,router_norm
LB=1,8; [ "$h200" != 0 ] && LB=1,8,64
for i in $(seq $((2 - h200))); do
  echo "== llama8b default $(date -u +%T)"; bench -m /tmp/llama8b --batch $LB --prompt-len 512 --gen-len 128
  echo "== llama8b DAYONE_DECODE_FUSION=$NO_ADD $(date -u +%T)"; DAYONE_DECODE_FUSION=$NO_ADD bench -m /tmp/llama8b --batch 1,8 --prompt-len 512 --gen-len 128
done
# The MoE block at 8 192 tokens with its 128-row tiles rasterised (128r, 128xr) or not, beside
# torch._grouped_mm.
echo "== moe tiles, 8192 tokens $(date -u +%T)"
for t in 128 128r 128xr; do
  echo "-- DAYONE_MOE_TILE=$t"; DAYONE_MOE_TILE=$t timeout 60 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens 8192 2>&1 | grep -v "^\s*$" | tail -2
done
[ "$h200" = 0 ] && timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 8192 2>&1 | grep grouped_mm
if [ "$h200" != 0 ]; then
  wait; tail -1 $OUT/w.txt
  SKIP_LLAMA=1 SKIP_KIMI_BASE=1 bash benches/gpu/run_h200_final.sh
fi
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T
