"""Gather and scatter by index tensors: advanced indexing (aten.index),
gather, scatter / scatter_add / scatter_reduce(sum), and embedding_bag.

Gathers and scatters are elementwise kernels (elementwise.ew) whose operand or
output offset moves by an index read in the kernel; embedding_bag has its own
kernel (shaders/embedding_bag.comp). An index out of range sets the plan's check
flag (checks.py) and the call raises after the submit, as eager does."""
from __future__ import annotations

import operator

import torch

from .checks import check_bit, index_check
from .core import Context, LoweringError, TRef, groups_for, lowering
from .determinism import float_atomics_check
from .elementwise import ew
from .index import advanced_index
from .registry import node_arg

aten = torch.ops.aten
WG = 64


@lowering(aten.index.Tensor)
def index(ctx, x, indices):
    x = ctx.ref(x)
    refs = [None if i is None else ctx.ref(i) for i in indices]
    shape, view, idx = advanced_index(x, refs)
    ops = [view] + [r for r, _, _ in idx]
    gather = [(j + 1, 0, stride, size) for j, (_, stride, size) in enumerate(idx)]
    return ew(ctx, "$0", ops, x.kind, compute=x.kind, shape=shape, gather=gather,
              check=index_check(ctx))


def _along(ref: TRef, shape: tuple, dim: int) -> TRef:
    """ref read in index's shape, with stride 0 along dim (the index moves it)."""
    strides = tuple(0 if d == dim else st for d, st in enumerate(ref.strides))
    return ref.with_layout(shape, strides, ref.offset)


def _as_1d(ref: TRef) -> TRef:
    return ref.with_layout((1,), (1,), ref.offset) if ref.ndim == 0 else ref


@lowering(aten.gather.default)
def gather(ctx, x, dim, index, sparse_grad=False):
    x, idx = _as_1d(ctx.ref(x)), _as_1d(ctx.ref(index))
    dim %= x.ndim
    out_shape = ctx.out_shape()
    view = _along(x, idx.shape, dim)
    out = ew(ctx, "$0", [view, idx], x.kind, compute=x.kind, shape=idx.shape,
             gather=[(1, 0, x.strides[dim], x.shape[dim])], check=index_check(ctx), wrap=False)
    return out.with_layout(out_shape, () if not out_shape else out.strides, 0)


REDUCE = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max",
          "amin": "min", "mean": "add"}
IDENTITY = {("add", "f32"): 0.0, ("mul", "f32"): 1.0, ("max", "f32"): float("-inf"),
            ("min", "f32"): float("inf"), ("add", "i32"): 0, ("mul", "i32"): 1,
            ("max", "i32"): -2**31, ("min", "i32"): 2**31 - 1}


def _scatter(ctx, x, dim, index, src, accumulate=False, include_self=True, mean=False):
    """out = x with src scattered along dim at index; accumulate: True/"add", "mul",
    "max", "min" combine with what is there (atomically). Without include_self the
    targeted elements start from the combine's identity; mean divides by the count."""
    x, idx = ctx.ref(x), _as_1d(ctx.ref(index))
    k = x.kind
    out = ew(ctx, "$0", [x], k, compute=k)
    o1 = _as_1d(out)
    dim %= o1.ndim
    if not idx.numel:
        return out
    if isinstance(src, (TRef, torch.Tensor)):
        s = _as_1d(ctx.ref(src))
        src = s.with_layout(idx.shape, s.strides, s.offset)    # src may be larger than index
    target = _along(o1, idx.shape, dim)
    where = [(1, o1.strides[dim], o1.shape[dim])]
    op = "add" if accumulate is True else accumulate
    if op and not include_self:
        ew(ctx, "$0", [IDENTITY[(op, k if k != "b" else "i32")], idx], k, compute=k, out=target,
           shape=idx.shape, scatter=where, wrap=False)
    ew(ctx, "$0", [src, idx], k, compute=k, out=target, shape=idx.shape, scatter=where,
       accumulate=op or False, check=index_check(ctx), wrap=False)
    if mean:
        count = ew(ctx, "$0", [1.0 if include_self else 0.0], "f32", shape=x.shape)
        c1 = _as_1d(count)
        ew(ctx, "$0", [1.0, idx], "f32", out=_along(c1, idx.shape, dim), shape=idx.shape,
           scatter=[(1, c1.strides[dim], c1.shape[dim])], accumulate=True, wrap=False)
        e = "$1 > 0.0 ? $0 / $1 : $0" if k == "f32" else \
            "$1 > 0.0 ? ifloordiv_($0, int($1)) : $0"
        out = ew(ctx, e, [out, count], k, compute=None, result=k)
    return out


@lowering(aten.scatter.src, aten.scatter.value)
def scatter(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce,
          check=float_atomics_check(lambda n: node_arg(n, 4, "reduce")))
def scatter_reduce_legacy(ctx, x, dim, index, src, *, reduce):
    return _scatter(ctx, x, dim, index, src, REDUCE[reduce])


