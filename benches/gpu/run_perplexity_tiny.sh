#!/usr/bin/env bash
# Issue [16] on the H200: `dayone perplexity` on the tiny llama fixture with the reference's
# word-level tokenizer, every case of tests/fixtures/perplexity_reference.json ("tiny"), on CUDA in
# f32, against transformers (PPL within 1e-4 relative, identical token counts) — what
# cli/tests/perplexity_cmd.rs checks on CPU and WGSL.
#   usage: bash benches/gpu/run_perplexity_tiny.sh      (binary: .bin/dayone, carried gzipped)
set -uo pipefail
OUT=${OUT:-/tmp/dayone-out}
mkdir -p "$OUT"
for f in .bin/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x .bin/* 2>/dev/null
export DAYONE_CACHE=/tmp/dayone-cache RUST_BACKTRACE=0
python3 - "$OUT" <<'PY'
import json, os, shutil, subprocess, sys
ref = json.load(open("tests/fixtures/perplexity_reference.json"))["tiny"]
model = "/tmp/ppl_tiny/model"
os.makedirs(model, exist_ok=True)
for f in ["model.safetensors", "generation_config.json", "config.json"]:
    shutil.copy(f"tests/fixtures/llama_tiny/{f}", model)
json.dump(ref["tokenizer"], open(f"{model}/tokenizer.json", "w"))
json.dump(ref["tokenizer_config"], open(f"{model}/tokenizer_config.json", "w"))
open("/tmp/ppl_tiny/text.txt", "w").write(ref["text"])
worst, ok = 0.0, True
for c in ref["cases"]:
    cmd = [".bin/dayone", "perplexity", "--model", model, "--file", "/tmp/ppl_tiny/text.txt",
           "--backend", "cuda", "--dtype", "f32", "--json", "--ctx", str(c["ctx"])] + (["--bos"] if c["bos"] else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        print("FAILED", c["ctx"], c["bos"], p.stderr[-500:]); ok = False; continue
    got = json.loads(p.stdout)
    rel = abs(got["ppl"] - c["ppl"]) / c["ppl"]
    same = (got["scored_tokens"], got["windows"], got["text_tokens"]) == (c["scored_tokens"], c["windows"], ref["text_tokens"])
    worst = max(worst, rel)
    ok &= rel < 1e-4 and same
    print(f"tiny cuda ctx {c['ctx']} bos {c['bos']}: ppl {got['ppl']:.9f} transformers {c['ppl']:.9f} rel {rel:.2e} "
          f"scored {got['scored_tokens']}/{c['scored_tokens']} windows {got['windows']}/{c['windows']}")
print(f"tiny cuda: worst rel {worst:.2e}: {'PASS' if ok else 'FAIL'}")
PY
