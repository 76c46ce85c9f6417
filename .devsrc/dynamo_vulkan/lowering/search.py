"""Binary search (shaders/search.comp): searchsorted and bucketize."""
from __future__ import annotations

import torch

from .core import groups_for, lowering
from .elementwise import contiguous, ew

aten = torch.ops.aten
WG = 64


def search(ctx, seq, values, right: bool, sorter=None, out_shape=None):
    seq, values = contiguous(ctx, ctx.ref(seq)), ctx.ref(values)
    kind = "f32" if "f32" in (seq.kind, values.kind) else "i32"
    if values.kind != kind or not values.is_contiguous():
        values = ew(ctx, "$0", [values], kind, compute=kind)
    if seq.kind != kind:
        seq = ew(ctx, "$0", [seq], kind, compute=kind)
    out = ctx.empty(out_shape, "i32")
    n = values.numel
    if n == 0:
        return out
    length = seq.shape[-1] if seq.ndim else 1
    vpr = 0 if seq.ndim <= 1 else n // max(1, seq.numel // max(1, length))
    glsl = "float" if kind == "f32" else "int"
    defines = {"VARIANT": f"{kind}{'_right' if right else ''}", "VAL_T": glsl,
               "LOAD(w)": "ld_f32(w)" if kind == "f32" else "ld_i32(w)"}
    if kind == "f32":
        defines["IS_FLOAT"] = 1
    if right:
        defines["RIGHT"] = 1
    bindings = [out, seq, values]
    if sorter is not None:
        defines["SORTER"] = 1
        bindings.append(contiguous(ctx, ctx.ref(sorter)))
    ctx.dispatch("search", defines, bindings, [0], [WG, n, length, vpr], groups_for(n, WG),
                 note=f"search {values.shape} in {seq.shape}")
    return out


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(ctx, seq, values, *, out_int32=False, right=False, side=None, sorter=None):
    if not isinstance(values, (torch.Tensor,)) and not hasattr(values, "buf"):
        values = torch.tensor(values)
    return search(ctx, seq, values, bool(right) or side == "right", sorter, ctx.out_shape())


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(ctx, values, boundaries, *, out_int32=False, right=False):
    if not isinstance(values, torch.Tensor) and not hasattr(values, "buf"):
        values = torch.tensor(values)
    return search(ctx, boundaries, values, bool(right), None, ctx.out_shape())


@lowering(aten._cdist_forward.default)
def cdist(ctx, x1, x2, p, compute_mode=None):
    """Pairwise p-distances (shaders/cdist.comp) of row sets broadcast over batch dims."""
    from .core import f32_bits
    out_shape = ctx.out_shape()
    x1, x2 = ctx.ref(x1), ctx.ref(x2)
    batch = out_shape[:-2]
    a = ew(ctx, "$0", [x1], "f32", compute="f32", shape=batch + x1.shape[-2:])
    b = ew(ctx, "$0", [x2], "f32", compute="f32", shape=batch + x2.shape[-2:])
    out = ctx.empty(out_shape, "f32")
    if out.numel == 0:
        return out
    if x1.shape[-1] == 0:
        return ew(ctx, "0.0", [], "f32", shape=out_shape)
    p = float(p)
    tag = {0.0: "P_ZERO", 1.0: "P_ONE", 2.0: "P_TWO", float("inf"): "P_INF"}.get(p, "P_ANY")
    ctx.dispatch("cdist", {"VARIANT": tag.lower(), tag: 1}, [out, a, b], [0],
                 [WG, out.numel, out_shape[-2], out_shape[-1], x1.shape[-1], f32_bits(p)],
                 groups_for(out.numel, WG), note=f"cdist {x1.shape} {x2.shape} p={p}")
    return out


@lowering(aten._pdist_forward.default)
def pdist(ctx, x, p=2):
    """Distances of every pair of rows i < j (shaders/cdist.comp, PDIST)."""
    from .core import f32_bits
    x = ctx.ref(x)
    a = ew(ctx, "$0", [x], "f32", compute="f32")
    out = ctx.empty(ctx.out_shape(), "f32")
    if out.numel == 0:
        return out
    p = float(p)
    tag = {0.0: "P_ZERO", 1.0: "P_ONE", 2.0: "P_TWO", float("inf"): "P_INF"}.get(p, "P_ANY")
    ctx.dispatch("cdist", {"VARIANT": f"pdist_{tag.lower()}", tag: 1, "PDIST": 1}, [out, a, a],
                 [0], [WG, out.numel, x.shape[0], x.shape[0], x.shape[1], f32_bits(p)],
                 groups_for(out.numel, WG), note=f"pdist {x.shape} p={p}")
    return out
