"""Reduction family (shaders/reduce.comp): sum, mean, prod, amax, amin, any,
all, var/std (centred on a mean computed first) over any dims of any view,
one workgroup per output element; argmax/argmin and max/min with indices
(shaders/argreduce.comp) the same way."""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import device
from .core import Context, TRef, contiguous_strides, f32_bits, lowering, row_wg
from .elementwise import _coalesce
from .fusion import Lazy, LazyView, materialize, row_loader

aten = torch.ops.aten
WG = 128
# reductions of at most this many elements per output take an invocation per output
# (PER_LANE): a workgroup per output left 120 of its 128 lanes idle over a batch dim of 8
# (the GPT's position-embedding gradient, (8, 256, 384) over dim 0: 109 us on an H100)
PER_LANE_MAX_R = 64
# COLUMNS (outputs neighbouring in memory, their reduced elements a row apart: a bias's or a
# norm's gradient summed over batch and positions): a workgroup's outputs and slices on a
# GPU, and the workgroups wanted there (the reduced elements split across them)
COLUMNS_CQ = 32           # outputs a workgroup: one 128-byte row segment
COLUMNS_TARGET_WGS = 256
COLUMNS_MIN_ROWS = 16     # reduced elements a lane at least (its loads in flight)
COLUMNS_MAX_SPLITS = 32
ARG_WG = 64
NAN = "uintBitsToFloat(0x7fc00000u)"

# op family -> (init, combine, subgroup combine, final) per accumulator type
FLOAT_OPS = {
    "sum": ("0.0", "(a + b)", "subgroupAdd(x)", "a"),
    "mean": ("0.0", "(a + b)", "subgroupAdd(x)", "(a / float(R))"),
    "prod": ("1.0", "(a * b)", "subgroupMul(x)", "a"),
    "var": ("0.0", "(a + b)", "subgroupAdd(x)", "div_(a)"),
    "std": ("0.0", "(a + b)", "subgroupAdd(x)", "sqrt(div_(a))"),
    "amax": ("uintBitsToFloat(0xff800000u)", "((isnan(a) || a > b) ? a : b)",
             f"(subgroupAny(isnan(x)) ? {NAN} : subgroupMax(x))", "a"),
    "amin": ("uintBitsToFloat(0x7f800000u)", "((isnan(a) || a < b) ? a : b)",
             f"(subgroupAny(isnan(x)) ? {NAN} : subgroupMin(x))", "a"),
}
INT_OPS = {
    "sum": ("0", "(a + b)", "subgroupAdd(x)", "a"),
    "prod": ("1", "(a * b)", "subgroupMul(x)", "a"),
    "amax": ("-2147483647 - 1", "max(a, b)", "subgroupMax(x)", "a"),
    "amin": ("2147483647", "min(a, b)", "subgroupMin(x)", "a"),
    "any": ("0", "max(a, b)", "subgroupMax(x)", "a"),
    "all": ("1", "min(a, b)", "subgroupMin(x)", "a"),
}


