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
