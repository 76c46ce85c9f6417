"""Binary search and pairwise distances (lowering/search.py) against eager."""
import pytest
import torch

from vk import check, noncontig

torch.manual_seed(0)


def test_searchsorted_forms():
    s, v = torch.sort(torch.randn(3, 10)).values, torch.randn(3, 7)
    v[0, 0] = s[0, 4]                                        # an exact hit: left vs right
    check(lambda s, v: (torch.searchsorted(s, v), torch.searchsorted(s, v, right=True),
                        torch.searchsorted(s[0], v), torch.searchsorted(s, v, side="right")), s, v)
    check(lambda s, v: torch.searchsorted(s, v), noncontig(s), noncontig(v))
    check(lambda s: torch.searchsorted(s, 0.5), s[0])


def test_searchsorted_ints_sorter_and_bucketize():
    check(lambda s, v: torch.searchsorted(s, v), torch.tensor([1, 3, 3, 5, 9]),
          torch.tensor([[0, 3], [5, 10]]))
    raw, v = torch.randn(3, 10), torch.randn(3, 7)
    check(lambda s, v, o: torch.searchsorted(s, v, sorter=o), raw, v, raw.argsort())
    check(lambda b, v: (torch.bucketize(v, b), torch.bucketize(v, b, right=True)),
          torch.tensor([-1.0, 0.0, 1.0]), v)
    check(lambda b, v: torch.bucketize(v, b), torch.tensor([0.5]), torch.randn(1))


@pytest.mark.parametrize("p", [0, 1, 2, 3.5, float("inf"), 0.5])
def test_cdist(p):
    a, b = torch.randn(2, 5, 3), torch.randn(1, 4, 3)
    a[0, 0] = b[0, 0]                                        # a zero distance
    check(lambda a, b: torch.cdist(a, b, p), a, b)


def test_cdist_unbatched_noncontiguous():
    check(lambda a, b: torch.cdist(a, b), torch.randn(5, 3), noncontig(torch.randn(4, 3)))
    check(lambda a, b: torch.cdist(a, b), torch.randn(1, 1), torch.randn(1, 1))


@pytest.mark.parametrize("p", [0, 1, 2, 3.5, float("inf")])
def test_pdist(p):
    x = torch.randn(6, 3)
    x[4] = x[1]                                              # a zero distance
    check(lambda x: torch.nn.functional.pdist(x, p), x)
    check(lambda x: torch.nn.functional.pdist(x, p), noncontig(torch.randn(2, 4)))
