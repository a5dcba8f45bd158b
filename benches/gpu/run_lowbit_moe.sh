#!/usr/bin/env bash
# one device call: [11] low-bit MoE paths and gpt-oss figures, [13] transformers' glm5_next beside dayone
. benches/gpu/device_env.sh   # binaries, NVRTC cache, env, cuda_tests
( python3 benches/gpu/write_gpt_oss.py 20b /tmp/gpt-oss-20b > $OUT/w20.txt 2>&1; python3 benches/gpu/write_gpt_oss.py 120b /tmp/gpt-oss-120b > $OUT/w120.txt 2>&1; echo "ckpts done $(date -u +%T)" ) &
w=$!
cuda_tests
{
for fmt in mxfp4 int4; do
  echo "== moe-bench kimi-k2 layer $fmt"
  timeout 120 .bin/moe-bench --backend cuda --hidden 7168 --experts 384 --expert-dim 2048 --top-k 8 \
    --groups 1 --topk-group 1 --shared 1 --tokens 1,8,64,512,8192 --experts-format $fmt --quant-path direct,decode 2>&1 | tail -14
done
echo "== moe-bench kimi-k2 layer bf16"
timeout 60 .bin/moe-bench --backend cuda --hidden 7168 --experts 384 --expert-dim 2048 --top-k 8 \
    --groups 1 --topk-group 1 --shared 1 --tokens 1,8,64,512,8192 2>&1 | tail -8
} > $OUT/moe.txt 2>&1
cat $OUT/moe.txt
wait $w; cat $OUT/w20.txt | tail -2
{
echo "== gpt-oss-20b shape"; timeout 200 .bin/dayone bench -m /tmp/gpt-oss-20b --backend cuda --batch 1,32,64,1 --prompt-len 1024,1024,1024,8192 --gen-len 64 --json 2>&1 | grep -v "^\s*$" | tail -6
echo "== gpt-oss-120b shape"; timeout 200 .bin/dayone bench -m /tmp/gpt-oss-120b --backend cuda --batch 1,32,64,1 --prompt-len 1024,1024,1024,8192 --gen-len 64 --json 2>&1 | grep -v "^\s*$" | tail -6
} > $OUT/gpt_oss.jsonl 2>&1
cat $OUT/gpt_oss.jsonl | cut -c1-600
mkdir -p /tmp/tf && tar xJf .kcache/tf524.tar.xz -C /tmp/tf
python3 -c "import json; json.dump(json.load(open('benches/gpu/glm5_next_layout.json'))['config'], open('/tmp/glm5_cfg.json','w'))"
echo "== transformers glm5_next"; PYTHONPATH=/tmp/tf timeout 150 python3 benches/gpu/torch_glm5_next.py /tmp/glm5_cfg.json 1024 32 2>&1 | grep -v "falling back" | tail -4 | tee $OUT/torch_glm5.txt
tar czf $OUT/kcache.tgz -C $kc .
