"""torch.use_deterministic_algorithms(True): nodes whose kernels add floats with atomics
in any order (lowering/determinism.py) run on the host, in order, and say so; the same
compiled training then gives the same bits run after run."""
from __future__ import annotations

import copy

import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan.training import gpt_workload, train
from vk import compiled


@pytest.fixture
def deterministic():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    torch._dynamo.reset()
    yield
    torch.use_deterministic_algorithms(before)
    torch._dynamo.reset()


def _scatter_add(x, idx, src):
    return x.scatter_add(0, idx, src) * 2


def _cpu_reasons(n_reports: int) -> list[str]:
    return [str(d.reason) for r in dynamo_vulkan.reports()[n_reports:] for d in r.cpu_nodes]


def test_a_float_scatter_add_runs_on_the_host_under_deterministic_mode(deterministic):
    torch.manual_seed(0)
    x, src = torch.randn(5, 3), torch.randn(40, 3)
    idx = torch.randint(0, 5, (40, 3))          # many adds into each element
    n = len(dynamo_vulkan.reports())
    got = compiled(_scatter_add)(x, idx, src)
    assert torch.equal(got, _scatter_add(x, idx, src))
    reasons = _cpu_reasons(n)
    assert len(reasons) == 1 and "use_deterministic_algorithms" in reasons[0], reasons


def test_orderless_combines_stay_on_vulkan_under_deterministic_mode(deterministic):
    """Integer adds and float maxima give the same result in any order."""
    torch.manual_seed(0)
    idx = torch.randint(0, 5, (40,))
    ints, floats = torch.randint(-9, 9, (40,)), torch.randn(40)

    def fn(ints, floats, idx):
        return (torch.zeros(5, dtype=ints.dtype).scatter_add(0, idx, ints),
                torch.zeros(5).scatter_reduce(0, idx, floats, "amax", include_self=False))
    n = len(dynamo_vulkan.reports())
    got = compiled(fn)(ints, floats, idx)
    for g, w in zip(got, fn(ints, floats, idx)):
        assert torch.equal(g, w)
    assert _cpu_reasons(n) == []


def test_a_float_scatter_add_stays_on_vulkan_otherwise():
    torch.manual_seed(0)
    x, src, idx = torch.randn(5, 3), torch.randn(40, 3), torch.randint(0, 5, (40, 3))
    n = len(dynamo_vulkan.reports())
    torch.testing.assert_close(compiled(_scatter_add)(x, idx, src), _scatter_add(x, idx, src))
    assert _cpu_reasons(n) == []


def test_a_gpt_trains_to_the_same_bits_twice_under_deterministic_mode(deterministic):
    """The embedding's gradient (index_put with accumulate) is the only float atomic add of
    a GPT's step; on the host, two runs give equal parameters bit for bit."""
    w = gpt_workload(layers=1, dim=32, heads=2, seq=16, batch=4, vocab=11, steps=3)
    runs = []
    for _ in range(2):
        torch._dynamo.reset()
        n = len(dynamo_vulkan.reports())
        runs.append(train(copy.deepcopy(w), "vulkan"))
        reasons = _cpu_reasons(n)
        assert reasons and all("use_deterministic_algorithms" in r for r in reasons), reasons
    assert runs[0].losses == runs[1].losses
    for p, q in zip(runs[0].model.parameters(), runs[1].model.parameters()):
        assert torch.equal(p, q)
