#!/usr/bin/env bash
# One device call (≤ 10 minutes) for issue [14] and the Hopper `wgmma` grouped GEMM
# (kernels/moe_wgmma.cu, DAYONE_MOE_TILE=wg / wg128).
#   H200: run_s10.sh first (the four figures with the default settings), then the wgmma
#         tiles against the reference on every tile case and the MoE block with `wg`.
#   H100: the wgmma tiles against the reference, then the MoE block with wg, wg128 and the
#         default 128r beside torch._grouped_mm.
# Carry [".bin", ".gl", ".kcache"]; the bundle as for run_s10.sh.
. benches/gpu/device_env.sh
S=$OUT/summary.txt
say() { tee -a $S; }
h200=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -c H200)
moe() { DAYONE_MOE_TILE=$1 timeout 90 .bin/moe-bench --backend cuda --hidden 7168 --experts 256 --expert-dim 2048 --top-k 8 --groups 8 --topk-group 4 --shared 1 --tokens $2 2>&1 | grep -v "^\s*$" | tail -5; }
if [ "$h200" != 0 ]; then bash benches/gpu/run_s10.sh
  # The wgmma part only while the call has time left (≤ 10 minutes in all).
  [ $SECONDS -gt 450 ] && { echo "no time left for the wgmma part ($SECONDS s)" | say; exit 0; }; fi
echo "== cuda_conformance grouped_expert_tiles (wg, wg128 among the tiles) $(date -u +%T)" | say
timeout 150 .bin/test-kernels-cuda-cuda_conformance grouped_expert_tiles --test-threads 1 2>&1 | grep -E "test result|panicked|FAILED|rel err|moe_experts" | head -6 | say
tiles="wg wg128 128r"; [ "$h200" != 0 ] && tiles="wg"
for t in $tiles; do echo "== moe $t $(date -u +%T)" | say; moe $t 64,512,8192 | say; done
[ "$h200" = 0 ] && { echo "== torch grouped_mm $(date -u +%T)" | say; timeout 80 python3 benches/gpu/torch_deepseek.py --tokens 64,512,8192 2>&1 | grep grouped_mm | say; }
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T | say
