"""dynamo_vulkan.attention (dynamo_vulkan/fused.py) on shaders/attention.comp: one
workgroup per (query head, query row), online softmax over chunks of WG keys; for few
rows (decode) the keys are split across workgroups and the last of a row's splits to
finish merges them (FUSED_COMBINE; or a second kernel)."""
from __future__ import annotations

import numpy as np
import torch

from dynamo_vulkan import fused as _fused  # noqa: F401  (defines the custom ops)

from .core import LoweringError, f32_bits, groups_for, lowering

WG = 256         # invocations per workgroup (and keys per chunk, one invocation each)
MAX_DIM = 1024   # head dims held in shared memory (q row) and registers (output)
SPLIT_ROWS = 64  # fewer query rows than this (decode) split the keys across workgroups
SPLIT_TPK = 8    # ... with this many invocations per key's dot product
MAX_SPLITS = 64
FUSED_COMBINE = True  # the last split of a row merges them (else a second kernel does)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check(node) -> str | None:
    q, v = node.args[0].meta.get("val"), node.args[2].meta.get("val")
    if q is not None and v is not None and max(q.shape[-1], v.shape[-1]) > MAX_DIM:
        return f"attention head dims {q.shape[-1]}/{v.shape[-1]} exceed {MAX_DIM}"
    return None


@lowering(torch.ops.dynamo_vulkan.attention.default, check=_check)
def attention(ctx, q, k, v, mask, scale):
    q, k, v, mask = (ctx.ref(t) for t in (q, k, v, mask))
    if not (q.kind == k.kind == v.kind == "f32") or mask.kind != "b":
        raise LoweringError("attention needs float32 q/k/v and a bool mask")
    hq, t, d = q.shape
    hkv, c, dv = v.shape
    out = ctx.empty((hq, t, dv), "f32")
    if out.numel == 0:
        return out
    aligned = d % 4 == 0 and dv % 4 == 0 and k.strides[2] == 1 and v.strides[2] == 1 and \
        all(x % 4 == 0 for x in (k.offset, k.strides[0], k.strides[1],
                                 v.offset, v.strides[0], v.strides[1]))
    vw = 4 if aligned else 1
    dvlp = min(dv // vw, WG)
    rows = hq * t
    tpk, splits, split_keys = 1, 1, c
    if rows < SPLIT_ROWS and c > WG // SPLIT_TPK:
        # decode: few rows, so spread the keys over more workgroups (SPLIT_TPK
        # invocations per key) and merge the splits in a second kernel
        tpk = min(SPLIT_TPK, 1 << ((d // vw).bit_length() - 1))
        kpp = WG // tpk
        splits = min(MAX_SPLITS, _ceil_div(c, kpp))
        split_keys = _ceil_div(_ceil_div(c, splits), kpp) * kpp     # whole chunks per split
        splits = _ceil_div(c, split_keys)
    defines = {"WG": WG, "VW": vw, "D": d, "DV": dv, "DVL": dv // vw, "DVLP": dvlp,
               "PARTS": WG // dvlp, "DPT": -(-(dv // vw) // dvlp), "TPK": tpk, "KPP": WG // tpk,
               "SPLITS": splits}
    spec = [hq, t, c, hq // hkv, f32_bits(scale),
            q.offset, *q.strides, k.offset, *k.strides, v.offset, *v.strides,
            mask.offset, *mask.strides, split_keys]
    note = f"q[{hq}x{t}x{d}] over kv[{hkv}x{c}x{dv}]" + (" vec4" if vw == 4 else "")
    if splits == 1:
        ctx.dispatch("attention", defines, [out, q, k, v, mask], [0], spec, groups_for(rows),
                     note=note)
        return out
    scratch = ctx.empty((rows * splits * (dv + 2),), "f32")
    if FUSED_COMBINE:
        # a counter per row, zero at upload and reset by the row's last split
        counter = ctx.buffer(rows, "const", "i32", np.zeros(rows, np.uint32))
        ctx.dispatch("attention", defines | {"SCRATCH_BINDING": 5, "COUNTER_BINDING": 6},
                     [out, q, k, v, mask, scratch, counter], [0, 5, 6], spec,
                     groups_for(rows * splits), note=f"{note}, {splits} splits merged by the last")
        return out
    ctx.dispatch("attention", defines | {"SCRATCH_BINDING": 5}, [out, q, k, v, mask, scratch],
                 [5], spec, groups_for(rows * splits), note=f"{note}, {splits} splits")
    ctx.dispatch("attention", {"WG": WG, "DV": dv, "SPLITS": splits, "COMBINE": 1,
                               "VARIANT": "combine", "SCRATCH_BINDING": 1},
                 [out, scratch], [0], spec[:5], groups_for(rows),
                 note=f"{splits} splits of {rows} rows")
    return out
