"""Indexing and assembly: embedding / index_select (shaders/gather.comp),
and cat / slice_scatter / select_scatter as strided copies into views."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .checks import index_check
from .core import LoweringError, TRef, broadcast_shapes, groups_for, lowering, meta_view
from .determinism import float_atomics_check
from .elementwise import contiguous, copy_to, ew
from .fusion import Lazy, materialize
from .registry import node_arg

aten = torch.ops.aten
WG = 256


def gather_rows(ctx, src: TRef, idx: TRef, out_shape) -> TRef:
    """out[i, ...] = src[idx[i]] for a 2-D src (rows x row_len, any strides); an index
    out of range raises after the submit (checks.py)."""
    if idx.ndim != 1:
        idx = contiguous(ctx, idx).with_layout((idx.numel,), (1,), 0) if not idx.is_contiguous() \
            else idx.with_layout((idx.numel,), (1,), idx.offset)
    out = ctx.empty(out_shape, src.kind)
    n, row = idx.shape[0], src.shape[1]
    if out.numel:
        check, bit = index_check(ctx)
        spec = [WG, n, row, src.shape[0], src.offset, src.strides[0], src.strides[1],
                idx.offset, idx.strides[0] if idx.ndim else 0, bit]
        ctx.dispatch("gather", {"VARIANT": "rows"}, [out, src, idx, check], [0], spec,
                     groups_for(n * row, WG), note=f"{n} rows of {row}")
    return out


@lowering(aten.embedding.default)
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad=False, sparse=False):
    w = ctx.ref(weight)
    if w.ndim != 2:
        raise LoweringError("embedding weight must be 2-D")
    return gather_rows(ctx, w, ctx.ref(indices), ctx.out_shape())


@lowering(aten.index_select.default)
def index_select(ctx, x, dim, index):
    x = ctx.ref(x)
    if x.ndim == 0:                        # a 0-d tensor: its one element (index 0)
        return ew(ctx, "$0", [x], x.kind, compute=x.kind, shape=ctx.out_shape())
    dim = dim % max(1, x.ndim)
    # move dim to the front and flatten the rest into one row (copy if not expressible)
    perm = [dim] + [d for d in range(x.ndim) if d != dim]
    moved = meta_view(x, lambda t: t.permute(perm))
    rest = 1
    for s in moved.shape[1:]:
        rest *= s
    try:
        src = meta_view(moved, lambda t: t.view(moved.shape[0], rest))
    except RuntimeError:
        src = meta_view(contiguous(ctx, moved), lambda t: t.view(moved.shape[0], rest))
    idx = ctx.ref(index)
    rows = gather_rows(ctx, src, idx, (idx.numel,) + tuple(moved.shape[1:]))
    inv = [0] * x.ndim
    for i, p in enumerate(perm):
        inv[p] = i
    return contiguous(ctx, meta_view(rows, lambda t: t.permute(inv)))


@lowering(aten.cat.default, folds=True)
def cat(ctx, tensors, dim=0):
    out = ctx.empty(ctx.out_shape(), ctx.out_kind())
    dim = dim % out.ndim
    pos = 0
    for t in tensors:
        t = t if isinstance(t, Lazy) else ctx.ref(t)
        if t.ndim == 1 and t.shape[0] == 0 and out.ndim > 1:
            continue                           # legacy empty tensor in cat
        size = t.shape[dim]
        if size:
            copy_to(ctx, t, meta_view(out, lambda v: v.narrow(dim, pos, size)))
        pos += size
    return out


@lowering(aten.slice_scatter.default, aten.select_scatter.default)
def scatter_view(ctx, base, src, dim=0, *args):
    out = ew(ctx, "$0", [base], ctx.out_kind(), compute=ctx.out_kind())
    if ctx.node.target == aten.select_scatter.default:
        view = meta_view(out, lambda v: v.select(dim, args[0]))
    else:
        start, end, step = (list(args) + [None, None, 1][len(args):])[:3]
        view = meta_view(out, lambda v: aten.slice.Tensor(v, dim, start, end, step))
    copy_to(ctx, src, view)
    return out


def advanced_index(x: TRef, indices: list):
    """Torch's advanced indexing x[indices] as layouts: the shape of the indexed
    result, x's strides in that space (0 on the index dims) and, per index tensor,
    its layout broadcast into that space with x's stride and size for its dim.

    Index dims that are adjacent stay in place; otherwise they move to the front
    (numpy's rule)."""
    indices = list(indices) + [None] * (x.ndim - len(indices))
    dims = [d for d, i in enumerate(indices) if i is not None]
    for d in dims:
        if indices[d].kind != "i32":
            raise LoweringError("boolean mask indices give a data-dependent shape")
    bshape = broadcast_shapes(*[indices[d].shape for d in dims])
    rest = [d for d in range(x.ndim) if d not in dims]
    front = dims != list(range(dims[0], dims[-1] + 1))
    where = 0 if front else dims[0]
    before, after = ([], rest) if front else ([d for d in rest if d < where],
                                              [d for d in rest if d > where])
    nb = len(bshape)
    shape = tuple(x.shape[d] for d in before) + bshape + tuple(x.shape[d] for d in after)
    strides = tuple(x.strides[d] for d in before) + (0,) * nb + tuple(x.strides[d] for d in after)
    pos = len(before)
    idx = []
    for d in dims:
        i = indices[d]
        pad = nb - i.ndim
        istr = [0] * pad + [0 if sz == 1 else st for sz, st in zip(i.shape, i.strides)]
        lay = [1] * pos + list(bshape) + [1] * len(after)
        lst = [0] * pos + istr + [0] * len(after)
        idx.append((i.with_layout(lay, lst, i.offset), x.strides[d], x.shape[d]))
    return shape, x.with_layout(shape, strides, x.offset), idx


def index_put_into(ctx, out: TRef, indices, values, accumulate=False) -> TRef:
    """out[indices] = values (or += with accumulate), written in out's buffer."""
    refs = [None if i is None else ctx.ref(i) for i in indices]
    shape, view, idx = advanced_index(out, refs)
    if math.prod(shape) == 0:
        return out
    # the indices first: a Lazy `values` folds into operands after them, and the
    # scatter names its index operands by position
    ops = [r for r, _, _ in idx] + [values]
    scatter = [(j, stride, size) for j, (_, stride, size) in enumerate(idx)]
    ew(ctx, f"${len(idx)}", ops, out.kind, compute=out.kind, out=view, shape=shape,
       scatter=scatter, accumulate=accumulate, check=index_check(ctx))
    return out


@lowering(aten.index_put.default, folds=True,
          check=float_atomics_check(lambda n: "add" if node_arg(n, 3, "accumulate", False) else None))
def index_put(ctx, x, indices, values, accumulate=False):
    """Functional index_put; in place on x's own buffer when the planner found
    that it only feeds copy_ back into the input x (a KV-cache update). An elementwise
    producer of the values (RoPE of the step's keys) is computed by the scatter."""
    x = ctx.ref(materialize(ctx, x))
    indices = [None if i is None else materialize(ctx, i) for i in indices]
    out = x if ctx.node in ctx.in_place else ew(ctx, "$0", [x], x.kind, compute=x.kind)
    before = len(ctx.plan.dispatches)
    index_put_into(ctx, out, indices, values, accumulate)
    dims = [d for d, i in enumerate(indices) if i is not None]
    if ctx.node in ctx.in_place and not accumulate and len(dims) == 1 and \
            len(ctx.plan.dispatches) == before + 1:
        idx = ctx.ref(indices[dims[0]])
        if idx.numel == 1 and idx.kind == "i32":
            ctx.row_writes[out.buf] = RowWrite(out, dims[0], idx, values, before)
    return out


@dataclass
class RowWrite:
    """A one-row scatter into a buffer in place (a decode step's KV-cache update),
    kept so that a later reader of the buffer (attention) may compute that row itself
    and run beside the scatter instead of after it."""
    target: TRef        # the whole updated tensor
    dim: int            # the indexed dim
    index: TRef         # the row's index (one int32)
    values: object      # what was written: a TRef, or a Lazy the scatter computed
    dispatch: int       # the scatter's position in plan.dispatches
