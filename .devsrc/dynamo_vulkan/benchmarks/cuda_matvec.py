"""The same fused dequantize + mat-vec on CUDA, written in Triton: what another
compiler gets on the same GPU, beside benchmarks/gguf_matvec.py's figures.

Issue 6 asks the GGUF mat-vec for 0.7 of copy bandwidth. This module answers
"is that reachable at all with fp32 arithmetic?" by measuring an independent
kernel: Triton on CUDA, searched over a grid of tile shapes, warps and stages,
for the legacy block types (32 elements a block, an fp16 scale, and for Q4_1
an fp16 minimum; 4-bit or 8-bit quants). The weights are split into a quants
array and scale arrays (`split_blocks`), decoded to fp32 and multiplied in fp32
like our kernels, never quantizing x. Like gguf_matvec.py it holds enough
distinct weights to defeat the L2 cache and runs them one after another on one
stream (each waits on the one before: chained); a CUDA graph replays them, so
launch costs are the GPU's own, and CUDA events time each round.

Its figures on an H100, beside our Vulkan kernel's, are in docs/journal.md (session 32,
"figures moved from benchmarks docstrings").

    python -m dynamo_vulkan.benchmarks.cuda_matvec [--types Q4_0,Q8_0] [--shapes 4096x4096]
"""
from __future__ import annotations

import argparse
import itertools
import math
import time

import numpy as np
import torch

TYPES = ("Q4_0", "Q4_1", "Q8_0")
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))
TARGET_BYTES = 192 << 20
# (rows per program, columns per step, warps, pipeline stages); the grid searched
CONFIGS = tuple(itertools.product((4, 8, 16), (1024, 2048), (4, 8), (1, 2)))
QUICK_CONFIGS = ((8, 2048, 4, 1), (8, 1024, 8, 2), (4, 2048, 4, 1))
# type -> (bytes of a block, quants' offset in it, 4-bit?, has a minimum?)
LAYOUT = {"Q4_0": (18, 2, True, False), "Q4_1": (20, 4, True, True), "Q8_0": (34, 2, False, False)}


