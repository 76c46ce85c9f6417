"""Ops the coverage report showed users hit, built from the families:
take / put (flat gathers and scatters), addmv / addbmm (matmul), median
(rank selection), nonzero_static (a scan of the mask, then scatters), and
native_dropout (its mask drawn on the GPU from a seed per call)."""
from __future__ import annotations

import torch

from .checks import index_check
from .core import Context, TRef, contiguous_strides, lowering
from .determinism import float_atomics_check
from .elementwise import contiguous, ew
from .matmul import matmul
from .reduce import reduce
from .registry import node_arg
from .scan import scan
from .sort import rank_select

aten = torch.ops.aten


def _flat(ctx: Context, x: TRef) -> TRef:
    x = contiguous(ctx, x)
    return x.with_layout((x.numel,), (1,), x.offset)


@lowering(aten.take.default, keep_whole=True)
def take(ctx, x, index):
    x, idx = ctx.ref(x), ctx.ref(index)
    flat = _flat(ctx, x)
    view = flat.with_layout(idx.shape, (0,) * idx.ndim, flat.offset)
    return ew(ctx, "$0", [view, idx], x.kind, compute=x.kind, shape=idx.shape,
              gather=[(1, 0, 1, max(1, x.numel))], check=index_check(ctx))


@lowering(aten.put.default,
          check=float_atomics_check(lambda n: "add" if node_arg(n, 3, "accumulate", False) else None))
def put(ctx, x, index, source, accumulate=False):
    x, idx, src = ctx.ref(x), ctx.ref(index), ctx.ref(source)
    out = ew(ctx, "$0", [x], x.kind, compute=x.kind)
    if idx.numel:
        flat = out.with_layout((out.numel,), (1,), 0)
        target = flat.with_layout(idx.shape, (0,) * idx.ndim, 0)
        src = contiguous(ctx, src)
        src = src.with_layout(idx.shape, contiguous_strides(idx.shape), src.offset)
        ew(ctx, "$0", [src, idx], x.kind, compute=x.kind, out=target, shape=idx.shape,
           scatter=[(1, 1, out.numel)], accumulate=bool(accumulate), check=index_check(ctx))
    return out


@lowering(aten.addmv.default)
def addmv(ctx, bias, mat, vec, *, beta=1, alpha=1):
    mat, vec, b = ctx.ref(mat), ctx.ref(vec), ctx.ref(bias)
    n = mat.shape[0]
    col = vec.with_layout((vec.shape[0], 1), (vec.strides[0], 0), vec.offset)
    if b.ndim == 0:
        bcol = b.with_layout((n, 1), (0, 0), b.offset)
    else:
        bcol = b.with_layout((n, 1), (b.strides[0] if b.shape[0] > 1 else 0, 0), b.offset)
    return matmul(ctx, mat, col, bcol, float(alpha), float(beta))


@lowering(aten.addbmm.default)
def addbmm(ctx, bias, b1, b2, *, beta=1, alpha=1):
    """sum over the batch of b1[i] @ b2[i]: one (n, B*m) @ (B*m, p) product."""
    b1, b2 = ctx.ref(b1), ctx.ref(b2)
    nb, n, m = b1.shape
    p = b2.shape[2]
    a = ew(ctx, "$0", [b1.with_layout((n, nb, m), (b1.strides[1], b1.strides[0], b1.strides[2]),
                                      b1.offset)], "f32", compute="f32")
    a = a.with_layout((n, nb * m), (nb * m, 1), 0)
    b = contiguous(ctx, b2)
    b = b.with_layout((nb * m, p), (p, 1), b.offset)
    return matmul(ctx, a, b, bias, float(alpha), float(beta))


@lowering(aten.median.default)
def median(ctx, x):
    """The lower median; NaN if any element is NaN (torch's rule)."""
    x = ctx.ref(x)
    flat = _flat(ctx, x)
    n = max(1, flat.numel)
    k = (n - 1) // 2
    val, _ = rank_select(ctx, flat, 0, False, k, k + 1, (1,))
    if x.kind != "f32":
        return val.with_layout((), (), 0)
    anynan = reduce(ctx, ew(ctx, "isnan($0)", [flat], "b", compute="f32", result="b"), [],
                    "any", out_shape=(), out_kind="b")
    return ew(ctx, "$1 ? uintBitsToFloat(0x7fc00000u) : $0", [val.with_layout((), (), 0), anynan],
              "f32", result="f32")


