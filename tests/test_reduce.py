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


LAZY_CASES = [  # (op, shapes of a and b, dims): b broadcast, a strided; odd sizes and size 1
    ("sum", (5, 7, 9), (9,), [0, 1]), ("sum", (5, 7, 9), (7, 1), [2]), ("mean", (3, 1, 33), (33,), [0]),
    ("amax", (4, 70), (4, 1), [1]), ("amin", (6, 5), (6, 5), None), ("sum", (1, 1), (1,), [1]),
    ("sum", (8, 300), (300,), [0]),       # a gradient summed over the batch: a lane per output
]


@pytest.mark.parametrize("op,sa,sb,dims", LAZY_CASES, ids=str)
def test_elementwise_producer_computed_as_the_reduction_loads(plans, op, sa, sb, dims):
    """An elementwise result read only by a float sum, mean, amax or amin is computed by
    the reduction as it loads each element (reduce.comp X_LAZY): no elementwise kernel;
    strided and broadcast operands, NaN and infinities where eager has them."""
    a, b = noncontig(torch.randn(sa)), torch.randn(sb)
    a.view(-1)[0] = float("nan") if op == "sum" else a.view(-1)[0]
    fn = {"sum": lambda t, d: t.sum(d), "mean": lambda t, d: t.mean(d),
          "amax": lambda t, d: t.amax(d), "amin": lambda t, d: torch.amin(t) if d is None else t.amin(d)}[op]
    check(lambda a, b: fn(a * b - torch.exp(b), dims), a, b)
    names = [d.name for p in plans for d in p.dispatches]
    notes = [d.note for p in plans for d in p.dispatches if d.name.startswith("reduce")]
    assert not any(n.startswith("elementwise") for n in names), names
    assert notes and all(" elementwise " in n for n in notes), notes


def test_a_producer_read_twice_or_not_float_is_computed_first(plans):
    """An elementwise result with another reader, or an integer one, gets its kernel."""
    x = torch.randn(6, 10)
    check(lambda x: (lambda y: (y.sum(1), y.amax(0)))(x * 2), x)
    check(lambda x: (x > 0).sum(1), x)
    notes = [d.note for p in plans for d in p.dispatches if d.name.startswith("reduce")]
    assert sum(" elementwise " in n for n in notes) == 0, notes


def test_a_reshaped_or_constant_producer(plans):
    """A reshape between the elementwise producer and the reduction (read in the
    producer's own row-major order), and a producer of constants only (computed first)."""
    a, b = torch.randn(5, 7, 9), torch.randn(9)
    check(lambda a, b: ((a * b).reshape(-1, 9).sum(0), (a - b).view(5, 63).amax(1)), a, b)
    check(lambda a: torch.full_like(a, 2.0).sum(), a)
    notes = [d.note for p in plans for d in p.dispatches if d.name.startswith("reduce")]
    assert sum(" elementwise " in n for n in notes) == 2, notes


@pytest.mark.parametrize("dim", [0, -1])
def test_sum_of_an_elementwise_input_keeps_nan_from_inf(dim):
    """A sum that computes its elementwise input as it loads it (reduce.comp X_LAZY) keeps
    x - x, x * 0 and x * 0.0 NaN where x is inf or NaN, as eager does: the driver may not
    fold them to 0 (fuzzing found x - x of a strided input summed to 0)."""
    x = noncontig(torch.randn(5, 4, 7))
    x[2, 1, 1], x[3, 2, 5] = math.inf, math.nan
    check(lambda t: ((t - t).sum(dim), (t * 0).sum(dim), (t * 0.0).amax(dim),
                     ((t - t) * 1.5).mean(dim)), x)


COLUMN_CASES = [  # (shape, dims): outputs neighbouring in memory, reduced elements a row apart
    ((300, 7), (0,)), ((8, 33, 70), (0, 1)), ((1000, 3), (0,)), ((130, 1, 45), (0,)),
    ((3, 40, 600), (0, 1)), ((4099, 65), (0,)),
]