def reduce(ctx: Context, x, dims, op: str, out_shape=None, out_kind=None,
           center: TRef | None = None, divisor: float = 1.0, pre: str = "",
           post: str = "") -> TRef:
    """Reduce x over dims (all if empty) with op. out_shape/out_kind default to the
    node's. var/std: sum of (x - center)^2 / divisor, center holding one mean per
    output element (contiguous, in the kept dims' order). pre: GLSL applied to
    each loaded value `v`; post: to the final result `a` (norms). x may be a Lazy (an
    elementwise expression, _loads_lazy): a float reduction computes it as it loads each
    element, which it reads once (no kernel, buffer or barrier for it); anything else is
    computed first."""
    out_kind = out_kind or ctx.out_kind()
    loader, k = None, 1
    # a reshape of a Lazy (LazyView) is read in the Lazy's own shape: both row-major
    lazy, shape = (x.lazy, x.shape) if isinstance(x, LazyView) else (x, getattr(x, "shape", ()))
    if isinstance(lazy, Lazy) and lazy.out_kind == "f32" and out_kind == "f32" and center is None \
            and op in ("sum", "mean", "amax", "amin") and lazy.ndim and shape:
        k = lazy.shape[-1]
        loader = row_loader(ctx, lazy, math.prod(lazy.shape) // max(1, k), k, 2)
        if loader is not None and loader.buffers:
            x = TRef(-1, tuple(shape), contiguous_strides(tuple(shape)), 0, "f32")
        else:
            loader = None
    if loader is None:
        x = ctx.ref(materialize(ctx, x))
    dims = sorted({d % x.ndim for d in dims} if dims else range(x.ndim)) if x.ndim else []
    kept = [d for d in range(x.ndim) if d not in dims]
    acc_kind = "f32" if out_kind == "f32" or op in ("var", "std") else "i32"
    init, combine, sub, final = (FLOAT_OPS if acc_kind == "f32" else INT_OPS)[op]
    nout, r = _numel(x, kept), _numel(x, dims)
    out = ctx.empty(ctx.out_shape() if out_shape is None else out_shape, out_kind)
    if nout == 0:
        return out
    if r == 0 and op == "mean":          # the mean of nothing is NaN (drivers' 0 / 0 may not be)
        final = NAN
    wg = _output_wg(ctx.caps, r)
    neighbours = _outputs_neighbour(x, kept)
    # on a GPU an invocation per output only where neighbouring lanes read neighbouring
    # elements; where the reduced elements are the contiguous ones (attention's row sums
    # over a head's 64 values) a workgroup per output reads each row in one pass instead
    per_lane = r <= PER_LANE_MAX_R and nout >= wg and (neighbours or device.is_cpu(ctx.caps))
    cols = None if per_lane or acc_kind != "f32" or not neighbours else \
        _columns(ctx.caps, x, dims, nout, r)
    spec = [cols["CQ"] * cols["KT"] if cols else wg, nout, r, x.offset,
            f32_bits(divisor), cols["rsplit"] if cols else r]
    decls, outer, inner = _index_code(x, kept, dims, spec)
    glsl = "float" if acc_kind == "f32" else "int"
    load = {"f32": "ld_f32(w)", "i32": "ld_i32(w)", "b": "int(ld_b(w))"}[x.kind] if loader is None \
        else "(w)"
    if acc_kind == "f32" and x.kind != "f32":
        load = f"float({load})"
    elif acc_kind == "i32" and x.kind == "f32":        # any/all of floats: nonzero (NaN too)
        load = f"int({load} != 0.0)"
    if center is not None:
        load = f"sq_(({load}) - ld_f32(auxb[o]))"
    if pre:
        load = f"pre_({load})"
    store = {"f32": "st_f32(v)", "i32": "st_i32(int(v))", "b": "st_b(v != 0)"}[out_kind]
    defines = {
        "VARIANT": f"{op}_{x.kind}",
        "ACC_T": glsl, "INIT": f"{glsl}({init})",
        "COMBINE(a, b)": combine, "SUBGROUP_COMBINE(x)": sub,
        "FINAL(a)": f"post_({final})" if post else final,
        "LOAD(w)": load, "STORE(v)": store,
        "SPEC_DECLS": " ".join(decls), "OUTER_INDEX": " ".join(outer),
        "INNER_INDEX": " ".join(inner),
    }
    if pre:
        defines["SPEC_DECLS"] += f" {glsl} pre_({glsl} v) {{ return {glsl}({pre}); }}"
    if post:
        defines["SPEC_DECLS"] += f" {glsl} post_({glsl} a) {{ return {glsl}({post}); }}"
    if r == 0:
        defines["INNER_INDEX"] = ""
    bindings = [out, x]
    if loader is not None:     # binding 1 unread: the loader's buffers from 2
        bindings = [out, loader.buffers[0], *loader.buffers]
        defines |= {"X_LAZY": loader.decls, "XL_K": k}
    if center is not None:
        defines["HAS_AUX"] = 1
        bindings.append(center)
    if op in ("sum", "prod") and acc_kind == "i32" and out_kind == "i32" and _int64_result(ctx):
        bindings.append(_exact_int64(ctx, op, defines, load))
        defines["CHECK_BINDING"] = len(bindings) - 1
    note, groups, writes = f"{op} {'elementwise ' if loader else ''}{x.shape} dims={dims}", nout, [0]
    if cols:
        defines |= {"COLUMNS": 1, "CQ": cols["CQ"], "KT": cols["KT"], "SPLITS": cols["splits"]}
        note += f", {cols['CQ']} neighbouring outputs a workgroup"
        if cols["splits"] > 1:
            base = len(bindings)
            # zero at upload; each block's last split resets its count for the next call
            bindings += [ctx.empty((cols["splits"], nout), "f32"),
                         ctx.buffer(cols["blocks"], "const", "i32", np.zeros(cols["blocks"], np.uint32))]
            defines |= {"PART_BINDING": base, "COUNT_BINDING": base + 1}
            writes += [base, base + 1]
            note += f" in {cols['splits']} splits"
        ctx.dispatch("reduce", defines, bindings, writes, spec, (cols["blocks"], cols["splits"], 1), note=note)
        return out
    if per_lane:
        defines["PER_LANE"] = 1
        groups, note = -(-nout // spec[0]), note + ", an invocation per output"
    ctx.dispatch("reduce", defines, bindings, writes, spec, (min(groups, 65535), -(-groups // 65535), 1),
                 note=note)
    return out


def _output_wg(caps: dict, r: int) -> int:
    """Invocations of a workgroup that reduces one output: row_wg's, on a GPU no more
    than the reduced elements (rounded up to a whole subgroup)."""
    wg = row_wg(caps, WG, r)
    if device.is_cpu(caps):
        return wg
    sg = int(caps.get("subgroup_size", 32))
    return min(wg, max(sg, 1 << max(0, r - 1).bit_length()))


def _outputs_neighbour(x: TRef, kept) -> bool:
    """Whether neighbouring outputs neighbour in memory: the kept dims' innermost is
    contiguous."""
    return bool(kept) and _dims(x, kept)[1][0][-1] == 1


def _columns(caps: dict, x: TRef, dims, nout: int, r: int) -> dict | None:
    """The COLUMNS mapping of a reduction whose neighbouring outputs neighbour in memory
    (_outputs_neighbour) and whose reduced elements do not (a workgroup per output would
    read one float a row, strided): CQ outputs by KT slices a workgroup, and on a GPU the
    reduced elements split over enough workgroups to fill it. None where the reduced
    elements are contiguous, or too few."""
    if not dims or nout < 2 or r < 2 or 1 in _dims(x, dims)[1][0]:
        return None
    cpu = device.is_cpu(caps)
    if cpu:                        # lanes along the outputs, one subgroup, no barrier
        cq, kt = int(caps.get("subgroup_size", 8)), 1
    else:
        cq = min(COLUMNS_CQ, 1 << (nout - 1).bit_length())
        kt = WG // cq
    blocks = -(-nout // cq)
    if blocks > 65535:
        return None
    splits = 1
    if not cpu:
        fit = int(caps.get("max_storage_buffer_range", 128 << 20)) // (4 * nout)
        splits = max(1, min(-(-COLUMNS_TARGET_WGS // blocks), r // (kt * COLUMNS_MIN_ROWS),
                            COLUMNS_MAX_SPLITS, fit))
    rsplit = -(-r // splits)
    return {"CQ": cq, "KT": kt, "blocks": blocks, "splits": -(-r // rsplit), "rsplit": rsplit}


def _int64_result(ctx: Context) -> bool:
    val = ctx.node.meta.get("val") if ctx.node is not None else None
    return isinstance(val, torch.Tensor) and val.dtype == torch.int64


def _exact_int64(ctx: Context, op: str, defines: dict, load: str) -> TRef:
    """An int64 sum or product whose result is checked against int32 (the range int64
    values travel in; checks.glsl): sums exact in (high, low) halves, products with a
    float32 product beside the wrapped one. The defines for it, and the check buffer to
    bind."""
    from .elementwise import int64_overflow_mask
    mask = int64_overflow_mask(ctx)
    if op == "sum":
        defines.update({"ACC_T": "ivec2", "INIT": "ivec2(0)", "COMBINE(a, b)": "add64_(a, b)",
                        "SUBGROUP_COMBINE(x)": "norm64_(subgroupAdd(x))",
                        "LOAD(w)": f"split64_({load})",
                        "FINAL(a)": f"join64_ck(a, {mask}u)", "STORE(v)": "st_i32(v)"})
    else:
        defines.update({"ACC_T": "ivec2", "INIT": "psplit64_(1)", "COMBINE(a, b)": "pmul64_(a, b)",
                        "SUBGROUP_COMBINE(x)": "psubgroup64_(x)",
                        "LOAD(w)": f"psplit64_({load})",
                        "FINAL(a)": f"pjoin64_ck(a, {mask}u)", "STORE(v)": "st_i32(v)"})
    defines["VARIANT"] += "_int64"
    return TRef(ctx.plan.check_buffer, (1,), (1,), 0, "i32")


def _numel(x: TRef, dims) -> int:
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


def _index_code(x: TRef, kept, dims, spec: list):
    """GLSL that turns output index o into `base` and reduced index r into `off`
    (offsets into x), with the dims' sizes and strides appended to spec."""
    (kshape,), (kstr,) = _dims(x, kept)
    (rshape,), (rstr,) = _dims(x, dims)
    decls, outer, inner = [], ["uint q = o;"], ["uint q = r;"]
    cid = len(spec)
    for tag, shape, strides, code, var in (("K", kshape, kstr, outer, "base"),
                                           ("R", rshape, rstr, inner, "off")):
        for k in reversed(range(len(shape))):
            decls.append(f"layout(constant_id={cid}) const uint {tag}D{k}=1u;"
                         f"layout(constant_id={cid + 1}) const uint {tag}S{k}=0u;")
            spec += [shape[k], strides[k]]
            cid += 2
            code.append(f"{{ uint c = q % {tag}D{k}; q /= {tag}D{k}; {var} += c * {tag}S{k}; }}")
    return decls, outer, inner


def _dims(x: TRef, dims):
    if not dims:
        return [[1]], [[0]]
    shape, strides = _coalesce([x.shape[d] for d in dims], [[x.strides[d] for d in dims]])
    return [shape], strides


def _loads_lazy(user, node) -> bool:
    """A float32 elementwise result read only by a float32 sum, mean, amax or amin (a
    gradient's product summed over the batch, a norm's backward sums): the reduction
    computes it as it loads it; each element is loaded once, so nothing is computed
    twice, on any device."""
    val, out = node.meta.get("val"), user.meta.get("val")
    return user.args[0] is node and node not in user.args[1:] and \
        user.target in LAZY_REDUCTIONS and isinstance(val, torch.Tensor) and \
        isinstance(out, torch.Tensor) and val.dtype == out.dtype == torch.float32 and \
        val.dim() > 0 and val.numel() > 0


LAZY_REDUCTIONS = frozenset({aten.sum.dim_IntList, aten.sum.default, aten.mean.dim,
                             aten.mean.default, aten.amax.default, aten.amin.default})


@lowering(aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default,
          aten.amax.default, aten.amin.default, aten.any.dim, aten.any.dims, aten.any.default,
          aten.all.dim, aten.all.dims, aten.all.default, takes_deferred=True, loads_lazy=_loads_lazy)
def reduction(ctx, x, dims=None, keepdim=False, *, dtype=None):
    name = ctx.node.target._overloadpacket.__name__
    if isinstance(dims, int):
        dims = [dims]
    return reduce(ctx, x, list(dims) if dims else [], name)


def _norm_dims(x: TRef, dim) -> list[int]:
    if dim is None:
        return list(range(x.ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % max(1, x.ndim) for d in dims}) if x.ndim else []


@lowering(aten.prod.default, aten.prod.dim_int)
def prod(ctx, x, dim=None, keepdim=False, *, dtype=None):
    return reduce(ctx, x, [] if dim is None else [dim], "prod")


@lowering(aten.max.default, aten.min.default)
def max_all(ctx, x):
    return reduce(ctx, x, [], "amax" if ctx.node.target == aten.max.default else "amin")


def variance(ctx: Context, x: TRef, dims, correction=1, keepdim=False, std=False):
    """(var or std, mean) over dims; both in the node's reduced shape."""
    dims = dims if dims else list(range(x.ndim))
    kept_shape = tuple(1 if d in dims else s for d, s in enumerate(x.shape)) if keepdim else \
        tuple(s for d, s in enumerate(x.shape) if d not in dims)
    n = _numel(x, dims)
    mean = reduce(ctx, x, dims, "mean", out_shape=kept_shape, out_kind="f32")
    corr = 1 if correction is None else float(correction)
    var = reduce(ctx, x, dims, "std" if std else "var", out_shape=kept_shape, out_kind="f32",
                 center=mean, divisor=max(0.0, n - corr))
    return var, mean


@lowering(aten.var.correction, aten.std.correction)
def var(ctx, x, dim=None, *, correction=None, keepdim=False):
    x = ctx.ref(x)
    std = ctx.node.target == aten.std.correction
    return variance(ctx, x, _norm_dims(x, dim), correction, keepdim, std)[0]


@lowering(aten.var_mean.correction, aten.std_mean.correction)
def var_mean(ctx, x, dim=None, *, correction=None, keepdim=False):
    x = ctx.ref(x)
    std = ctx.node.target == aten.std_mean.correction
    return variance(ctx, x, _norm_dims(x, dim), correction, keepdim, std)


# --- arg reductions: (value, index) pairs --------------------------------------------------
ARG_SPLIT_ROW = 8192      # rows at least this long, of few outputs, reduce in two passes
# elements a workgroup of the first pass, and the invocations of either pass: one element an
# invocation, so no invocation waits on a chain of loads (an LM head's logits: many
# workgroups, not a few that each walk thousands; docs/journal.md, session 52)
ARG_CHUNK = 256
ARG_SPLIT_WG = 256


def arg_reduce(ctx: Context, x: TRef, dims, largest: bool, out_shape, want_values: bool):
    """Index (int32, flat over the reduced dims) of the first max/min, NaN counting as the
    largest; and optionally the value itself. A long row of few outputs (an LM head's
    logits) is split over many workgroups, then their (value, index) pairs are reduced."""
    kept = [d for d in range(x.ndim) if d not in dims]
    nout, r = _numel(x, kept), _numel(x, dims)
    idx = ctx.empty(out_shape, "i32")
    vals = ctx.empty(out_shape, x.kind) if want_values else None
    if not nout:
        return idx, vals
    splits = -(-r // ARG_CHUNK) if r >= ARG_SPLIT_ROW and nout <= 64 else 1
    if splits == 1:
        _arg_pass(ctx, x, kept, dims, largest, nout, r, idx, vals)
        return idx, vals
    pidx, pval = ctx.empty((nout, splits), "i32"), ctx.empty((nout, splits), x.kind)
    _arg_pass(ctx, x, kept, dims, largest, nout, r, pidx, pval, split=(splits, ARG_CHUNK))
    _arg_pass(ctx, pval, [0], [1], largest, nout, splits, idx, vals, pairs=pidx)
    return idx, vals


def _arg_pass(ctx, x: TRef, kept, dims, largest, nout, r, idx, vals, split=None, pairs=None):
    """One argreduce dispatch; split (workgroups per output, elements each) writes a pair
    per workgroup; pairs: x holds candidate values whose indices are in that buffer."""
    wg = ARG_SPLIT_WG if split or pairs is not None else ARG_WG
    spec = [row_wg(ctx.caps, wg, split[1] if split else r), nout, r, x.offset]
    decls, outer, inner = _index_code(x, kept, dims, spec)
    glsl = "float" if x.kind == "f32" else "int"
    load = {"f32": "ld_f32(w)", "i32": "ld_i32(w)", "b": "int(ld_b(w))"}[x.kind]
    store = {"f32": "st_f32(v)", "i32": "st_i32(v)", "b": "st_b(v != 0)"}[x.kind]
    defines = {"VARIANT": f"{'max' if largest else 'min'}_{x.kind}", "VAL_T": glsl,
               "LOAD(w)": load, "STORE(v)": store, "SPEC_DECLS": " ".join(decls),
               "OUTER_INDEX": " ".join(outer), "INNER_INDEX": " ".join(inner)}
    defines["LARGEST" if largest else "SMALLEST"] = 1
    if x.kind == "f32":
        defines["IS_FLOAT"] = 1
    bindings, writes = [idx, x], [0]
    if vals is not None:
        defines["WANT_VALUES"] = 1
        bindings.append(vals)
        writes.append(2)
    groups, note = nout, f"arg {x.shape} dims={dims}"
    if split:
        defines.update(SPLITS=f"{split[0]}u", CHUNK=f"{split[1]}u")
        groups, note = nout * split[0], note + f" in {split[0]} splits"
    if pairs is not None:
        defines["PAIRS"] = 1
        bindings.append(pairs)
        note = f"arg of {r} pairs x {nout}"
    ctx.dispatch("argreduce", defines, bindings, writes, spec,
                 (min(groups, 65535), -(-groups // 65535), 1), note=note)


@lowering(aten.argmax.default, aten.argmin.default)
def argmax(ctx, x, dim=None, keepdim=False):
    x = ctx.ref(x)
    largest = ctx.node.target == aten.argmax.default
    return arg_reduce(ctx, x, _norm_dims(x, dim), largest, ctx.out_shape(), False)[0]


@lowering(aten.max.dim, aten.min.dim)
def max_dim(ctx, x, dim, keepdim=False):
    x = ctx.ref(x)
    idx, vals = arg_reduce(ctx, x, _norm_dims(x, dim), ctx.node.target == aten.max.dim,
                           ctx.out_shape(0), True)
    return vals, idx


@lowering(aten.linalg_vector_norm.default)
def vector_norm(ctx, x, ord=2, dim=None, keepdim=False, *, dtype=None):
    x = ctx.ref(x)
    return p_norm(ctx, x, _norm_dims(x, dim) if dim is not None and dim != [] else [], ord)


@lowering(aten.dist.default)
def dist(ctx, x, y, p=2):
    from .elementwise import ew
    return p_norm(ctx, ew(ctx, "$0 - $1", [x, y], "f32", compute="f32"), [], p)


def p_norm(ctx: Context, x: TRef, dims, ord, out_shape=None) -> TRef:
    """sum(|x|^p)^(1/p) over dims; max/min |x| for +-inf; the count of nonzeros for 0."""
    p = float(ord)
    if p == float("inf"):
        return reduce(ctx, x, dims, "amax", out_shape=out_shape, out_kind="f32", pre="abs(v)")
    if p == float("-inf"):
        return reduce(ctx, x, dims, "amin", out_shape=out_shape, out_kind="f32", pre="abs(v)")
    if p == 0:
        return reduce(ctx, x, dims, "sum", out_shape=out_shape, out_kind="f32", pre="v != 0.0 ? 1.0 : 0.0")
    if p == 1:
        return reduce(ctx, x, dims, "sum", out_shape=out_shape, out_kind="f32", pre="abs(v)")
    if p == 2:
        return reduce(ctx, x, dims, "sum", out_shape=out_shape, out_kind="f32", pre="v * v", post="sqrt(a)")
    # GLSL leaves pow(0, y) undefined: zeros and infinities take their limits
    inf = "uintBitsToFloat(0x7f800000u)"
    pb, ib = f"uintBitsToFloat({f32_bits(p)}u)", f"uintBitsToFloat({f32_bits(1.0 / p)}u)"
    zero_pow = inf if p < 0 else "0.0"
    return reduce(ctx, x, dims, "sum", out_shape=out_shape, out_kind="f32",
                  pre=f"v == 0.0 ? {zero_pow} : pow(abs(v), {pb})",
                  post=f"a == 0.0 ? {zero_pow} : (isinf(a) ? {'0.0' if p < 0 else inf} : "
                       f"pow(a, {ib}))")
