"""Row family (shaders/rowwise.comp): softmax, log_softmax, layer norm and its backward,
RMS norm (dynamo_vulkan.rms_norm)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dynamo_vulkan import device
from dynamo_vulkan import fused as _fused  # noqa: F401  (defines the custom ops)

from .core import (NO_REQUEST, Context, Lowered, LoweringError, TRef, contiguous_strides, f32_bits,
                   lowering, row_wg)
from .elementwise import contiguous, ew, row_walk
from .fusion import Deferred, materialize
from .reduce import reduce

aten = torch.ops.aten
RMS_NORM = torch.ops.dynamo_vulkan.rms_norm.default
WG = 128
# Few rows (a decode step's norm) on a GPU: a workgroup of up to this many invocations per
# row, so each loads a few elements of a long row rather than looping over dozens of
# dependent loads (docs/journal.md, session 29)
FEW_ROWS = 64
FEW_ROWS_WG = 1024


def row_workgroup(caps: dict, rows: int, n: int) -> int:
    """Invocations per row: row_wg's, widened on a GPU for few long rows (FEW_ROWS_WG, at
    most the device's limit and 64 subgroups, wg_reduce.glsl's partials)."""
    wg = row_wg(caps, WG, n)
    if device.is_cpu(caps) or rows > FEW_ROWS or n <= 4 * wg:
        return wg
    sg = max(1, int(caps.get("subgroup_size", 32)))
    most = min(FEW_ROWS_WG, int(caps.get("max_compute_work_group_invocations", 128)), 64 * sg)
    while wg * 2 <= most and 4 * wg < n:
        wg *= 2
    return wg


def _row_kernel(ctx: Context, mode: str, x: TRef, out: TRef, dim: int, extra: list,
                extra_decls: dict, eps: float = 0.0, stats=()):
    rows = math.prod(x.shape[d] for d in range(x.ndim) if d != dim)
    n = x.shape[dim]
    spec = [row_workgroup(ctx.caps, rows, n), rows, n, x.offset, x.strides[dim], out.strides[dim], f32_bits(eps)]
    decls, code = row_walk(x, out.strides, dim, spec)
    cid = len(spec)
    for name, value in extra_decls.items():
        decls.append(f"layout(constant_id={cid}) const uint {name}=0u;")
        spec.append(value)
        cid += 1
    bindings = [out, x, *stats, *extra]
    names = ["outb", "inb"] + (["meanb", "rstdb"] if stats else []) + \
        (["xb", "meanb", "rstdb"] if mode.startswith("LAYER_NORM_BACKWARD") else []) + \
        [name for flag, name in (("HAS_WEIGHT", "wb"), ("HAS_BIAS", "bb"), ("HAS_RESIDUAL", "resb"))
         if flag in mode.split()]
    defines = {mode.split()[0]: 1, "VARIANT": mode.split()[0].lower()}
    for m in mode.split()[1:]:
        defines[m] = 1
    defines.update({"SPEC_DECLS": " ".join(decls), "ROW_INDEX": " ".join(code),
                    "BUFFER_DECLS": " ".join(f"BUFFER({i}, {nm})" for i, nm in enumerate(names))})
    if rows:
        ctx.dispatch("rowwise", defines, bindings, list(range(1 + len(stats))), spec,
                     (min(rows, 65535), -(-rows // 65535), 1), note=f"{x.shape} dim={dim}")


@lowering(aten._softmax.default, aten._log_softmax.default)
def softmax(ctx, x, dim, half_to_float=False):
    mode = "SOFTMAX" if ctx.node.target == aten._softmax.default else "LOG_SOFTMAX"
    out = ctx.empty(x.shape, "f32")
    if x.ndim == 0:
        return _row_kernel(ctx, mode, x.with_layout((1,), (1,), x.offset), out.with_layout(
            (1,), (1,), 0), 0, [], {}) or out
    _row_kernel(ctx, mode, x, out, dim % x.ndim, [], {})
    return out


@lowering(aten.native_layer_norm.default)
def layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    k = len(normalized_shape)
    lead = x.shape[:x.ndim - k]
    n = 1
    for s in normalized_shape:
        n *= s
    if not _trailing_collapsible(x, k):
        x = contiguous(ctx, x)
    flat = x.with_layout(lead + (n,), x.strides[:x.ndim - k] + (1,),
                         x.offset)
    out = ctx.empty(x.shape, "f32")
    out_flat = out.with_layout(lead + (n,), contiguous_strides(lead + (n,)), 0)
    stat_shape = lead + (1,) * k
    mean, rstd = ctx.empty(stat_shape, "f32"), ctx.empty(stat_shape, "f32")
    mode, extra, decls = "LAYER_NORM", [], {}
    for name, t, tag in (("HAS_WEIGHT", weight, "W"), ("HAS_BIAS", bias, "B")):
        if t is not None:
            t = ctx.ref(t)
            if not _trailing_collapsible(t, t.ndim):
                t = contiguous(ctx, t)
            mode += f" {name}"
            extra.append(t)
            decls[f"{tag}_OFF"] = t.offset
            decls[f"{tag}_RS"] = 1 if t.numel > 1 else 0
    _row_kernel(ctx, mode, flat, out_flat, len(lead), extra, decls, eps, stats=(mean, rstd))
    return out, mean, rstd


@lowering(aten.native_layer_norm_backward.default, keep_whole=True)
def layer_norm_backward(ctx, dy, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    """The three gradients of a layer norm as one row kernel (dx: both of a row's sums and
    the result in one pass of its workgroup) and two column sums (the weight's of
    dy * xhat, computed as they load it, the bias's of dy), none reading another's
    result: one barrier level, where torch's decomposition took six."""
    dy, x, mean, rstd = (ctx.ref(t) for t in (dy, x, mean, rstd))
    if any(t.kind != "f32" for t in (dy, x, mean, rstd)) or not x.numel:
        raise LoweringError("the layer norm's backward takes non-empty float32 tensors")
    k = len(normalized_shape)
    lead, n = x.shape[:x.ndim - k], math.prod(normalized_shape)
    rows, dims = math.prod(lead), list(range(len(lead)))
    grads = [None, None, None]
    if output_mask[0]:
        dy_c, x_c = contiguous(ctx, dy), contiguous(ctx, x)
        mean_c, rstd_c = contiguous(ctx, mean), contiguous(ctx, rstd)
        dx = ctx.empty(x.shape, "f32")
        mode, extra = "LAYER_NORM_BACKWARD", [x_c, mean_c, rstd_c]
        decls = {"X_OFF": x_c.offset, "M_OFF": mean_c.offset, "S_OFF": rstd_c.offset}
        if weight is not None:
            w = contiguous(ctx, ctx.ref(weight))
            mode += " HAS_WEIGHT"
            extra.append(w)
            decls |= {"W_OFF": w.offset, "W_RS": 1 if w.numel > 1 else 0}
        _row_kernel(ctx, mode, dy_c.with_layout((rows, n), (n, 1), dy_c.offset),
                    dx.with_layout((rows, n), (n, 1), 0), 1, extra, decls)
        grads[0] = dx
    shape = tuple(int(s) for s in normalized_shape)
    # over the leading dims; with none (every dim normalised) each is its own sum
    total = (lambda t: reduce(ctx, t, dims, "sum", out_shape=shape, out_kind="f32")) if dims \
        else (lambda t: ew(ctx, "$0", [t], "f32"))
    if output_mask[1] and weight is not None:
        grads[1] = total(ew(ctx, "$0 * (($1 - $2) * $3)", [dy, x, mean, rstd], "f32", defer=bool(dims)))
    if output_mask[2] and bias is not None:
        grads[2] = total(dy)
    return tuple(grads)


def _trailing_collapsible(x: TRef, k: int) -> bool:
    """The last k dims of x are laid out contiguously (read as one row, stride 1)."""
    shape, strides = x.shape[x.ndim - k:], x.strides[x.ndim - k:]
    want = contiguous_strides(shape)
    return all(st == w for s, st, w in zip(shape, strides, want) if s != 1)


@dataclass(eq=False)
class NormedRows(Deferred):
    """rms_norm(x, weight, eps) left to a mat-vec consumer, which normalises x as it
    loads it (the rms_norm record's prologue: lowering/gguf.py says when)."""
    x: TRef
    weight: TRef
    eps: float

    def compute(self, ctx):
        return _rms_norm(ctx, self.x, self.weight, self.eps)


def _feeds_matvecs(node, ctx) -> bool:
    """The rms_norm's prologue role: its mat-vec readers normalise x themselves
    (gguf.norm_feeds_matvecs, where the mat-vec's costs are known)."""
    from .gguf import norm_feeds_matvecs
    return norm_feeds_matvecs(node, ctx)


# epilogue: out = residual + norm(x); takes_deferred: a deferred producer may fold the
# norm into its own kernel (Deferred.fold_rms_norm)
@lowering(RMS_NORM, epilogue=True, takes_deferred=True, prologue=_feeds_matvecs)
def rms_norm(ctx, x, weight, eps, request=NO_REQUEST):
    w = ctx.ref(materialize(ctx, weight))
    res = request.residual      # laid out as out is, or not taken
    if res is not None and not (res.is_contiguous() and res.shape == ctx.out_shape()):
        res = None
    if isinstance(x, Deferred) and not request.defer and w.kind == "f32":
        out = x.fold_rms_norm(ctx, w, float(eps), res)   # its producer's epilogue (a mat-vec)
        if out is not None:
            return Lowered(out, residual_added=res is not None)
    x = ctx.ref(materialize(ctx, x))
    if x.kind != "f32" or w.kind != "f32":
        raise LoweringError("rms_norm needs float32 x and weight")
    if request.defer:
        return NormedRows(x, w, float(eps))
    return Lowered(_rms_norm(ctx, x, w, eps, res), residual_added=res is not None)


def _rms_norm(ctx, x: TRef, w: TRef, eps: float, res: TRef | None = None) -> TRef:
    out = ctx.empty(x.shape, "f32")
    if out.numel:
        mode, extra, decls = "RMS_NORM HAS_WEIGHT", [w], {"W_OFF": w.offset, "W_RS": w.strides[0]}
        if res is not None:
            mode, extra, decls["R_OFF"] = mode + " HAS_RESIDUAL", extra + [res], res.offset
        _row_kernel(ctx, mode, x, out, x.ndim - 1, extra, decls, eps)
    return out
