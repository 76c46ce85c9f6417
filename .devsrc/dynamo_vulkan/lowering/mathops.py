"""More elementwise math (shaders/elementwise.comp through elementwise.ew):
special functions (erfinv, erfc, lgamma, digamma, i0, ...), sign-bit and NaN-aware
binary ops, shifts, rounding to decimals, elu.

The special functions' GLSL is in shaders/special.glsl, each behind its NEED_<name>
define, so only kernels that use them carry them."""
from __future__ import annotations

import math

import torch

from .core import lowering
from .elementwise import _input_kind, ew, int64_checked

aten = torch.ops.aten

# The special functions' GLSL is in shaders/special.glsl; a kernel compiles in those it
# names (ew's helpers, as NEED_<name> defines).
ERFC = ()    # erfc_f is in shaders/common.glsl (gelu uses it)
ERFINV, LGAMMA, DIGAMMA, I0, SIGNBIT = ("ERFINV",), ("LGAMMA",), ("DIGAMMA",), ("I0",), ("SIGNBIT",)
NEXTAFTER, TRIGAMMA, ZETA, IGAMMA = ("NEXTAFTER",), ("TRIGAMMA",), ("ZETA",), ("IGAMMA",)

UNARY = {  # op -> (expr, special.glsl helpers, result kind)
    aten.erfinv.default: ("erfinv_f($0)", ERFINV, "f32"),
    aten.erfc.default: ("erfc_f($0)", ERFC, "f32"),
    aten.lgamma.default: ("lgamma_f($0)", LGAMMA, "f32"),
    aten.digamma.default: ("digamma_f($0)", DIGAMMA, "f32"),
    aten.i0.default: ("i0_f($0)", I0, "f32"),
    aten.signbit.default: ("signbit_f($0)", SIGNBIT, "b"),
    aten.angle.default: ("isnan($0) ? $0 : ($0 < 0.0 ? 3.14159265358979 : 0.0)", (), "f32"),
}
FLOAT_BINARY = {
    aten.copysign.Tensor: ("signbit_f($1) ? -abs($0) : abs($0)", SIGNBIT),
    aten.copysign.Scalar: ("signbit_f($1) ? -abs($0) : abs($0)", SIGNBIT),
    aten.hypot.default: ("hypot_f($0, $1)", ()),
    aten.nextafter.default: ("nextafter_f($0, $1)", NEXTAFTER),
    aten.ldexp.Tensor: ("$0 * exp2($1)", ()),
    aten.xlogy.Tensor: ("isnan($1) ? $1 : ($0 == 0.0 ? 0.0 : $0 * log($1))", ()),
    aten.igamma.default: ("igamma_f($0, $1, false)", IGAMMA),
    aten.igammac.default: ("igamma_f($0, $1, true)", IGAMMA),
}
SAME_KIND_BINARY = {  # NaN-ignoring max/min for floats; plain for ints
    aten.fmax.default: ("(isnan($0) ? $1 : (isnan($1) ? $0 : max_f($0, $1)))", "max($0, $1)"),
    aten.fmin.default: ("(isnan($0) ? $1 : (isnan($1) ? $0 : min_f($0, $1)))", "min($0, $1)"),
    aten.bitwise_left_shift.Tensor: ("$0 << $1", "$0 << $1"),
    aten.bitwise_right_shift.Tensor: ("$0 >> $1", "ishr_($0, $1)"),
    aten.bitwise_left_shift.Tensor_Scalar: ("$0 << $1", "$0 << $1"),
    aten.bitwise_right_shift.Tensor_Scalar: ("$0 >> $1", "ishr_($0, $1)"),
    aten.__lshift__.Scalar: ("$0 << $1", "$0 << $1"), aten.__lshift__.Tensor: ("$0 << $1", "$0 << $1"),
    aten.__rshift__.Scalar: ("$0 >> $1", "ishr_($0, $1)"), aten.__rshift__.Tensor: ("$0 >> $1", "ishr_($0, $1)"),
}


