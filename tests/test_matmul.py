"""Matmul family (lowering/matmul.py) against eager CPU."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig

torch.manual_seed(0)
SIZES = [(1, 1, 1), (1, 64, 7), (5, 3, 9), (8, 300, 33), (9, 40, 5), (65, 130, 67), (128, 64, 256), (3, 17, 1)]


@pytest.mark.parametrize("m,k,n", SIZES, ids=str)
def test_mm(m, k, n):
    check(torch.mm, torch.randn(m, k), torch.randn(k, n), rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("m,k,n", SIZES[:4], ids=str)
def test_mm_transposed_operands(m, k, n):
    a, b = torch.randn(k, m).t(), noncontig(torch.randn(n, k)).t()
    check(torch.mm, a, b, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("b,m,k,n", [(1, 3, 4, 5), (7, 1, 33, 9), (3, 65, 65, 65)], ids=str)
def test_bmm(b, m, k, n):
    check(torch.bmm, torch.randn(b, m, k), torch.randn(b, k, n), atol=1e-4 * k ** 0.5)


def test_bmm_broadcast_batch():
    x = torch.randn(4, 1, 6, 5)
    y = torch.randn(3, 5, 2)
    check(torch.matmul, x, y)


@pytest.mark.parametrize("bias_shape", [(9,), (1, 9), (5, 9), ()], ids=str)
def test_addmm(bias_shape):
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
          torch.randn(bias_shape), torch.randn(5, 7), torch.randn(7, 9))


def test_linear():
    check(F.linear, torch.randn(2, 3, 20), torch.randn(11, 20), torch.randn(11), atol=2e-4)
