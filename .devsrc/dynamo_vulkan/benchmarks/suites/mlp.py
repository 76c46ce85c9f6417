"""The MLP of dynamo_vulkan.examples (256-1024-1024-256, GELU), per-call latency
against eager CPU, inductor CPU, torch CUDA and IREE on Vulkan."""
from __future__ import annotations

import torch

from dynamo_vulkan.examples import MLP

DESCRIPTION = "MLP 256-1024-1024-256 (latency)"


def workloads(quick: bool):
    """(name, factory) pairs; a factory returns (model, inputs) with fixed seeds."""
    def make(batch):
        def f():
            torch.manual_seed(0)
            return MLP((256, 1024, 1024, 256)).eval(), (torch.randn(batch, 256),)
        return f
    return [(f"mlp {b}x256", make(b)) for b in ((8,) if quick else (1, 64))]


def run(bench) -> None:
    for name, make in workloads(bench.quick):
        model, inputs = make()
        flops = 2 * inputs[0].shape[0] * sum(a * b for a, b in ((256, 1024), (1024, 1024), (1024, 256)))
        bench.compare("mlp", name, model, inputs, work=flops, unit="GFLOP/s", rtol=1e-4, atol=1e-5,
                      cuda=True, iree=True)
