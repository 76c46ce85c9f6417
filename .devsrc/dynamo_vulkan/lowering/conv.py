"""Convolution family (shaders/conv.comp): aten.convolution for 1-d, 2-d and
3-d inputs, groups, stride, padding, dilation, and transposed convolutions.
Every shape is brought to (N, C, D, H, W) by adding size-1 spatial dims as
views, so one kernel serves all of them."""
from __future__ import annotations

import torch

from .core import Context, LoweringError, TRef, groups_for, host_matmul, lowering

aten = torch.ops.aten
WG = 64


def as_5d(ref: TRef, batched: bool = True) -> TRef:
    """(N, C, *spatial) with 1..3 spatial dims -> (N, C, D, H, W) by size-1 views."""
    if not batched:
        ref = ref.with_layout((1,) + ref.shape, (0,) + ref.strides, ref.offset)
    lead, spatial = ref.shape[:2], ref.shape[2:]
    pad = 3 - len(spatial)
    if pad < 0:
        raise LoweringError(f"{len(spatial)} spatial dims (at most 3 are supported)")
    return ref.with_layout(lead + (1,) * pad + spatial,
                           ref.strides[:2] + (0,) * pad + ref.strides[2:], ref.offset)


def _triple(v, n: int, fill: int) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v] * n
    if len(v) == 1 and n > 1:
        v = v * n
    return [fill] * (3 - n) + [int(x) for x in v]


def conv(ctx: Context, x: TRef, w: TRef, bias, stride, padding, dilation, transposed: bool,
         groups: int, out_shape) -> TRef:
    nsp = w.ndim - 2
    batched = x.ndim == w.ndim
    x5, w5 = as_5d(x, batched), as_5d(w)
    out = ctx.empty(out_shape, "f32")
    o5 = as_5d(out, batched)
    if out.numel == 0:
        return out
    n, cin = x5.shape[:2]
    cout = o5.shape[1]
    spec = [WG, out.numel, cout, cin // groups, cout // groups, *x5.shape[2:], *o5.shape[2:],
            *w5.shape[2:], *_triple(stride, nsp, 1), *_triple(padding, nsp, 0),
            *_triple(dilation, nsp, 1), x5.offset, *x5.strides, w5.offset, *w5.strides, 0, 0]
    defines = {"VARIANT": "transposed" if transposed else "direct"}
    bindings = [out, x5, w5]
    if bias is not None:
        b = ctx.ref(bias)
        spec[-2:] = [b.offset, b.strides[0] if b.ndim else 0]
        defines["HAS_BIAS"] = 1
        bindings.append(b)
    if transposed:
        defines["TRANSPOSED"] = 1
    ctx.dispatch("conv", defines, bindings, [0], spec, groups_for(out.numel, WG),
                 note=f"{x.shape} * {w.shape} groups={groups}")
    return out


def _check(node) -> str | None:
    w = node.args[1].meta["val"]
    if w.dim() - 2 > 3:
        return "convolution with more than 3 spatial dims"
    # a product whose rows are the output's positions: on a CPU device, torch's (oneDNN's)
    # convolution is hundreds of times faster than ours on lavapipe (docs/journal.md, session 29)
    out = node.meta.get("val")
    return host_matmul(out.numel() // max(1, out.shape[1])) if isinstance(out, torch.Tensor) and \
        out.dim() >= 3 else None


@lowering(aten.convolution.default, check=_check)
def convolution(ctx, x, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    return conv(ctx, ctx.ref(x), ctx.ref(weight), bias, stride, padding, dilation,
                bool(transposed), int(groups), ctx.out_shape())
