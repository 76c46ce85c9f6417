"""Sort family (shaders/sort.comp): sort, topk and kthvalue along one dim by
ranking every element against its row: stable, NaN last (first when
descending), as torch's CPU sort. Rows longer than MAX_N stay on the CPU."""
from __future__ import annotations

import torch

from .core import Context, TRef, contiguous_strides, groups_for, lowering
from .elementwise import row_walk
from .registry import node_arg

aten = torch.ops.aten
WG = 64
MAX_N = 1 << 16


def rank_select(ctx: Context, x: TRef, dim: int, descending: bool, k_lo: int, k_hi: int,
                out_shape, nan_median: bool = False) -> tuple[TRef, TRef]:
    """Values and int32 indices of the elements ranked k_lo..k_hi-1 along dim, in rank
    order, written in out_shape (x's shape with dim of size k_hi - k_lo)."""
    vals, idx = ctx.empty(out_shape, x.kind), ctx.empty(out_shape, "i32")
    if x.ndim == 0:
        x = x.with_layout((1,), (1,), x.offset)
        dim = 0
    dim %= x.ndim
    ostr = vals.strides if vals.ndim else (1,)
    n = x.shape[dim]
    rows = x.numel // max(1, n)
    if rows * n == 0 or k_hi <= k_lo:
        return vals, idx
    spec = [WG, rows * n, n, k_hi, x.offset, x.strides[dim], ostr[dim], k_lo]
    decls, code = row_walk(x, ostr, dim, spec)
    glsl = "float" if x.kind == "f32" else "int"
    defines = {"VARIANT": f"{x.kind}{'_desc' if descending else ''}", "VAL_T": glsl,
               "LOAD(w)": {"f32": "ld_f32(w)", "i32": "ld_i32(w)", "b": "int(ld_b(w))"}[x.kind],
               "STORE(v)": {"f32": "st_f32(v)", "i32": "st_i32(v)", "b": "st_b(v != 0)"}[x.kind],
               "SPEC_DECLS": " ".join(decls), "ROW_INDEX": " ".join(code)}
    if x.kind == "f32":
        defines["IS_FLOAT"] = 1
    if descending:
        defines["DESCENDING"] = 1
    if nan_median:
        defines["NAN_MEDIAN"] = 1
        defines["VARIANT"] += "_nanmedian"
    ctx.dispatch("sort", defines, [vals, idx, x], [0, 1], spec, groups_for(rows * n, WG),
                 note=f"rank {x.shape} dim={dim} [{k_lo}, {k_hi})")
    return vals, idx


def _dim_len(node, dim_pos: int, default: int) -> int:
    x = node.args[0].meta["val"]
    dim = node_arg(node, dim_pos, "dim", default)
    return x.shape[dim] if x.dim() else 1


def _checker(dim_pos: int):
    def check(node) -> str | None:
        n = _dim_len(node, dim_pos, -1)
        return f"sorting rows of {n} elements (more than {MAX_N})" if n > MAX_N else None
    return check


@lowering(aten.sort.default, aten.sort.stable, check=_checker(1))
def sort(ctx, x, dim=-1, descending=False, stable=None):
    x = ctx.ref(x)
    n = x.shape[dim] if x.ndim else 1
    return rank_select(ctx, x, dim, bool(descending), 0, n, ctx.out_shape(0))


@lowering(aten.topk.default, check=_checker(2))
def topk(ctx, x, k, dim=-1, largest=True, sorted=True):
    return rank_select(ctx, ctx.ref(x), dim, bool(largest), 0, int(k), ctx.out_shape(0))


@lowering(aten.kthvalue.default, check=_checker(2))
def kthvalue(ctx, x, k, dim=-1, keepdim=False):
    x = ctx.ref(x)
    d = dim % max(1, x.ndim)
    shape = ctx.out_shape(0)
    full = tuple(1 if i == d else s for i, s in enumerate(x.shape)) if x.ndim else ()
    vals, idx = rank_select(ctx, x, dim, False, int(k) - 1, int(k), full)
    return (vals.with_layout(shape, contiguous_strides(shape), 0),
            idx.with_layout(shape, contiguous_strides(shape), 0))
