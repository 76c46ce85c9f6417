"""Elementwise ops and a fused-able chain on large tensors, in GB/s of the bytes
the op must move (inputs read once, output written once).

Our figure is the kernels' GPU time from kp timestamps (host copies excluded),
torch CUDA's from CUDA events on device tensors; both against the device's
copy bandwidth. Issue 6 asks for >= 80% of torch CUDA's bandwidth on 64M floats.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..harness import Target

DESCRIPTION = "elementwise ops and a chain on large tensors (GB/s)"
FULL_ELEMS = 64 << 20


def chain(x, y):
    return torch.relu(torch.sigmoid(x * 1.5 + y) * x - 0.25) + y * 0.5


def add(x, y):
    return x + y


def gelu(x):
    return F.gelu(x)


OPS = {
    # name: (fn, inputs, tensors moved)
    "add": (add, 2, 3),
    "gelu": (gelu, 1, 2),
    "chain7": (chain, 2, 3),
}


def elems(bench) -> tuple[int, str]:
    """64M floats, or fewer where one buffer may not hold them (lavapipe: 128 MiB)."""
    if bench.quick:
        return 1 << 18, ""
    from dynamo_vulkan import device_info
    cap = int(device_info().get("max_storage_buffer_range", 128 << 20)) // 4
    n = FULL_ELEMS
    while n > cap:
        n //= 2
    return n, ("" if n == FULL_ELEMS else f"{n >> 20}M floats: the device's buffer limit is {cap * 4 >> 20} MiB")


def run(bench) -> None:
    n, why = elems(bench)
    if why:
        bench.note("elementwise", why)
    g = torch.Generator().manual_seed(0)
    for name, (fn, n_in, moved) in OPS.items():
        inputs = tuple(torch.randn(n, generator=g) for _ in range(n_in))
        workload = f"{name} {n >> 20}M" if n >= 1 << 20 else f"{name} {n >> 10}K"
        bench.compare("elementwise", workload, fn, inputs, work=moved * n * 4, unit="GB/s",
                      rtol=1e-5, atol=1e-6, inductor=name == "chain7", cuda=True)
        bench.target(Target(f"elementwise {workload} floats: GB/s vs torch CUDA", ("elementwise", workload, "vulkan"),
                            0.8, baseline=("elementwise", workload, "torch_cuda")))
