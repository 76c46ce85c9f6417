"""Indexing and assembly (lowering/index.py): embedding, index_select, cat, scatters."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig

torch.manual_seed(0)


@pytest.mark.parametrize("idx_shape", [(1,), (7,), (2, 3), ()], ids=str)
def test_embedding(idx_shape):
    w = torch.randn(11, 6)
    idx = torch.randint(0, 11, idx_shape)
    check(F.embedding, idx, w)


def test_embedding_noncontiguous_weight():
    check(F.embedding, torch.tensor([[0, 3], [4, 4]]), noncontig(torch.randn(5, 3)))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_select(dim):
    x = torch.randn(4, 5, 6)
    idx = torch.tensor([3, 0, 0, 1])
    check(lambda t, i: torch.index_select(t, dim, i), x, idx)


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_cat(dim):
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    c = noncontig(torch.randn(2, 3, 4))
    check(lambda x, y, z: torch.cat([x, y, z], dim), a, b, c)


def test_cat_broadcast_mix_and_size_one():
    check(lambda x, y: torch.cat([x, y * 2], 0), torch.randn(1, 5), torch.randn(3, 5))


def test_slice_and_select_scatter():
    base = torch.randn(6, 5)
    src = torch.randn(2, 5)
    check(lambda b, s: (torch.slice_scatter(b, s, 0, 1, 5, 2), torch.select_scatter(b, s[0], 0, 3)),
          base, src)


def test_inplace_update_of_input_buffer():
    cache = torch.zeros(8, 4)

    def step(c, x, pos):
        c[pos:pos + 2] = x
        return c.sum(0)

    x = torch.randn(2, 4)
    expected_cache = cache.clone()
    expected = step(expected_cache, x, 3)
    got = torch.compile(step, backend="vulkan", dynamic=False)(cache, x, 3)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(cache, expected_cache)


def test_a_boolean_mask_index_runs_on_the_host_inside_a_full_graph():
    """x[mask]'s size is the mask's count of True: no program knows it before it runs, so
    the index runs on the host (the report says why) and what reads its result stays on
    Vulkan, specialised to the size it got; with fullgraph=True as without."""
    import dynamo_vulkan
    x = torch.randn(5, 4, 3)
    before = len(dynamo_vulkan.reports())
    fn = torch.compile(lambda x, m: (x[m] * 2 + 1).sum(0), backend="vulkan", fullgraph=True)
    for m in (torch.tensor([True, False, True, True, False]), torch.tensor([False, True] + [False] * 3)):
        torch.testing.assert_close(fn(x, m), (x[m] * 2 + 1).sum(0))
    reports = dynamo_vulkan.reports()[before:]
    cpu = [n for r in reports for n in r.cpu_nodes]
    assert {n.op for n in cpu} == {"aten.index.Tensor"}, cpu
    assert all("data-dependent shape" in n.reason for n in cpu)
    assert any(n.op == "aten.mul.Tensor" for r in reports for n in r.vulkan_nodes)


def test_a_partition_whose_shapes_its_values_give_falls_back_whole(monkeypatch):
    """Where such a node reaches a Vulkan partition anyway (the partition check patched
    out), specialising the partition refuses it as a LoweringError: the partition runs
    eagerly with the fallback's warning (an error under DYNAMO_VULKAN_FALLBACK=error), not
    the fake-tensor exception."""
    import dynamo_vulkan
    from dynamo_vulkan import partition
    monkeypatch.setattr(partition, "_data_dependent_shape", lambda node: False)
    x, m = torch.randn(5, 4), torch.tensor([True, False, True, True, False])
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "warn")
    torch._dynamo.reset()
    with pytest.warns(UserWarning, match="output shape depends on the values it reads"):
        out = torch.compile(lambda x, m: x[m] * 2, backend="vulkan", fullgraph=True)(x, m)
    torch.testing.assert_close(out, x[m] * 2)
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    torch._dynamo.reset()
    with pytest.raises(dynamo_vulkan.VulkanFallbackError, match="output shape depends on the values"):
        torch.compile(lambda x, m: x[m] * 3, backend="vulkan", fullgraph=True)(x, m)