@lowering(aten.nonzero_static.default)
def nonzero_static(ctx, x, *, size, fill_value=-1):
    """Coordinates of the first `size` nonzero elements (row-major), padded with
    fill_value: an inclusive scan of the mask gives each nonzero element its row."""
    x = ctx.ref(x)
    size = int(size)
    nd = max(1, x.ndim)
    out = ew(ctx, "$0", [int(fill_value)], "i32", compute="i32", shape=(size, x.ndim))
    if x.numel == 0 or size == 0 or x.ndim == 0:
        return out
    zero = {"f32": "0.0", "i32": "0", "b": "false"}[x.kind]
    mask = ew(ctx, f"$0 != {zero} ? 1 : 0", [x], "i32", result="i32")
    flat = mask.with_layout((x.numel,), (1,), 0)
    pos = scan(ctx, flat, 0, "sum", "i32")
    # row of element i: pos - 1 where the mask is set, else `size` (out of range: skipped)
    row = ew(ctx, "$1 != 0 ? $0 - 1 : $2", [pos, flat, size], "i32", compute="i32")
    strides = contiguous_strides(x.shape)
    for d in range(nd):
        col = out.with_layout((x.numel,), (0,), d)
        coord = f"($i / {strides[d]}) % {x.shape[d]}"
        ew(ctx, coord, [row], "i32", compute="i32", out=col, shape=(x.numel,),
           scatter=[(0, x.ndim, size)])
    return out


@lowering(aten.median.dim)
def median_dim(ctx, x, dim=-1, keepdim=False):
    """(lower median, its index) along dim; a row with NaN gives NaN and the index of
    its first NaN (torch's rule)."""
    from .reduce import arg_reduce
    x = ctx.ref(x)
    if x.ndim == 0:
        return ew(ctx, "$0", [x], x.kind, compute=x.kind), ew(ctx, "0", [], "i32", shape=())
    d = dim % x.ndim
    n = x.shape[d]
    k = (n - 1) // 2
    full = tuple(1 if i == d else s for i, s in enumerate(x.shape))
    shape = ctx.out_shape(0)
    vals, idx = rank_select(ctx, x, d, False, k, k + 1, full)
    vals = vals.with_layout(shape, contiguous_strides(shape), 0)
    idx = idx.with_layout(shape, contiguous_strides(shape), 0)
    if x.kind != "f32" or n == 0:
        return vals, idx
    isnan = ew(ctx, "isnan($0)", [x], "b", compute="f32", result="b")
    first, _ = arg_reduce(ctx, isnan, [d], True, shape, False)
    anynan = reduce(ctx, isnan, [d], "any", out_shape=shape, out_kind="b")
    vals = ew(ctx, "$1 ? uintBitsToFloat(0x7fc00000u) : $0", [vals, anynan], "f32", result="f32")
    idx = ew(ctx, "$2 ? $1 : $0", [idx, first, anynan], "i32", result="i32")
    return vals, idx


@lowering(aten.nanmedian.default, aten.nanmedian.dim)
def nanmedian(ctx, x, dim=None, keepdim=False):
    """The lower median of the non-NaN values (NaN if there are none)."""
    x = ctx.ref(x)
    if dim is None:
        x, d = _flat(ctx, x), 0
    elif x.ndim == 0:
        v = ew(ctx, "$0", [x], x.kind, compute=x.kind)
        return v, ew(ctx, "0", [], "i32", shape=())
    else:
        d = dim % x.ndim
    if x.kind != "f32":
        k = (x.shape[d] - 1) // 2
        vals, idx = rank_select(ctx, x, d, False, k, k + 1,
                                tuple(1 if i == d else s for i, s in enumerate(x.shape)))
    else:
        vals, idx = rank_select(ctx, x, d, False, 0, 1,
                                tuple(1 if i == d else s for i, s in enumerate(x.shape)),
                                nan_median=True)
    shape = ctx.out_shape(0) if dim is not None else ctx.out_shape()
    vals = vals.with_layout(shape, contiguous_strides(shape), 0)
    if dim is None:
        return vals
    return vals, idx.with_layout(shape, contiguous_strides(shape), 0)


def _seed(ctx: Context) -> list[TRef]:
    """The plan's two seed words (runtime/program.py fills them per call) as scalars."""
    plan = ctx.plan
    if plan.seed_buffer is None:
        plan.seed_buffer = ctx.buffer(2, "input", "i32")
    return [TRef(plan.seed_buffer, (), (), k, "i32") for k in (0, 1)]


@lowering(aten.native_dropout.default)
def native_dropout(ctx, x, p, train):
    """(x * mask * 1/(1-p), mask), mask keeping each element with probability 1 - p, in
    eager's order of roundings (x times the 0/1 mask, then times the float scale). In
    training the mask is drawn on the GPU from a seed that each call takes from torch's
    default generator: torch.manual_seed makes a run repeat itself, but the mask is not
    the one eager draws (the GPU has no copy of the CPU's generator). The backward reads
    the mask the forward returned."""
    x = ctx.ref(x)
    if not train or p == 0 or p == 1:         # nothing to draw: all kept, or all dropped
        keep = "true" if not train or p == 0 else "false"
        mask = ew(ctx, keep, [x], "b", compute=x.kind)
    else:
        mask = ew(ctx, "dv_uniform(uint($i), $1, $2) >= $3", [x, *_seed(ctx), float(p)], "b",
                  compute=None, helpers=("RANDOM_BITS",), shape=x.shape)   # dv_uniform: shaders/special.glsl
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p) if train else 1.0
    out = ew(ctx, "($0 * ($1 ? 1.0 : 0.0)) * $2", [x, mask, scale], x.kind, compute=None,
             result="f32")
    return out, mask
