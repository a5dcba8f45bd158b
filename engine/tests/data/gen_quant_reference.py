"""Writes quant_reference.bin: random ggml blocks of each quantized type and their values as
dequantized by the `gguf` Python package (llama.cpp's gguf-py), to check dayone's dequantizer.

Run: python -m venv v && v/bin/pip install gguf numpy && v/bin/python gen_quant_reference.py

File format (little-endian), repeated per type:
  u32 ggml type id, u32 number of blocks, u32 bytes per block, block bytes, f32 values.
"""
import os
import struct

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants

# (type, byte offsets of the f16 scale/min fields inside a block)
TYPES = [
    (T.Q4_0, [0]), (T.Q4_1, [0, 2]), (T.Q5_0, [0]), (T.Q5_1, [0, 2]), (T.Q8_0, [0]),
    (T.Q2_K, [80, 82]), (T.Q3_K, [108]), (T.Q4_K, [0, 2]), (T.Q5_K, [0, 2]), (T.Q6_K, [208]),
]
SIZES = quants.GGML_QUANT_SIZES if hasattr(quants, "GGML_QUANT_SIZES") else None
if SIZES is None:
    from gguf.constants import GGML_QUANT_SIZES as SIZES

rng = np.random.default_rng(1234)
out = bytearray()
for ty, half_offsets in TYPES:
    per, bsize = SIZES[ty]
    nblocks = 3
    raw = bytearray(rng.integers(0, 256, size=nblocks * bsize, dtype=np.uint8).tobytes())
    for b in range(nblocks):
        for off in half_offsets:
            val = np.float16(rng.uniform(-0.05, 0.05))
            raw[b * bsize + off: b * bsize + off + 2] = val.tobytes()
    arr = np.frombuffer(bytes(raw), dtype=np.uint8).reshape(nblocks, bsize)
    vals = quants.dequantize(arr, ty).astype(np.float32).reshape(-1)
    assert vals.size == nblocks * per, (ty, vals.size)
    out += struct.pack("<III", int(ty), nblocks, bsize) + bytes(raw) + vals.tobytes()

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quant_reference.bin")
with open(path, "wb") as f:
    f.write(out)
print("wrote", path, len(out), "bytes")
