"""A fixed, fast subset of the OpInfo coverage run (dynamo_vulkan.coverage):
the first samples of ops from every lowering family must pass (compiled with
DYNAMO_VULKAN_FALLBACK=error, fullgraph, equal to eager). A regression in any
family shows up here; `python -m dynamo_vulkan.coverage` runs them all."""

import pytest
import torch

from dynamo_vulkan import coverage

SAMPLES = 3
OPS = [
    # elementwise, casts, comparisons, where
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "pow", "exp", "log1p",
    "tanh", "sigmoid", "nn.functional.gelu", "nn.functional.silu", "clamp", "where",
    "masked_fill", "remainder", "floor_divide", "fmod", "round", "trunc", "sign", "erf",
    "erfinv", "lgamma", "logical_and", "logical_xor", "logical_not", "eq", "maximum",
    "nan_to_num", "float", "long", "bool", "half",
    # reductions, scans, sorting
    "sum", "mean", "prod", "amax", "var", "std", "var_mean", "argmax", "max.reduction_with_dim",
    "any", "norm", "cumsum", "cumprod", "logcumsumexp", "sort", "topk", "kthvalue",
    # rows, matmul, normalisation
    "softmax", "log_softmax", "nn.functional.layer_norm", "native_layer_norm",
    "nn.functional.group_norm", "nn.functional.batch_norm", "mm", "bmm", "addmm", "matmul",
    # convolution, pooling, resampling
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv_transpose2d",
    "nn.functional.max_pool2d", "nn.functional.avg_pool2d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.adaptive_max_pool2d", "max_pool2d_with_indices_backward",
    "nn.functional.interpolate.nearest", "nn.functional.interpolate.bilinear",
    "nn.functional.pad.constant", "nn.functional.pad.reflect", "nn.functional.pad.replicate",
    # indexing, gathers, scatters, layout
    "index_select", "gather", "scatter", "scatter_add", "take_along_dim", "__getitem__",
    "index_reduce.amax", "histc", "nonzero_static", "polygamma.polygamma_n_1",
    "nn.functional.embedding", "nn.functional.embedding_bag", "cat", "stack", "flip", "repeat",
    "roll", "tril", "searchsorted", "cdist", "diagonal_scatter",
]


@pytest.fixture(scope="module", autouse=True)
def _fallback_error():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DYNAMO_VULKAN_FALLBACK", "error")
        yield


_OPS = {coverage.op_name(op): op for op in coverage.select_ops(OPS)[0]}


def test_subset_names_exist():
    assert sorted(set(OPS) - set(_OPS)) == []


@pytest.mark.parametrize("name", OPS)
def test_opinfo_samples_pass(name):
    op = _OPS[name]
    outcomes = coverage.run_op(op, SAMPLES)
    assert outcomes, f"{name}: no sample ran"
    bad = [f"#{k} {o.status}: {o.reason} — {o.desc}" for k, o in enumerate(outcomes)
           if o.status != "pass"]
    assert not bad, f"{name}:\n" + "\n".join(bad)
