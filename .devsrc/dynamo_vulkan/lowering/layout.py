"""Data movement that views cannot express, as strided copies (elementwise.ew):
constant padding, repeat, flip (a view with negative strides, read by one
copy), the *_copy forms of view ops, and diagonal / as_strided scatters."""
from __future__ import annotations

import torch

from .core import NO_REQUEST, TRef, contiguous_strides, lowering, meta_view
from .elementwise import contiguous, copy_to, ew
from .fusion import materialize

aten = torch.ops.aten


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(ctx, x, pad, value=0):
    """Fill, then copy x (cropped where a pad is negative) into the middle."""
    x = ctx.ref(x)
    k = ctx.out_kind()
    out = ew(ctx, "$0", [value], k, compute=k, shape=ctx.out_shape())
    src, dst = x, out
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        lo, hi = int(pad[2 * i]), int(pad[2 * i + 1])
        start = max(0, -lo)
        length = x.shape[d] - start - max(0, -hi)
        if length <= 0:
            return out
        src = meta_view(src, lambda t, d=d, s=start, n=length: t.narrow(d, s, n))
        dst = meta_view(dst, lambda t, d=d, s=max(0, lo), n=length: t.narrow(d, s, n))
    if src.numel:
        copy_to(ctx, src, dst)
    return out


@lowering(aten.repeat.default)
def repeat(ctx, x, repeats):
    """x read as (r0, s0, r1, s1, ...) with stride 0 on the r dims, copied out."""
    x = ctx.ref(x)
    reps = [int(r) for r in repeats]
    pad = len(reps) - x.ndim
    shape, strides = (1,) * pad + x.shape, (0,) * pad + x.strides
    ishape, istrides = [], []
    for r, s, st in zip(reps, shape, strides):
        ishape += [r, s]
        istrides += [0, st]
    out = ew(ctx, "$0", [x.with_layout(ishape, istrides, x.offset)], x.kind, compute=x.kind)
    final = ctx.out_shape()
    return out.with_layout(final, contiguous_strides(final), 0)


@lowering(aten.flip.default, fusible=True)    # one ew() of a view: folds into an elementwise consumer
def flip(ctx, x, dims, request=NO_REQUEST):
    """A view that walks the flipped dims backwards (negative strides, which the
    kernels' uint offset arithmetic wraps correctly), copied out. An elementwise
    producer deferred for it (flip is fusible) is computed first, as a kernel of its
    own even when flip itself is being deferred."""
    x = ctx.ref(materialize(ctx, x))
    strides, offset = list(x.strides), x.offset
    for d in {d % max(1, x.ndim) for d in dims} if x.ndim else ():
        if x.shape[d] > 1:
            offset += (x.shape[d] - 1) * strides[d]
            strides[d] = -strides[d]
    return ew(ctx, "$0", [x.with_layout(x.shape, strides, offset)], x.kind, compute=x.kind,
              defer=request.defer)


COPY_OF_VIEW = {
    aten.view_copy.default: aten.view.default, aten.permute_copy.default: aten.permute.default,
    aten.expand_copy.default: aten.expand.default, aten.t_copy.default: aten.t.default,
    aten.transpose_copy.int: aten.transpose.int, aten.unsqueeze_copy.default:
    aten.unsqueeze.default, aten.squeeze_copy.default: aten.squeeze.default,
    aten.squeeze_copy.dim: aten.squeeze.dim, aten.squeeze_copy.dims: aten.squeeze.dims,
    aten.diagonal_copy.default: aten.diagonal.default,
    aten.as_strided_copy.default: aten.as_strided.default,
    aten.alias_copy.default: aten.alias.default, aten.detach_copy.default: aten.detach.default,
    aten.narrow_copy.default: aten.narrow.default, aten.select_copy.int: aten.select.int,
    aten.slice_copy.Tensor: aten.slice.Tensor, aten.unfold_copy.default: aten.unfold.default,
}
MULTI_COPY_OF_VIEW = {
    aten.unbind_copy.int: aten.unbind.int, aten.split_copy.Tensor: aten.split.Tensor,
    aten.split_with_sizes_copy.default: aten.split_with_sizes.default,
}


def _view_of(ctx, x: TRef, op, args, kwargs) -> TRef:
    if op is aten.view.default:
        try:
            return meta_view(x, lambda t: t.view(*args))
        except RuntimeError:
            return meta_view(contiguous(ctx, x), lambda t: t.view(*args))
    return meta_view(x, lambda t: op(t, *args, **kwargs))


@lowering(*COPY_OF_VIEW)
def view_copy(ctx, x, *args, **kwargs):
    x = ctx.ref(x)
    v = _view_of(ctx, x, COPY_OF_VIEW[ctx.node.target], args, kwargs)
    return ew(ctx, "$0", [v], x.kind, compute=x.kind)


@lowering(*MULTI_COPY_OF_VIEW)
def split_copy(ctx, x, *args):
    x = ctx.ref(x)
    op = MULTI_COPY_OF_VIEW[ctx.node.target]
    n = len(op(torch.empty_strided(x.shape, x.strides, device="meta"), *args))
    return tuple(ew(ctx, "$0", [meta_view(x, lambda t, i=i: op(t, *args)[i])], x.kind,
                    compute=x.kind) for i in range(n))


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, base, src, offset=0, dim1=0, dim2=1):
    out = ew(ctx, "$0", [base], ctx.out_kind(), compute=ctx.out_kind())
    copy_to(ctx, src, meta_view(out, lambda t: t.diagonal(offset, dim1, dim2)))
    return out


@lowering(aten.as_strided_scatter.default)
def as_strided_scatter(ctx, base, src, size, stride, storage_offset=None):
    out = ew(ctx, "$0", [base], ctx.out_kind(), compute=ctx.out_kind())
    view = out.with_layout(tuple(size), tuple(stride),
                           int(storage_offset) if storage_offset is not None else 0)
    copy_to(ctx, src, view)
    return out
