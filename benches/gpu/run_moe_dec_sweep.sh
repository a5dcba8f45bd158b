#!/usr/bin/env bash
# The fused decode MoE block's kernel variants (DAYONE_MOE_DEC, kernels/moe_decode.cu) timed
# alone: `moe-bench --shared-fused` (router + the block's two launches, eager) at Kimi-Linear's
# shape (D 2304, 256 × 1024, top-8, one group) and DeepSeek-V3's (D 7168, 256 × 2048, top-8 of
# 4/8 groups; SWEEP_DEEPSEEK=1, its 22.5 GB of experts take a while to upload), 1 and 4
# tokens; then the router alone (moe-bench --route-only) with and without router_topk. Sourced
# after device_env.sh (or run alone: ≈ 1 minute).
[ -n "${OUT:-}" ] && [ -x .bin/moe-bench ] || . benches/gpu/device_env.sh
for v in gu,dn gu_u3b4,dn gu,dn_r2b4 gu,dn_r1b4 gu_b3,dn_b3 gu_u3b4,dn_r2b4 gu,dn; do
  k=$(DAYONE_MOE_DEC=$v timeout 60 .bin/moe-bench --backend cuda --shared-fused --hidden 2304 --experts 256 --expert-dim 1024 --top-k 8 --groups 1 --topk-group 1 --shared 1 --tokens 1,4 --json 2>&1 | python3 -c '
import json, sys
print(" ".join("t%d %.1f us %.0f GB/s" % (d["tokens"], d["ms"] * 1e3, d["weight_gbps"]) for d in map(json.loads, filter(lambda l: l.startswith("{"), sys.stdin))))')
  s=skipped; [ -n "${SWEEP_DEEPSEEK:-}" ] && s=$(DAYONE_MOE_DEC=$v timeout 60 .bin/moe-bench --backend cuda --shared-fused --tokens 1 --json 2>&1 | python3 -c '
import json, sys
print(" ".join("t%d %.1f us %.0f GB/s" % (d["tokens"], d["ms"] * 1e3, d["weight_gbps"]) for d in map(json.loads, filter(lambda l: l.startswith("{"), sys.stdin))))')
  echo "DAYONE_MOE_DEC=$v  kimi: $k  deepseek: $s"
done
# The router alone at Kimi's shape (GEMV + top-k, one launch with router_topk; two without).
for f in default rope_kv,moe_block,conv3; do
  r=$( (if [ $f = default ]; then unset DAYONE_DECODE_FUSION; else export DAYONE_DECODE_FUSION=$f; fi
        timeout 60 .bin/moe-bench --backend cuda --route-only --hidden 2304 --experts 256 --expert-dim 1024 --top-k 8 --groups 1 --topk-group 1 --tokens 1,4 --json 2>&1) | python3 -c '
import json, sys
print(" ".join("t%d %.1f us" % (d["tokens"], d["ms"] * 1e3) for d in map(json.loads, filter(lambda l: l.startswith("{"), sys.stdin))))')
  echo "router alone, DAYONE_DECODE_FUSION=$f: $r"
done
