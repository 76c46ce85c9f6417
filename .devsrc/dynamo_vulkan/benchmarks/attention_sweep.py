"""A prompt's attention per tile of the register-tiled kernel: GPU microseconds a call.

For each shape (query heads, kv heads, query rows, cache length, head dim, live keys: a
causal prompt whose last row sees that many keys; a prefill starts the cache, a decode
step is one row) and each tile of
lowering/attention.TILED_CONFIGS ("row": the row-per-workgroup kernel, attention.comp),
the attention kernel's GPU time from the backend's timestamps (the mask's live ranges,
made once a forward, and the copies left out), its TFLOP/s over the live keys, and its
largest difference from eager on the CPU. A decode step's shapes take the row kernel
with its keys split (--max-splits: that many splits at most, lowering/attention.MAX_SPLITS,
whatever SPLIT_WORKGROUPS says). A measurement script,
not a test: it sets the module's tile list and keeps each variant's plans apart by the
device's name.

    python3 -m dynamo_vulkan.benchmarks.attention_sweep [--configs 32x32x4x8,row]
    python3 -m dynamo_vulkan.benchmarks.attention_sweep --configs row --shapes 7b-decode-512 --max-splits 64,16
"""
from __future__ import annotations

import argparse
import logging
import math
import statistics

import torch

from .gputime import LOGGER, profiled

# (label, query heads, kv heads, rows, cache length, head dim, live keys of the last row):
# the 7B's, SmolLM2's and Gemma 3's prompts of 512 and 128 tokens in a 2048-slot cache,
# and the 7B's decode step after 1, 512 and 2047 tokens
SHAPES = [("7b-512", 28, 4, 512, 2048, 128, 512), ("7b-128", 28, 4, 128, 2048, 128, 128),
          ("smollm2-512", 9, 3, 512, 2048, 64, 512), ("smollm2-128", 9, 3, 128, 2048, 64, 128),
          ("gemma3-512", 4, 1, 512, 2048, 256, 512), ("gemma3-128", 4, 1, 128, 2048, 256, 128),
          ("7b-decode-1", 28, 4, 1, 2048, 128, 1), ("7b-decode-512", 28, 4, 1, 2048, 128, 512),
          ("7b-decode-2048", 28, 4, 1, 2048, 128, 2048)]


class _Kernel(logging.Handler):
    """GPU microseconds of the dispatches whose name starts with `prefix`, per call."""

    def __init__(self, prefix: str):
        super().__init__(logging.INFO)
        self.prefix, self.calls = prefix, []

    def emit(self, record):
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) != 2:
            return
        us = 0.0
        for line in str(args[0]).splitlines():
            head, _, rest = line.strip().partition(" us  ")
            if rest.startswith(self.prefix):
                us += float(head)
        self.calls.append(us)


def _config(text: str):
    return None if text == "row" else tuple(int(x) for x in text.split("x"))


def measure(shape, config, calls: int = 10, max_splits: int | None = None) -> dict:
    """One shape under one tile (None: the row kernel; max_splits: its key splits at most,
    where it splits them): median GPU us, TFLOP/s, error."""
    from dynamo_vulkan import device
    from dynamo_vulkan.fused import attention
    from dynamo_vulkan.lowering import attention as att

    label, hq, hkv, t, c, d, live = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*s, generator=g) for s in ((hq, t, d), (hkv, c, d), (hkv, c, d)))
    mask = torch.arange(t)[:, None] + (live - t) >= torch.arange(c)[None, :]
    scale = 1 / math.sqrt(d)
    info = device.device_info()
    saved = (att.TILED_CONFIGS, att.TILED_MIN_BLOCKS, att.MAX_SPLITS, att.SPLIT_WORKGROUPS, info["name"])
    att.TILED_CONFIGS = () if config is None else (config,)
    att.TILED_MIN_BLOCKS = 1
    if max_splits:           # at most that many splits, the total workgroups uncapped
        att.MAX_SPLITS, att.SPLIT_WORKGROUPS = max_splits, 1 << 30
    info["name"] = f"{saved[4]} (attention tile {config}, splits {att.MAX_SPLITS}/{att.SPLIT_WORKGROUPS})"
    handler = _Kernel("attention")
    log = logging.getLogger(LOGGER)
    try:
        if config is not None and att.tiled_config(info, hq, t, d, d) is None:
            raise ValueError(f"tile {config} does not fit this device or head dim {d}")
        with profiled():
            log.addHandler(handler)
            torch._dynamo.reset()
            fn = torch.compile(lambda q, k, v, m: attention(q, k, v, m, scale), backend="vulkan")
            out = fn(q, k, v, mask)
            handler.calls.clear()
            for _ in range(calls):
                fn(q, k, v, mask)
    finally:
        log.removeHandler(handler)
        att.TILED_CONFIGS, att.TILED_MIN_BLOCKS, att.MAX_SPLITS, att.SPLIT_WORKGROUPS, info["name"] = saved
    ref = torch.softmax((q @ k.repeat_interleave(hq // hkv, 0).transpose(1, 2) * scale)
                        .masked_fill(~mask, float("-inf")), -1) @ v.repeat_interleave(hq // hkv, 0)
    us = statistics.median(handler.calls)
    flops = 4 * hq * d * sum(min(c, live - t + r + 1) for r in range(t))   # over live keys
    name = "row" if config is None else "x".join(map(str, config))
    return {"shape": label, "config": name + (f"/{max_splits}" if max_splits else ""),
            "us": us, "tflops": flops / us / 1e6, "err": float((out - ref).abs().max())}


def main(argv=None) -> None:
    from dynamo_vulkan.lowering import attention as att
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default=",".join(["x".join(map(str, c)) for c in att.TILED_CONFIGS] + ["row"]),
                   help="tiles BQxBKxRPTxTPRG, or 'row', comma-separated")
    p.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--max-splits", default="", help="the row kernel's key splits at most, "
                   "comma-separated (decode shapes); default lowering/attention's rule")
    args = p.parse_args(argv)
    splits = [int(x) for x in args.max_splits.split(",") if x] or [None]
    shapes = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    print(f"{'shape':14s} {'tile':12s} {'us':>9s} {'TFLOP/s':>8s} {'max err':>9s}")
    for shape in shapes:
        for text in args.configs.split(","):
            for ms in splits:
                try:
                    r = measure(shape, _config(text), args.calls, ms)
                except Exception as e:       # a tile that does not fit this device or shape
                    print(f"{shape[0]:14s} {text:12s} failed: {type(e).__name__}: {str(e)[:80]}")
                    continue
                print(f"{r['shape']:14s} {r['config']:12s} {r['us']:9.1f} {r['tflops']:8.2f} "
                      f"{r['err']:9.2e}", flush=True)


if __name__ == "__main__":
    main()