@lowering(aten.scatter_add.default, check=float_atomics_check(lambda n: "add"))
def scatter_add(ctx, x, dim, index, src):
    return _scatter(ctx, x, dim, index, src, True)


@lowering(aten.scatter_reduce.two, check=float_atomics_check(lambda n: node_arg(n, 4, "reduce")))
def scatter_reduce(ctx, x, dim, index, src, reduce, include_self=True):
    return _scatter(ctx, x, dim, index, src, REDUCE[reduce], bool(include_self),
                    mean=reduce == "mean")


# --- embedding_bag ----------------------------------------------------------------------------
MODES = {0: "SUM", 1: "MEAN", 2: "MAX"}


def _bag_check(node) -> str | None:
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    if used - {0}:
        return "embedding_bag's offset2bag/bag_size/max_indices outputs are used"
    return None                     # (scale_grad_by_freq changes only the gradient)


@lowering(aten._embedding_bag_forward_only.default, aten._embedding_bag.default, check=_bag_check)
def embedding_bag(ctx, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    w, idx, offs = ctx.ref(weight), ctx.ref(indices), ctx.ref(offsets)
    if idx.ndim != 1 or offs.ndim != 1 or w.ndim != 2:
        raise LoweringError("embedding_bag expects 1-d indices and offsets and a 2-d weight")
    out = ctx.empty(ctx.out_shape(0), "f32")
    bags, dim = out.shape
    if out.numel:
        spec = [WG, bags * dim, dim, idx.shape[0], offs.shape[0], w.shape[0], w.offset,
                w.strides[0], w.strides[1], idx.offset, idx.strides[0], offs.offset,
                offs.strides[0], int(padding_idx if padding_idx is not None else -1)
                & 0xFFFFFFFF, 0, 0, int(bool(include_last_offset))]
        check, bit = index_check(ctx)
        _, offsets_bit = check_bit(ctx, "embedding_bag: offsets must start at 0, not decrease "
                                        "and not pass the number of indices", "IndexError")
        spec += [1 << bit, 1 << offsets_bit]
        defines = {"VARIANT": MODES[int(mode)].lower(), MODES[int(mode)]: 1}
        bindings = [out, w, idx, offs, check]
        if per_sample_weights is not None:
            p = ctx.ref(per_sample_weights)
            spec[14:16] = [p.offset, p.strides[0]]
            defines["HAS_PSW"] = 1
            bindings.append(p)
        ctx.dispatch("embedding_bag", defines, bindings, [0], spec, groups_for(bags * dim, WG),
                     note=f"{bags} bags of {dim} from {w.shape}")
    rest = [ctx.empty(ctx.out_shape(i), "i32") for i in (1, 2, 3)]   # unused (see _bag_check)
    return (out, *rest)


@lowering(aten._unsafe_masked_index.default)
def unsafe_masked_index(ctx, x, mask, indices, fill):
    """where(mask, x[indices], fill): indices need only be valid where mask is set
    (elsewhere the gather reads 0 and fill replaces it)."""
    g = index(ctx, x, indices)
    k = ctx.out_kind()
    return ew(ctx, "bool($0) ? $1 : $2", [mask, g, fill], k, compute=None, result=k)


@lowering(aten.index_reduce.default)
def index_reduce(ctx, x, dim, index, source, reduce, *, include_self=True):
    """x's slices along dim at index[i] combined with source's slice i: a scatter
    with the 1-d index broadcast over source's other dims."""
    src, idx = ctx.ref(source), ctx.ref(index)
    d = dim % max(1, src.ndim)
    if src.ndim == 0:
        full = idx.with_layout((), (), idx.offset)
    else:
        full = idx.with_layout(src.shape, tuple(idx.strides[0] if k == d else 0
                                                for k in range(src.ndim)), idx.offset)
    return _scatter(ctx, x, dim, full, src, REDUCE[reduce], bool(include_self),
                    mean=reduce == "mean")


@lowering(aten.embedding_renorm.default)
def embedding_renorm(ctx, weight, indices, max_norm, norm_type):
    """The weight with each row that indices name scaled down to max_norm (p-norm) if
    it is longer (embedding with max_norm): the functional embedding_renorm_."""
    from .reduce import p_norm
    w, idx = ctx.ref(weight), ctx.ref(indices)
    rows = w.shape[0]
    norms = p_norm(ctx, w, [1], norm_type, out_shape=(rows, 1))
    named = ew(ctx, "0", [], "i32", shape=(rows, 1))
    if idx.numel:
        flat = idx.with_layout((idx.numel,), (1,), idx.offset) if idx.is_contiguous() else \
            ew(ctx, "$0", [idx], "i32").with_layout((idx.numel,), (1,), 0)
        ew(ctx, "1", [flat], "i32", out=named.with_layout((idx.numel,), (0,), 0),
           shape=(idx.numel,), scatter=[(0, 1, rows)])
    return ew(ctx, "($1 != 0 && $2 > $3) ? $0 * ($3 / ($2 + 1e-7)) : $0",
              [w, named, norms, float(max_norm)], "f32", compute=None, result="f32")
