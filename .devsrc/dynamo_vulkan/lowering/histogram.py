"""Histograms (shaders/histogram.comp): histc, histogram with a bin count or
given edges, weights and density; the outer edges come from the data (amin /
amax on the GPU) unless a range is given."""
from __future__ import annotations

import torch

from .core import Context, TRef, groups_for, lowering
from .elementwise import _coalesce, contiguous, ew
from .reduce import reduce

aten = torch.ops.aten
WG = 64


def _range(ctx: Context, x: TRef, lo, hi, pad: float) -> TRef:
    """A 2-element (lo, hi) buffer: the given range, else the data's; equal ends
    move apart by pad each way (torch's rule); an empty input spans 0..1."""
    if lo is not None and hi is not None and (lo != hi or x.numel == 0):
        lo, hi = (0.0, 1.0) if lo == hi else (lo, hi)
        return ew(ctx, "$i == 0 ? $0 : $1", [float(lo), float(hi)], "f32", shape=(2,))
    if x.numel == 0:
        return ew(ctx, "$i == 0 ? 0.0 : 1.0", [], "f32", shape=(2,))
    mn = reduce(ctx, x, [], "amin", out_shape=(), out_kind="f32")
    mx = reduce(ctx, x, [], "amax", out_shape=(), out_kind="f32")
    return ew(ctx, "$0 == $1 ? ($i == 0 ? $0 - $2 : $1 + $2) : ($i == 0 ? $0 : $1)",
              [mn, mx, pad], "f32", shape=(2,))


def _linspace_edges(ctx: Context, rng: TRef, bins: int) -> TRef:
    """bins + 1 edges from lo to hi, computed as torch's linspace does."""
    lo = rng.with_layout((), (), rng.offset)
    hi = rng.with_layout((), (), rng.offset + 1)
    half = (bins + 1) // 2
    return ew(ctx, "$i < $3 ? $0 + (($1 - $0) / float($2)) * float($i) : "
                   "$1 - (($1 - $0) / float($2)) * float($2 - $i)",
              [lo, hi, bins, half], "f32", shape=(bins + 1,))


def histogram(ctx: Context, x: TRef, bins: int, rng: TRef, mode: str, edges: TRef | None = None,
              weight=None) -> TRef:
    hist = ew(ctx, "0.0", [], "f32", shape=(bins,))
    if x.numel == 0:
        return hist
    shape, (xs,) = _coalesce(x.shape, [x.strides])
    spec = [WG, x.numel, bins]
    decls, code = [], []
    for k in reversed(range(len(shape))):
        cid = len(spec)
        decls.append(f"layout(constant_id={cid}) const uint XD{k}=1u;"
                     f"layout(constant_id={cid + 1}) const uint XS{k}=0u;")
        spec += [shape[k], xs[k]]
        code.append(f"{{ uint c = r % XD{k}; r /= XD{k}; xo += c * XS{k}; }}")
    decls.append(f"layout(constant_id={len(spec)}) const uint X_OFF=0u;")
    spec.append(x.offset)
    defines = {"VARIANT": mode.lower(), mode: 1, "SPEC_DECLS": " ".join(decls),
               "X_INDEX": " ".join(code)}
    bindings = [hist, x, rng, edges if edges is not None else rng]
    if weight is not None:
        defines["WEIGHTED"] = 1
        w = ew(ctx, "$0", [weight], "f32", compute="f32")
        bindings.append(w)
    ctx.dispatch("histogram", defines, bindings, [0], spec, groups_for(x.numel, WG),
                 note=f"{mode} {x.shape} into {bins} bins")
    return hist


def _density(ctx: Context, hist: TRef, edges: TRef) -> TRef:
    n = hist.shape[0]
    total = reduce(ctx, hist, [], "sum", out_shape=(), out_kind="f32")
    lo = edges.with_layout((n,), (1,), edges.offset)
    hi = edges.with_layout((n,), (1,), edges.offset + 1)
    return ew(ctx, "$0 / ($1 * ($3 - $2))", [hist, total, lo, hi], "f32", compute="f32")


def _as_f32(ctx, x) -> TRef:
    x = ctx.ref(x)
    return x if x.kind == "f32" else ew(ctx, "$0", [x], "f32", compute="f32")


@lowering(aten.histc.default)
def histc(ctx, x, bins=100, min=0, max=0):
    x = _as_f32(ctx, x)
    rng = _range(ctx, x, None if min == max else float(min), None if min == max else float(max),
                 1.0)
    return histogram(ctx, x, int(bins), rng, "LINEAR")


@lowering(aten.histogram.bin_ct)
def histogram_bin_ct(ctx, x, bins=100, *, range=None, weight=None, density=False):
    x = _as_f32(ctx, x)
    lo, hi = (range if range is not None else (None, None))
    rng = _range(ctx, x, lo, hi, 0.5)
    edges = _linspace_edges(ctx, rng, int(bins))
    hist = histogram(ctx, x, int(bins), rng, "LOCAL", edges, weight)
    return (_density(ctx, hist, edges) if density else hist), edges


@lowering(aten.histogram.bins_tensor)
def histogram_edges(ctx, x, bins, *, weight=None, density=False):
    x = _as_f32(ctx, x)
    edges = contiguous(ctx, _as_f32(ctx, bins))
    n = edges.shape[0] - 1
    rng = ew(ctx, "$i == 0 ? $0 : $1", [edges.with_layout((), (), 0),
                                         edges.with_layout((), (), n)], "f32", shape=(2,))
    hist = histogram(ctx, x, n, rng, "SEARCH", edges, weight)
    return (_density(ctx, hist, edges) if density else hist), edges


