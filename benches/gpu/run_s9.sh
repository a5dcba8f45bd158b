#!/usr/bin/env bash
# One device call (≤ 10 minutes) for the fusions of 2026-12-07's fourth session — add_norm
# (Backend::linear_add_rms_norm: o_proj / down, the residual add and the next norm in one GEMV
# launch), kda_step (Backend::kda_from_projections: a KDA decode step in one launch) — and the
# rasterised MoE tiles (DAYONE_MOE_TILE=128r, 128xr). Items in order of need; every summary line
# also goes to $OUT/summary.txt as it comes, so a cut-off call keeps what ran.
#   H200: issue [14]'s four figures first (Llama-8B batch 1/8/64, Kimi-Linear-48B batch 1,
#         WGSL beside CUDA, the MoE block beside torch._grouped_mm), then the baselines without
#         the new fusions and the tiles.
#   H100: the CUDA tests of the new ops, Kimi-Linear-48B's first 14 layers with and without
#         kda_step, Llama-8B with and without add_norm, the tiles at 8 192 tokens.
# Carry [".bin", ".gl", ".kcache"].
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
B=.bin/dayone
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
moe() { DAYONE_MOE_TILE=$1 timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens $2 2>&1 | grep -v "^\s*$" | tail -5; }
OLD=rope_kv,moe_block,conv3,router_topk,router_norm   # the defaults
NEW=$OLD,add_norm,kda_step                            # with this session's fusions
export DAYONE_DECODE_FUSION=$NEW                      # the tests and the figures run them
if [ "$h200" != 0 ]; then KIMI=/tmp/kimi48b; KL=benches/gpu/kimi48b_layout.json
else KIMI=/tmp/kimi14; python3 benches/gpu/shallow_layout.py benches/gpu/kimi48b_layout.json 14 /tmp/kimi14.json; KL=/tmp/kimi14.json; fi
( python3 benches/gpu/write_sparse_safetensors.py benches/gpu/llama8b_layout.json /tmp/llama8b > $OUT/w.txt 2>&1
  touch /tmp/llama.done
  python3 benches/gpu/write_sparse_safetensors.py $KL $KIMI >> $OUT/w.txt 2>&1
  echo "ckpts $(date -u +%T)" >> $OUT/w.txt; touch /tmp/kimi.done ) &
waitf() { while [ ! -f $1 ]; do sleep 1; done; }
if [ "$h200" = 0 ]; then
  echo "== tests $(date -u +%T)" | say; fusion_tests 200 | say
  for t in "golden cuda 60" "cuda_conformance grouped_expert_tiles 60"; do
    set -- $t; b=$(ls .bin/test-*-$1 2>/dev/null | head -1); [ -n "$b" ] || continue
    echo "== $1 $2" | say; timeout $3 $b $2 --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED|differ|not bit" | head -5 | say
  done
  waitf /tmp/kimi.done
  for f in $NEW $OLD; do
    echo "== kimi14 DAYONE_DECODE_FUSION=$f $(date -u +%T)" | say
    DAYONE_DECODE_FUSION=$f bench -m $KIMI --batch 1 --prompt-len 512 --gen-len 48 | say
  done
  for f in $NEW $OLD; do
    echo "== llama8b DAYONE_DECODE_FUSION=$f $(date -u +%T)" | say
    DAYONE_DECODE_FUSION=$f bench -m /tmp/llama8b --batch 1,8 --prompt-len 512 --gen-len 128 | say
  done
  for t in 128 128r; do echo "== moe 8192 DAYONE_MOE_TILE=$t $(date -u +%T)" | say; moe $t 8192 | say; done
else
  echo "== decode_graphs $(date -u +%T)" | say; timeout 40 .bin/test-tests-decode_graphs cuda --test-threads 1 2>&1 | grep -E "test result|panicked" | say
  for g in golden golden_kimi; do echo "== $g cuda (fusions $NEW) $(date -u +%T)" | say
    timeout 60 .bin/test-tests-$g cuda --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED" | head -4 | say; done
  waitf /tmp/llama.done
  echo "== llama8b DAYONE_DECODE_FUSION=$NEW $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1,8,64 --prompt-len 512 --gen-len 128 | say
  waitf /tmp/kimi.done
  echo "== kimi48b DAYONE_DECODE_FUSION=$NEW $(date -u +%T)" | say; bench -m $KIMI --batch 1 --prompt-len 512 --gen-len 48 | say
  mkdir -p /tmp/vk && for d in .gl/*.deb; do dpkg -x "$d" /tmp/vk; done
  echo "== llama8b cuda b1, prompt 128 (beside WGSL) $(date -u +%T)" | say; bench -m /tmp/llama8b --batch 1 --prompt-len 128 --gen-len 64 | say
  echo "== llama8b wgsl b1 $(date -u +%T)" | say; LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp \
    timeout 100 $B bench -m /tmp/llama8b --backend wgsl --batch 1 --prompt-len 128 --gen-len 64 --json 2>>$OUT/wgsl_err.txt | bench_summary | say; tail -2 $OUT/wgsl_err.txt
  echo "== moe auto $(date -u +%T)" | say; moe auto 64,512,8192 | say
  echo "== torch grouped_mm $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm | say
  echo "== kimi48b DAYONE_DECODE_FUSION=$OLD $(date -u +%T)" | say; DAYONE_DECODE_FUSION=$OLD bench -m $KIMI --batch 1 --prompt-len 512 --gen-len 48 | say
  echo "== llama8b DAYONE_DECODE_FUSION=$OLD $(date -u +%T)" | say; DAYONE_DECODE_FUSION=$OLD bench -m /tmp/llama8b --batch 1,8 --prompt-len 512 --gen-len 128 | say
  echo "== moe 8192 DAYONE_MOE_TILE=128r $(date -u +%T)" | say; moe 128r 8192 | say
  echo "== torch llama8b $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_llama8b.py --batch 1 --attn sdpa --prompt-len 512 --gen-len 16 2>&1 | tail -2 | say
fi
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T | say
