"""GPU time of our compiled programs, from the backend's own kp timestamps.

A compiled call copies its inputs in, runs its kernels and copies its outputs
out, all in one submit; its wall time is what a user with CPU tensors sees,
but a bandwidth or FLOP/s figure must count the kernels alone. With
DYNAMO_VULKAN_PROFILE=1 (read when a graph is compiled) every call logs GPU
time per recorded op on the ``dynamo_vulkan.profile`` logger; this module
captures those records and adds up the kernels, leaving the copies out.
"""
from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager

LOGGER = "dynamo_vulkan.profile"
_ROW = re.compile(r"^\s*([0-9.]+) us  (.*)$")
COPY_LABELS = ("copy inputs in", "copy outputs out", "copy mutated buffer")


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.calls: list[tuple[float, float, int]] = []   # (total us, copies us, kernels)
        self.by_kernel: list[dict[str, float]] = []        # per call: us per kernel name

    def emit(self, record):
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) != 2:
            return
        table, total = args
        copies, kernels, named = 0.0, 0, {}
        for line in str(table).splitlines():
            m = _ROW.match(line)
            if not m:
                continue
            if m.group(2).strip() in COPY_LABELS:
                copies += float(m.group(1))
            else:
                kernels += 1
                name = m.group(2).split()[0]
                named[name] = named.get(name, 0.0) + float(m.group(1))
        self.calls.append((float(total), copies, kernels))
        self.by_kernel.append(named)


@contextmanager
def profiled():
    """Graphs compiled inside record timestamps; yields the capture whose
    ``calls`` gets one (total us, copy us, kernel count) per program call."""
    cap = _Capture()
    log = logging.getLogger(LOGGER)
    saved = (log.level, log.propagate, os.environ.get("DYNAMO_VULKAN_PROFILE"))
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(cap)
    os.environ["DYNAMO_VULKAN_PROFILE"] = "1"
    try:
        yield cap
    finally:
        log.removeHandler(cap)
        log.setLevel(saved[0])
        log.propagate = saved[1]
        if saved[2] is None:
            os.environ.pop("DYNAMO_VULKAN_PROFILE", None)
        else:
            os.environ["DYNAMO_VULKAN_PROFILE"] = saved[2]


def kernel_ms_per_call(cap: _Capture, fn, calls: int, prefix: str | None = None
                       ) -> tuple[list[float], int]:
    """Call ``fn`` ``calls`` times; per call, the GPU ms of its kernels (the
    sum over its programs, copies excluded; with ``prefix``, only the kernels
    whose name starts with it) and the kernels dispatched."""
    samples, kernels = [], 0
    for _ in range(calls):
        cap.calls.clear()
        cap.by_kernel.clear()
        fn()
        if not cap.calls:
            raise RuntimeError("no GPU timestamps were logged: did the graph compile for Vulkan "
                               "inside benchmarks.gputime.profiled()?")
        if prefix is None:
            samples.append(sum(t - c for t, c, _ in cap.calls) / 1e3)
        else:
            samples.append(sum(us for named in cap.by_kernel for name, us in named.items()
                               if name.startswith(prefix)) / 1e3)
        kernels = sum(k for _, _, k in cap.calls)
    return samples, kernels
