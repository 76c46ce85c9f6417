"""Pooling family (shaders/pool.comp): max pooling with indices, average
pooling, adaptive average and adaptive max pooling over 1 to 3 spatial dims
(what the core decompositions leave: the 2-d and 3-d ATen forms; 1-d pools
reach us as 2-d ones on unsqueezed inputs)."""
from __future__ import annotations

import torch

from .conv import _triple
from .core import Context, LoweringError, TRef, groups_for, lowering
from .determinism import float_atomics_check
from .elementwise import ew

aten = torch.ops.aten
WG = 64


def _planes(ref: TRef, nsp: int) -> TRef:
    """(N, C, D, H, W) view of a (N?, C?, *spatial) tensor with nsp spatial dims."""
    lead = ref.ndim - nsp
    shape, strides = list(ref.shape), list(ref.strides)
    while lead < 2:                       # unbatched (C, ...) or bare planes
        shape.insert(0, 1)
        strides.insert(0, 0)
        lead += 1
    if lead > 2:                          # fold extra leading dims into N when expressible
        raise LoweringError(f"{ref.ndim}-d input for a {nsp}-d pool")
    pad = 3 - nsp
    return ref.with_layout(shape[:2] + [1] * pad + shape[2:],
                           strides[:2] + [0] * pad + strides[2:], ref.offset)


def pool(ctx: Context, x: TRef, nsp: int, mode: str, kernel=(1,), stride=(), padding=(0,),
         dilation=(1,), divisor=None, include_pad=True, out_shape=None):
    """mode: max | avg | adaptive_avg | adaptive_max. Returns out (and int32 indices for max)."""
    is_max = mode.endswith("max")
    out = ctx.empty(out_shape, "f32")
    idx = ctx.empty(out_shape, "i32") if is_max else None
    x5, o5 = _planes(x, nsp), _planes(out, nsp)
    if out.numel:
        stride = stride if stride else kernel
        spec = [WG, out.numel, x5.shape[1], *x5.shape[2:], *o5.shape[2:],
                *_triple(kernel, nsp, 1), *_triple(stride, nsp, 1), *_triple(padding, nsp, 0),
                *_triple(dilation, nsp, 1), x5.offset, *x5.strides, int(divisor or 0),
                int(bool(include_pad))]
        defines = {"VARIANT": mode, "MAX" if is_max else "AVG": 1}
        if mode.startswith("adaptive"):
            defines["ADAPTIVE"] = 1
        bindings = [out, x5] + ([idx] if is_max else [])
        ctx.dispatch("pool", defines, bindings, [0, 2] if is_max else [0], spec,
                     groups_for(out.numel, WG), note=f"{mode} {x.shape} -> {out.shape}")
    return (out, idx) if is_max else out


@lowering(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def max_pool(ctx, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    nsp = 2 if ctx.node.target == aten.max_pool2d_with_indices.default else 3
    return pool(ctx, ctx.ref(x), nsp, "max", kernel_size, stride, padding, dilation,
                out_shape=ctx.out_shape(0))


@lowering(aten.avg_pool2d.default, aten.avg_pool3d.default)
def avg_pool(ctx, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    nsp = 2 if ctx.node.target == aten.avg_pool2d.default else 3
    return pool(ctx, ctx.ref(x), nsp, "avg", kernel_size, stride, padding, 1, divisor_override,
                count_include_pad, out_shape=ctx.out_shape())


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(ctx, x, output_size):
    nsp = 2 if ctx.node.target == aten._adaptive_avg_pool2d.default else 3
    return pool(ctx, ctx.ref(x), nsp, "adaptive_avg", out_shape=ctx.out_shape())


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(ctx, x, output_size):
    nsp = 2 if ctx.node.target == aten.adaptive_max_pool2d.default else 3
    return pool(ctx, ctx.ref(x), nsp, "adaptive_max", out_shape=ctx.out_shape(0))


@lowering(aten.max_pool2d_with_indices_backward.default,
          aten.max_pool3d_with_indices_backward.default, check=float_atomics_check(lambda n: "add"))
def max_pool_backward(ctx, grad_out, x, kernel_size, stride, padding, dilation, ceil_mode,
                      indices):
    """grad_input: each output gradient added at its argmax (an index into the plane)."""
    nsp = 2 if ctx.node.target == aten.max_pool2d_with_indices_backward.default else 3
    g, idx = ctx.ref(grad_out), ctx.ref(indices)
    out = ew(ctx, "0.0", [], "f32", shape=ctx.out_shape())
    plane = 1
    for s in out.shape[out.ndim - nsp:]:
        plane *= s
    lead = g.ndim - nsp
    view = out.with_layout(g.shape, out.strides[:lead] + (0,) * nsp, 0)
    if g.numel:
        ew(ctx, "$0", [g, idx], "f32", compute="f32", out=view, shape=g.shape,
           scatter=[(1, 1, plane)], accumulate=True)
    return out


GRID_MODES = {0: "BILINEAR", 1: "NEAREST", 2: "BICUBIC"}
GRID_PADDING = {0: "ZEROS", 1: "BORDER", 2: "REFLECTION"}


@lowering(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(ctx, x, grid, interpolation_mode, padding_mode, align_corners):
    x, g = ctx.ref(x), ctx.ref(grid)
    out = ctx.empty(ctx.out_shape(), "f32")
    if out.numel:
        dim3 = x.ndim == 5
        if not dim3:          # one depth slice
            x = x.with_layout(x.shape[:2] + (1,) + x.shape[2:], x.strides[:2] + (0,) +
                              x.strides[2:], x.offset)
            g = g.with_layout(g.shape[:1] + (1,) + g.shape[1:], g.strides[:1] + (0,) +
                              g.strides[1:], g.offset)
        n, c, idp, ih, iw = x.shape
        od, oh, ow = g.shape[1:4]
        mode, pad = GRID_MODES[int(interpolation_mode)], GRID_PADDING[int(padding_mode)]
        defines = {"VARIANT": f"{mode}_{pad}{'_3d' if dim3 else ''}".lower(), mode: 1, pad: 1}
        if dim3:
            defines["DIM3"] = 1
        if align_corners:
            defines["ALIGN"] = 1
        ctx.dispatch("grid_sample", defines, [out, x, g], [0],
                     [WG, out.numel, c, idp, ih, iw, od, oh, ow, x.offset, *x.strides, g.offset,
                      *g.strides], groups_for(out.numel, WG),
                     note=f"grid_sample {x.shape} at {g.shape[1:4]}")
    return out
