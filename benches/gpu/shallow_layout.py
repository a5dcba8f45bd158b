"""A shallower copy of a checkpoint layout (write_sparse_safetensors.py's input): the first N
decoder layers, `num_hidden_layers` = N, and kimi_linear's 1-based `full_attn_layers` /
`kda_layers` cut to them. The per-layer shapes stay those of the full model, so a decode step
is the full one's layer mix at a fraction of the weights — for a card too small for the whole
model (Kimi-Linear-48B's 98.6 GB on an 80 GB H100).

    python3 benches/gpu/shallow_layout.py benches/gpu/kimi48b_layout.json 14 /tmp/kimi14.json
"""

import json
import re
import sys


def main():
    src, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    layout = json.load(open(src))
    cfg = layout["config"]
    if not 0 < n <= cfg["num_hidden_layers"]:
        sys.exit(f"{src}: N must be in 1..={cfg['num_hidden_layers']}, got {n}")
    cfg["num_hidden_layers"] = n
    lin = cfg.get("linear_attn_config")
    if lin:
        for key in ("full_attn_layers", "kda_layers"):
            lin[key] = [i for i in lin[key] if i <= n]
    layer = re.compile(r"\.layers\.(\d+)\.")
    keep = []
    for t in layout["tensors"]:
        m = layer.search(t["name"])
        if m is None or int(m.group(1)) < n:
            keep.append(t)
    layout["tensors"] = keep
    json.dump(layout, open(out, "w"))
    print(f"{out}: {n} layers, {len(keep)} tensors")


if __name__ == "__main__":
    main()
