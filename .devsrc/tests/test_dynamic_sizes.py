"""Sizes under dynamic shapes (torch.compile(dynamic=True), or a recompile after a size
changed): aten.sym_size of an intermediate and arithmetic on SymInts (operator.mul,
torch.sym_sum, ...) are fixed by the input shapes a program is built for, so the planner
reads them off the specialised shapes (lowering/planner.is_size_value) and the graph stays
one Vulkan partition. Before, each was a CPU node that split the graph (transformers'
DynamicCache decode step: 3 partitions and a warning per size)."""
import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan import backend


def _compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend="vulkan", dynamic=True)


def _last_report():
    return dynamo_vulkan.reports()[-1]


def _attend(k_cache, k_new, q):
    """A decode step over a cache grown by cat (as transformers' DynamicCache does): the
    attention's views and expands take the grown cache's size, a sym_size of the cat."""
    k = torch.cat([k_cache, k_new], dim=2)                    # [b, h, t + 1, d]
    kv = k[:, :, None].expand(-1, -1, 2, -1, -1).reshape(k.shape[0], -1, k.shape[2], k.shape[3])
    att = (q @ kv.transpose(-1, -2) / kv.shape[-1] ** 0.5).softmax(-1)
    return att @ kv, k


@pytest.mark.parametrize("lengths", [(1, 4, 9)])
def test_a_growing_cache_is_one_partition(lengths):
    c = _compiled(_attend)
    for t in lengths:
        cache, new, q = torch.randn(1, 2, t, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 4, 1, 8)
        for got, want in zip(c(cache, new, q), _attend(cache, new, q)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    report = _last_report()
    assert report.partitions == 1 and not report.cpu_nodes, str(report)
    assert any(n.op == "aten.sym_size.int" for n in report.nodes), "no size query was exercised"


def _arith(x, y):
    z = torch.cat([x, y], 0)                     # s0 + s1 rows: torch.sym_sum
    w = z.view(z.shape[0] * 2, -1)               # operator.mul of SymInts
    return (w.relu() + 1).sum(0), torch.arange(z.shape[0]).float()


def test_size_arithmetic_runs_in_the_partition():
    c = _compiled(_arith)
    for n in (1, 3, 8):
        x, y = torch.randn(n, 6), torch.randn(n + 1, 6)
        for got, want in zip(c(x, y), _arith(x, y)):
            torch.testing.assert_close(got, want)
    report = _last_report()
    assert not report.cpu_nodes and report.partitions == 1, str(report)
    assert {"mul", "sym_sum"} <= {n.op for n in report.nodes}, str(report)


def _size_leaves(x):
    z = torch.cat([x, x], 0)
    n = z.shape[0] // 3                          # a size the next graph needs
    return torch.nonzero(z > 0)[:n] * 2, z.relu() + 1


def test_a_size_a_partition_returns_is_its_programs_value():
    """nonzero breaks the graph; the first graph hands its size on as an output, which
    each program returns as the constant its input shape makes it (a size of 1 is
    specialised by Dynamo: a static graph, the size a constant of its own)."""
    c = _compiled(_size_leaves)
    with backend.capture_partitions() as got:
        for s in (5, 9, 1):
            x = torch.randn(s)
            for a, b in zip(c(x), _size_leaves(x)):
                torch.testing.assert_close(a, b)
    consts = sorted(o.const for _, subs in got for sub in subs for p in sub.programs.values()
                    for o in p.plan.outputs if o.const is not None)
    assert consts == [3, 6]


def test_a_partition_built_for_many_shapes_says_how_to_avoid_it(monkeypatch):
    monkeypatch.setattr(backend, "SHAPES_WARNED", 3)
    c = _compiled(_attend)
    with pytest.warns(UserWarning, match="has been built for 3 input shapes.*cache_implementation='static'"):
        for t in (5, 6, 7):   # none equal to another size (Dynamo would guard on that)
            cache, new, q = torch.randn(1, 2, t, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 4, 1, 8)
            torch.testing.assert_close(c(cache, new, q)[0], _attend(cache, new, q)[0], rtol=1e-4, atol=1e-5)
