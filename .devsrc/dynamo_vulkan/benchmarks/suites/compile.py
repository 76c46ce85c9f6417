"""Compile time of our backend: first (empty memory and disk caches: glslc,
planning, pipelines) and cached (a fresh Dynamo and empty memory caches, the
disk cache warm, as in a second process). Each is the wall time of
torch.compile plus the first call. The disk cache is a private temporary
directory, so the user's cache is neither used nor cleared."""
from __future__ import annotations

import os
import tempfile

import torch

import dynamo_vulkan

from ..record import Row
from ..timing import Stat, once_s
from . import block, mlp

DESCRIPTION = "compile time, first vs cached (s)"


def _compile_call(model, inputs) -> float:
    torch._dynamo.reset()
    dynamo_vulkan.clear_cache(disk=False)
    with torch.no_grad():
        _, s = once_s(lambda: torch.compile(model, backend="vulkan", dynamic=False)(*inputs))
    return s


def run(bench) -> None:
    saved = os.environ.get("DYNAMO_VULKAN_CACHE_DIR")
    reps = 1 if bench.quick else 3
    try:
        for suite in ((mlp,) if bench.quick else (mlp, block)):
            name, make = suite.workloads(bench.quick)[0]
            model, inputs = make()
            firsts, cached = [], []
            for _ in range(reps):
                with tempfile.TemporaryDirectory(prefix="dvk-bench-cache-") as d:
                    os.environ["DYNAMO_VULKAN_CACHE_DIR"] = d
                    firsts.append(_compile_call(model, inputs) * 1e3)
                    cached += [_compile_call(model, inputs) * 1e3 for _ in range(reps)]
            bench.add(Row("compile", f"{name} first", "vulkan", Stat.of(firsts), note="empty caches"))
            bench.add(Row("compile", f"{name} cached", "vulkan", Stat.of(cached), note="disk cache warm"))
    finally:
        if saved is None:
            os.environ.pop("DYNAMO_VULKAN_CACHE_DIR", None)
        else:
            os.environ["DYNAMO_VULKAN_CACHE_DIR"] = saved
        torch._dynamo.reset()
