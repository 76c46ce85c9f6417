"""View ops: metadata only. Each is applied to a meta tensor of the input's
layout and the resulting shape/strides/offset become the new TRef; a view
that the layout cannot express (a reshape of a transposed tensor) copies first."""
from __future__ import annotations

import torch

from .core import NO_REQUEST, TRef, lowering, meta_view
from .elementwise import contiguous
from .fusion import Deferred, Lazy, LazyView, materialize

aten = torch.ops.aten
VIEW_OPS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
            aten.permute.default, aten.transpose.int, aten.t.default, aten.expand.default,
            aten.unsqueeze.default, aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims,
            aten.slice.Tensor, aten.select.int, aten.alias.default, aten.detach.default,
            aten.as_strided.default, aten.unfold.default, aten.diagonal.default,
            aten.narrow.default)


RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


@lowering(*RESHAPES, lazy_view=True, takes_deferred=True)
def reshape(ctx, x, *args, request=NO_REQUEST, **kwargs):
    """A reshape; of a Lazy deferred for a consumer that computes it as it loads
    (OpSpec.loads_lazy), a LazyView the consumer indexes; of a deferred result that can be
    reshaped unmade (Deferred.reshape: a mat-vec whose consumer folds into it), that."""
    if request.defer and isinstance(x, Lazy):
        return LazyView(x, torch.empty(x.shape, device="meta").reshape(*args).shape)
    if request.defer and isinstance(x, Deferred):
        r = x.reshape(tuple(ctx.out_shape()))
        if r is not None:
            return r
    return view(ctx, x, *args, **kwargs)


@lowering(*(op for op in VIEW_OPS if op not in RESHAPES))
def view(ctx, x, *args, **kwargs):
    op = ctx.node.target
    x = materialize(ctx, x)
    if not isinstance(x, TRef):            # a folded constant
        return op(x, *args, **kwargs)
    if op in RESHAPES:
        try:
            return meta_view(x, lambda t: t.view(*args))
        except RuntimeError:                # not expressible as a view: copy first
            return meta_view(contiguous(ctx, x), lambda t: t.view(*args))
    return meta_view(x, lambda t: op(t, *args, **kwargs))


@lowering(aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int)
def split(ctx, x, *args):
    """Multi-output views: one TRef per piece, read off the meta op's outputs."""
    op = ctx.node.target
    if not isinstance(x, TRef):
        return op(x, *args)
    pieces = []
    n = len(op(torch.empty_strided(x.shape, x.strides, device="meta"), *args))
    for i in range(n):
        pieces.append(meta_view(x, lambda t, i=i: op(t, *args)[i]))
    return tuple(pieces)