# --- histogramdd ------------------------------------------------------------------------------
def _points(ctx: Context, x) -> TRef:
    """x (..., D) as an (N, D) view (a copy if the leading dims do not merge)."""
    x = _as_f32(ctx, x)
    d = x.shape[-1]
    n = x.numel // max(1, d)
    try:
        from .core import meta_view
        return meta_view(x, lambda t: t.view(n, d))
    except RuntimeError:
        x = contiguous(ctx, x)
        return x.with_layout((n, d), (d, 1), x.offset)


def _ranges_dd(ctx: Context, pts: TRef, rng) -> TRef:
    """(D, 2) outer edges per dim: the given range, else the data's (equal ends +-0.5)."""
    n, d = pts.shape
    if rng is not None:
        vals = [float(v) for v in rng]
        return ctx.ref(torch.tensor(vals, dtype=torch.float32))
    if n == 0:
        return ew(ctx, "($i % 2) == 0 ? 0.0 : 1.0", [], "f32", shape=(d, 2))
    mn = reduce(ctx, pts, [0], "amin", out_shape=(d, 1), out_kind="f32")
    mx = reduce(ctx, pts, [0], "amax", out_shape=(d, 1), out_kind="f32")
    return ew(ctx, "$0 == $1 ? (($i % 2) == 0 ? $0 - 0.5 : $1 + 0.5) : (($i % 2) == 0 ? $0 : $1)",
              [mn, mx], "f32", shape=(d, 2))


def _edges_dd(ctx: Context, ranges: TRef, bins) -> list[TRef]:
    return [_linspace_edges(ctx, ranges.with_layout((2,), (1,), ranges.offset + 2 * k), int(b))
            for k, b in enumerate(bins)]


def histogramdd(ctx: Context, pts: TRef, bins: list[int], ranges: TRef, edges: list[TRef],
                mode: str, weight, density: bool) -> TRef:
    shape = tuple(int(b) for b in bins)
    hist = ew(ctx, "0.0", [], "f32", shape=shape)
    n, d = pts.shape
    if n and hist.numel:
        total = sum(b + 1 for b in shape)
        all_edges = ctx.empty((total,), "f32")
        meta, pos = [], 0
        for k, e in enumerate(edges):
            ew(ctx, "$0", [e], "f32", out=all_edges.with_layout(e.shape, (1,), pos))
            meta += [shape[k], pos, hist.strides[k]]
            pos += shape[k] + 1
        bindings = [hist, pts, ranges, all_edges, ctx.ref(torch.tensor(meta, dtype=torch.int32))]
        defines = {"VARIANT": mode.lower(), mode: 1}
        if weight is not None:
            defines["WEIGHTED"] = 1
            bindings.append(contiguous(ctx, _as_f32(ctx, weight)))
        ctx.dispatch("histogramdd", defines, bindings, [0],
                     [WG, n, d, pts.offset, pts.strides[0], pts.strides[1]], groups_for(n, WG),
                     note=f"histogramdd {pts.shape} into {shape}")
    if not density:
        return hist
    tot = reduce(ctx, hist, [], "sum", out_shape=(), out_kind="f32")
    ops, expr = [hist, tot], "$0 / $1"
    for k, e in enumerate(edges):
        nb = shape[k]
        width = ew(ctx, "$1 - $0", [e.with_layout((nb,), (1,), e.offset),
                                    e.with_layout((nb,), (1,), e.offset + 1)], "f32")
        strides = tuple(1 if j == k else 0 for j in range(len(shape)))
        ops.append(width.with_layout(shape, strides, 0))
        expr += f" / ${len(ops) - 1}"
    return ew(ctx, expr, ops, "f32", compute="f32")


@lowering(aten._histogramdd_bin_edges.default)
def histogramdd_bin_edges(ctx, x, bins, *, range=None, weight=None, density=False):
    pts = _points(ctx, x)
    return tuple(_edges_dd(ctx, _ranges_dd(ctx, pts, range), bins))


@lowering(aten._histogramdd_from_bin_cts.default)
def histogramdd_from_bin_cts(ctx, x, bins, *, range=None, weight=None, density=False):
    pts = _points(ctx, x)
    ranges = _ranges_dd(ctx, pts, range)
    return histogramdd(ctx, pts, bins, ranges, _edges_dd(ctx, ranges, bins), "LOCAL", weight,
                       density)


@lowering(aten._histogramdd_from_bin_tensors.default)
def histogramdd_from_bin_tensors(ctx, x, bins, *, weight=None, density=False):
    pts = _points(ctx, x)
    edges = [contiguous(ctx, _as_f32(ctx, b)) for b in bins]
    ranges = ctx.empty((len(edges), 2), "f32")
    for k, e in enumerate(edges):
        ew(ctx, "$i == 0 ? $0 : $1", [e.with_layout((), (), e.offset),
                                      e.with_layout((), (), e.offset + e.shape[0] - 1)], "f32",
           out=ranges.with_layout((2,), (1,), 2 * k))
    return histogramdd(ctx, pts, [e.shape[0] - 1 for e in edges], ranges, edges, "SEARCH", weight,
                       density)
