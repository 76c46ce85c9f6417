"""Mat-vec speed of the fused GGUF kernels: GB/s of quantized weight bytes read.

One Program holds L copies of a weight shape (distinct GPU buffers, together
well past the GPU's L2 cache, so every read comes from DRAM) and one mat-vec
dispatch per copy, that chain recorded R times over:
  - "chained": every dispatch writes the same output, which shares its buffer with
    every x, so a barrier orders all the dispatches (a decoder's layers, each x made
    from the last output: no overlap between kernels, the integer-dot path's planes
    kernel included);
  - "overlapped": independent dispatches, which the GPU may overlap (a barrier
    between the rounds, which write the same outputs again).
The time per mat-vec is the difference of the wall times of the chain recorded 2R and
R times, over R * L: the submit, uploads and read-back cancel, and no GPU timestamp is
written between the kernels. kp's timestamps (written after every op, ALL_COMMANDS)
cost each chained op about 1.1 us that a decode step does not pay, and the integer-dot
path, two ops a mat-vec, twice: on the H100 (2026-11-24) a chained read of 9.4 MB took
6.68 us with them against 5.58 without, Q8_0 4096 x 4096 mat-vecs 11.14 against 9.11.
Weights are random bytes with modest fp16 scales (speed does not depend on the
values); the first weight's result is checked against the CPU op. Beside each
chained figure: a kernel that only streams the same bytes, chained and timed the same
way (benchmarks/probes.py ChainedRead), the most any mat-vec of that weight can do.

    python benchmarks/gguf_matvec.py [--types Q4_0,Q8_0] [--shapes 4096x4096]
        [--variants 1x128x4,2x64x2] [--modes chained] [--out DIR]

`run(...)` returns the rows as dicts for the benchmark harness.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K")   # F16 / F32 also work (as a reference)
SHAPES = ((4096, 4096), (4096, 14336), (14336, 4096))   # (rows, cols) of W
TARGET_BYTES = 192 << 20     # weights per measurement (H200 L2: 60 MB)
ROUNDS = 4       # the chain of mat-vecs recorded 4 and 8 times: the time is their difference
WARMUP_S = 0.3   # seconds of the measured submits first (uploads, first-use costs)
HEAT_S = 0.5     # then of a dense load (probes.ChainedRead.heat), so clocks are up


def random_blocks(name: str, nbytes: int, rng: np.random.Generator) -> np.ndarray:
    """nbytes of GGUF blocks of type `name`: random quant bits, modest fp16 scales
    (F32/F16: normal values)."""
    from dynamo_vulkan.gguf.quants import quant_info
    if name in ("F32", "F16"):
        w = rng.standard_normal(nbytes // (4 if name == "F32" else 2), dtype=np.float32)
        return (w if name == "F32" else w.astype(np.float16)).view(np.uint8)
    from dynamo_vulkan.gguf.random_blocks import random_blocks as blocks
    return blocks(name, nbytes // quant_info(name).type_size, rng).reshape(-1)


def _weights(name, nbytes, cols, m, copies, rng):
    """The args of a chain of `copies` mat-vecs of `nbytes` weights each: x, then each
    weight's blocks. Each mat-vec has its own x, so nothing made from x (the integer-dot
    path's planes) is shared between them: a decoder's mat-vecs mostly read an x of
    their own."""
    data = torch.from_numpy(random_blocks(name, nbytes * copies, rng))
    return [torch.randn(copies, m, cols), *(data[i * nbytes:(i + 1) * nbytes] for i in range(copies))]


def _program(name, rows, cols, args, chained, rounds=1):
    """A Program of `rounds` times the chain of mat-vecs of `args` (_weights), and the
    args it takes. Chained, the output and every x share one buffer (the output first),
    so each dispatch waits behind a barrier for the one before, as in a decoder, where x
    is made from the last output: the integer-dot path's planes kernel too, which would
    otherwise run beside the mat-vec before it."""
    from dynamo_vulkan import device
    from dynamo_vulkan.gguf.gpu_layout import packed_kind
    from dynamo_vulkan.gguf.quants import quant_info
    from dynamo_vulkan.lowering.core import Context, TRef
    from dynamo_vulkan.lowering.gguf import emit_linear
    from dynamo_vulkan.runtime.plan import InputSpec, OutputSpec, words_of
    from dynamo_vulkan.runtime.program import Program

    qt = quant_info(name).ggml_type
    x, blocks = args[0], args[1:]
    copies, m = x.shape[0], x.shape[1]
    ctx = Context(device.device_info())
    plan = ctx.plan
    head = m * rows if chained else 0          # the output's words before x's
    xin = torch.cat([torch.zeros(head), x.reshape(-1)]) if chained else x
    xbuf = ctx.buffer(xin.numel(), "input", "f32")
    plan.inputs.append(InputSpec(xbuf, str(xin.dtype), tuple(xin.shape), False))
    kind = packed_kind(qt, cols)
    ws = []
    for b in blocks:
        ws.append(TRef(ctx.buffer(words_of(kind, b.numel()), "param", kind), (b.numel(),), (1,), 0, kind))
        plan.inputs.append(InputSpec(ws[-1].buf, str(b.dtype), tuple(b.shape), True))
    outs = [TRef(xbuf, (m, rows), (rows, 1), 0, "f32")] if chained else \
        [ctx.empty((m, rows), "f32") for _ in range(copies)]
    for _ in range(rounds):
        ctx.forget_derived()           # each round makes x's planes again, as the first did
        for i, w in enumerate(ws):
            xr = TRef(xbuf, (m, cols), (cols, 1), head + i * m * cols, "f32")
            emit_linear(ctx, outs[0 if chained else i], xr, w, qt, rows, cols)
    ctx.run_before_dispatch()          # kernels still waiting to be emitted (elementwise siblings)
    for o in outs:
        if not chained:
            plan.buffers[o.buf].role = "output"
        plan.outputs.append(OutputSpec(o.buf, "torch.float32", (m, rows)))
    return Program(plan, [xin, *blocks]), [xin, *blocks]


def kernel_config(prog) -> str:
    """The first mat-vec dispatch's rows per group, threads per row group, workgroup size
    and unroll, as its source and specialisation constants hold them."""
    d = next(d for d in prog.plan.dispatches if d.name.startswith("gguf_matvec"))
    from dynamo_vulkan.runtime.shaders import head_defines
    defs = head_defines(prog.plan.sources[d.spirv_key])
    if d.name.startswith("gguf_matvec_idot"):
        return f"idot NR={defs.get('NR')} WG={d.spec[0]} U={defs.get('UNROLL')}"
    return f"NR={defs.get('NR')} TPR={defs.get('TPR')} WG={d.spec[0]} U={defs.get('UNROLL')}"


def measure(name, rows, cols, m=1, calls=20, chained=True, seed=0,
            target_bytes=TARGET_BYTES, warmup_s=WARMUP_S, heat_s=HEAT_S) -> dict:
    """Time per mat-vec: the difference of the median wall times of the chain recorded
    2 * ROUNDS and ROUNDS times (`calls` submits each, alternated), after `warmup_s`
    seconds of the same submits and `heat_s` of a dense load (the GPU's clocks up);
    chained, beside a chained read of the same bytes, timed right after."""
    from dynamo_vulkan import device
    from dynamo_vulkan.gguf.op import gguf_linear
    from dynamo_vulkan.gguf.quants import quant_info, tensor_nbytes
    rng = np.random.default_rng(seed)
    nbytes = tensor_nbytes(quant_info(name).ggml_type, rows, cols)
    copies = max(4, math.ceil(target_bytes / nbytes))
    args = _weights(name, nbytes, cols, m, copies, rng)
    (short, pargs), (long, _) = (_program(name, rows, cols, args, chained, r) for r in (ROUNDS, 2 * ROUNDS))
    from .probes import ChainedRead, wall_difference
    floor = ChainedRead(nbytes, copies)       # made before the warm-up; also its load
    t_end, n = time.perf_counter() + warmup_s, 0
    while n < 3 or time.perf_counter() < t_end:      # warm-up (uploads, clocks)
        short(pargs)
        long(pargs)
        n += 1
    if not device.is_cpu():              # a CPU device has no clocks to bring up
        floor.heat(heat_s)
    per = wall_difference(lambda: short(pargs), lambda: long(pargs), calls) / (ROUNDS * copies)
    floor_gbps = floor.gbps(calls)["gbps"] if chained else None   # at once: as warm
    floor.close()
    qt = quant_info(name).ggml_type
    outs = short(pargs)
    last = -1 if chained else 0          # what outs[0] holds: the last weight's, or the first's
    ref = gguf_linear(args[0][last], args[last if chained else 1], qt, rows, cols)
    err = float((outs[0] - ref).abs().max() / ref.abs().max())
    return {"type": name, "rows": rows, "cols": cols, "m": m, "copies": copies,
            "mode": "chained" if chained else "overlapped", "weight_MB": nbytes / 1e6,
            "us_per_matvec": per * 1e6, "GB_per_s": nbytes / per / 1e9,
            "max_rel_err": err, "kernel": kernel_config(short),
            "read_floor_GB_per_s": floor_gbps}


def run(types=TYPES, shapes=SHAPES, variants=((1, 128, 4),), modes=(True, False), m=1,
        budget_s=float("inf"), target_bytes=TARGET_BYTES, calls=20, warmup_s=WARMUP_S,
        log=print) -> list[dict]:
    """All (type, shape, variant, mode) rows; stops starting new ones past budget_s."""
    from dynamo_vulkan.lowering import gguf as lowering, gguf_int_dot as int_dot
    rows_out, t0 = [], time.perf_counter()
    settings = {lowering: ("MV_NR", "MV_MANY_NR", "MV_WG", "MV_UNROLL", "MV_CPL"),
                int_dot: ("INT_DOT_SHAPES", "INT_DOT_UNROLL", "INT_DOT_UNROLLS")}
    saved = {(mod, k): getattr(mod, k) for mod, names in settings.items() for k in names}
    try:
        for variant in variants:
            for (mod, k), v in saved.items():  # what the variant leaves alone stays default
                setattr(mod, k, v)
            if variant[0] == "idot":           # the integer-dot kernel's
                nr, wg, int_dot.INT_DOT_UNROLL = variant[1:]
                int_dot.INT_DOT_SHAPES = {(None, kind): (nr, wg) for kind in ("few", "long", "many")}
                int_dot.INT_DOT_UNROLLS = {}
            else:
                nr, wg, unroll, *cpl = variant
                # the variant's rows a thread group, for many rows of W as for few
                lowering.MV_NR = lowering.MV_MANY_NR = nr
                lowering.MV_WG, lowering.MV_UNROLL = wg, unroll
                if cpl:
                    lowering.MV_CPL = cpl[0]
            for name in types:
                for rows, cols in shapes:
                    for chained in modes:
                        if time.perf_counter() - t0 > budget_s:
                            log(f"time budget of {budget_s:.0f} s spent; stopping")
                            return rows_out
                        r = measure(name, rows, cols, m=m, chained=chained, calls=calls,
                                    target_bytes=target_bytes, warmup_s=warmup_s)
                        r["variant"] = r["kernel"] + ("" if variant[0] == "idot" else f" CPL={lowering.MV_CPL}")
                        rows_out.append(r)
                        log(f"{name:5s} {rows:6d}x{cols:<6d} {r['variant']:16s} {r['mode']:10s} "
                            f"{r['us_per_matvec']:8.2f} us {r['GB_per_s']:8.1f} GB/s"
                            + (f" ({r['GB_per_s'] / r['read_floor_GB_per_s']:.2f} of a chained read)"
                               if r["read_floor_GB_per_s"] else "")
                            + f"  err {r['max_rel_err']:.1e}")
    finally:
        for (mod, k), v in saved.items():
            setattr(mod, k, v)
    return rows_out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--shapes", default=",".join(f"{r}x{c}" for r, c in SHAPES))
    p.add_argument("--variants", default="1x128x4",
                   help="NRxWGxU[xCPL]: W rows per workgroup x threads x chunks per thread and "
                        "step [x neighbouring chunks per thread]; iNRxWGxU: the integer-dot "
                        "kernel's W rows per workgroup x threads x blocks per thread and step")
    p.add_argument("--modes", default="chained,overlapped")
    p.add_argument("--m", type=int, default=1, help="rows of x (<= 8)")
    p.add_argument("--target-mb", type=float, default=TARGET_BYTES / 2**20,
                   help="weight bytes per measurement (well past the L2 cache)")
    p.add_argument("--calls", type=int, default=20, help="timed submits per measurement")
    p.add_argument("--warmup", type=float, default=WARMUP_S, help="seconds of submits before timing")
    p.add_argument("--budget", type=float, default=float("inf"), help="seconds")
    p.add_argument("--out", default=None, help="directory for gguf_matvec_TAG.json")
    p.add_argument("--tag", default="run")
    a = p.parse_args(argv)
    from dynamo_vulkan import device
    info = device.device_info()
    print(f"device: {info.get('name')} ({info.get('driver_info', '')})")
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s]
    variants = [("idot", *(int(v) for v in s[1:].split("x"))) if s.startswith("i")
                else tuple(int(v) for v in s.split("x")) for s in a.variants.split(",") if s]
    modes = tuple(m == "chained" for m in a.modes.split(",") if m)
    rows = run(a.types.split(","), shapes, variants, modes=modes, m=a.m, budget_s=a.budget,
               target_bytes=int(a.target_mb * 2**20), calls=a.calls, warmup_s=a.warmup)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"gguf_matvec_{a.tag}.json").write_text(json.dumps(
            {"device": info.get("name"), "driver": info.get("driver_info"),
             "argv": sys.argv, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
