"""index_put and input mutations (copy_ back into graph inputs): KV-cache style
updates of buffers stay correct on the host, or live on the GPU when asked."""
import pytest
import torch
from torch import nn

import dynamo_vulkan
from vk import check, compiled, noncontig

torch.manual_seed(0)


@pytest.mark.parametrize("case", ["dim0", "dim1", "two-broadcast", "non-adjacent", "negative",
                                  "values-broadcast", "size1"])
def test_index_put(case):
    x = torch.randn(5, 7, 3)
    if case == "dim0":
        idx, v = (torch.tensor([4, 0, 2]),), torch.randn(3, 7, 3)
    elif case == "dim1":
        idx, v = (slice(None), torch.tensor([6, 1])), torch.randn(5, 2, 3)
    elif case == "two-broadcast":
        idx, v = (torch.tensor([[0], [3]]), torch.tensor([1, 5, 6])), torch.randn(2, 3, 3)
    elif case == "non-adjacent":
        idx, v = (torch.tensor([1, 2]), slice(None), torch.tensor([0, 2])), torch.randn(2, 7)
    elif case == "negative":
        idx, v = (torch.tensor([-1, -5]),), torch.randn(2, 7, 3)
    elif case == "values-broadcast":
        idx, v = (torch.tensor([2, 3]),), torch.randn(3)
    else:
        idx, v = (torch.tensor([0]),), torch.randn(1, 7, 3)

    def fn(x, v):
        y = x.clone()
        y[idx] = v
        return y
    check(fn, x, v)
    check(fn, noncontig(x), v)


def test_index_put_accumulate_with_duplicates():
    x, v = torch.randn(6, 4), torch.randn(5, 4)
    idx = torch.tensor([1, 3, 1, 1, 5])
    check(lambda x, i, v: torch.index_put(x, (i,), v, accumulate=True), x, idx, v)
    xi = torch.randint(-5, 5, (6,), dtype=torch.int32)
    check(lambda x, i: torch.index_put(x, (i,), torch.ones(5, dtype=torch.int32), accumulate=True),
          xi, idx)


def test_index_copy_into_an_intermediate():
    x, v = torch.randn(3, 8, 4), torch.randn(3, 2, 4)
    check(lambda x, v, p: x.exp().index_copy(1, p, v), x, v, torch.tensor([5, 2]))


class Cache(nn.Module):
    """A KV-cache in miniature: write rows at pos, then read the whole cache."""

    def __init__(self, keep=False):
        super().__init__()
        self.register_buffer("cache", torch.zeros(2, 16, 4))
        if keep:
            dynamo_vulkan.keep_on_device(self.cache)

    def forward(self, x, pos):
        self.cache.index_copy_(1, pos, x)
        return self.cache.sum(1) * 2.0


def _run(keep):
    torch.manual_seed(1)
    eager, model = Cache(), Cache(keep)
    steps = [(torch.randn(2, 3, 4), torch.arange(0, 3))] + \
        [(torch.randn(2, 1, 4), torch.tensor([p])) for p in range(3, 7)]
    cm = compiled(model)
    with torch.no_grad():
        for x, pos in steps:
            torch.testing.assert_close(cm(x, pos), eager(x, pos), rtol=1e-5, atol=1e-5)
    report = dynamo_vulkan.reports()[-1]
    assert not report.cpu_nodes, report
    return eager, model


def test_buffer_mutation_is_written_back_to_the_host():
    eager, model = _run(keep=False)
    torch.testing.assert_close(model.cache, eager.cache)


def test_keep_on_device_leaves_the_host_stale_until_read_back():
    eager, model = _run(keep=True)
    assert not torch.equal(model.cache, eager.cache)      # host copy not refreshed per call
    dynamo_vulkan.read_back(model.cache)
    torch.testing.assert_close(model.cache, eager.cache)
    with torch.no_grad():                                 # a host write uploads it again
        model.cache.zero_()
        eager.cache.zero_()
        x, pos = torch.randn(2, 1, 4), torch.tensor([9])
        torch.testing.assert_close(compiled(model)(x, pos), eager(x, pos))


def test_streamed_input_mutation():
    def fn(a, b):
        a.mul_(2.0)
        a[1] = b
        return a + 1.0
    a, b = torch.randn(3, 5), torch.randn(5)
    a2 = a.clone()
    out = compiled(fn)(a, b)
    exp = fn(a2, b)
    torch.testing.assert_close(out, exp)
    torch.testing.assert_close(a, a2)


def _index_put_then_copy(second_write: bool):
    """A graph as some torch versions functionalize a cache update: the copy_ back into
    the input comes before another reader of the update (and, optionally, a second
    copy_ into the same input after it)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(cache, idx, val):
        new = torch.ops.aten.index_put.default(cache, [idx], val)
        torch.ops.aten.copy_.default(cache, new)
        out = new * 2
        if second_write:
            torch.ops.aten.copy_.default(cache, out)
        return out
    return make_fx(f)(torch.zeros(5, 3), torch.tensor([2]), torch.ones(1, 3))


@pytest.mark.parametrize("second_write", [False, True])
def test_cache_update_in_place_when_its_copy_back_comes_early(second_write):
    from dynamo_vulkan.lowering import planner
    gm = _index_put_then_copy(second_write)
    puts = [n for n in gm.graph.nodes if n.target is torch.ops.aten.index_put.default]
    assert planner.in_place_updates(gm) == (set() if second_write else set(puts))
