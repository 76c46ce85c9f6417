"""dynamo_vulkan.attention (dynamo_vulkan/fused.py) as one kernel: shaders/attention.comp,
one workgroup per (query head, query row), online softmax over chunks of WG keys."""
from __future__ import annotations

import torch

from dynamo_vulkan import fused as _fused  # noqa: F401  (defines the custom ops)

from .core import LoweringError, f32_bits, groups_for, lowering

WG = 256         # keys per chunk, and invocations per workgroup
MAX_DIM = 1024   # head dims held in shared memory (q row) and registers (output)


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
    defines = {"WG": WG, "VW": vw, "D": d, "DV": dv, "DVL": dv // vw, "DVLP": dvlp,
               "PARTS": WG // dvlp, "DPT": -(-(dv // vw) // dvlp)}
    spec = [hq, t, c, hq // hkv, f32_bits(scale),
            q.offset, *q.strides, k.offset, *k.strides, v.offset, *v.strides,
            mask.offset, *mask.strides]
    ctx.dispatch("attention", defines, [out, q, k, v, mask], [0], spec, groups_for(hq * t),
                 note=f"q[{hq}x{t}x{d}] over kv[{hkv}x{c}x{dv}]" + (" vec4" if vw == 4 else ""))
    return out
