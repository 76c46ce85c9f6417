"""Sorting (lowering/sort.py), narrow and wide dtypes (computed in float32 or
int32 on the GPU, converted at the edges), and max-pool backward."""
import pytest
import torch
import torch.nn.functional as F

import dynamo_vulkan
from vk import check, compiled, noncontig

torch.manual_seed(0)


def _with_nan_and_ties():
    x = torch.randn(4, 37, 5)
    x[0, 3, 0] = float("nan")
    x[1, 4, 1] = x[1, 5, 1]
    return x


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sort_stable_nan_last(dim):
    check(lambda x: torch.sort(x, dim=dim, stable=True), _with_nan_and_ties())
    x = torch.randn(4, 37, 5)          # no ties: eager's unstable sort may order them either way
    x[0, 3, 0] = float("nan")
    check(lambda x: (torch.sort(x, dim), torch.sort(x, dim, descending=True),
                     torch.argsort(x, dim)), x)


def test_sort_int_noncontig_scalar():
    check(lambda x: torch.sort(x), torch.randint(0, 5, (3, 10)))
    check(lambda x: torch.sort(x, 0, descending=True), noncontig(torch.randn(6, 3)))
    check(lambda x: torch.sort(x), torch.tensor(2.0))
    check(lambda x: torch.sort(x), torch.randn(1))


def test_topk_and_kthvalue():
    x = torch.randn(4, 37, 5)
    check(lambda x: (torch.topk(x, 3, 1), torch.topk(x, 1, -1, largest=False)), x)
    check(lambda x: torch.topk(x, 2, 0, largest=False), noncontig(torch.randn(5, 3)))
    check(lambda x: (torch.kthvalue(x, 3, 1), torch.kthvalue(x, 1, 0, keepdim=True)), x)


def test_casts_round_and_wrap_like_torch():
    x = (torch.randn(4, 5) * 100).abs()
    check(lambda x: (x.half().float(), x.bfloat16().float(), x.to(torch.uint8), x.to(torch.int8),
                     x.to(torch.int16)), x)
    check(lambda x: (x.to(torch.uint8), x.to(torch.int8)), torch.randint(-300, 300, (4, 5)))


# float -> narrower casts whose result GLSL leaves to the driver: out-of-range and NaN
# float -> int (torch's CPU casts give -2^31, wrapped for narrower types), float16 ties
# and values that round up (rounded to nearest even, overflow to inf), negative floats
# to uint8 (wrapped)
CAST_EDGES = torch.tensor([
    300.7, -5.5, -300.7, 255.9, -0.9, 0.0, -0.0, 3e9, -3e9, 2147483520.0, -2147483904.0, 1e20,
    float("nan"), float("inf"), -float("inf"), 65519.0, 65520.0, 65504.0, -65520.0, 1e-8,
    2.9802322e-08, 8.940697e-08, 300.0625, 300.1875, -300.0625, 300.2, 0.1, 3.4e38, 1e-40])


def test_casts_define_what_the_driver_may_not():
    x = CAST_EDGES
    check(lambda x: (x.to(torch.uint8), x.to(torch.int8), x.to(torch.int16), x.to(torch.int32),
                     x.to(torch.bool), x.half().float(), x.bfloat16().float(),
                     (x * 0.5).half().float()), x, rtol=0, atol=0)
    fin = x[x.abs() < 65000]
    check(lambda x: (x.half().to(torch.int16), x.bfloat16().to(torch.uint8)), fin, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_computed_in_float32_returned_in_their_dtype(dtype):
    x = torch.randn(4, 9).to(dtype)
    got = check(lambda x: (torch.softmax(x, -1), x * 2 + 1), x, rtol=1e-2, atol=1e-2)
    assert got[0].dtype == dtype and got[1].dtype == dtype


def test_int64_travels_as_int32_and_overflow_is_an_error():
    check(lambda x: x * 3 + 1, torch.tensor([1, -2, 2**28], dtype=torch.int64))
    f = compiled(lambda x: x + 1)
    f(torch.tensor([1, 2]))
    with pytest.raises(OverflowError, match="does not fit"):
        f(torch.tensor([1, 2**40]))


def test_float64_only_inside_a_graph():
    check(lambda x: torch.logspace(x, -3, 5, 2.0), torch.tensor(1))   # upcasts internally
    n = len(dynamo_vulkan.reports())
    x = torch.randn(3, dtype=torch.float64)
    torch.testing.assert_close(compiled(lambda x: x * 2)(x), x * 2)
    cpu = [d for r in dynamo_vulkan.reports()[n:] for d in r.cpu_nodes]
    assert cpu and "float64" in cpu[0].reason


@pytest.mark.parametrize("shape,kernel,stride,padding,ceil", [
    ((1, 2, 5, 6), 3, 2, 1, True), ((2, 5, 6), 2, 1, 0, False)], ids=str)
def test_max_pool2d_backward(shape, kernel, stride, padding, ceil):
    x = torch.randn(shape)
    y = F.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil)

    def f(x, g):
        _, i = F.max_pool2d(x, kernel, stride, padding, ceil_mode=ceil, return_indices=True)
        return torch.ops.aten.max_pool2d_with_indices_backward(
            g, x, [kernel] * 2, [stride] * 2, [padding] * 2, [1, 1], ceil, i)
    check(f, x, torch.randn(y.shape))