def split_blocks(name: str, blocks: torch.Tensor, rows: int, cols: int):
    """GGML blocks (uint8) -> (quants, scales, mins or None): quants [rows, cols / 2]
    uint8 with element 2j in the low nibble of byte j (4-bit types) or [rows, cols]
    int8; scales and mins [rows, cols / 32] fp16. The bytes add up to the blocks'."""
    size, qoff, four, affine = LAYOUT[name]
    b = blocks.reshape(rows * cols // 32, size)
    half = lambda o: b[:, o:o + 2].contiguous().view(torch.float16).reshape(rows, cols // 32)  # noqa: E731
    if four:
        qs = b[:, qoff:qoff + 16]
        vals = torch.cat([qs & 0x0F, qs >> 4], dim=1)          # element order
        q = (vals[:, 0::2] | (vals[:, 1::2] << 4)).reshape(rows, cols // 2)
    else:
        q = b[:, qoff:qoff + 32].contiguous().view(torch.int8).reshape(rows, cols)
    return q.contiguous(), half(0).contiguous(), half(2).contiguous() if affine else None


def dequantize_split(name: str, q, s, m) -> torch.Tensor:
    """The fp32 weight the Triton kernel multiplies by, from split_blocks' arrays."""
    rows = q.shape[0]
    if LAYOUT[name][2]:
        w = torch.stack([q & 0x0F, q >> 4], dim=-1).reshape(rows, -1).float()
        w = w if m is not None else w - 8.0
    else:
        w = q.float()
    w = w.reshape(rows, -1, 32) * s.float()[..., None]
    if m is not None:
        w = w + m.float()[..., None]
    return w.reshape(rows, -1)


def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def matvec(q_ptr, s_ptr, m_ptr, x_ptr, o_ptr, K: tl.constexpr, FOUR: tl.constexpr,
               AFFINE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        rows = tl.program_id(0) * BN + tl.arange(0, BN)
        acc = tl.zeros([BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            if FOUR:
                qb = tl.load(q_ptr + rows[:, None] * (K // 2) + k0 // 2 + tl.arange(0, BK // 2)[None, :])
                lo, hi = (qb & 15).to(tl.float32), (qb >> 4).to(tl.float32)
                if not AFFINE:
                    lo, hi = lo - 8.0, hi - 8.0
                w = tl.reshape(tl.join(lo, hi), [BN, BK])
            else:
                w = tl.load(q_ptr + rows[:, None] * K + k0 + tl.arange(0, BK)[None, :]).to(tl.float32)
            xv = tl.load(x_ptr + k0 + tl.arange(0, BK))
            blk = rows[:, None] * (K // 32) + k0 // 32 + tl.arange(0, BK // 32)[None, :]
            d = tl.load(s_ptr + blk).to(tl.float32)
            acc += tl.sum(tl.sum(tl.reshape(w * xv[None, :], [BN, BK // 32, 32]), axis=2) * d, axis=1)
            if AFFINE:
                sx = tl.sum(tl.reshape(xv, [BK // 32, 32]), axis=1)
                acc += tl.sum(tl.load(m_ptr + blk).to(tl.float32) * sx[None, :], axis=1)
        tl.store(o_ptr + rows, acc)
    return matvec


def available() -> str | None:
    """None when CUDA and Triton are here, else why not."""
    if not torch.cuda.is_available():
        return "torch.cuda is not available"
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not importable ({e})"
    return None


def measure(name, rows, cols, configs=CONFIGS, target_bytes=TARGET_BYTES, rounds=10, seed=0) -> dict:
    """The best configuration's time per mat-vec (minimum over `rounds` graph replays
    of all copies), its error against the CPU op, and the configuration."""
    from dynamo_vulkan.gguf.op import gguf_linear
    from dynamo_vulkan.gguf.quants import quant_info, tensor_nbytes

    from .gguf_matvec import random_blocks
    kernel, qt = _kernel(), quant_info(name).ggml_type
    nbytes = tensor_nbytes(qt, rows, cols)
    copies = max(4, math.ceil(target_bytes / nbytes))
    rng = np.random.default_rng(seed)
    blocks0 = torch.from_numpy(random_blocks(name, nbytes, rng))
    weights = [split_blocks(name, blocks0, rows, cols)]
    weights += [split_blocks(name, torch.from_numpy(random_blocks(name, nbytes, rng)), rows, cols)
                for _ in range(copies - 1)]
    weights = [tuple(t.cuda() if t is not None else None for t in w) for w in weights]
    x = torch.randn(1, cols)
    ref = gguf_linear(x, blocks0, qt, rows, cols)[0]
    xc, out = x[0].cuda(), torch.empty(rows, device="cuda")
    four, affine = LAYOUT[name][2], LAYOUT[name][3]
    best, e0, e1 = None, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    tried = set()
    for bn, bk, warps, stages in configs:
        bk = min(bk, cols)
        if cols % bk or rows % bn or (bn, bk, warps, stages) in tried:
            continue
        tried.add((bn, bk, warps, stages))

        def launch(w):
            q, s, m = w
            kernel[(rows // bn,)](q, s, m if m is not None else s, xc, out, cols, four, affine, bn, bk,
                                  num_warps=warps, num_stages=stages)
        launch(weights[0])
        torch.cuda.synchronize()
        err = float((out.cpu() - ref).abs().max() / ref.abs().max())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for w in weights:
                launch(w)
        for _ in range(3):
            graph.replay()
        spans = []
        for _ in range(rounds):
            e0.record()
            graph.replay()
            e1.record()
            e1.synchronize()
            spans.append(e0.elapsed_time(e1) * 1e-3 / copies)
        t = min(spans)
        if best is None or t < best["us_per_matvec"] * 1e-6:
            best = {"type": name, "rows": rows, "cols": cols, "copies": copies, "weight_MB": nbytes / 1e6,
                    "us_per_matvec": t * 1e6, "GB_per_s": nbytes / t / 1e9, "max_rel_err": err,
                    "config": f"BN={bn} BK={bk} warps={warps} stages={stages}"}
        del graph
    if best is None:
        raise ValueError(f"no configuration fits {name} {rows}x{cols}")
    return best


def run(types=TYPES, shapes=SHAPES, configs=CONFIGS, budget_s=float("inf"), log=print, **kw) -> list[dict]:
    """Rows for each (type, shape); stops starting new ones past budget_s."""
    why = available()
    if why:
        raise RuntimeError(f"no CUDA mat-vec reference: {why}")
    out, t0 = [], time.perf_counter()
    for name in types:
        for rows, cols in shapes:
            if time.perf_counter() - t0 > budget_s:
                log(f"time budget of {budget_s:.0f} s spent; stopping")
                return out
            r = measure(name, rows, cols, configs=configs, **kw)
            log(f"{name:5s} {rows:6d}x{cols:<6d} triton {r['config']:34s} {r['us_per_matvec']:8.2f} us "
                f"{r['GB_per_s']:8.1f} GB/s  err {r['max_rel_err']:.1e}")
            out.append(r)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES))
    p.add_argument("--quick", action="store_true", help="three configurations, not the whole grid")
    a = p.parse_args(argv)
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s]
    return run(a.types.split(","), shapes, QUICK_CONFIGS if a.quick else CONFIGS)


if __name__ == "__main__":
    main()
