"""The pre-norm transformer block of dynamo_vulkan.examples (RMSNorm, causal
attention, SwiGLU), for a prompt and for one decode token, against eager CPU,
inductor CPU, torch CUDA and IREE on Vulkan."""
from __future__ import annotations

import torch

from dynamo_vulkan.examples import TransformerBlock

DESCRIPTION = "transformer block, prompt and decode shapes (latency)"


def workloads(quick: bool):
    def make(t):
        def f():
            torch.manual_seed(0)
            return TransformerBlock(256, 4, 688).eval(), (torch.randn(1, t, 256),)
        return f
    return [(f"block 1x{t}x256", make(t)) for t in ((16,) if quick else (128, 1))]


def run(bench) -> None:
    for name, make in workloads(bench.quick):
        model, inputs = make()
        bench.compare("block", name, model, inputs, rtol=1e-4, atol=1e-5, cuda=True, iree=True,
                      inductor=not bench.quick)
