"""GGUF weights larger than one buffer (lowering/gguf.py RowChunks): held in several
buffers of whole rows, one dispatch per chunk, against the CPU ops. The chunk size is
forced small here (WEIGHT_BUFFER_MAX), so small weights split as a 7B model's token
embedding and output head do on lavapipe (128 MiB): every GGUF type, the mat-vec and the
tiled matmul (as planned for a CPU device and for a GPU), the embedding lookup, odd row
counts and chunks of unequal size, the mat-vec's fusions (norm, residual, computed x,
integer dots), and greedy decoding whose argmax feeds a split embedding. A float32
tensor over the device's buffer limit runs on the CPU and says why."""
from __future__ import annotations

import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan import device
from dynamo_vulkan.gguf import GGUFEmbedding, GGUFLinear
from dynamo_vulkan.gguf.quants import QUANT_TYPES, quant_info, row_nbytes
from dynamo_vulkan.lowering import gguf as gguf_lowering
from dynamo_vulkan.runtime.program import Resident
from gguf_fixtures import blocks_of
from vk import check, compiled, require_int_dot

ALL_TYPES = tuple(info.name for info in QUANT_TYPES.values())
ROWS = 101          # odd; three chunks of CHUNK_ROWS-ish rows, the last one shorter
CHUNK_ROWS = 37


@pytest.fixture(autouse=True)
def _no_silent_fallback(monkeypatch):
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")


@pytest.fixture
def split_at(monkeypatch):
    """Set the bytes a GGUF weight's buffer may hold, with a device name that keeps these
    plans cached apart from the real limit's."""
    info = device.device_info()

    def set_limit(nbytes: int):
        monkeypatch.setattr(gguf_lowering, "WEIGHT_BUFFER_MAX", nbytes)
        monkeypatch.setitem(info, "name", f"{info['name']} (weight buffers of {nbytes})")
    return set_limit


def cols_of(name: str) -> int:
    """Rows of a few blocks; float rows not a multiple of the tiled kernel's k-step."""
    if name in ("F32", "F16", "BF16"):
        return 72
    return 512 if name.endswith("_K") else 96


def tolerances(k: int, expected) -> dict:
    rtol = 1e-4 * max(1.0, k / 256)
    scale = max(float(t.abs().max()) for t in expected)
    return {"rtol": rtol, "atol": rtol * scale}


def chunked(name: str, rows: int = ROWS, seed: int = 0):
    """(qtype, cols, blocks, the weight-buffer limit that holds ~CHUNK_ROWS of its rows)."""
    qt, k = quant_info(name).ggml_type, cols_of(name)
    return qt, k, blocks_of(name, rows, k, seed), CHUNK_ROWS * row_nbytes(qt, k) + 3


def chunk_sizes(module) -> list[int]:
    """Rows in each buffer the module's blocks were uploaded into."""
    spans = sorted(key[-1] for key in Resident._pool if key[0] == id(module.blocks)
                   and isinstance(key[-1], tuple))
    rb = row_nbytes(module.qtype, module.cols)
    assert spans and spans[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert sum(s[1] for s in spans) == module.blocks.numel()
    return [s[1] // rb for s in spans]


def gguf_kernels(plans) -> list[str]:
    return [d.name.split(":")[0] for p in plans for d in p.dispatches if d.name.startswith("gguf_")]


class LinearAndLookup(torch.nn.Module):
    """One split weight read as a linear (x of several shapes) and as an embedding."""

    def __init__(self, name: str):
        super().__init__()
        qt, k, b, self.limit = chunked(name)
        self.lin = GGUFLinear(b, qt, ROWS, k)
        self.emb = GGUFEmbedding(b, qt, ROWS, k)

    def forward(self, xs, ids):
        return [self.lin(x) for x in xs] + [self.emb(ids)]


def _check_split(name: str, plans, split_at) -> None:
    torch.manual_seed(0)
    model = LinearAndLookup(name)
    split_at(model.limit)
    k = model.lin.cols
    # mat-vec (one row, 3-D), tiled (9 rows, a transposed view)
    xs = [torch.randn(1, 1, k), torch.randn(k, 9).t()]
    # each chunk's first and last row, repeated, 2-D
    step = gguf_lowering.chunk_rows(row_nbytes(model.lin.qtype, k), model.limit)
    ids = torch.tensor([[0, step - 1, step, 2 * step - 1], [2 * step, ROWS - 1, 0, step]])
    with torch.no_grad():
        expected = model(xs, ids)
        check(model, xs, ids, **tolerances(k, expected))
    sizes = chunk_sizes(model.lin)
    assert len(sizes) == 3 and sizes[0] == sizes[1] > sizes[2] and sum(sizes) == ROWS, sizes
    kernels = gguf_kernels(plans)
    assert kernels.count("gguf_embed") == 3, kernels
    assert kernels.count("gguf_matvec") == 3 and kernels.count("gguf_matmul") == 3, kernels
    from dynamo_vulkan.runtime.plan import barriers
    seen = set()
    for p in plans:          # the embedding's and the mat-vec's chunks run side by side
        waits = barriers(p.dispatches)
        for family in ("gguf_embed", "gguf_matvec:"):
            at = [i for i, d in enumerate(p.dispatches) if d.name.startswith(family)]
            assert len(at) in (0, 3) and not any(waits[i] for i in at[1:]), (family, waits)
            seen |= {family} if at else set()
    assert seen == {"gguf_embed", "gguf_matvec:"}, seen


@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_type_split(plans, split_at, name):
    """Planned for this device (lavapipe: a CPU device)."""
    _check_split(name, plans, split_at)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "F16"])
