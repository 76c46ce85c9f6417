"""Special functions and the integer/bool forms of elementwise ops
(lowering/mathops.py, lowering/elementwise.py) and p-norms (lowering/reduce.py)."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig

torch.manual_seed(0)
X = torch.randn(200) * 3
EDGES = torch.tensor([0.0, -0.0, -1.0, -2.5, 1.0, 2.0, 100.0, float("inf"), float("nan")])


def test_erfinv_erfc():
    u = torch.cat([torch.rand(200) * 2 - 1, torch.tensor([1.0, -1.0, 0.0, 0.999999, -0.9999, 1.5])])
    check(torch.erfinv, u)
    check(torch.erfc, torch.cat([X, EDGES]))


def test_lgamma_digamma_i0():
    x = torch.cat([X, EDGES[:-2]])
    check(torch.lgamma, x)
    check(torch.digamma, x)
    check(torch.special.i0, noncontig(X))


def test_sign_bit_and_nan_aware_binary():
    nan = torch.full_like(X, float("nan"))
    check(lambda x, n: (torch.signbit(x), torch.copysign(x, -x), torch.hypot(x, x * 2),
                        torch.fmax(x, n), torch.fmin(n, x), torch.nextafter(x, x + 1),
                        torch.ldexp(x, torch.full_like(x, 3.0))), X, nan)


def test_round_decimals_elu_logit():
    check(lambda x: (torch.round(x, decimals=2), torch.round(x * 100, decimals=-1),
                     F.elu(x, 0.5), torch.logit(torch.sigmoid(x), eps=1e-6)), X)


def test_integer_division_modulo_power_shifts():
    a = torch.randint(-20, 20, (50,))
    b = torch.randint(1, 7, (50,)) * torch.tensor([1, -1]).repeat(25)
    check(lambda a, b: (torch.remainder(a, b), torch.fmod(a, b), torch.floor_divide(a, b),
                        torch.div(a, b, rounding_mode="trunc"), a ** 2, a.abs() ** b.abs(),
                        torch.bitwise_left_shift(a, 2), a >> 1, torch.fmax(a, b)), a, b)


def test_bool_arithmetic_forms():
    a, b = torch.rand(9) > 0.5, torch.rand(9) > 0.5
    check(lambda a, b: (a * b, a + b, torch.maximum(a, b), torch.minimum(a, b), torch.sign(a),
                        torch.floor(a.int())), a, b)


def test_decomposed_ops_on_bools():
    x = torch.cat([X, EDGES])
    check(lambda x: (torch.isfinite(x), torch.isclose(x, x + 1e-9), torch.logaddexp(x, x * 2),
                     torch.isneginf(x), torch.isposinf(x)), x)
    check(torch.any, torch.tensor(0.5))
    check(lambda x: (torch.any(x, 0), torch.all(x, 1)), torch.randn(3, 2))


@pytest.mark.parametrize("p", [2, 1, 0, 3.5, float("inf"), float("-inf"), -1.5])
def test_vector_norm(p):
    x = torch.randn(4, 7, 5)
    x[0, 0, 0] = 0
    check(lambda x: (torch.linalg.vector_norm(x, p),
                     torch.linalg.vector_norm(x, p, dim=(0, 2), keepdim=True)), x)
    check(lambda x: torch.linalg.vector_norm(x, p, dim=1), noncontig(x))


def test_normalize_and_dist():
    x = torch.randn(4, 7, 5)
    check(lambda x: F.normalize(x, dim=1), noncontig(x))
    check(lambda x, y: (torch.dist(x, y, 3), torch.dist(x, y)), x, x * 0.5)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
def test_polygamma(n):
    x = torch.cat([torch.rand(40) * 6 - 3, torch.tensor([0.5, 3.0, -2.5, 10.0])])
    check(lambda x: torch.polygamma(n, x), x)


def test_bilinear_through_trilinear():
    x1, x2, w, b = torch.randn(4, 3), torch.randn(4, 5), torch.randn(2, 3, 5), torch.randn(2)
    check(lambda x1, x2, w, b: F.bilinear(x1, x2, w, b), x1, x2, w, b)


def test_nan_and_inf_times_a_zero_constant_stay_nan():
    """Drivers fold x * 0.0 to 0; torch gives NaN for NaN or inf times 0."""
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0])
    check(lambda x: (x * 0.0, torch.addr(x[:1, None].expand(1, 1).clone(), x[1:2], x[:1],
                                         beta=0.0, alpha=0.0), x * -0.0), x)


def test_inverse_trig_and_near_zero_forms_are_accurate():
    u = torch.cat([torch.rand(500) * 2 - 1, torch.tensor([1.0, -1.0, 0.0, 1.5, float("nan")])])
    check(lambda u: (torch.asin(u), torch.acos(u)), u, rtol=1e-5, atol=1e-5)
    x = torch.cat([torch.randn(100) * 1e-6, torch.randn(100) * 5,
                   torch.tensor([-1.0, 0.0, float("inf"), -float("inf"), float("nan"), -0.99999])])
    check(lambda x: (torch.log1p(x), torch.expm1(x)), x, rtol=1e-5, atol=1e-7)


def test_mean_of_nothing_is_nan():
    check(lambda x: (torch.var_mean(x), torch.std_mean(x), torch.mean(x)), torch.randn(0))
    check(lambda x: (torch.var_mean(x, 0), torch.mean(x, 0)), torch.randn(0, 5))


def test_tan_keeps_relative_accuracy_near_its_poles():
    """The driver's tan was 1.3e-4 off near a pole on the H200 (OpInfo tan #0)."""
    x = torch.cat([torch.linspace(-100, 100, 20001), torch.randn(2000) * 10,
                   torch.tensor([0.0, -0.0, 1e-5, 1.5707963, float("inf"), float("nan")])])
    check(torch.tan, x, rtol=2e-6, atol=1e-6)


def test_igamma_igammac():
    a = torch.cat([torch.rand(60) * 9, torch.tensor([0.0, 0.0, 1.0, -1.0, 3.0, float("inf")])])
    x = torch.cat([torch.rand(60) * 12, torch.tensor([0.0, 2.0, 0.0, 1.0, float("inf"), 2.0])])
    check(lambda a, x: (torch.igamma(a, x), torch.igammac(a, x)), a, x)
