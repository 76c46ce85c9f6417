"""Nested compile regions (dynamo_vulkan/regions.py): a function marked
torch.compiler.nested_compile_region is traced once, and the backend inlines its calls
so the whole graph still runs on Vulkan, with the region's input mutations (a layer's
KV-cache write) written back as before."""
import pytest
import torch
from torch import nn

import dynamo_vulkan
from vk import compiled

region = torch.compiler.nested_compile_region      # torch >= 2.11 (pyproject) has it


def _hops(gm) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function"
            and isinstance(n.target, torch._ops.HigherOrderOperator)]


def _compiled_graphs(fn, *args):
    """fn's output compiled for Vulkan, and the AOT graphs the backend received (as
    compile_graph got them, before inlining) with the graphs after it."""
    from dynamo_vulkan import backend
    seen = []
    real = backend.compile_graph

    def spy(gm, ex, *rest):
        seen.append(_hops(gm))
        out = real(gm, ex, *rest)
        seen.append(_hops(gm))
        return out
    backend.compile_graph = spy
    try:
        with torch.no_grad():
            out = compiled(fn)(*args)
    finally:
        backend.compile_graph = real
    return out, seen


class Layer(nn.Module):
    """A layer in miniature: a cache write at pos, then a read of the whole cache."""

    def __init__(self, d, ctx):
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d) / d)
        self.register_buffer("cache", torch.zeros(ctx, d))

    @region
    def forward(self, x, pos):
        y = torch.tanh(x @ self.w)
        self.cache.index_copy_(0, pos, y)
        return x + self.cache.sum(0, keepdim=True) * 0.5 + y


class Stack(nn.Module):
    def __init__(self, n=3, d=12, ctx=7):
        super().__init__()
        self.layers = nn.ModuleList(Layer(d, ctx) for _ in range(n))

    def forward(self, x, pos):
        for layer in self.layers:
            x = _scale(layer(x, pos))
        return x


@region
def _scale(x):          # a region with no mutation, called between the layers
    return x * 0.9 + 0.1


def test_regions_with_cache_writes_run_on_vulkan_and_write_back():
    torch.manual_seed(0)
    model, eager = Stack(), Stack()
    eager.load_state_dict(model.state_dict())
    x, pos = torch.randn(3, 12), torch.tensor([4, 0, 6])
    n_reports = len(dynamo_vulkan.reports())
    out, seen = _compiled_graphs(model, x, pos)
    with torch.no_grad():
        want = eager(x, pos)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    for got, ref in zip(model.layers, eager.layers):      # every layer's cache written
        torch.testing.assert_close(got.cache, ref.cache, rtol=1e-5, atol=1e-5)
        assert got.cache.abs().sum() > 0
    assert len(seen[0]) >= 6, seen      # the regions reached the backend as calls ...
    assert seen[1] == [], seen          # ... and were all inlined
    rep = dynamo_vulkan.reports()[n_reports:]
    assert rep and not [n for r in rep for n in r.cpu_nodes], rep


def test_a_region_mutating_a_view_of_its_base_runs_on_the_cpu_still_correct():
    """A cache that is a slice of a bigger buffer reaches the region as a view
    (auto_functionalized_v2's _argN_size): left as a call, run eagerly."""
    caches = torch.zeros(2, 5, 4)

    def fn(x, pos, caches):
        for i in range(2):
            x = _write(x, pos, caches[i])
        return x

    x, pos = torch.randn(2, 4), torch.tensor([1, 3])
    want_caches = caches.clone()
    want = fn(x, pos, want_caches)
    n_reports = len(dynamo_vulkan.reports())
    out, seen = _compiled_graphs(fn, x, pos, caches)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close(caches, want_caches)
    assert seen[0] and seen[1] == seen[0], seen        # not inlined
    rep = dynamo_vulkan.reports()[n_reports:]
    assert any("auto_functionalized" in n.op for r in rep for n in r.cpu_nodes), rep


@region
def _write(x, pos, cache):
    cache.index_copy_(0, pos, x * 2)
    return x + cache.sum(0)


def test_decoder_layers_reach_the_backend_as_one_region(tmp_path):
    """The decoder's blocks are traced once (torch >= 2.13, llm/models/decoder.py): its graph
    calls one subgraph per layer (layers alike: a subgraph used once is inlined by
    torch already), the backend inlines them all, and the logits are eager's."""
    from gguf_fixtures import write_tiny_model

    from dynamo_vulkan.llm.models import load_model
    from dynamo_vulkan.llm.models.decoder import BLOCKS_ARE_REGIONS
    if not BLOCKS_ARE_REGIONS:
        pytest.skip(f"torch {torch.__version__}: the blocks are regions from 2.13 on (llm/models/decoder.py)")
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    same = {f"blk.{i}.{t}.weight": "Q8_0" for i in range(3) for t in names}   # alike layers
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", n_layers=3, types=same)
    model, eager = load_model(path, max_ctx=16), load_model(path, max_ctx=16)
    tokens, start = torch.tensor([[3, 7, 11]]), torch.tensor(0)
    out, seen = _compiled_graphs(model, tokens, start)
    with torch.no_grad():
        want = eager(tokens, start)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    assert len(seen[0]) == len(model.layers) and seen[1] == [], seen
