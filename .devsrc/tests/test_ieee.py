"""IEEE special values through the kernels, against eager: NaN and inf propagate as
torch's do (maximum/minimum/clamp/fmax/relu, reductions, identities the shader compiler
could fold such as x - x and x * 0 + 1), atan2 and copysign keep signed zeros, pow, fmod,
remainder and floor division follow torch at zeros and infinities, and subnormal inputs
give eager's result or eager's result for them flushed to zero (Vulkan lets a driver
flush them)."""
import math

import pytest
import torch
import torch.nn.functional as F

import dynamo_vulkan
from vk import compiled

inf, nan = math.inf, math.nan
# every pair (a, b) of these: A[i], B[i]
SPECIAL = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 2.5, -3.5, 0.75, -1e-30, 3e38])
A = SPECIAL.repeat_interleave(len(SPECIAL))
B = SPECIAL.repeat(len(SPECIAL))
# for transcendental functions: no 3e38 (lavapipe's sin/cos reduce huge arguments poorly)
UNARY_IN = torch.tensor([nan, inf, -inf, 0.0, -0.0, 1.0, -1.0, 2.5, -3.5, 0.75, 1e-6, -1e-30, 40.0])
SUBNORMAL = torch.tensor([1e-40, -1e-40, 3e-39, -5e-45, 1e-38, 1.0, -2.0])


def assert_ieee(got, want, what: str, signed_zeros: bool = True, rtol: float = 2e-6,
                atol: float = 1e-37) -> None:
    """Same dtype and shape, NaN where eager has NaN, the same infinities, finite values
    within rtol/atol (float32 rounding by default) and, with signed_zeros, zeros of the
    same sign."""
    assert got.dtype == want.dtype and got.shape == want.shape, \
        f"{what}: {got.dtype}{tuple(got.shape)} against eager's {want.dtype}{tuple(want.shape)}"
    if not want.dtype.is_floating_point:
        bad = (got != want).nonzero().flatten().tolist()
        assert not bad, f"{what}: {len(bad)} differ, first at {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"
        return
    g, w = got.flatten(), want.flatten()
    same = (g.isnan() & w.isnan()) | (g == w) | \
        (w.isfinite() & g.isfinite() & ((g - w).abs() <= rtol * w.abs() + atol))
    if signed_zeros:
        same &= ~((w == 0) & (g == 0) & (g.signbit() != w.signbit()))
    bad = (~same).nonzero().flatten().tolist()
    assert not bad, f"{what}: {len(bad)} of {g.numel()} differ from eager, e.g. " + ", ".join(
        f"[{i}] got {g[i].item()!r} want {w[i].item()!r}" for i in bad[:4])


def run_group(ops: dict, *args, signed_zeros=(), **kwargs):
    """Compile every op of `ops` as one graph of fn(*args); compare each output with eager
    and check that nothing ran on the CPU."""
    names = list(ops)

    def fn(*a):
        return tuple(ops[n](*a) for n in names)
    n_reports = len(dynamo_vulkan.reports())
    want = fn(*args)
    got = compiled(fn)(*args)
    cpu = [n for r in dynamo_vulkan.reports()[n_reports:] for n in r.cpu_nodes]
    assert not cpu, f"nodes ran on the CPU, so the kernels were not checked: {cpu}"
    for name, g, w in zip(names, got, want):
        assert_ieee(g, w, name, signed_zeros=name in signed_zeros, **kwargs)


BINARY = {
    "maximum": torch.maximum, "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin,
    "clamp_min_t": lambda a, b: torch.clamp(a, min=b), "clamp_max_t": lambda a, b: torch.clamp(a, max=b),
    "clamp_both": lambda a, b: torch.clamp(a, min=b, max=b + 1),
    "atan2": torch.atan2, "copysign": torch.copysign, "mul": torch.mul, "add": torch.add,
    "sub": torch.sub, "div": torch.div, "pow": torch.pow,
    "trunc_div": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "hypot": torch.hypot,
    "where_gt": lambda a, b: torch.where(a > b, a, b), "where_nan": lambda a, b: torch.where(a.isnan(), b, a),
    "lt": torch.lt, "eq": torch.eq, "ne": torch.ne, "ge": torch.ge,
}
# torch's own max/min give either zero for (+0, -0) (its vector and scalar paths differ)
SIGNED_BINARY = {"atan2", "copysign", "mul", "add", "sub", "div", "trunc_div", "where_gt",
                 "where_nan"}


def test_binary_special_values():
    run_group(BINARY, A, B, signed_zeros=SIGNED_BINARY)


REMAINDERS = {"fmod": torch.fmod, "remainder": torch.remainder,
              "floor_div": lambda a, b: torch.div(a, b, rounding_mode="floor")}


def test_remainders_special_values():
    """fmod, remainder and floor division at zeros and infinities. Quotients that overflow
    (3e38 / 0.75) are left out here: torch's vectorized fmod gives NaN for them, its
    scalar path (and C's fmod) the exact remainder, which the kernel computes."""
    finite = SPECIAL[:-2]
    n = len(finite)
    run_group(REMAINDERS, finite.repeat_interleave(n), finite.repeat(n),
              signed_zeros=set(REMAINDERS))


