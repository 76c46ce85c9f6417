"""A graph of 50 small kernels (a chain of 50 tiny matmuls, which no fusion
merges) against one empty kp submit + wait measured in the same run: the
Python path around our one submit should cost next to nothing (issue 6: per
call <= 1.3x the empty submit). The baseline is kp 0.9's submit+wait as released
(a fence created and destroyed per submit: ~0.5 ms on the H100); our runtime's own,
with kp patch 6, is noted beside it. The kernel count is read from the GPU
timestamps, so the figure says how many kernels it really ran."""
from __future__ import annotations

import torch

from .. import probes
from ..harness import Target

DESCRIPTION = "50 small kernels per call vs one empty submit"
N = 50


class Chain(torch.nn.Module):
    def __init__(self, n: int, d: int, g: torch.Generator):
        super().__init__()
        eye = torch.eye(d)
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(eye + 0.05 * torch.randn(d, d, generator=g) / d ** 0.5)
                                         for _ in range(n))

    def forward(self, x):
        for w in self.ws:
            x = x @ w
        return x


def run(bench) -> None:
    g = torch.Generator().manual_seed(0)
    model = Chain(N, 16, g)
    x = torch.randn(1, 16, generator=g)
    workload = f"{N} small kernels"
    rows = bench.compare("small_kernels", workload, model, (x,), rtol=1e-4, atol=1e-5)
    empty = probes.empty_submit_ms(bench.probes, as_released=True)
    ours = probes.empty_submit_ms(bench.probes)
    if "vulkan" in rows and rows["vulkan"].kernels not in (None, N):
        bench.note("small_kernels", f"the graph ran {rows['vulkan'].kernels} kernels, not {N}")
    row = rows.get("vulkan")
    if row is not None and row.ms is not None and ours:
        gpu = f", of which {row.gpu_ms.median:.3f} ms is the kernels' GPU time" if row.gpu_ms else ""
        bench.note("small_kernels", f"{workload}: {row.ms.median:.3f} ms per call{gpu}; our runtime's own "
                   f"empty submit+wait is {ours * 1e3:.0f} us (kp patch 6: one fence per sequence, "
                   f"polled), {row.ms.median / ours:.1f}x of it. The target's baseline is kp 0.9's "
                   "submit+wait as released, which the issue measured at ~0.56 ms")
    bench.target(Target(f"{workload}: per call vs one empty kp submit+wait (kp 0.9 as released)",
                        ("small_kernels", workload, "vulkan"),
                        1.3, higher_is_better=False, metric="ms",
                        baseline_value=(empty, "empty kp 0.9 submit+wait") if empty else None))
