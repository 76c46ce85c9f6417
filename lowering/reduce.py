"""Reduction family (shaders/reduce.comp): sum, mean, amax, amin, any, all
over any dims of any view, one workgroup per output element."""
from __future__ import annotations

import torch

from .core import Context, TRef, lowering
from .elementwise import _coalesce

aten = torch.ops.aten
WG = 128
NAN = "uintBitsToFloat(0x7fc00000u)"

# op family -> (init, combine, subgroup combine, final) per accumulator type
FLOAT_OPS = {
    "sum": ("0.0", "(a + b)", "subgroupAdd(x)", "a"),
    "mean": ("0.0", "(a + b)", "subgroupAdd(x)", "(a / float(R))"),
    "amax": ("uintBitsToFloat(0xff800000u)", "((isnan(a) || a > b) ? a : b)",
             f"(subgroupAny(isnan(x)) ? {NAN} : subgroupMax(x))", "a"),
    "amin": ("uintBitsToFloat(0x7f800000u)", "((isnan(a) || a < b) ? a : b)",
             f"(subgroupAny(isnan(x)) ? {NAN} : subgroupMin(x))", "a"),
}
INT_OPS = {
    "sum": ("0", "(a + b)", "subgroupAdd(x)", "a"),
    "amax": ("-2147483647 - 1", "max(a, b)", "subgroupMax(x)", "a"),
    "amin": ("2147483647", "min(a, b)", "subgroupMin(x)", "a"),
    "any": ("0", "max(a, b)", "subgroupMax(x)", "a"),
    "all": ("1", "min(a, b)", "subgroupMin(x)", "a"),
}


def reduce(ctx: Context, x: TRef, dims, op: str) -> TRef:
    dims = sorted({d % x.ndim for d in dims} if dims else range(x.ndim)) if x.ndim else []
    kept = [d for d in range(x.ndim) if d not in dims]
    out_kind = ctx.out_kind()
    acc_kind = "f32" if out_kind == "f32" else "i32"
    init, combine, sub, final = (FLOAT_OPS if acc_kind == "f32" else INT_OPS)[op]
    (kshape,), (kstr,) = _dims(x, kept)
    (rshape,), (rstr,) = _dims(x, dims)
    nout = 1
    for d in kept:
        nout *= x.shape[d]
    r = 1
    for d in dims:
        r *= x.shape[d]
    out = ctx.empty(ctx.out_shape(), out_kind)
    if nout == 0:
        return out
    spec = [WG, nout, r, x.offset]
    decls, outer, inner = [], ["uint q = o;"], ["uint q = r;"]
    cid = 4
    for tag, shape, strides, code, var in (("K", kshape, kstr, outer, "base"),
                                           ("R", rshape, rstr, inner, "off")):
        for k in reversed(range(len(shape))):
            decls.append(f"layout(constant_id={cid}) const uint {tag}D{k}=1u;"
                         f"layout(constant_id={cid + 1}) const uint {tag}S{k}=0u;")
            spec += [shape[k], strides[k]]
            cid += 2
            code.append(f"{{ uint c = q % {tag}D{k}; q /= {tag}D{k}; {var} += c * {tag}S{k}; }}")
    glsl = "float" if acc_kind == "f32" else "int"
    load = {"f32": "ld_f32(w)", "i32": "ld_i32(w)", "b": "int(ld_b(w))"}[x.kind]
    if acc_kind == "f32" and x.kind != "f32":
        load = f"float({load})"
    store = {"f32": "st_f32(v)", "i32": "st_i32(int(v))", "b": "st_b(v != 0)"}[out_kind]
    defines = {
        "VARIANT": f"{op}_{x.kind}",
        "ACC_T": glsl, "INIT": f"{glsl}({init})",
        "COMBINE(a, b)": combine, "SUBGROUP_COMBINE(x)": sub, "FINAL(a)": final,
        "LOAD(w)": load, "STORE(v)": store,
        "SPEC_DECLS": " ".join(decls), "OUTER_INDEX": " ".join(outer),
        "INNER_INDEX": " ".join(inner),
    }
    if r == 0:
        defines["INNER_INDEX"] = ""
    ctx.dispatch("reduce", defines, [out, x], [0], spec, (min(nout, 65535), -(-nout // 65535), 1),
                 note=f"{op} {x.shape} dims={dims}")
    return out


def _dims(x: TRef, dims):
    if not dims:
        return [[1]], [[0]]
    shape, strides = _coalesce([x.shape[d] for d in dims], [[x.strides[d] for d in dims]])
    return [shape], strides


@lowering(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
          aten.amax.default, aten.amin.default, aten.any.dim, aten.any.dims, aten.any.default,
          aten.all.dim, aten.all.dims, aten.all.default)
def reduction(ctx, x, dims=None, keepdim=False, *, dtype=None):
    name = ctx.node.target._overloadpacket.__name__
    if isinstance(dims, int):
        dims = [dims]
    return reduce(ctx, x, list(dims) if dims else [], name)