def _register():
    for op, (e, pre, rk) in UNARY.items():
        lowering(op)(lambda ctx, x, e=e, pre=pre, rk=rk: ew(
            ctx, e, [x], ctx.out_kind(), compute="f32", result=rk, helpers=pre))
    for op, (e, pre) in FLOAT_BINARY.items():
        lowering(op)(lambda ctx, a, b, e=e, pre=pre: ew(
            ctx, e, [a, b], ctx.out_kind(), compute="f32", result="f32", helpers=pre))
    for op, (ef, ei) in SAME_KIND_BINARY.items():
        lowering(op)(lambda ctx, a, b, ef=ef, ei=ei: ew(
            ctx, ef if ctx.out_kind() == "f32" else int64_checked(ctx, ei), [a, b],
            ctx.out_kind(), compute=ctx.out_kind()))


_register()


@lowering(aten.round.decimals)
def round_decimals(ctx, x, *, decimals=0):
    scale = 10.0 ** abs(int(decimals))
    e = "div_f(roundEven($0 * $1), $1)" if decimals >= 0 else "roundEven(div_f($0, $1)) * $1"
    return ew(ctx, e, [x, scale], "f32", compute="f32")


@lowering(aten.elu.default)
def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    return ew(ctx, "$0 > 0.0 ? $2 * $0 : $2 * $1 * expm1_f($0 * $3)",
              [x, float(alpha), float(scale), float(input_scale)], "f32", compute="f32")


@lowering(aten.logit.default)
def logit(ctx, x, eps=None):
    if eps is None:
        return ew(ctx, "log($0 / (1.0 - $0))", [x], "f32", compute="f32")
    return ew(ctx, "log(clamp($0, $1, 1.0 - $1) / (1.0 - clamp($0, $1, 1.0 - $1)))",
              [x, float(eps)], "f32", compute="f32")


@lowering(aten.frac.default)
def frac(ctx, x):
    return ew(ctx, "$0 - trunc($0)", [x], "f32", compute="f32")


@lowering(aten.sgn.default)
def sgn(ctx, x):
    k = ctx.out_kind()
    return ew(ctx, "$0" if k == "b" else "sign($0)", [x], k, compute=k)


@lowering(aten.heaviside.default)
def heaviside(ctx, x, values):
    k = ctx.out_kind()
    z = "0.0" if k == "f32" else "0"
    return ew(ctx, f"$0 == {z} ? $1 : ($0 > {z} ? {'1.0' if k == 'f32' else '1'} : {z})",
              [x, values], k, compute=k)


@lowering(aten.isneginf.default, aten.isposinf.default)
def isinf_signed(ctx, x):
    k = _input_kind(ctx)
    if k != "f32":
        return ew(ctx, "false", [x], "b", compute=k, result="b")
    e = "isinf($0) && $0 < 0.0" if ctx.node.target == aten.isneginf.default else \
        "isinf($0) && $0 > 0.0"
    return ew(ctx, e, [x], "b", compute="f32", result="b")


@lowering(aten.polygamma.default)
def polygamma(ctx, n, x):
    n = int(n)
    if n == 0:
        return ew(ctx, "digamma_f($0)", [x], "f32", compute="f32", helpers=DIGAMMA)
    if n == 1:
        return ew(ctx, "trigamma_f($0)", [x], "f32", compute="f32", helpers=TRIGAMMA)
    fact = float(math.factorial(n)) * (1.0 if n % 2 else -1.0)
    return ew(ctx, "$1 * zeta_f($2, $0)", [x, fact, float(n + 1)], "f32", compute="f32",
              helpers=ZETA)


@lowering(aten._trilinear.default)
def trilinear(ctx, i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """sum over sumdim of the three inputs, each unsqueezed at its expand dims
    (nn.functional.bilinear): one product kernel, then a sum."""
    from .core import meta_view
    from .reduce import reduce

    def unsq(t, dims):
        t = ctx.ref(t)
        for d in sorted(dims):
            t = meta_view(t, lambda v, d=d: v.unsqueeze(d))
        return t
    a, b, c = unsq(i1, expand1), unsq(i2, expand2), unsq(i3, expand3)
    prod = ew(ctx, "$0 * $1 * $2", [a, b, c], "f32", compute="f32")
    if not sumdim:
        return prod
    return reduce(ctx, prod, list(sumdim), "sum", out_shape=ctx.out_shape(), out_kind="f32")
