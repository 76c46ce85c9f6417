"""Normalisation family: batch norm (inference and training forms, with the
running-statistics update) and group norm. Statistics come from the reduce
family (mean, then variance centred on it); the normalisation is one
elementwise kernel with the per-channel vectors broadcast by strides."""
from __future__ import annotations

import torch

from .core import Context, TRef, lowering
from .elementwise import ew
from .reduce import reduce

aten = torch.ops.aten


def _channel_view(ref: TRef, ndim: int) -> TRef:
    """A per-channel vector [C] viewed as (C, 1, ..., 1) for an (N, C, *spatial) tensor."""
    return ref.with_layout(ref.shape + (1,) * (ndim - 2), ref.strides + (0,) * (ndim - 2),
                           ref.offset)


def _affine(expr: str, ops: list, weight, bias, view) -> tuple[str, list]:
    if weight is not None:
        ops.append(view(weight))
        expr = f"({expr}) * ${len(ops) - 1}"
    if bias is not None:
        ops.append(view(bias))
        expr = f"{expr} + ${len(ops) - 1}"
    return expr, ops


def batch_norm(ctx: Context, x: TRef, weight, bias, rm, rv, training: bool, momentum, eps,
               n_outs: int):
    """(out, save_mean, save_rstd[, new_running_mean, new_running_var]); the saved
    statistics are empty in inference, as in ATen."""
    cview = lambda t: _channel_view(ctx.ref(t), x.ndim)     # noqa: E731
    if training or rm is None:
        dims = [0] + list(range(2, x.ndim))
        c = x.shape[1]
        n = x.numel // max(1, c)
        mean = reduce(ctx, x, dims, "mean", out_shape=(c,), out_kind="f32")
        var = reduce(ctx, x, dims, "var", out_shape=(c,), out_kind="f32", center=mean,
                     divisor=float(n))
        rstd = ew(ctx, "inversesqrt($0 + $1)", [var, float(eps)], "f32", compute="f32")
        expr, ops = _affine("($0 - $1) * $2", [x, cview(mean), cview(rstd)], weight, bias, cview)
        out = ew(ctx, expr, ops, "f32", compute="f32")
        outs = [out, mean, rstd]
        if n_outs == 5:
            m = float(momentum)
            unbias = n / (n - 1) if n > 1 else float("inf")
            outs.append(ew(ctx, "(1.0 - $2) * $0 + $2 * $1", [ctx.ref(rm), mean, m], "f32",
                           compute="f32"))
            outs.append(ew(ctx, "(1.0 - $2) * $0 + $2 * $1 * $3", [ctx.ref(rv), var, m, unbias],
                           "f32", compute="f32"))
        return tuple(outs)
    expr, ops = _affine("($0 - $1) * inversesqrt($2 + $3)",
                        [x, cview(rm), cview(rv), float(eps)], weight, bias, cview)
    out = ew(ctx, expr, ops, "f32", compute="f32")
    outs = (out, ctx.empty(ctx.out_shape(1), "f32"), ctx.empty(ctx.out_shape(2), "f32"))
    if n_outs == 5:                      # not training: the running statistics stay
        outs += (ew(ctx, "$0", [ctx.ref(rm)], "f32"), ew(ctx, "$0", [ctx.ref(rv)], "f32"))
    return outs


@lowering(aten._native_batch_norm_legit_no_training.default)
def bn_no_training(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    return batch_norm(ctx, ctx.ref(x), weight, bias, running_mean, running_var, False, momentum,
                      eps, 3)


@lowering(aten._native_batch_norm_legit_functional.default)
def bn_functional(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    return batch_norm(ctx, ctx.ref(x), weight, bias, running_mean, running_var, training,
                      momentum, eps, 5)


@lowering(aten._native_batch_norm_legit.no_stats)
def bn_no_stats(ctx, x, weight, bias, training, momentum, eps):
    return batch_norm(ctx, ctx.ref(x), weight, bias, None, None, True, momentum, eps, 3)


@lowering(aten.native_batch_norm.default)
def native_batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """The functional form: statistics out, running buffers left as they are."""
    return batch_norm(ctx, ctx.ref(x), weight, bias, running_mean, running_var, training,
                      momentum, eps, 3)


@lowering(aten.native_group_norm.default)
def group_norm(ctx, x, weight, bias, n, c, hxw, group, eps):
    """(out, mean [N, G], rstd [N, G]) with statistics over each (n, group)."""
    x = ctx.ref(x)
    n, c, group = int(n), int(c), int(group)
    cg = c // group
    sp, sps = x.shape[2:], x.strides[2:]
    xg = x.with_layout((n, group, cg) + sp, (x.strides[0], x.strides[1] * cg, x.strides[1]) + sps,
                       x.offset)
    dims = list(range(2, xg.ndim))
    mean = reduce(ctx, xg, dims, "mean", out_shape=(n, group), out_kind="f32")
    var = reduce(ctx, xg, dims, "var", out_shape=(n, group), out_kind="f32", center=mean,
                 divisor=float(cg * hxw))
    rstd = ew(ctx, "inversesqrt($0 + $1)", [var, float(eps)], "f32", compute="f32")
    tail = (1,) * (1 + len(sp))
    per_ng = lambda t: t.with_layout((n, group) + tail, t.strides + (0,) * len(tail), 0)  # noqa
    per_c = lambda t: (lambda r: r.with_layout((group, cg) + (1,) * len(sp),  # noqa: E731
                                               (r.strides[0] * cg, r.strides[0]) + (0,) * len(sp),
                                               r.offset))(ctx.ref(t))
    out = ctx.empty(x.shape, "f32")
    og = out.with_layout(xg.shape, (out.strides[0], out.strides[1] * cg, out.strides[1]) +
                         out.strides[2:], 0)
    expr, ops = _affine("($0 - $1) * $2", [xg, per_ng(mean), per_ng(rstd)], weight, bias, per_c)
    if og.numel:
        ew(ctx, expr, ops, "f32", compute="f32", out=og)
    return out, mean, rstd


@lowering(aten._batch_norm_with_update_functional.default)
def bn_with_update(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    """Training batch norm: (out, save_mean, save_rstd, reserve, new running mean/var)."""
    out, mean, rstd, rm, rv = batch_norm(ctx, ctx.ref(x), weight, bias, running_mean,
                                         running_var, True, momentum, eps, 5)
    return out, mean, rstd, ctx.empty(ctx.out_shape(3), ctx.out_kind(3)), rm, rv
