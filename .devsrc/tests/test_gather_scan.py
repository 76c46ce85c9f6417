"""Index-driven gathers and scatters (lowering/indexing.py) and scans
(lowering/scan.py) against eager."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig

torch.manual_seed(0)


def test_advanced_index_forms():
    x, i = torch.randn(5, 6, 7), torch.tensor([0, 4, -1, 2])
    check(lambda x, i: (x[i], x[:, i], x[i, :, i], x[:, i, :2], x[i.view(2, 2)], x[:, None, i]),
          x, i)
    check(lambda x, i: x[i, 1:, i], noncontig(x), i)
    check(lambda x, i, j: x[i, j], torch.randn(4, 3), torch.tensor([[1], [3]]),
          torch.tensor([0, 2, 1]))                                      # broadcast indices
    check(lambda x, i: x[i], torch.randint(0, 9, (4, 2)), torch.tensor([3, 3, 0]))


@pytest.mark.parametrize("dim,index_shape", [(1, (5, 3, 7)), (-1, (2, 3, 4)), (0, (1, 1, 1))],
                         ids=str)
def test_gather(dim, index_shape):
    x = torch.randn(5, 6, 7)
    idx = torch.randint(0, x.shape[dim], index_shape)
    check(lambda x, i: torch.gather(x, dim, i), x, idx)
    check(lambda x, i: torch.gather(x, dim, i), noncontig(x), idx)


def test_gather_scalar_and_take_along_dim():
    check(lambda x, i: torch.gather(x, 0, i), torch.tensor(2.0), torch.tensor(0))
    x = torch.randn(4, 5)
    check(lambda x: torch.take_along_dim(x, x.argsort(1)[:, :2], 1), x)


def test_scatter_src_value_add_reduce():
    x = torch.randn(3, 5)
    check(lambda x, i, s: torch.scatter(x, 1, i, s), x, torch.tensor([[0, 1], [2, 3], [4, 0]]),
          torch.randn(3, 4))
    check(lambda x, i: torch.scatter(x, 0, i, 2.5), x, torch.tensor([[0, 1], [2, 0]]))
    idx, src = torch.randint(0, 5, (3, 4)), torch.randn(3, 4)     # duplicates accumulate
    check(lambda x, i, s: torch.scatter_add(x, 1, i, s), x, idx, src)
    check(lambda x, i, s: torch.scatter_reduce(x, 1, i, s, "sum"), noncontig(x), idx, src)
    check(lambda x, i, s: torch.scatter_add(x, 0, i, s), torch.zeros(4, dtype=torch.int64),
          torch.tensor([1, 1, 3]), torch.tensor([2, 5, 7]))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag(mode):
    w = torch.randn(10, 4)
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), w, torch.tensor([1, 2, 3, 4, 9, 0]),
          torch.tensor([0, 2, 2, 5]))                                   # an empty bag
    check(lambda w, i: F.embedding_bag(i, w, mode=mode, padding_idx=2), noncontig(w),
          torch.tensor([[1, 2, 3], [2, 2, 2]]))                         # an all-padding bag


def test_embedding_bag_per_sample_weights_last_offset():
    check(lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p,
                                             include_last_offset=True),
          torch.randn(10, 4), torch.tensor([1, 2, 3, 4, 9, 0]), torch.tensor([0, 2, 5, 6]),
          torch.randn(6))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumsum_cumprod(dim):
    x = torch.randn(3, 300, 5)
    check(lambda x: (torch.cumsum(x, dim), torch.cumprod(x * 0.1 + 1, dim)), x, rtol=1e-4)


def test_scans_int_bool_noncontig_scalar():
    check(lambda x: torch.cumsum(x, 0), noncontig(torch.randn(7, 3)))
    check(lambda x: (torch.cumsum(x, 0), torch.cumprod(x, 1)), torch.randint(-3, 4, (7, 3)))
    check(lambda x: torch.cumsum(x, 0), torch.rand(7) > 0.5)
    check(lambda x: torch.cumsum(x, 0), torch.tensor(3.0))
    check(lambda x: torch.cumsum(x, 0), torch.randn(1, 4))


def test_logcumsumexp():
    x = torch.randn(4, 130)
    x[0, 3] = float("-inf")
    check(lambda x: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x, 0)), x)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    idx = torch.randint(0, 5, (3, 4))                       # duplicates combine
    check(lambda x, i, s: torch.scatter_reduce(x, 1, i, s, reduce, include_self=include_self),
          torch.randn(3, 5), idx, torch.randn(3, 4))
    check(lambda x, i, s: torch.scatter_reduce(x, 1, i, s, reduce, include_self=include_self),
          torch.randint(-9, 9, (3, 5)), idx, torch.randint(-9, 9, (3, 4)))


def test_scatter_legacy_reduce():
    x, idx, src = torch.randn(3, 5), torch.randint(0, 5, (3, 4)), torch.randn(3, 4)
    check(lambda x, i, s: (torch.scatter(x, 1, i, s, reduce="add"),
                           torch.scatter(x, 1, i, s, reduce="multiply")), x, idx, src)


def test_index_select_of_a_scalar():
    check(lambda x, i: torch.index_select(x, 0, i), torch.tensor(3.0), torch.tensor([0]))


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 10.0])
def test_segment_reduce(reduce, initial):
    d, lengths = torch.tensor([1.0, 2.0, 3.0, -1.0]), torch.tensor([2, 0, 1, 1])   # an empty one
    offsets = torch.tensor([0, 2, 2, 3, 4])
    check(lambda d, L, o: (torch.segment_reduce(d, reduce, lengths=L, initial=initial),
                           torch.segment_reduce(d, reduce, offsets=o, initial=initial)),
          d, lengths, offsets)


def test_segment_reduce_axis_and_inner_dims():
    check(lambda d, L: torch.segment_reduce(d, "sum", lengths=L, axis=1), torch.randn(2, 5, 3),
          torch.tensor([[2, 3], [1, 4]]))
    check(lambda d, L: torch.segment_reduce(d, "max", lengths=L), noncontig(torch.randn(5, 3)),
          torch.tensor([4, 1]))


def test_cummax_cummin_ties_nan_ints():
    x = torch.randn(4, 9)
    x[0, 3] = x[0, 5] = float("nan")
    x[1, 4] = x[1, 2] = 5.0                                   # a tie: the later index wins
    check(lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)), x)
    check(lambda x: torch.cummax(x, 0), noncontig(torch.randint(-3, 3, (6, 2))))
    check(lambda x: torch.cummin(x, 0), torch.tensor(1.5))


def test_unsafe_masked_index():
    x, i = torch.randn(4, 5), torch.tensor([0, 9, 3])         # 9 is out of range, masked off
    mask = torch.tensor([[True], [False], [True]])
    check(lambda x, m, i: torch.ops.aten._unsafe_masked_index(x, m, [i], -1.5), x, mask, i)


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(reduce, include_self):
    idx = torch.tensor([0, 0, 2, 3, 0])                       # repeats combine
    check(lambda x, i, s: torch.index_reduce(x, 0, i, s, reduce, include_self=include_self),
          torch.randn(4, 3), idx, torch.randn(5, 3))
    check(lambda x, i, s: torch.index_reduce(x, 1, i, s, reduce), torch.randn(3, 4),
          torch.tensor([1, 3, 1]), noncontig(torch.randn(3, 3)))


def test_embedding_max_norm_renorms_named_rows():
    w, i = torch.randn(10, 4) * 3, torch.tensor([[1, 2, 2], [9, 0, 1]])
    check(lambda w, i: F.embedding(i, w, max_norm=2.0), w.clone(), i)
    check(lambda w, i: F.embedding_bag(i, w, max_norm=1.5, norm_type=1.0, scale_grad_by_freq=True),
          w.clone(), i)
