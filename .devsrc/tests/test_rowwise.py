"""Row family (lowering/rowwise.py): softmax, log_softmax, layer_norm."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig

torch.manual_seed(0)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("shape,dim", [((7,), 0), ((3, 5), -1), ((3, 5), 0), ((2, 3, 300), 1),
                                       ((1, 1), -1), ((4, 1000), -1)], ids=str)
def test_softmax(fn, shape, dim):
    check(lambda t: fn(t * 4, dim=dim), torch.randn(shape))


def test_softmax_noncontiguous_and_masked():
    x = noncontig(torch.randn(4, 6)).t()
    check(lambda t: F.softmax(t, -1), x)
    m = torch.zeros(5, 5)
    m[:, 3:] = float("-inf")
    check(lambda t: F.softmax(t + m, -1), torch.randn(5, 5))


@pytest.mark.parametrize("shape,norm", [((5, 8), (8,)), ((2, 3, 7), (3, 7)), ((1, 33), (33,)),
                                        ((4, 1), (1,))], ids=str)
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm(shape, norm, affine):
    x = torch.randn(shape) * 3 + 1
    w = torch.randn(norm) if affine else None
    b = torch.randn(norm) if affine else None
    check(lambda t: F.layer_norm(t, norm, w, b, eps=1e-5), x)


def test_layer_norm_noncontiguous_with_stats():
    x = noncontig(torch.randn(6, 10)).t()
    check(lambda t: torch.native_layer_norm(t, (6,), None, None, 1e-5), x)


@pytest.mark.parametrize("n", [1, 9, 4096, 4097], ids=str)
def test_row_kernels_either_side_of_the_cpu_row_threshold(n):
    """On a CPU device rows up to lowering/core.CPU_ROW_WG_MAX_ROW are reduced by one
    subgroup, longer ones by the whole workgroup: both, with many rows, a strided view
    and a row that is all -inf but one."""
    from dynamo_vulkan.lowering.core import CPU_ROW_WG_MAX_ROW
    assert n <= CPU_ROW_WG_MAX_ROW or n == CPU_ROW_WG_MAX_ROW + 1
    x = torch.randn(n, 37).t()             # 37 rows of n, elements n apart... transposed view
    x[3] = float("-inf")
    x[3, n // 2] = 1.0
    check(lambda t: (F.softmax(t, -1), F.log_softmax(t, -1)), x)
    y = torch.randn(37, n) * 3 + 1
    check(lambda t: (F.layer_norm(t, (n,)), t.sum(-1), t.var(-1), t.amax(-1), t.argmax(-1)), y)
    check(lambda t, w: torch.ops.dynamo_vulkan.rms_norm(t, w, 1e-6), y, torch.randn(n))


@pytest.mark.parametrize("rows,n", [(1, 3584), (3, 5000), (1, 513), (2, 100)], ids=str)
def test_few_long_rows_on_a_gpu_take_a_wide_workgroup(as_gpu, plans, rows, n):
    """Planned as for a GPU: few long rows (a decode step's norm) get a workgroup wider than
    WG, so each invocation loads a few elements instead of looping over dozens; short rows
    keep WG. Softmax, log_softmax, layer norm and RMS norm, with a strided view."""
    from dynamo_vulkan.lowering import rowwise
    y = torch.randn(rows, n) * 3 + 1
    x = torch.randn(n, rows).t()
    check(lambda t: (F.softmax(t, -1), F.log_softmax(t, -1)), x)
    check(lambda t: F.layer_norm(t, (n,)), y)
    check(lambda t, w: torch.ops.dynamo_vulkan.rms_norm(t, w, 1e-6), y, torch.randn(n))
    sizes = {d.spec[0] for p in plans[-3:] for d in p.dispatches if d.name.startswith("rowwise")}
    assert sizes and all(s > rowwise.WG for s in sizes) == (n > 4 * rowwise.WG), sizes
