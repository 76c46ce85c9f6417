"""fp32 matmul x[M,K] @ W[K,N] with W a parameter (resident on the GPU), in GFLOP/s.

Shapes: 4096^3, and LLM shapes with M (tokens) from 1 to 512 and K,N from
SmolLM2's 576/1536 to 4096. Our figure is the kernels' GPU time; torch CUDA's
(TF32 off) is the baseline of issue 6 (>= 60%), and the peak we hold both
against is torch CUDA's own fp32 rate measured by the probes.
"""
from __future__ import annotations

import torch

from ..harness import Target

DESCRIPTION = "fp32 matmul, square and LLM shapes (GFLOP/s)"

FULL = [(4096, 4096, 4096)] + [(m, k, n) for (k, n) in ((576, 1536), (1536, 576), (4096, 4096))
                               for m in (1, 16, 128, 512)]
QUICK = [(128, 128, 128), (1, 256, 512), (16, 256, 512)]


class MatMul(torch.nn.Module):
    def __init__(self, k: int, n: int, g: torch.Generator):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(k, n, generator=g) / k ** 0.5)

    def forward(self, x):
        return x @ self.w


def run(bench) -> None:
    g = torch.Generator().manual_seed(0)
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    bench.note("matmul", "inductor CPU left out: it hands mm to the same CPU BLAS as eager")
    try:
        for m, k, n in (QUICK if bench.quick else FULL):
            workload = f"{m}x{k}x{n}"
            if bench.over_budget("matmul", workload):
                break
            model = MatMul(k, n, g)
            x = torch.randn(m, k, generator=g)
            bench.compare("matmul", workload, model, (x,), work=2 * m * k * n, unit="GFLOP/s",
                          rtol=1e-4, atol=1e-4, inductor=False, cuda=True)
            bench.target(Target(f"matmul {workload} fp32: GFLOP/s vs torch CUDA (TF32 off)",
                                ("matmul", workload, "vulkan"), 0.6, baseline=("matmul", workload, "torch_cuda")))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
