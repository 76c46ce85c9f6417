"""Random GGUF blocks of a quantized type, for tests, benchmarks and synthetic models:
every bit pattern of the quant fields, with the fp16 scale fields set to finite values
of a chosen size (random bytes there would decode to infs, NaNs and huge values)."""
from __future__ import annotations

import numpy as np

from .quants import quant_info

# byte offsets of each type's fp16 fields in its block: d, and dmin where it has one
HALF_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
               "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(name: str, n_blocks: int, rng: np.random.Generator, scale: float = 1e-3,
                  positive: bool = False) -> np.ndarray:
    """uint8 [n_blocks, block bytes] of type `name`: random bytes, then each fp16 field a
    normal value times `scale` (positive: (|normal| + 0.5) times it, so no scale is near 0)."""
    if name not in HALF_FIELDS:
        raise ValueError(f"no random-block recipe for {name}; quantized types with one: "
                         f"{', '.join(HALF_FIELDS)}")
    b = rng.integers(0, 256, (n_blocks, quant_info(name).type_size), dtype=np.uint8)
    for off in HALF_FIELDS[name]:
        h = rng.standard_normal((n_blocks, 1))
        h = (np.abs(h) + 0.5 if positive else h) * scale
        b[:, off:off + 2] = h.astype(np.float16).view(np.uint8)
    return b