def test_fmod_is_exact_for_large_quotients():
    a, b = torch.tensor([3e38, -1e20, 7.5e9]), torch.tensor([0.75, 3.3, -0.1])
    want = torch.tensor([math.fmod(x, y) for x, y in zip(a.tolist(), b.tolist())])
    run_group({"fmod": torch.fmod}, a, b)       # 3 elements: torch's scalar path, exact
    assert_ieee(compiled(torch.fmod)(a, b), want.float(), "fmod against C's fmod")


SCALAR = {
    "max_0": lambda a: torch.maximum(a, torch.zeros(())), "clamp": lambda a: a.clamp(-1, 1),
    "clamp_min": lambda a: a.clamp_min(0.5), "clamp_max": lambda a: a.clamp_max(0.5),
    "relu": torch.relu, "relu6": F.relu6, "hardtanh": F.hardtanh, "leaky_relu": F.leaky_relu,
    "elu": F.elu, "sign": torch.sign, "sgn": torch.sgn, "signbit": torch.signbit,
    "neg": torch.neg, "abs": torch.abs, "copysign_neg0": lambda a: torch.copysign(a, -0.0),
    "nan_to_num": torch.nan_to_num,
    # identities a shader compiler folds unless told not to: each must stay NaN for NaN/inf
    "x_minus_x": lambda a: a - a, "x_times_0": lambda a: a * 0, "x_times_0_plus_1": lambda a: a * 0 + 1,
    "x_times_0f": lambda a: a * 0.0, "x_div_x": lambda a: a / a, "zero_minus_x": lambda a: 0.0 - a,
    "chain": lambda a: (a - a).exp() * 2 + (a * 0).abs(),
    **{f"pow_{e}": (lambda a, e=e: a ** e) for e in (2, 3, 0.5, -0.5, -1, -2, 1.5, 0, -3)},
    "scalar_pow": lambda a: 2.0 ** a, "one_pow": lambda a: 1.0 ** a,
    "fmod_s": lambda a: torch.fmod(a, 0.75), "remainder_s": lambda a: torch.remainder(a, -0.75),
}
SIGNED_SCALAR = {"sign", "sgn", "neg", "abs", "copysign_neg0", "x_times_0", "x_times_0f",
                 "zero_minus_x", "relu", "elu", "fmod_s", "remainder_s"} | \
    {f"pow_{e}" for e in (2, 3, -1, -2, 0, -3)}


def test_scalar_operand_special_values():
    run_group(SCALAR, SPECIAL, signed_zeros=SIGNED_SCALAR)


UNARY = {
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "silu": F.silu, "softplus": F.softplus, "atan": torch.atan,
    "asin": torch.asin, "sinh": torch.sinh, "asinh": torch.asinh, "erf": torch.erf,
    "log1p": torch.log1p, "expm1": torch.expm1, "reciprocal": torch.reciprocal, "sin": torch.sin,
    "floor": torch.floor, "round": torch.round, "trunc": torch.trunc, "frac": torch.frac,
    "isfinite": torch.isfinite, "isinf": torch.isinf, "isnan": torch.isnan,
    "gelu": lambda a: F.gelu(a.clamp(max=1e30)),   # torch's gelu(+inf) is NaN, a quirk of its erf
}
SIGNED_UNARY = {"tanh", "atan", "asin", "sinh", "asinh", "erf", "expm1", "sin", "floor", "trunc",
                "round", "reciprocal", "log1p"}


