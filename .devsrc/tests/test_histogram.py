"""Histograms (lowering/histogram.py) against eager."""
import pytest
import torch

from vk import check, noncontig

torch.manual_seed(0)
X = torch.randn(5, 40)


@pytest.mark.parametrize("fn", [
    lambda x: torch.histc(x, 10),
    lambda x: torch.histc(x, 7, -1, 1),
    lambda x: torch.histc(x * 0 + 2, 4),                     # equal ends move apart
    lambda x: torch.histogram(x, 9),
    lambda x: torch.histogram(x, 9, range=(-1.0, 2.0)),
    lambda x: torch.histogram(x * 0 + 2, 4),
    lambda x: torch.histogram(x, 6, weight=x.abs(), density=True),
    lambda x: torch.histogram(x, torch.tensor([-2.0, -0.5, 0.0, 0.1, 3.0])),
    lambda x: torch.histogram(x, torch.tensor([-2.0, 0.0, 3.0]), weight=x.abs(), density=True),
], ids=["histc", "histc_range", "histc_equal", "histogram", "histogram_range",
        "histogram_equal", "histogram_weight_density", "histogram_edges", "edges_density"])
def test_histograms(fn):
    check(fn, X)


def test_histc_noncontiguous_and_ints():
    check(lambda x: torch.histc(x, 5), noncontig(X))
    check(lambda x: torch.histc(x.float(), 4, 0, 8), torch.randint(0, 9, (30,)))


@pytest.mark.parametrize("case", ["counts", "weighted_density", "range", "edges", "equal_ends", "3d"])
def test_histogramdd(case):
    x, w = torch.randn(30, 2), torch.rand(30)
    fns = {
        "counts": lambda x, w: torch.histogramdd(x, bins=[3, 4]),
        "weighted_density": lambda x, w: torch.histogramdd(x, bins=[3, 4], weight=w, density=True),
        "range": lambda x, w: torch.histogramdd(x, bins=[2, 5], range=[-1.0, 1.0, -2.0, 0.5]),
        "edges": lambda x, w: torch.histogramdd(
            x, bins=[torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([-3.0, -1.0, 0.0, 0.5, 3.0])],
            weight=w),
        "equal_ends": lambda x, w: torch.histogramdd(x * 0 + 1, bins=[2, 2]),
        "3d": lambda x, w: torch.histogramdd(torch.cat([x, w[:, None]], 1), bins=[2, 3, 2]),
    }
    check(fns[case], x, w)
