"""Tensor-core matmul (issue 33) per tile variant: TFLOP/s of our kernels beside torch CUDA.

For each shape (M x K x N, x @ W with W a parameter) and each kind -- fp32 under precision
"highest" (exact fp32 kernels), "high" (bf16x3), "medium" (bf16), and fp16 tensors -- the
kernels' GPU time (the backend's timestamps, copies left out) under each tile variant of
lowering/coopmat.py (TILE, SUBGROUPS), its relative error against an fp64 product, the
note of the kernel that ran, and torch CUDA's time for the same kind (fp32 with TF32 off,
TF32, bf16 tensors, fp16 tensors). A measurement script, not a test: it sets coopmat's
module knobs and keeps each variant's plans apart by the device's name.

    python3 -m dynamo_vulkan.benchmarks.coopmat_sweep [--variants 128x128/2x4,128x256/2x4]
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch

from .gputime import kernel_ms_per_call, profiled

SHAPES = [(4096, 4096, 4096), (512, 3584, 18944)]
KINDS = ("highest", "high", "medium", "fp16")
CUDA_BASE = {"highest": "fp32", "high": "TF32", "medium": "bf16", "fp16": "fp16"}


def _variant(text: str, bk_choices: tuple, pack: str | None
             ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, ...], dict, str | None, int | None]:
    """"128x256/2x4" -> ((128, 256), ((2, 4),), bk_choices, {}, pack, None); an optional
    third part names the K step ("128x128/2x4/64"); "+NAME" ("+NAME=VALUE") suffixes add
    (or override) kernel defines ("+NAME=none" drops one: "+ACC16=none", fp32 sums),
    "+packAB" ("+packA", "+packB", "+pack") sets which operands are converted first,
    "+splits=N" the K split (coopmat.FORCE_SPLITS)."""
    head, *extra = text.split("+")
    tile, sub, *bk = head.split("/")
    bks = (int(bk[0]),) if bk else bk_choices
    pack = next((e[4:] for e in extra if e.startswith("pack")), pack)
    return (tuple(map(int, tile.split("x"))), (tuple(map(int, sub.split("x"))),), bks,
            {n: None if v == "none" else int(v) if v else 1
             for n, _, v in (e.partition("=") for e in extra
                             if not e.startswith(("pack", "splits=")))},
            pack, next((int(e[7:]) for e in extra if e.startswith("splits=")), None))


_REFERENCE: dict = {}     # (m, k, n, kind) -> the fp64 product, computed once


def _ours(m, k, n, kind, reps) -> tuple[float, float, float, str]:
    """(median kernel ms, median ms of the matmul kernels alone (no 16-bit copies),
    relative error, notes) of our compiled x @ W."""
    import dynamo_vulkan  # noqa: F401  (the backend)
    from dynamo_vulkan.runtime import program

    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    w = torch.nn.Parameter(torch.randn(k, n, generator=g) / k ** 0.5, requires_grad=False)
    if kind == "fp16":
        x, w = x.half(), torch.nn.Parameter(w.detach().half(), requires_grad=False)
    torch.set_float32_matmul_precision("highest" if kind == "fp16" else kind)
    torch._dynamo.reset()
    seen = []
    init = program.Program.__init__

    def spy(self, plan, *a, **kw):
        seen.append(plan)
        init(self, plan, *a, **kw)
    program.Program.__init__ = spy
    try:
        with torch.no_grad(), profiled() as cap:
            fn = torch.compile(lambda t: t @ w, backend="vulkan", dynamic=False)
            out = fn(x)
            samples, _ = kernel_ms_per_call(cap, lambda: fn(x), reps)
            alone, _ = kernel_ms_per_call(cap, lambda: fn(x), reps, prefix="matmul")
    finally:
        program.Program.__init__ = init
    want = _REFERENCE.get((m, k, n, kind))
    if want is None:
        want = _REFERENCE[(m, k, n, kind)] = x.double() @ w.double()
    err = ((out.double() - want).norm() / want.norm()).item()
    notes = "; ".join(d.note for p in seen for d in p.dispatches if d.name.startswith("matmul"))
    return statistics.median(samples), statistics.median(alone), err, notes


def _cuda(m, k, n, kind, reps) -> float | None:
    if not torch.cuda.is_available():
        return None
    dt = {"fp16": torch.float16, "medium": torch.bfloat16}.get(kind, torch.float32)
    x = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(k, n, device="cuda", dtype=dt)
    torch.backends.cuda.matmul.allow_tf32 = kind == "high"
    for _ in range(3):
        x @ w
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        x @ w
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    torch.backends.cuda.matmul.allow_tf32 = False
    return statistics.median(times)


def main(argv=None) -> None:
    from dynamo_vulkan import device
    from dynamo_vulkan.lowering import coopmat

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", default="128x128/4x4,128x128/2x4,128x128/2x2/16,256x128/4x2/16",
                   help="tile/subgroups, comma-separated (the first is the default's)")
    p.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES))
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)
    os.environ.setdefault("DYNAMO_VULKAN_TENSOR_CORES", "auto")    # off by default
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    kinds = args.kinds.split(",")
    info = device.device_info()
    name = info["name"]
    print(f"device: {name}; torch CUDA: "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'absent'}")
    print("| shape | kind | variant | ours TFLOP/s | matmul alone | torch CUDA TFLOP/s | ratio | "
          "rel. error | kernel |")
    print("|---|---|---|---|---|---|---|---|---|")
    saved = (coopmat.TILE, coopmat.SUBGROUPS, torch.get_float32_matmul_precision(),
             coopmat.BK_CHOICES, coopmat.EXTRA_DEFINES, coopmat.FORCE_PACK, coopmat.FORCE_SPLITS)
    try:
        for m, k, n in shapes:
            flop = 2 * m * k * n
            for kind in kinds:
                base = _cuda(m, k, n, kind, args.reps)
                base_tf = flop / base / 1e9 if base else None
                variants = args.variants.split(",") if kind != "highest" else args.variants.split(",")[:1]
                for v in variants:
                    (coopmat.TILE, coopmat.SUBGROUPS, coopmat.BK_CHOICES, coopmat.EXTRA_DEFINES,
                     coopmat.FORCE_PACK, coopmat.FORCE_SPLITS) = _variant(v, saved[3], saved[5])
                    info["name"] = f"{name} [coopmat {v}]"
                    try:
                        ms, alone, err, notes = _ours(m, k, n, kind, args.reps)
                        tf = flop / ms / 1e9
                        ratio = f"{tf / base_tf:.2f}" if base_tf else "-"
                        print(f"| {m}x{k}x{n} | {kind} | {v} | {tf:.4g} | {flop / alone / 1e9:.4g} | "
                              f"{f'{base_tf:.4g} ({CUDA_BASE[kind]})' if base_tf else '-'} | {ratio} | "
                              f"{err:.2e} | {notes} |", flush=True)
                    except Exception as e:     # one variant's failure is a row, the sweep goes on
                        print(f"| {m}x{k}x{n} | {kind} | {v} | failed | - | - | - | - | "
                              f"{type(e).__name__}: {str(e)[:200]} |", flush=True)
    finally:
        coopmat.TILE, coopmat.SUBGROUPS = saved[0], saved[1]
        coopmat.BK_CHOICES, coopmat.EXTRA_DEFINES, coopmat.FORCE_PACK = saved[3], saved[4], saved[5]
        coopmat.FORCE_SPLITS = saved[6]
        torch.set_float32_matmul_precision(saved[2])
        info["name"] = name


if __name__ == "__main__":
    main()
