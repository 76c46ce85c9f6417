"""Reduction family (lowering/reduce.py) against eager CPU."""
import math

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


@pytest.mark.parametrize("make,dims", [
    (lambda: torch.randn(8, 33, 12), (0,)),                                    # a batch dim
    (lambda: noncontig(torch.randn(3, 150, 7)).permute(2, 1, 0), (0, 2)),      # strided, two dims
    (lambda: torch.randn(64, 130), (0,)),                                      # R at the limit
], ids=["batch", "strided", "r64"])
def test_few_elements_per_output_take_a_lane_each(plans, make, dims):
    """Few reduced elements for many outputs (a gradient summed over a batch dim): an
    invocation per output walks them (PER_LANE), for every op, NaN included. At least 128
    outputs each, a GPU's workgroup of them."""
    from dynamo_vulkan.lowering import reduce
    x = make()
    x[(1,) * x.ndim] = float("nan")
    check(lambda t: (t.sum(dims), t.mean(dims), t.amax(dims), t.amin(dims),
                     t.var(dims), (t > 0).any(dims[0]), (t > 0).sum(dims)), x)
    notes = [d.note for p in plans for d in p.dispatches if d.name.startswith("reduce")]
    assert notes and all("an invocation per output" in n for n in notes), notes
    assert math.prod(x.shape[d] for d in dims) <= reduce.PER_LANE_MAX_R