def test_split_as_a_gpu(as_gpu, plans, split_at, name):
    """Planned for a GPU: the tiled matmul splits K, and its partial sums go to each
    chunk's columns of the output; the mat-vec takes the GPU's row groups."""
    _check_split(name, plans, split_at)


class Fused(torch.nn.Module):
    """A decoder's mat-vecs on split weights: rms_norm(x) -> q, k (a norm prologue), the
    output projection plus the residual stream, silu(gate) * up into down (x computed as
    it is loaded)."""

    def __init__(self, name: str):
        super().__init__()
        qt, k, _, self.limit = chunked(name)
        self.register_buffer("nw", torch.randn(k))
        self.q = GGUFLinear(blocks_of(name, ROWS, k, 1), qt, ROWS, k)
        self.k = GGUFLinear(blocks_of(name, 60, k, 2), qt, 60, k)
        self.o = GGUFLinear(blocks_of(name, ROWS, k, 3), qt, ROWS, k)
        self.down = GGUFLinear(blocks_of(name, ROWS, k, 4), qt, ROWS, k)

    def forward(self, x, res, gu):
        from dynamo_vulkan.fused import rms_norm
        h = rms_norm(x, self.nw, 1e-6)
        g, u = gu.chunk(2, dim=-1)
        return self.q(h), self.k(h), self.o(x) + res, self.down(torch.nn.functional.silu(g) * u)


def _check_fused(name: str, plans, split_at, m: int = 1) -> list[str]:
    torch.manual_seed(1)
    model = Fused(name)
    split_at(model.limit)
    k = model.q.cols
    args = torch.randn(m, k), torch.randn(m, ROWS), torch.randn(m, 2 * k)
    with torch.no_grad():
        expected = model(*args)
        check(model, *args, **tolerances(k, expected))
    return [d.note for p in plans for d in p.dispatches if d.name.startswith("gguf_matvec")]


@pytest.mark.parametrize("name", ["Q4_K", "Q6_K", "Q8_0"])
def test_fusions_on_split_weights(as_gpu, plans, split_at, name):
    """Each chunk's dispatch normalises x, adds its columns of the residual, or computes
    x as it loads it, as the one dispatch of an unsplit weight does."""
    notes = _check_fused(name, plans, split_at)
    per_chunk = [n for n in notes if " -> columns " in n]
    assert len(per_chunk) == len(notes) == 3 + 2 + 3 + 3, notes     # q, k, o, down
    assert sum(n.startswith("rms_norm + ") for n in per_chunk) == 5, notes
    assert sum(n.endswith("+ residual") for n in per_chunk) == 3, notes
    assert sum(n.startswith("elementwise + ") for n in per_chunk) == 3, notes


def test_fusions_on_split_weights_with_integer_dots(as_gpu, plans, split_at, monkeypatch):
    """The integer-dot mat-vec: every chunk reads the one planes dispatch of its x (the
    norm or the computed x folded into the planes)."""
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "on")
    require_int_dot()
    notes = _check_fused("Q4_K", plans, split_at)
    assert sum(" -> columns " in n and n.endswith("(integer dot products)") for n in notes) == 11, notes
    planes = [d.note for p in plans for d in p.dispatches if d.name.startswith("gguf_xplanes")]
    assert len(planes) == 3, planes     # of h (for q and k), x (o) and silu(g) * u (down)