def test_unary_special_values():
    # the special functions' approximations are good to a few float32 ulps
    run_group(UNARY, UNARY_IN, signed_zeros=SIGNED_UNARY, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dim", [1, None])
def test_reductions_with_nan_and_inf(dim):
    """NaN wins max/min and their arg-reductions (the first NaN's index), inf sums to inf,
    inf - inf is NaN; over a row of all -inf softmax is NaN."""
    x = torch.randn(5, 37)
    x[1, 5] = x[1, 20] = nan
    x[2, 3] = inf
    x[3, 7] = -inf
    x[4, :] = -inf
    x[0, 0] = inf
    x[0, 36] = -inf
    kw = {} if dim is None else {"dim": dim}
    ops = {"amax": lambda t: t.amax(**kw), "amin": lambda t: t.amin(**kw),
           "argmax": lambda t: t.argmax(**kw), "argmin": lambda t: t.argmin(**kw),
           "sum": lambda t: t.sum(**kw), "prod": lambda t: t.prod(**kw),
           "mean": lambda t: t.mean(**kw), "nansum": lambda t: t.nansum(**kw),
           "logsumexp": lambda t: t.logsumexp(**({"dim": 1} if dim is None else kw))}
    if dim is not None:
        ops |= {"max_dim": lambda t: t.max(dim).values, "max_idx": lambda t: t.max(dim).indices,
                "min_idx": lambda t: t.min(dim).indices, "softmax": lambda t: t.softmax(dim),
                "log_softmax": lambda t: t.log_softmax(dim), "cumsum": lambda t: t.cumsum(dim)}
    run_group(ops, x.t().contiguous().t(), rtol=1e-5, atol=1e-6)   # column-major strides


def test_subnormal_inputs():
    """A subnormal input gives eager's result or eager's result for it flushed to zero."""
    ops = {"add": lambda a: a + 1e-40, "mul": lambda a: a * 3.0, "sub": lambda a: a - a,
           "maximum": lambda a: torch.maximum(a, -a), "relu": torch.relu, "log": torch.log,
           "tanh": torch.tanh, "sinh": torch.sinh, "asinh": torch.asinh, "erf": torch.erf,
           "atan": torch.atan, "abs": torch.abs, "lt": lambda a: a < 0, "eq0": lambda a: a == 0}
    names = list(ops)

    def fn(a):
        return tuple(ops[n](a) for n in names)
    got = compiled(fn)(SUBNORMAL)
    want = fn(SUBNORMAL)
    flushed = fn(torch.where(SUBNORMAL.abs() < 1.1754944e-38, 0.0, SUBNORMAL))
    for name, g, w, f in zip(names, got, want, flushed):
        for i in range(len(SUBNORMAL)):
            try:
                assert_ieee(g[i], w[i], name, signed_zeros=False)
            except AssertionError:
                assert_ieee(g[i], f[i], f"{name} of {SUBNORMAL[i].item()!r} (neither eager nor "
                            "eager flushed to zero)", signed_zeros=False)


def test_int_and_bool_max_min_keep_their_kinds():
    """maximum/minimum/clamp on ints and bools use the integer forms, not the float ones."""
    i = torch.tensor([-5, 0, 7, 2**31 - 1, -2**31], dtype=torch.int32)
    j = torch.tensor([3, -1, 7, 0, 0], dtype=torch.int32)
    b = torch.tensor([True, False, True, False, True])
    run_group({"maximum": torch.maximum, "minimum": torch.minimum,
               "clamp": lambda x, y: torch.clamp(x, min=y, max=y + 4),
               "remainder": lambda x, y: torch.remainder(x, y.clamp(min=1)),
               "fmod": lambda x, y: torch.fmod(x, y.clamp(min=1)), "pow": lambda x, y: x ** 2},
              i, j)
    run_group({"maximum": torch.maximum, "minimum": torch.minimum}, b, b.flip(0))


def test_folding_under_bool_and_int_results():
    """x - x under isnan and comparisons (a bool result) stays NaN for inf and NaN x."""
    run_group({"isnan_sub": lambda a: torch.isnan(a - a), "ne_mul": lambda a: (a * 0) != 0,
               "to_int": lambda a: torch.isnan(a * 0).int()}, SPECIAL)
    run_group({"isnan_sub_0d": lambda a: torch.isnan(a - a)}, torch.tensor(inf))


def test_float16_values_round_before_a_cast():
    """A float16 result kept in float32 inside a kernel is rounded to float16 before
    .float() or .long() reads it, as eager holds it."""
    a = torch.tensor([0.3, 1.7, -2.9, 0.999, 33.3], dtype=torch.float16)
    b = torch.tensor([0.7, 2.3, 1.1, 1.001, 3.1], dtype=torch.float16)
    run_group({"float": lambda x, y: (x * y).float(), "long": lambda x, y: (x * y).long(),
               "clamp": lambda x, y: x.clamp(-0.5, 0.7).float()}, a, b)


def test_gelu_is_accurate_in_its_tail():
    """gelu(x) for x < -2 through erfc (1 + erf(x) cancels there; eager's float32 gelu is
    2e-3 off at -4 and 0 below -5.5): within 1e-5 of float64 down to -6."""
    x = torch.linspace(-6.0, -2.0, 17)
    got = compiled(F.gelu)(x)
    torch.testing.assert_close(got.double(), F.gelu(x.double()), rtol=1e-5, atol=0)


# divisors above 2^126, whose reciprocal is subnormal (a driver that divides through a
# flushed reciprocal gives 0 for these: NVIDIA's did)
HUGE = torch.tensor([1e38, -3e38, 8.6e37, 2.0**126, 3.4e38, 1.7e38, -1e38, 5e37, 1e-30, 0.0])
NUMER = torch.tensor([1e38, 3e38, -8.6e37, 2.0**126, 1.0, -2.5, 1e30, 3e-39, 7.0, 1e38])


def test_division_by_huge_numbers():
    """x / y, 1 / y, atan2, floor division, pow(y, -1), hypot and a scalar divisor with
    |y| above 2^126, against eager."""
    ops = {"div": torch.div, "self": lambda a, b: b / b, "reciprocal": lambda a, b: b.reciprocal(),
           "atan2": torch.atan2, "atan2_self": lambda a, b: torch.atan2(b, b),
           "atan2_swapped": lambda a, b: torch.atan2(b, a),
           "floor_div": lambda a, b: torch.div(a, b, rounding_mode="floor"),
           "trunc_div": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
           "pow_minus_1": lambda a, b: b ** -1, "hypot": torch.hypot,
           "scalar": lambda a, b: a / 2e38, "remainder": torch.remainder}
    run_group(ops, NUMER, HUGE, signed_zeros=set(ops) - {"hypot"}, rtol=4e-6)