@pytest.mark.parametrize("gpu", [False, True], ids=["lavapipe", "as_gpu"])
@pytest.mark.parametrize("shape,dims", COLUMN_CASES, ids=str)
def test_columns_take_neighbouring_outputs_a_workgroup(request, plans, gpu, shape, dims):
    """A reduction over leading dims of a row-major tensor (a bias's gradient) takes
    neighbouring outputs a workgroup (COLUMNS), its reduced elements split across
    workgroups on a GPU: every float op, NaN and infinities included, a strided view,
    and an elementwise input computed as it is loaded."""
    if gpu:
        request.getfixturevalue("as_gpu")
    x = torch.randn(shape)
    x.view(-1)[5] = float("nan")
    x.view(-1)[-1] = float("inf")
    check(lambda t: (t.sum(dims), t.mean(dims), t.amax(dims), t.amin(dims), t.var(dims),
                     t.std(dims, keepdim=True)), x)
    check(lambda t: t[::2].sum(0), x.reshape(shape[0], -1))
    check(lambda a, b: (a * b - b).sum(dims), torch.randn(shape), torch.randn(shape[-1]))
    notes = [d.note for p in plans for d in p.dispatches if d.name.startswith("reduce")]
    cols = [n for n in notes if "neighbouring outputs a workgroup" in n]
    assert len(cols) >= 8, notes
    if gpu and shape in ((8, 33, 70), (4099, 65)):
        assert any(" splits" in n for n in cols), cols


def test_columns_layout_choice():
    """COLUMNS only where the outputs' innermost dim is contiguous and the reduced dims
    are not, in memory: a transposed view's rows are columns; a reduction along
    contiguous elements keeps a workgroup per output."""
    from dynamo_vulkan.lowering import reduce
    from dynamo_vulkan.lowering.core import TRef, contiguous_strides
    gpu = {"device_type": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"}
    x = TRef(0, (2048, 384), contiguous_strides((2048, 384)), 0, "f32")
    assert reduce._outputs_neighbour(x, [1])
    p = reduce._columns(gpu, x, [0], 384, 2048)
    assert (p["CQ"], p["KT"], p["blocks"]) == (32, 4, 12) and 1 < p["splits"] <= reduce.COLUMNS_MAX_SPLITS
    assert p["splits"] * p["rsplit"] >= 2048 > (p["splits"] - 1) * p["rsplit"]
    # rows: the reduced dim contiguous, the outputs a row apart
    assert not reduce._outputs_neighbour(x, [0]) and reduce._columns(gpu, x, [1], 2048, 384) is None
    xt = TRef(0, (384, 2048), (1, 384), 0, "f32")                        # a transposed view
    assert not reduce._outputs_neighbour(xt, [1]) and reduce._columns(gpu, xt, [0], 2048, 384) is None
    assert reduce._outputs_neighbour(xt, [0]) and reduce._columns(gpu, xt, [1], 384, 2048)["blocks"] == 12
    cpu = {"device_type": "PHYSICAL_DEVICE_TYPE_CPU", "subgroup_size": 8}
    assert reduce._columns(cpu, x, [0], 384, 2048)["splits"] == 1


def test_few_contiguous_elements_per_output_on_a_gpu(as_gpu, plans):
    """On a GPU an invocation per output (PER_LANE) is taken only where neighbouring lanes
    read neighbouring elements; rows of few contiguous elements (attention's sums over a
    head's 64 values) take a workgroup of that many lanes per output, the other layout
    an invocation per output, every op, NaN included."""
    rows, cols = torch.randn(4, 3, 50, 64), torch.randn(64, 300)
    rows[1, 2, 3, 4] = cols[5, 6] = float("nan")
    check(lambda t: (t.sum(-1), t.amax(-1), t.var(-1)), rows)
    check(lambda t: (t.sum(0), t.amin(0), t.mean(0)), cols)
    ds = [d for p in plans for d in p.dispatches if d.name.startswith("reduce")]
    lane = ["invocation per output" in d.note for d in ds]
    assert lane == [False] * 4 + [True] * 3, [d.note for d in ds]
    assert all(d.spec[0] == 64 for d in ds[:4])
