"""Repetitions, warm-up and the statistics every figure carries.

A figure is the median over repetitions after warm-up, with its spread (10th
and 90th percentiles, min, max). Slow calls get fewer repetitions, down to a
floor of three, so one big eager-CPU matmul cannot eat the whole run; the
number actually taken is recorded beside the figure.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass

MIN_REPS = 3


@dataclass(frozen=True)
class Stat:
    """Summary of samples, all in the same unit (milliseconds unless named)."""
    median: float
    p10: float
    p90: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, samples) -> "Stat":
        s = sorted(float(v) for v in samples)
        if not s:
            raise ValueError("no samples")
        return cls(statistics.median(s), _quantile(s, 0.1), _quantile(s, 0.9), s[0], s[-1], len(s))

    def scaled(self, k: float) -> "Stat":
        return Stat(self.median * k, self.p10 * k, self.p90 * k, self.min * k, self.max * k, self.n)

    def as_dict(self) -> dict:
        return asdict(self)


def _quantile(sorted_vals, q: float) -> float:
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


@dataclass(frozen=True)
class Plan:
    """How hard to measure: repetitions wanted, warm-up calls, seconds allowed per figure."""
    reps: int = 20
    warmup: int = 3
    max_s: float = 3.0

    def count(self, one_call_s: float) -> int:
        """Repetitions to take when one call lasts ``one_call_s``."""
        if one_call_s <= 0:
            return self.reps
        return max(min(MIN_REPS, self.reps), min(self.reps, int(self.max_s / one_call_s)))


def measure(fn, plan: Plan, sync=None) -> Stat:
    """Wall time of ``fn()`` in ms over repetitions after ``plan.warmup`` calls.

    ``sync`` (e.g. torch.cuda.synchronize) runs before each clock read, for
    asynchronous devices; our Vulkan calls and CPU calls are synchronous."""
    _warm(fn, plan)
    samples = [_one(fn, sync)]
    for _ in range(plan.count(samples[0] / 1e3) - 1):
        samples.append(_one(fn, sync))
    return Stat.of(samples)


def _warm(fn, plan: Plan) -> None:
    """``plan.warmup`` calls, fewer when they are slow (a second of warm-up is plenty)."""
    t0 = time.perf_counter()
    for _ in range(plan.warmup):
        fn()
        if time.perf_counter() - t0 > min(1.0, plan.max_s / 2):
            break


def _one(fn, sync) -> float:
    if sync:
        sync()
    t0 = time.perf_counter()
    fn()
    if sync:
        sync()
    return (time.perf_counter() - t0) * 1e3


def measure_cuda(fn, plan: Plan) -> Stat:
    """GPU time of ``fn()`` in ms from CUDA events (device work only, no host copies)."""
    import torch

    _warm(fn, plan)
    torch.cuda.synchronize()

    def one():
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b)

    samples = [one()]
    for _ in range(plan.count(samples[0] / 1e3) - 1):
        samples.append(one())
    return Stat.of(samples)


def once_s(fn) -> tuple[object, float]:
    """(result, seconds) of one call: compile times and first calls."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
