"""gguf_linear for each GGUF type, in GB/s of quantized weight bytes read.

Two views:
- compiled: a GGUFLinear (legacy types quantized from floats with
  GGUFLinear.from_float, K-quants as random blocks with modest fp16 scales)
  under torch.compile for one token (a mat-vec), against eager CPU's
  dequantize-and-multiply. One weight of a few MB can sit in a big GPU's L2
  cache between calls, so this figure can exceed DRAM bandwidth.
- kernel (issue 6's targets): benchmarks/gguf_matvec.py, when present, runs the
  fused mat-vec over enough distinct copies of each weight to defeat the L2
  cache and times the dispatches alone; Q4_0, Q4_1, Q8_0, Q4_K and Q6_K on
  4096x4096 and 4096x14336 against the device's copy bandwidth (>= 70%).
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from dynamo_vulkan.gguf.op import GGUFLinear
from dynamo_vulkan.gguf.quants import quant_info

from ..harness import Target
from ..record import Row
from ..synth_model import _random_blocks
from ..timing import Stat

log = logging.getLogger(__name__)

DESCRIPTION = "gguf_linear per quant type (GB/s of quantized weights)"
TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
QUICK_TYPES = ("F16", "Q4_1", "Q4_K", "Q6_K")     # --quick: a smoke test of the suite, not of every kernel
LEGACY = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
TARGET_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")
TARGET_SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))     # (rows, cols) of W


def make_linear(name: str, rows: int, cols: int, seed: int = 0) -> GGUFLinear:
    if name in LEGACY:
        g = torch.Generator().manual_seed(seed)
        return GGUFLinear.from_float(torch.randn(rows, cols, generator=g) * 0.05, name)
    blocks = _random_blocks(np.random.default_rng(seed), name, [cols, rows])
    return GGUFLinear(torch.from_numpy(blocks.reshape(-1).copy()), quant_info(name).ggml_type, rows, cols)


def run(bench) -> None:
    rows, cols = (256, 512) if bench.quick else (4096, 4096)
    g = torch.Generator().manual_seed(1)
    for name in (QUICK_TYPES if bench.quick else TYPES):
        if bench.over_budget("gguf_linear", name):
            break
        try:
            lin = make_linear(name, rows, cols)
        except Exception as e:      # e.g. the gguf package cannot quantize this type here
            bench.note("gguf_linear", f"{name}: could not build the weight ({type(e).__name__}: {e})")
            continue
        x = torch.randn(1, cols, generator=g)
        bench.compare("gguf_linear", f"{name} {rows}x{cols} matvec", lin, (x,), work=lin.blocks.numel(),
                      unit="GB/s", rtol=1e-4, atol=1e-5, inductor=False)
    kernel_rows(bench)


def kernel_rows(bench) -> None:
    """Issue 6's mat-vec rows from benchmarks/gguf_matvec.py (another helper's module)."""
    if bench.over_budget("gguf_linear", "gguf_matvec kernel rows"):
        return
    try:
        from .. import gguf_matvec
    except Exception as e:
        bench.note("gguf_linear", f"benchmarks/gguf_matvec.py not usable here ({type(e).__name__}: {e}); "
                                  "no L2-free kernel rows")
        return
    from .. import probes

    limit, limit_name = probes.copy_limit(bench.probes)
    types, shapes = (("Q4_0",), ((256, 512),)) if bench.quick else (TARGET_TYPES, TARGET_SHAPES)
    try:
        kw = {"target_bytes": 1 << 20} if bench.quick else {}
        results = gguf_matvec.run(types=types, shapes=shapes, modes=(True,), log=log.info,
                                  **kw, **_budget(bench))
    except Exception as e:
        bench.fail("gguf_linear", f"gguf_matvec.run failed: {type(e).__name__}: {e}")
        return
    for r in results:
        floor = r.get("read_floor_GB_per_s")
        of_floor = (f"; {r['GB_per_s'] / floor:.2f} of a chained read of the same bytes "
                    f"({floor:,.0f} GB/s, probes.ChainedRead)") if floor else ""
        row = _kernel_row(bench, r, "vulkan_kernel", limit, limit_name,
                          f"benchmarks/gguf_matvec.py, {r.get('mode', '')} {r.get('variant', '')}; "
                          f"err is relative; wall-time difference of 8 and 4 rounds, no GPU "
                          f"timestamps between kernels{of_floor}")
        bench.target(Target(f"GGUF mat-vec {r['type']} {r['rows']}x{r['cols']}: GB/s vs copy bandwidth",
                            ("gguf_linear", row.workload, "vulkan_kernel"), 0.7,
                            baseline_value=(limit, limit_name) if limit else None,
                            note=f"a chained read of the same bytes: {floor / limit:.2f} of copy"
                            if floor and limit else ""))
    cuda_rows(bench, types, shapes, limit, limit_name)


def cuda_rows(bench, types, shapes, limit, limit_name) -> None:
    """The same mat-vecs in Triton on CUDA (benchmarks/cuda_matvec.py), where CUDA is: what
    another compiler reaches on this GPU with the same fp32 arithmetic."""
    from .. import cuda_matvec
    why = cuda_matvec.available()
    if why:
        bench.note("gguf_linear", f"no Triton reference mat-vec rows: {why}")
        return
    if bench.over_budget("gguf_linear", "cuda_matvec rows"):
        return
    kw = {"configs": cuda_matvec.QUICK_CONFIGS, "target_bytes": 1 << 20} if bench.quick else {}
    try:
        results = cuda_matvec.run([t for t in types if t in cuda_matvec.LAYOUT], shapes, log=log.info,
                                  **kw, **_budget(bench))
    except Exception as e:
        bench.fail("gguf_linear", f"cuda_matvec.run failed: {type(e).__name__}: {e}")
        return
    for r in results:
        _kernel_row(bench, r, "cuda_triton", limit, limit_name,
                    f"benchmarks/cuda_matvec.py, the best of its configurations ({r['config']}); "
                    "CUDA graph of chained launches, CUDA events; err is relative")


def _budget(bench) -> dict:
    """run()'s budget_s: the seconds left before the harness's deadline (none: no limit)."""
    if bench.opts.deadline is None:
        return {}
    import time
    return {"budget_s": max(0.0, bench.opts.deadline - time.perf_counter())}


def _kernel_row(bench, r: dict, backend: str, limit, limit_name, note: str) -> Row:
    """A row for one mat-vec measurement of gguf_matvec.run or cuda_matvec.run (the same
    workload name for both, so they sit side by side): its time, GB/s of weight bytes
    against the copy limit, and relative error."""
    ms = r["us_per_matvec"] / 1e3
    return bench.add(Row("gguf_linear", f"{r['type']} {r['rows']}x{r['cols']} matvec, {r['copies']} copies",
                         backend, None, gpu_ms=Stat(ms, ms, ms, ms, ms, 1), work=r["weight_MB"] * 1e6,
                         unit="GB/s", err=r["max_rel_err"], ref_scale=1.0, tol=1e-4, limit=limit,
                         limit_name=limit_name, note=note))
