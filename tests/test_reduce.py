"""Reduction family (lowering/reduce.py) against eager CPU."""
import pytest
import torch

from vk import check, noncontig

torch.manual_seed(0)
CASES = [((7,), None), ((3, 5), (1,)), ((3, 5), (0,)), ((2, 3, 4), (0, 2)), ((1, 9, 1), (1,)),
         ((4, 1, 6), (-1, 0)), ((300, 7), (0,)), ((5, 1000), (1,)), ((), None)]
OPS = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k) if d else x.sum(),
    "mean": lambda x, d, k: x.mean(d, keepdim=k) if d else x.mean(),
    "amax": lambda x, d, k: x.amax(d, keepdim=k) if d else x.amax(),
    "amin": lambda x, d, k: x.amin(d, keepdim=k) if d else x.amin(),
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("shape,dims", CASES, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce(op, shape, dims, keepdim):
    x = torch.randn(shape)
    check(lambda t: OPS[op](t, dims, keepdim), x)


@pytest.mark.parametrize("op", list(OPS))
def test_reduce_noncontiguous(op):
    x = noncontig(torch.randn(6, 5, 4)).permute(2, 0, 1)
    check(lambda t: OPS[op](t, (0, 2), False), x)


def test_reduce_nan_propagates():
    x = torch.randn(4, 33)
    x[1, 7] = float("nan")
    check(lambda t: (t.amax(1), t.amin(1), t.sum(1)), x)


def test_int_and_bool_reductions():
    x = torch.randint(-5, 5, (4, 9))
    check(lambda t: (t.sum(1), t.amax(0), (t > 0).any(1), (t > -5).all(1), (t > 0).sum()), x)
