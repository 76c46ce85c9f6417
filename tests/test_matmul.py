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


@pytest.mark.parametrize("case", ["mm", "bmm", "addmm", "transposed"])
def test_k_split_on_a_gpu(as_gpu, plans, case):
    """Too few tiles to fill a GPU: K in slices, each a partial product, then one sum;
    K not a multiple of the slice, batches, a bias added once (by the first slice),
    transposed operands: eager's result."""
    k = 1000
    if case == "mm":
        check(torch.mm, torch.randn(70, k), torch.randn(k, 33), atol=1e-4 * k ** 0.5)
    elif case == "bmm":
        check(torch.bmm, torch.randn(3, 20, k), torch.randn(3, k, 9), atol=1e-4 * k ** 0.5)
    elif case == "addmm":
        check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0),
              torch.randn(1, 33), torch.randn(70, k), torch.randn(k, 33), atol=2e-4 * k ** 0.5)
    else:
        check(torch.mm, torch.randn(k, 70).t(), noncontig(torch.randn(33, k)).t(), atol=1e-4 * k ** 0.5)
    names = [(d.name, d.note) for p in plans for d in p.dispatches]
    assert any(n.startswith("matmul") and "splits" in note for n, note in names), names
    assert names[-1][0].startswith("elementwise"), names


def test_no_k_split_on_a_cpu_device(plans):
    check(torch.mm, torch.randn(70, 1000), torch.randn(1000, 33), atol=1e-4 * 1000 ** 0.5)
    assert [d.name for p in plans for d in p.dispatches] == ["matmul:tiled64"]
