"""Matmul family (shaders/matmul.comp): mm, bmm, addmm, baddbmm with
transposed or broadcast operands read through their strides."""
from __future__ import annotations

import torch

from .core import Context, TRef, f32_bits, k_splits, lowering
from .elementwise import add_slices

aten = torch.ops.aten
TILE = 64
SKINNY_M = 8   # rows up to which the skinny (mat-vec) kernel is used
MV_WG = 64


def matmul(ctx: Context, a: TRef, b: TRef, bias=None, alpha=1.0, beta=1.0) -> TRef:
    if a.ndim == 2:
        a = a.with_layout((1,) + a.shape, (0,) + a.strides, a.offset)
        b = b.with_layout((1,) + b.shape, (0,) + b.strides, b.offset)
    nb, m, k = a.shape
    n = b.shape[2]
    out = ctx.empty(ctx.out_shape(), "f32")
    if out.numel == 0:
        return out
    sb_a = a.strides[0] if a.shape[0] > 1 else 0
    sb_b = b.strides[0] if b.shape[0] > 1 else 0
    spec = [m, n, k, a.offset, sb_a, a.strides[1], a.strides[2],
            b.offset, sb_b, b.strides[1], b.strides[2], 0, 0, 0, 0, f32_bits(alpha), f32_bits(beta)]
    defines = {"VARIANT": "tiled64"}
    bindings = [out, a, b]
    if bias is not None and beta != 0:
        c = ctx.ref(bias)
        shape = (nb, m, n)
        pad = 3 - c.ndim
        sizes = (1,) * pad + c.shape
        strides = (0,) * pad + c.strides
        cs = [0 if sz == 1 else st for sz, st in zip(sizes, strides)]
        spec[11:15] = [c.offset, *cs]
        defines["HAS_BIAS"] = 1
        bindings.append(c)
    if k == 0:
        spec[2] = 0
    note = f"[{nb}x{m}x{k}] @ [{k}x{n}]"
    if m <= SKINNY_M:    # few rows (decode): one workgroup per output column
        defines["VARIANT"] = "skinny"
        ctx.dispatch("matvec", defines, bindings, [0], [MV_WG] + spec,
                     (min(n, 65535), -(-n // 65535), nb), note=note)
        return out
    tiles = (-(-n // TILE), -(-m // TILE))
    splits, ks = k_splits(ctx.caps, tiles[0] * tiles[1] * nb, k, nb * m * n)
    if splits == 1:
        ctx.dispatch("matmul", defines, bindings, [0], spec, (*tiles, nb), note=note)
        return out
    # too few tiles to fill the GPU: K in slices, each a partial product, then their sum
    part = ctx.empty((splits, nb, m, n), "f32")
    ctx.dispatch("matmul", defines, [part] + bindings[1:], [0], spec + [ks, splits, nb],
                 (*tiles, nb * splits), note=f"{note}, K in {splits} splits")
    add_slices(ctx, part, out.with_layout((nb, m, n), (m * n, n, 1), out.offset))
    return out


@lowering(aten.mm.default, aten.bmm.default)
def mm(ctx, a, b):
    return matmul(ctx, ctx.ref(a), ctx.ref(b))


@lowering(aten.addmm.default, aten.baddbmm.default)
def addmm(ctx, bias, a, b, beta=1.0, alpha=1.0):
    return matmul(ctx, ctx.ref(a), ctx.ref(b), bias, alpha, beta)