def test_split_weights_at_prompt_size(as_gpu, plans, split_at):
    """Tiled sizes of the same graph: no fusion, same numbers."""
    notes = _check_fused("Q4_K", plans, split_at, m=12)
    assert not notes
    assert gguf_kernels(plans).count("gguf_matmul") >= 9


def greedy_tokens(model, token: int, steps: int, k: int) -> tuple[list[int], list[int]]:
    """(eager's greedy tokens after `token` at position 0, the replayed compiled step's):
    the replay's first call is one step through torch.compile (binding its inputs), each
    later one k steps in one submit, each step's argmax feeding the next step's lookup on
    the GPU. The KV caches are zeroed between the two."""
    from dynamo_vulkan.llm.generate import step_replay
    from dynamo_vulkan.llm.models.greedy import GreedySteps
    with torch.no_grad():
        want = GreedySteps(model)(torch.tensor([[token]]), GreedySteps.positions(0, steps)).tolist()
    model.reset_cache()
    replay = step_replay(model, "vulkan")
    got = replay(token, 0, k)
    while len(got) < steps:
        got += replay(got[-1], len(got), k, min(k, steps - len(got)))
    assert replay.why_not is None, replay.why_not
    return want, got


def test_greedy_decoding_with_split_embedding_and_head(tmp_path, split_at):
    """A tiny llama whose token embedding and output head span three buffers each: the
    replayed decode step gives eager's tokens."""
    pytest.importorskip("gguf")
    from dynamo_vulkan.llm.models import load_model
    from gguf_fixtures import write_tiny_model
    path = write_tiny_model(tmp_path / "tiny.gguf", "llama", n_layers=1,
                            types={"token_embd.weight": "Q8_0", "output.weight": "Q6_K"})
    model = load_model(path, max_ctx=16)
    head, emb = model.lm_head, model.embed
    # 3 chunks of the embedding (Q8_0 rows of 272 bytes) and of the head (Q6_K, 210)
    split_at(-(-emb.rows // 3) * row_nbytes(emb.qtype, emb.cols))
    n = len(dynamo_vulkan.reports())
    want, got = greedy_tokens(model, 5, steps=7, k=3)
    assert got == want
    assert len(chunk_sizes(emb)) == 3 and len(chunk_sizes(head)) == 3
    nodes = [d for r in dynamo_vulkan.reports()[n:] for d in r.nodes if "gguf" in d.op]
    assert nodes and all(d.where == "vulkan" for d in nodes), nodes


def test_float_tensor_over_the_buffer_limit_runs_on_the_cpu(monkeypatch):
    """A float32 weight larger than maxStorageBufferRange cannot be split: its graph runs
    on the CPU, with a warning that names the limit, and eager's numbers."""
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "warn")
    info = device.device_info()
    monkeypatch.setitem(info, "max_storage_buffer_range", 16384)
    monkeypatch.setitem(info, "name", f"{info['name']} (test limit 16384)")
    lin = torch.nn.Linear(80, 70)           # 22,400 bytes of weight
    x = torch.randn(2, 80)
    with torch.no_grad(), pytest.warns(UserWarning, match="maxStorageBufferRange"):
        got = compiled(lin)(x)
        torch.testing.assert_close(got, lin(x))


def test_large_uploads_show_progress(monkeypatch):
    """A call whose stale resident inputs add up to PROGRESS_BYTES or more uploads them
    under a progress bar counting their bytes; later calls upload nothing."""
    from dynamo_vulkan.runtime import program
    bars = []

    class Bar:
        def __init__(self, total):
            self.total, self.done, self.closed = total, 0, False
            bars.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True
    monkeypatch.setattr(program, "PROGRESS_BYTES", 4096)
    monkeypatch.setattr(program, "_progress", Bar)
    name = "Q8_0"
    qt, k = quant_info(name).ggml_type, 256
    lin = GGUFLinear(blocks_of(name, 40, k, 8), qt, 40, k)      # 10,880 bytes
    f = compiled(lin)
    x = torch.randn(1, k)
    with torch.no_grad():
        torch.testing.assert_close(f(x), lin(x), **tolerances(k, [lin(x)]))
        f(x)
    assert len(bars) == 1 and bars[0].closed
    assert bars[0].done == bars[0].total == -(-lin.blocks.numel() // 4) * 4
