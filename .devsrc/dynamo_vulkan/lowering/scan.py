"""Scan family (shaders/scan.comp): cumsum, cumprod and logcumsumexp along
one dim of any view, in float32 or int32 (integer and bool inputs)."""
from __future__ import annotations

import torch

from .core import Context, TRef, lowering
from .elementwise import row_walk

aten = torch.ops.aten
WG = 128
NEG_INF = "uintBitsToFloat(0xff800000u)"

# op -> (init, combine) per accumulator type
OPS = {
    ("sum", "f32"): ("0.0", "(a + b)"), ("sum", "i32"): ("0", "(a + b)"),
    ("prod", "f32"): ("1.0", "(a * b)"), ("prod", "i32"): ("1", "(a * b)"),
    ("logsumexp", "f32"): (NEG_INF, "lse_(a, b)"),
}


def scan(ctx: Context, x: TRef, dim: int, op: str, out_kind: str) -> TRef:
    out = ctx.empty(x.shape, out_kind)
    if x.ndim == 0:
        x = x.with_layout((1,), (1,), x.offset)
        dim = 0
    dim %= x.ndim
    acc = "f32" if out_kind == "f32" else "i32"
    init, combine = OPS[(op, acc)]
    ostrides = out.strides if out.ndim else (1,)
    rows = out.numel // max(1, x.shape[dim])
    n = x.shape[dim]
    if out.numel == 0:
        return out
    spec = [WG, rows, n, x.offset, x.strides[dim], ostrides[dim]]
    decls, code = row_walk(x, ostrides, dim, spec)
    glsl = "float" if acc == "f32" else "int"
    load = {"f32": "ld_f32(w)", "i32": "ld_i32(w)", "b": "int(ld_b(w))"}[x.kind]
    defines = {"VARIANT": f"{op}_{x.kind}", "ACC_T": glsl, "INIT": f"{glsl}({init})",
               "COMBINE(a, b)": combine, "LOAD(w)": load,
               "STORE(v)": "st_f32(v)" if acc == "f32" else "st_i32(v)",
               "SPEC_DECLS": " ".join(decls),
               "ROW_INDEX": " ".join(code)}
    if op == "logsumexp":
        defines["NEED_LSE"] = 1          # lse_ from shaders/special.glsl
    bindings = [out, x]
    val = ctx.node.meta.get("val") if ctx.node is not None else None
    if op in ("sum", "prod") and acc == "i32" and isinstance(val, torch.Tensor) and \
            val.dtype == torch.int64:
        # each prefix checked against int32 (checks.glsl): sums exact in (high, low) halves,
        # products with a float32 product beside the wrapped one
        from .elementwise import int64_overflow_mask
        mask = int64_overflow_mask(ctx)
        p = "" if op == "sum" else "p"
        defines.update({"VARIANT": f"{op}_{x.kind}_int64", "ACC_T": "ivec2",
                        "INIT": "ivec2(0)" if op == "sum" else "psplit64_(1)",
                        "COMBINE(a, b)": f"{'add' if op == 'sum' else 'pmul'}64_(a, b)",
                        "LOAD(w)": f"{p}split64_({load})",
                        "STORE(v)": f"st_i32({p}join64_ck(v, {mask}u))", "CHECK_BINDING": 2})
        bindings.append(TRef(ctx.plan.check_buffer, (1,), (1,), 0, "i32"))
    ctx.dispatch("scan", defines, bindings, [0], spec, (min(rows, 65535), -(-rows // 65535), 1),
                 note=f"{op} {x.shape} dim={dim}")
    return out


@lowering(aten.cumsum.default, aten.cumprod.default)
def cumulative(ctx, x, dim, *, dtype=None):
    op = "sum" if ctx.node.target == aten.cumsum.default else "prod"
    return scan(ctx, ctx.ref(x), dim, op, ctx.out_kind())


@lowering(aten.logcumsumexp.default)
def logcumsumexp(ctx, x, dim):
    return scan(ctx, ctx.ref(x), dim, "logsumexp", "f32")


# --- segment_reduce (shaders/segment.comp) ----------------------------------------------------
SEGMENT = {  # reduce -> (combine, identity)
    "sum": ("(a + b)", 0.0), "mean": ("(a + b)", 0.0), "prod": ("(a * b)", 1.0),
    "max": ("((isnan(a) || a > b) ? a : b)", float("-inf")),
    "min": ("((isnan(a) || a < b) ? a : b)", float("inf")),
}


@lowering(aten.segment_reduce.default)
def segment_reduce(ctx, data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    from .core import LoweringError, f32_bits, groups_for
    from .elementwise import contiguous, ew
    if (lengths is None) == (offsets is None) or indices is not None:
        raise LoweringError("segment_reduce needs exactly one of lengths and offsets")
    x = ctx.ref(data)
    x = contiguous(ctx, x if x.kind == "f32" else ew(ctx, "$0", [x], "f32", compute="f32"))
    seg = contiguous(ctx, ctx.ref(lengths if lengths is not None else offsets))
    axis %= x.ndim
    out = ctx.empty(ctx.out_shape(), "f32")
    if out.numel == 0:
        return out
    inner = 1
    for s in x.shape[axis + 1:]:
        inner *= s
    nseg = out.shape[axis]
    combine, identity = SEGMENT[reduce]
    init = identity if initial is None else float(initial)
    defines = {"VARIANT": reduce, "COMBINE(a, b)": combine}
    if reduce == "mean":
        defines["MEAN"] = 1
    if offsets is not None:
        defines["OFFSETS"] = 1
    ctx.dispatch("segment", defines, [out, x, seg], [0],
                 [WG, out.numel, nseg, x.shape[axis], inner, f32_bits(init),
                  int(initial is not None)], groups_for(out.numel, WG),
                 note=f"segment {reduce} {x.shape} axis={axis}")
    return out


@lowering(aten.cummax.default, aten.cummin.default)
def cummax(ctx, x, dim):
    """(running max/min, its index) along dim (shaders/cumext.comp)."""
    from .core import groups_for
    x = ctx.ref(x)
    vals, idx = ctx.empty(x.shape, x.kind), ctx.empty(x.shape, "i32")
    if x.numel == 0:
        return vals, idx
    if x.ndim == 0:
        x = x.with_layout((1,), (1,), x.offset)
        dim = 0
    dim %= x.ndim
    ostr = vals.strides if vals.ndim else (1,)
    rows = x.numel // x.shape[dim]
    spec = [WG, rows, x.shape[dim], x.offset, x.strides[dim], ostr[dim]]
    decls, code = row_walk(x, ostr, dim, spec, q="q_")
    code.insert(0, "uint q_ = q;")
    cmp = ">=" if ctx.node.target == aten.cummax.default else "<="
    glsl = "float" if x.kind == "f32" else "int"
    takes = f"(isnan(v) || (!isnan(b) && v {cmp} b))" if x.kind == "f32" else f"(v {cmp} b)"
    defines = {"VARIANT": f"{'max' if cmp == '>=' else 'min'}_{x.kind}", "VAL_T": glsl,
               "TAKES(v, b)": takes,
               "LOAD(w)": {"f32": "ld_f32(w)", "i32": "ld_i32(w)", "b": "int(ld_b(w))"}[x.kind],
               "STORE(v)": {"f32": "st_f32(v)", "i32": "st_i32(v)", "b": "st_b(v != 0)"}[x.kind],
               "SPEC_DECLS": " ".join(decls), "ROW_INDEX": " ".join(code)}
    ctx.dispatch("cumext", defines, [vals, idx, x], [0, 1], spec, groups_for(rows, WG),
                 note=f"cum{'max' if cmp == '>=' else 'min'} {x.shape} dim={dim}")
    return vals, idx
