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
# tensor cores (issue 33): fp32 under precision "high" (bf16x3) and "medium" (bf16), and
# fp16 tensors, beside torch CUDA with TF32 ("high"), bf16 ("medium") and fp16 tensors
TENSOR_CORES = [(4096, 4096, 4096), (512, 3584, 18944)]
TENSOR_CORES_QUICK = [(130, 96, 136)]


class MatMul(torch.nn.Module):
    def __init__(self, k: int, n: int, g: torch.Generator):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(k, n, generator=g) / k ** 0.5)

    def forward(self, x):
        return x @ self.w


class HalfMatMul(torch.nn.Module):
    """x @ W in fp16; on the CPU outside a compile (the eager reference) in fp32, rounded to
    fp16: torch's CPU fp16 matmul runs at ~1 GFLOP/s where the CPU lacks fp16 arithmetic."""
    def __init__(self, model: MatMul):
        super().__init__()
        self.w = torch.nn.Parameter(model.w.detach().half())

    def forward(self, x):
        if x.device.type == "cpu" and not torch.compiler.is_compiling():
            return (x.float() @ self.w.float()).half()
        return x @ self.w


class CastMatMul(torch.nn.Module):
    """torch CUDA's bf16 baseline of an fp32 product: x @ W in bf16 (W cast once)."""
    def __init__(self, model: MatMul):
        super().__init__()
        self.w = torch.nn.Parameter(model.w.detach().to(torch.bfloat16))

    def forward(self, x):
        return (x.to(torch.bfloat16) @ self.w).float()


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
        _tensor_cores(bench, g)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def _tensor_cores(bench, g) -> None:
    """Rows of the tensor-core kernels: fp32 under each precision (exact fp32 kernels
    under "highest", for comparison), then fp16 tensors."""
    before = torch.get_float32_matmul_precision()
    tol = {"highest": 1e-4, "high": 1e-3, "medium": 5e-2, "fp16": 5e-2}
    try:
        for m, k, n in (TENSOR_CORES_QUICK if bench.quick else TENSOR_CORES):
            for kind in ("highest", "high", "medium", "fp16"):
                workload = f"{m}x{k}x{n} {kind}"
                if bench.over_budget("matmul", workload):
                    return
                model = MatMul(k, n, g)
                x = torch.randn(m, k, generator=g)
                cuda_model = None
                if kind == "fp16":
                    torch.set_float32_matmul_precision("highest")
                    model, x = HalfMatMul(model), x.half()
                else:
                    # torch CUDA: fp32 under "highest", TF32 under "high"; bf16 tensors for "medium"
                    torch.set_float32_matmul_precision(kind)
                    cuda_model = CastMatMul(model) if kind == "medium" else None
                base = {"highest": "fp32", "high": "TF32", "medium": "bf16", "fp16": "fp16"}[kind]
                bench.compare("matmul", workload, model, (x,), work=2 * m * k * n, unit="GFLOP/s",
                              rtol=tol[kind], atol=tol[kind], inductor=False, cuda=True, cuda_model=cuda_model,
                              note=f"precision {kind}; torch CUDA {base}"
                              + ("; eager CPU in fp32, rounded" if kind == "fp16" else ""))
                bench.target(Target(f"matmul {workload}: GFLOP/s vs torch CUDA {base}",
                                    ("matmul", workload, "vulkan"), 0.6, baseline=("matmul", workload, "torch_cuda")))
    finally:
        torch.set_float32_matmul_precision(before)
