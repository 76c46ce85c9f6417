"""take / put, addmv / addbmm, median and nonzero_static (lowering/misc.py)."""
import torch

from vk import check, noncontig

torch.manual_seed(0)


def test_take_and_put():
    x = torch.randn(3, 4)
    check(lambda x, i: torch.take(x, i), noncontig(x), torch.tensor([[0, 11], [-1, 5]]))
    check(lambda x, i: torch.take(x, i), torch.tensor(2.0), torch.tensor(0))   # kept whole
    check(lambda x, i, s: (torch.put(x, i, s), torch.put(x, i, s, accumulate=True)), x,
          torch.tensor([1, 1, 7]), torch.randn(3))


def test_addmv_addbmm():
    check(lambda b, m, v: (torch.addmv(b, m, v), torch.addmv(b, m, v, beta=0.5, alpha=2)),
          torch.randn(3), torch.randn(3, 5), torch.randn(5))
    check(lambda b, m, v: torch.addmv(b, m, v), torch.randn(()), noncontig(torch.randn(3, 5)),
          torch.randn(5))
    check(lambda b, x, y: (torch.addbmm(b, x, y), torch.addbmm(b, x, y, beta=0.3, alpha=-1)),
          torch.randn(3, 4), torch.randn(5, 3, 2), torch.randn(5, 2, 4))


def test_median_with_nan_and_ints():
    check(torch.median, torch.randn(7, 3))
    xn = torch.randn(4, 7)
    xn[1, 3] = xn[1, 5] = float("nan")
    check(lambda x: (torch.median(x), torch.median(x, 1), torch.median(x, 0, keepdim=True)), xn)
    check(torch.median, torch.randint(0, 9, (6,)))
    check(lambda x: torch.median(x, 0), torch.tensor(3.0))


def test_nonzero_static():
    m = torch.randn(4, 5)
    m[m < 0] = 0
    check(lambda x: (torch.nonzero_static(x, size=4), torch.nonzero_static(x, size=30, fill_value=-7)),
          m)
    check(lambda x: torch.nonzero_static(x, size=3), torch.tensor([0, 1, 0, 2.0]))
    check(lambda x: torch.nonzero_static(x, size=2), torch.tensor([True, False]))


def test_nanmedian():
    x = torch.randn(4, 7)
    x[1, 3] = x[1, 5] = float("nan")
    check(lambda x: (torch.nanmedian(x), torch.nanmedian(x, 1), torch.nanmedian(x, 0, True)), x)
    x[2] = float("nan")                # an all-NaN row: NaN (eager's index for it is arbitrary)
    check(lambda x: (torch.nanmedian(x), torch.nanmedian(x, 1)[0]), x)
    check(lambda x: torch.nanmedian(x, 0), torch.randint(0, 9, (5, 2)))
