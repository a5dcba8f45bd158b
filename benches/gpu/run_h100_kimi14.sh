#!/usr/bin/env bash
# one call on an H100 (≈ 5 minutes): the CUDA tests carried in .bin, then Kimi-Linear-48B's
# first 14 layers (shallow_layout.py: the full model's layer shapes, 50 GB) at batch 1 with
# the default fusions, without router_norm, with gated_norm on; the fused decode MoE block's
# variants (run_moe_dec_sweep.sh). Carry [".bin", ".kcache"].
. benches/gpu/device_env.sh
python3 benches/gpu/shallow_layout.py benches/gpu/kimi48b_layout.json 14 /tmp/kimi14.json
( python3 benches/gpu/write_sparse_safetensors.py /tmp/kimi14.json /tmp/kimi48b > $OUT/w.txt 2>&1; echo "ckpt $(date -u +%T)" >> $OUT/w.txt ) &
w=$!
echo "== tests $(date -u +%T)"; fusion_tests 180
wait $w; tail -1 $OUT/w.txt
B=.bin/dayone
bench() { timeout 150 $B bench --backend cuda --json "$@" 2>>$OUT/bench_err.txt | bench_summary; }
for f in default rope_kv,moe_block,conv3,router_topk rope_kv,moe_block,conv3,router_topk,router_norm,gated_norm; do
  echo "== kimi14 DAYONE_DECODE_FUSION=$f $(date -u +%T)"
  if [ $f = default ]; then bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48
  else DAYONE_DECODE_FUSION=$f bench -m /tmp/kimi48b --batch 1 --prompt-len 512 --gen-len 48; fi
done
echo "== moe decode variants $(date -u +%T)"; . benches/gpu/run_moe_dec_sweep.sh
tar czf $OUT/kcache.tgz -C $HOME/.cache/dayone . 2>/dev/null
date -u +%T
