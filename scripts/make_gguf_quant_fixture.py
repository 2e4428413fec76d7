"""Writes runtime/src/model/gguf/testdata/quants.json: random blocks of every quantization the
GGUF loader dequantizes, with the floats the `gguf` Python package (llama.cpp's own
`gguf-py`, `gguf.quants.dequantize`) makes of them, for the loader's unit tests.

    /work/torch-venv/bin/python scripts/make_gguf_quant_fixture.py
"""

import json
import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "runtime", "src", "model", "gguf", "testdata", "quants.json",
)
# type: (bytes per block, offsets of its f16 scales)
LAYOUTS = {
    "Q4_0": (T.Q4_0, 18, [0]),
    "Q4_1": (T.Q4_1, 20, [0, 2]),
    "Q8_0": (T.Q8_0, 34, [0]),
    "Q4_K": (T.Q4_K, 144, [0, 2]),
    "Q5_K": (T.Q5_K, 176, [0, 2]),
    "Q6_K": (T.Q6_K, 210, [208]),
}
BLOCKS = 2

rng = np.random.default_rng(18)
fixture = {}
for name, (qtype, size, scales) in LAYOUTS.items():
    raw = rng.integers(0, 256, size=(BLOCKS, size), dtype=np.uint8)
    for b in range(BLOCKS):
        for at in scales:
            # A finite scale of either sign, so no block decodes to inf or NaN.
            scale = np.float16(rng.uniform(-0.05, 0.05))
            raw[b, at:at + 2] = np.frombuffer(scale.tobytes(), dtype=np.uint8)
    values = dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
    fixture[name] = {
        "hex": raw.tobytes().hex(),
        "values": [float(v) for v in values],
    }
with open(OUT, "w") as f:
    json.dump(fixture, f)
    f.write("\n")
print("wrote", OUT, os.path.getsize(OUT), "bytes")
