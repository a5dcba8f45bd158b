"""Writes a safetensors checkpoint from a layout file (see kimi48b_layout.py) without filling the
disk: the routed experts (`.mlp.experts.`, 96 % of a 48B-A3B model) are left as file holes (zeros,
no disk blocks); everything else — embedding, attention/KDA projections, router, shared experts,
LM head — gets random values (norm weights ≈ 1, `A_log` = ln U(1, 16), small biases), so hidden
states, next tokens and hence MoE routing differ between sequences as in a real model. Expert
GEMV/GEMM time does not depend on the values. For timing only.

    python3 benches/gpu/write_sparse_safetensors.py benches/gpu/kimi48b_layout.json /tmp/kimi48b
"""

import json
import os
import struct
import sys

import numpy as np


def tiled(pool: np.ndarray, start: int, n: int) -> np.ndarray:
    """`n` values of `pool` from `start` on, wrapping around."""
    rolled = np.concatenate([pool[start:], pool[:start]])
    return np.tile(rolled, -(-n // len(pool)))[:n]


def main() -> None:
    layout, out = sys.argv[1], sys.argv[2]
    d = json.load(open(layout))
    os.makedirs(out, exist_ok=True)
    json.dump(d["config"], open(os.path.join(out, "config.json"), "w"))
    header, offset = {}, 0
    for t in d["tensors"]:
        n = int(np.prod(t["shape"]))
        size = n * (4 if t["dtype"] == "F32" else 2)
        header[t["name"]] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    path = os.path.join(out, "model.safetensors")
    rng = np.random.default_rng(0)
    # Large tensors take windows of one pool of 2^24 normal values at random offsets: as random
    # as routing and gates need, and the write runs at disk speed instead of the generator's.
    pool = rng.standard_normal(1 << 24, dtype=np.float32)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        base = f.tell()
        f.truncate(base + offset)  # holes everywhere
        for t in d["tensors"]:
            name, n = t["name"], int(np.prod(t["shape"]))
            if ".mlp.experts." in name:
                continue
            if name.endswith("A_log"):
                v = np.log(rng.uniform(1, 16, n))
            elif "norm" in name:
                v = 1.0 + 0.02 * rng.standard_normal(n)
            elif name.endswith(("dt_bias", "e_score_correction_bias")):
                v = 0.01 * rng.standard_normal(n)
            else:
                v = 0.02 * tiled(pool, int(rng.integers(len(pool))), n)
            v = v.astype(np.float32)
            if t["dtype"] == "BF16":
                v = (v.view(np.uint32) >> 16).astype(np.uint16)
            f.seek(base + header[name]["data_offsets"][0])
            f.write(v.tobytes())
    st = os.stat(path)
    print(f"{path}: {st.st_size / 1e9:.1f} GB apparent, {st.st_blocks * 512 / 1e9:.2f} GB on disk")


if __name__ == "__main__":
    main()
