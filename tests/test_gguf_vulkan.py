"""The Vulkan lowering of gguf_linear / gguf_embedding against the CPU ops, for
every GGUF type: mat-vec shapes (M <= 8), tiled shapes, odd row counts,
non-contiguous and 3-D x, repeated and 2-D ids; plus the packed-bytes
plumbing (resident, streamed and tied weights) and the CPU fallbacks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan.gguf import GGUFEmbedding, GGUFLinear
from dynamo_vulkan.gguf.op import gguf_embedding, gguf_linear
from dynamo_vulkan.gguf.quants import QUANT_TYPES, quant_info
from dynamo_vulkan.lowering import gguf as gguf_lowering
from dynamo_vulkan.lowering import schedule
from dynamo_vulkan.runtime.program import Resident
from gguf_fixtures import blocks_of
from vk import LinearPlus, check, compiled, lowered_plan, noncontig

LEGACY = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
ALL_TYPES = LEGACY + KQUANTS
# row length per type: more chunks of 8 than a mat-vec workgroup has threads (64),
# and for F32/F16/BF16 not a multiple of the tiled kernel's k-step (16)
COLS = {"F32": 520, "F16": 520, "BF16": 520}


@pytest.fixture(autouse=True)
def _no_silent_fallback(monkeypatch):
    """A partition that fails to lower raises here instead of running eagerly."""
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")


def cols_of(name: str) -> int:
    if name in COLS:
        return COLS[name]
    return 768 if name in KQUANTS else 640


# byte offsets of each type's fp16 scales (d, m / dmin) inside a block
class Layers(torch.nn.Module):
    """Two GGUF linears (7 and 65 rows) and an embedding of one GGUF type."""

    def __init__(self, name: str):
        super().__init__()
        qt = quant_info(name).ggml_type
        k = cols_of(name)
        self.a = GGUFLinear(blocks_of(name, 7, k, 1), qt, 7, k)
        self.b = GGUFLinear(blocks_of(name, 65, k, 2), qt, 65, k)
        self.e = GGUFEmbedding(blocks_of(name, 33, k, 3), qt, 33, k)

    def forward(self, xs, ids2d, ids_nc):
        return [f(x) for x in xs for f in (self.a, self.b)] + [self.e(ids2d), self.e(ids_nc)]


def tolerances(k: int, expected) -> dict:
    """fp32 sums of k products: relative error grows with k (kernels sum in another order)."""
    rtol = 1e-4 * max(1.0, k / 256)
    scale = max(float(t.abs().max()) for t in expected)
    return {"rtol": rtol, "atol": rtol * scale}


@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_type_matches_cpu(name):
    _check_every_shape(name)


@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_type_matches_cpu_as_gpu(as_gpu, name):
    """Planned as for a GPU: the tiled kernel's 4x4-per-thread layout for prompts
    (lavapipe's plans take its 8x8 one), and the GPU's mat-vec row groups."""
    _check_every_shape(name)


def _check_every_shape(name):
    torch.manual_seed(0)
    model = Layers(name)
    k = cols_of(name)
    xs = [torch.randn(1, k), torch.randn(3, k), torch.randn(8, k),            # mat-vec
          torch.randn(9, k), torch.randn(70, k), noncontig(torch.randn(66, k)),  # tiled (GPU: W decoded first)
          noncontig(torch.randn(3, k)), noncontig(torch.randn(40, k)),
          torch.randn(2, 5, k), torch.randn(1, 1, k),                          # 3-D
          torch.randn(k, 6).t(), torch.randn(k, 4, 3).permute(2, 1, 0),        # k-strided
          torch.randn(3, k + 1)[:, 1:], torch.randn(1, k + 2)[:, 2:]]          # unaligned rows
    ids2d = torch.tensor([[3, 0, 3, 32], [5, 5, 1, 31]])                       # repeats
    ids_nc = torch.tensor([7, -1, 7, -1, 0, -1, 32])[::2]
    with torch.no_grad():
        expected = model(xs, ids2d, ids_nc)
        check(model, xs, ids2d, ids_nc, **tolerances(k, expected))


def _plan_of(module: GGUFLinear, m: int):
    """The plan the planner lowers for module(randn(m, cols)), blocks resident."""
    return lowered_plan(lambda x, b: gguf_linear(x, b, module.qtype, module.rows, module.cols),
                        [torch.randn(m, module.cols), module.blocks], [False, True])


@pytest.mark.parametrize("plan_as", ["as_gpu", "as_cpu"])
def test_kernel_choice_and_packed_weight(request, plan_as):
    """M <= 8 rows take the mat-vec kernel, more the tiled one (on a CPU device its
    lanes-own-rows-of-W layout, CPU_LANES); the weight is one resident buffer of packed bytes (a word
    holds 4 of them), its rows regrouped for the GPU (dynamo_vulkan/gguf/gpu_layout.py:
    Q4_0 rows of 64 are 36 bytes)."""
    from dynamo_vulkan import device
    from dynamo_vulkan.lowering.core import has_cpu_lanes
    from dynamo_vulkan.runtime.shaders import head_defines
    request.getfixturevalue(plan_as)
    # a CPU device with subgroups of 8 or more (lavapipe's 256-bit build: 8; 128-bit: 4)
    cpu_lanes = has_cpu_lanes(device.device_info())
    lin = GGUFLinear(blocks_of("Q4_0", 9, 64, 0), quant_info("Q4_0").ggml_type, 9, 64)
    for m, kernel in ((1, "gguf_matvec:Q4_0"), (8, "gguf_matvec:Q4_0"), (9, "gguf_matmul:Q4_0")):
        plan = _plan_of(lin, m)
        names = [d.name for d in plan.dispatches]
        # on a GPU the tiled kernel may split K, and one elementwise kernel adds the parts
        assert names[0] == kernel and (names[1:] == [] or m == 9 and plan_as == "as_gpu" and
                                       len(names) == 2 and names[1].startswith("elementwise")), names
        if m == 9:
            assert ("CPU_LANES" in head_defines(plan.sources[plan.dispatches[0].spirv_key])) == cpu_lanes
        w = plan.buffers[plan.inputs[1].buffer]
        assert (w.kind, w.role, w.words) == ("u8/Q4_0/36", "param", -(-lin.blocks.numel() // 4))


def test_prompt_on_a_gpu_decodes_w_first(as_gpu, monkeypatch):
    """Planned as for a GPU, a prompt of DECODE_FIRST_M rows or more decodes W whole
    (gguf_dequant) and runs the plain matmul on it; fewer rows keep the tiled GGUF kernel;
    a decoded W over the buffer limit keeps it too."""
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 40 * 256)
    lin = GGUFLinear(blocks_of("Q4_K", 40, 256, 0), quant_info("Q4_K").ggml_type, 40, 256)
    m = gguf_lowering.DECODE_FIRST_M
    names = [d.name.split(":")[0] for d in _plan_of(lin, m).dispatches]
    # then the matmul's kernels (here K split, and its partial sums added)
    assert names[0] == "gguf_dequant" and names[1] in ("matmul", "matmul_coopmat") and \
        "gguf_matmul" not in names, names
    names = [d.name for d in _plan_of(lin, m - 1).dispatches]
    assert names[0] == "gguf_matmul:Q4_K" and not any("dequant" in x for x in names), names


@pytest.mark.parametrize("name", ["Q5_0", "Q4_K"])
def test_a_small_prompt_on_a_gpu_splits_k_finely(as_gpu, plans, name):
    """Planned as for a GPU, a small model's prompt (few 64x64 tiles) splits K into more
    parts than core.k_splits' default allows (lowering/gguf.GGUF_SPLIT_K), and the partial
    products, added by one kernel, give eager's result."""
    torch.manual_seed(5)
    k = 2 * cols_of(name)
    lin = GGUFLinear(blocks_of(name, 70, k, 2), quant_info(name).ggml_type, 70, k)
    x = torch.randn(33, k)
    with torch.no_grad():
        expected = lin(x)
        check(lin, x, **tolerances(k, expected))
    notes = [d.note for p in plans for d in p.dispatches if d.name.startswith("gguf_matmul")]
    splits = [int(n.rsplit("K in ", 1)[1].split()[0]) for n in notes if "K in" in n]
    assert splits and max(splits) > 8, notes


@pytest.mark.parametrize("name", ALL_TYPES)
def test_every_type_decoded_first_matches_cpu(as_gpu, plans, monkeypatch, name):
    """The decoded-first path (gguf_dequant + the plain matmul) for every type, its
    thresholds lowered to fit the test: contiguous and strided x, odd rows."""
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    torch.manual_seed(9)
    k = cols_of(name)
    lin = GGUFLinear(blocks_of(name, 65, k, 4), quant_info(name).ggml_type, 65, k)
    xs = [torch.randn(70, k), noncontig(torch.randn(66, k))]
    with torch.no_grad():
        expected = [lin(x) for x in xs]
        check(lambda *a: [lin(x) for x in a], *xs, **tolerances(k, expected))
    assert any(d.name.startswith("gguf_dequant") for p in plans for d in p.dispatches)


def test_when_w_is_decoded_first():
    """On a GPU, from DECODE_FIRST_M rows, with W in one buffer writing all of out and the
    decoded W within the device's buffer limit; never on a CPU device."""
    from types import SimpleNamespace
    m, n, k = gguf_lowering.DECODE_FIRST_M, 4096, 1024
    gpu = SimpleNamespace(caps={"device_type": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU",
                                "max_storage_buffer_range": 4 * n * k}, node=None)
    cpu = SimpleNamespace(caps=dict(gpu.caps, device_type="PHYSICAL_DEVICE_TYPE_CPU"))
    assert gguf_lowering._decode_first(gpu, m, n, k, 0, n, "Q5_1")
    assert not gguf_lowering._decode_first(gpu, m - 1, n, k, 0, n, "Q5_1")
    assert not gguf_lowering._decode_first(gpu, m, n // 2, k - 8, 0, n // 2, "Q5_1")   # too small a weight
    assert not gguf_lowering._decode_first(gpu, m, n, k + 8, 0, n, "Q5_1")      # over the limit
    assert not gguf_lowering._decode_first(gpu, m, n, k, 8, 2 * n, "Q5_1")      # one chunk of a split W
    assert not gguf_lowering._decode_first(cpu, m, n, k, 0, n, "Q5_1")


def test_when_w_is_packed_for_tensor_cores(monkeypatch):
    """Where the scaled fp16 tensor cores take the product: from TC_DECODE_FIRST_M rows,
    the fp16 copy (rows and K rounded up to whole tiles and steps, an exponent a row)
    within the device's buffer limit, or no copy (coopmat_pack.decodes_inline)."""
    from types import SimpleNamespace

    from dynamo_vulkan.lowering import coopmat
    plan = coopmat.Plan("f16", False, (16, 16, 16), 128, 128, 32, 32, True)
    monkeypatch.setattr(gguf_lowering, "_scaled_plan", lambda ctx, m, n, k: plan)
    m, n, k = gguf_lowering.TC_DECODE_FIRST_M, 4200, 1000          # rows_p 4224, kp 1024
    need = 2 * 4224 * 1024 + 4 * 4224
    gpu = SimpleNamespace(caps={"device_type": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU",
                                "max_storage_buffer_range": need}, node=None)
    assert gguf_lowering._decode_first(gpu, m, n, k, 0, n, "Q5_1")
    assert not gguf_lowering._decode_first(gpu, m - 1, n, k, 0, n, "Q5_1")
    gpu.caps["max_storage_buffer_range"] = need - 4
    assert not gguf_lowering._decode_first(gpu, m, n, k, 0, n, "Q5_1")   # 2 * n * k fits; the copy does not
    # a type decoded in the tile loads needs no copy where few rows of tiles take the
    # product: up to INLINE_MAX_TILES_M for a large W, one for a small one
    from dynamo_vulkan.lowering import coopmat_pack
    large = coopmat_pack.INLINE_MANY_MIN_WEIGHTS
    assert n * k >= large
    assert m <= plan.bm and gguf_lowering._decode_first(gpu, m, n, k, 0, n, "Q4_K") is plan
    most = coopmat_pack.INLINE_MAX_TILES_M * plan.bm
    assert gguf_lowering._decode_first(gpu, most, n, k, 0, n, "Q4_K") is plan
    assert not gguf_lowering._decode_first(gpu, most + 1, n, k, 0, n, "Q4_K")
    monkeypatch.setattr(coopmat_pack, "INLINE_MANY_MIN_WEIGHTS", n * k + 1)    # W counts as small
    assert gguf_lowering._decode_first(gpu, plan.bm, n, k, 0, n, "Q4_K") is plan
    assert not gguf_lowering._decode_first(gpu, plan.bm + 1, n, k, 0, n, "Q4_K")
    monkeypatch.setattr(coopmat_pack, "INLINE_MANY_MIN_WEIGHTS", large)
    # a weight below DECODE_FIRST_WEIGHTS: packed only for the tensor cores (no fp32 copy),
    # from TC_DECODE_FIRST_M rows, or from TC_DECODE_ALL_M where its rows pass TC_LONG_K
    gpu.caps["max_storage_buffer_range"] = 1 << 30
    g = gguf_lowering
    short, long_ = (1024, 640), (512, g.TC_LONG_K + 32)
    assert short[0] * short[1] < long_[0] * long_[1] < g.DECODE_FIRST_WEIGHTS
    assert g._decode_first(gpu, g.TC_DECODE_FIRST_M, *short, 0, short[0], "Q5_1") is plan
    assert not g._decode_first(gpu, g.TC_DECODE_FIRST_M - 1, *short, 0, short[0], "Q5_1")
    assert g._decode_first(gpu, g.TC_DECODE_ALL_M, *long_, 0, long_[0], "Q5_1") is plan
    assert not g._decode_first(gpu, g.TC_DECODE_ALL_M - 1, *long_, 0, long_[0], "Q5_1")
    monkeypatch.setattr(g, "_scaled_plan", lambda ctx, m, n, k: None)
    assert not g._decode_first(gpu, g.TC_DECODE_ALL_M, *short, 0, short[0], "Q5_1")


@pytest.mark.parametrize("n,sg,wg", [(576, 8, 48), (192, 8, 16), (3072, 8, 64), (960, 8, 40), (5, 8, 8),
                                     (576, 16, 48)])
def test_cpu_lanes_workgroup_computes_the_fewest_columns_past_n(n, sg, wg):
    from dynamo_vulkan.lowering.core import cpu_lanes
    caps = {"device_type": "PHYSICAL_DEVICE_TYPE_CPU", "subgroup_size": sg}
    assert cpu_lanes(caps, n)["CL_WG"] == wg
    assert cpu_lanes(caps | {"device_type": "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU"}, n) is None
    assert cpu_lanes(caps | {"subgroup_size": 4}, n) is None


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q6_K", "Q8_0"])
@pytest.mark.parametrize("m,n", [(9, 1), (17, 67), (70, 200)])
def test_cpu_lanes_matmul_on_odd_shapes(as_cpu, plans, name, m, n):
    """CPU_LANES against eager: rows of x past the workgroup's 8 and rows of W past
    its lanes' (clamped, never stored), one row of W, x a transposed view."""
    torch.manual_seed(7)
    k = cols_of(name)
    lin = GGUFLinear(blocks_of(name, n, k, 3), quant_info(name).ggml_type, n, k)
    x = torch.randn(k, m).t()                  # k-stride m: loads through both strides
    with torch.no_grad():
        check(lin, x, **tolerances(k, [lin(x)]))
    assert [d.name for p in plans for d in p.dispatches if d.name.startswith("gguf_")] == \
        [f"gguf_matmul:{name}"]


def test_cpu_device_with_narrow_subgroups_takes_the_gpu_tile(as_cpu, monkeypatch):
    """CPU_LANES shares x through 8 lanes: a CPU device with 4-lane subgroups (128-bit
    SIMD) gets the generic tile."""
    from dynamo_vulkan import device
    from dynamo_vulkan.runtime.shaders import head_defines
    info = device.device_info()
    monkeypatch.setitem(info, "subgroup_size", 4)
    monkeypatch.setitem(info, "name", f"{info['name']} (test subgroups of 4)")   # cached apart
    lin = GGUFLinear(blocks_of("Q8_0", 9, 64, 0), quant_info("Q8_0").ggml_type, 9, 64)
    plan = _plan_of(lin, 9)
    assert [d.name for d in plan.dispatches] == ["gguf_matmul:Q8_0"]
    assert "CPU_LANES" not in head_defines(plan.sources[plan.dispatches[0].spirv_key])


@pytest.mark.parametrize("name", ["Q5_1", "Q4_0", "Q6_K"])
def test_blocks_passed_as_a_graph_input(name):
    """Blocks that are not a module buffer are streamed in each call as packed bytes
    (GGML's order, or regrouped for the GPU as they are copied in)."""
    qt, k = quant_info(name).ggml_type, cols_of(name)
    b7 = blocks_of(name, 7, k, 4)
    x = torch.randn(2, k)
    check(lambda x, b: gguf_linear(x, b, qt, 7, k) * 2, x, b7, rtol=1e-4, atol=1e-4)


def test_blocks_read_as_two_types_run_on_the_cpu(monkeypatch):
    """One uint8 tensor read as Q4_0 and as Q4_1 rows cannot be stored in both GPU
    orders: the graph runs on the CPU, with a warning that says why, same numbers."""
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "warn")
    b = blocks_of("Q4_0", 10, 64, 1)            # 360 bytes: also 9 Q4_1 rows of 64
    q40, q41 = quant_info("Q4_0").ggml_type, quant_info("Q4_1").ggml_type

    def fn(x, b):
        return gguf_linear(x, b, q40, 10, 64), gguf_linear(x, b, q41, 9, 64)
    x = torch.randn(1, 64)
    with pytest.warns(UserWarning, match="two types or row lengths"):
        got = compiled(fn)(x, b)
    torch.testing.assert_close(got, fn(x, b), rtol=1e-4, atol=1e-4, equal_nan=True)


def test_tied_weights_share_one_resident_buffer():
    """A tied LM head: embedding and linear read one blocks tensor, uploaded once."""
    name = "Q8_0"
    qt, rows, k = quant_info(name).ggml_type, 33, 64
    emb = GGUFEmbedding(blocks_of(name, rows, k, 5), qt, rows, k)
    head = GGUFLinear(emb.blocks, qt, rows, k)
    assert head.blocks is emb.blocks

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = emb, head

        def forward(self, ids):
            return self.head(torch.tanh(self.emb(ids)))

    model = Tied()
    ids = torch.tensor([[1, 2, 32]])
    with torch.no_grad():
        check(model, ids, rtol=1e-4, atol=1e-4)
    shared = [key for key in Resident._pool if key[0] == id(emb.blocks)]
    assert len(shared) == 1 and shared[0][-1] == "u8/Q8_0/68"     # rows regrouped once


@pytest.fixture
def small_limit(monkeypatch):
    """Set the device's maxStorageBufferRange (as the planner and the CPU-fallback
    check read it) to a given number of bytes, with a device name that keeps
    plans cached under the real limit apart."""
    from dynamo_vulkan import device
    info = device.device_info()

    def set_limit(nbytes: int):
        monkeypatch.setitem(info, "max_storage_buffer_range", nbytes)
        monkeypatch.setitem(info, "name", f"{info['name']} (test limit {nbytes})")
    return set_limit


SPLIT_LIMIT = 10240    # bytes: the weights below take 3 buffers, x and outputs fit in one


def _split_plan(module, m: int):
    plan = _plan_of(module, m)
    spec = plan.inputs[1]
    assert spec.chunks and [c[1] for c in spec.chunks][0] == 0
    assert sum(c[2] for c in spec.chunks) == module.blocks.numel()
    assert all(plan.buffers[b].words * 4 <= SPLIT_LIMIT for b, _, _ in spec.chunks)
    return plan, spec


@pytest.mark.parametrize("name", ["Q8_0", "Q6_K"])     # rows of 272 and 210 bytes
def test_weight_over_the_buffer_limit_is_split(as_cpu, small_limit, name):
    """A weight over maxStorageBufferRange is held in several buffers of whole rows,
    one dispatch each, and gives the CPU op's results (101 rows: the last chunk is
    short; a 210-byte row needs an even row count per chunk to start on a word).
    Planned as for a CPU device: a GPU's tiled matmul splits K too (its own test)."""
    small_limit(SPLIT_LIMIT)
    qt, rows, k = quant_info(name).ggml_type, 101, 256
    lin = GGUFLinear(blocks_of(name, rows, k, 10), qt, rows, k)
    for m, kernel in ((1, "gguf_matvec"), (9, "gguf_matmul")):
        plan, spec = _split_plan(lin, m)
        assert len(spec.chunks) == 3
        assert [d.name.split(":")[0] for d in plan.dispatches] == [kernel] * 3
    xs = [torch.randn(1, k), torch.randn(9, k), noncontig(torch.randn(3, k)),
          torch.randn(2, 5, k)]
    with torch.no_grad():
        expected = [lin(x) for x in xs]
        check(lambda *xs: [lin(x) for x in xs], *xs, **tolerances(k, expected))


def test_split_embedding_and_tied_head(small_limit):
    """A tied embedding + LM head over the limit: both read the same chunks, uploaded
    once (one resident per chunk); ids in every chunk, repeated, and out of range."""
    small_limit(SPLIT_LIMIT)
    name = "Q8_0"
    qt, rows, k = quant_info(name).ggml_type, 101, 256
    emb = GGUFEmbedding(blocks_of(name, rows, k, 11), qt, rows, k)
    head = GGUFLinear(emb.blocks, qt, rows, k)

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = emb, head

        def forward(self, ids, ids2):
            return self.head(torch.tanh(self.emb(ids))), self.emb(ids2)

    ids = torch.tensor([[0, 36, 37, 73, 74, 100, 37]])      # chunk edges (37 rows each)
    ids2 = torch.tensor([5, -1, 100, 101, 50, 2000, 80])[::2]
    uploads = [key for key in Resident._pool if key[0] == id(emb.blocks)]
    with torch.no_grad():
        expected = Tied()(ids, ids2)
        check(Tied(), ids, ids2, **tolerances(k, expected))
    keys = [key for key in Resident._pool if key[0] == id(emb.blocks)]
    assert not uploads and len(keys) == 3
    assert sorted(key[-1] for key in keys) == [(0, 37 * 272), (37 * 272, 37 * 272),
                                               (74 * 272, 27 * 272)]


def test_split_weight_passed_as_a_graph_input(small_limit):
    """Streamed blocks over the limit are copied into their chunks on each call."""
    small_limit(SPLIT_LIMIT)
    name = "Q4_K"
    qt, rows, k = quant_info(name).ggml_type, 90, 256       # 144-byte rows
    b = blocks_of(name, rows, k, 12)
    ids = torch.tensor([89, 0, 71, 70])
    x = torch.randn(2, k)

    def fn(x, ids, b):
        return gguf_linear(x, b, qt, rows, k) * 2, gguf_embedding(ids, b, qt, rows, k)
    plan = lowered_plan(fn, [x, ids, b], [False] * 3)
    assert plan.inputs[2].chunks == [(plan.inputs[2].buffer, 0, 71 * 144),
                                     (plan.inputs[2].chunks[1][0], 71 * 144, 19 * 144)]
    assert {plan.buffers[c[0]].role for c in plan.inputs[2].chunks} == {"input"}
    check(fn, x, ids, b, rtol=1e-4, atol=1e-4)


def test_row_over_the_buffer_limit_runs_on_the_cpu(monkeypatch):
    """A single row larger than maxStorageBufferRange: only that node falls back,
    with the reason; a weight over the limit whose rows fit stays on Vulkan. (The
    check's limit only: x of a row that large could not fit a buffer either.)"""
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "silent")
    monkeypatch.setattr(gguf_lowering, "_limit", lambda: 2048)
    name = "Q4_0"
    qt = quant_info(name).ggml_type
    small = GGUFLinear(blocks_of(name, 64, 64, 6), qt, 64, 64)         # 36-byte rows, 2304 bytes
    big = GGUFLinear(blocks_of(name, 3, 4096, 7), qt, 3, 4096)         # 2304-byte rows
    fn = compiled(lambda x: big(small(x).repeat(1, 64)))
    n = len(dynamo_vulkan.reports())
    x = torch.randn(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), big(small(x).repeat(1, 64)), rtol=1e-4, atol=1e-4)
    nodes = [d for r in dynamo_vulkan.reports()[n:] for d in r.nodes if "gguf_linear" in d.op]
    assert [d.where for d in nodes] == ["vulkan", "cpu"]
    assert "a row of its GGUF weight (2304 bytes) exceeds" in nodes[1].reason


def test_type_without_a_kernel_runs_on_the_cpu(monkeypatch):
    """A GGUF type the shaders do not decode: the node runs on the CPU, its reason names the type."""
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "silent")
    qt = quant_info("Q6_K").ggml_type
    monkeypatch.setattr(gguf_lowering, "SHADER_TYPES",
                        {t: n for t, n in gguf_lowering.SHADER_TYPES.items() if t != qt})
    lin = GGUFLinear(blocks_of("Q6_K", 3, 256, 8), qt, 3, 256)
    n = len(dynamo_vulkan.reports())
    x = torch.randn(1, 256)
    with torch.no_grad():
        torch.testing.assert_close(compiled(lin)(x), lin(x))
    cpu = [d for r in dynamo_vulkan.reports()[n:] for d in r.cpu_nodes]
    assert len(cpu) == 1 and "Q6_K" in cpu[0].reason


def test_every_supported_type_has_a_kernel():
    assert set(gguf_lowering.SHADER_TYPES) == set(QUANT_TYPES)
    assert set(ALL_TYPES) == {i.name for i in QUANT_TYPES.values()}


@pytest.mark.parametrize("nr,unroll,wg,cpl", [(3, 1, 64, 1), (2, 3, 32, 1), (1, 4, 64, 2),
                                             (2, 6, 32, 3), (16, 2, 8, 1)])
def test_mat_vec_variants(monkeypatch, nr, unroll, wg, cpl):
    """Other mat-vec tunings (rows per workgroup, unroll, threads, neighbouring chunks per
    thread) give the same results, including workgroups whose last rows lie past the
    weight's end and threads whose last chunks lie past the row's end; (16, 2, 8, 1): more
    outputs per row group (16 rows of W, fewer per row of x from 4) than its 8 threads."""
    monkeypatch.setattr(gguf_lowering, "MV_NR", nr)
    monkeypatch.setattr(gguf_lowering, "MV_CPU_NR", nr)
    monkeypatch.setattr(gguf_lowering, "MV_UNROLL", unroll)
    monkeypatch.setattr(gguf_lowering, "MV_WG", wg)
    monkeypatch.setattr(gguf_lowering, "MV_CPL", cpl)
    name = "Q5_K"
    qt, k = quant_info(name).ggml_type, 768
    b = blocks_of(name, 7, k, 9)
    xs = [torch.randn(1, k), torch.randn(2, 3, k), noncontig(torch.randn(5, k))]
    with torch.no_grad():
        check(lambda *xs: [gguf_linear(x, b, qt, 7, k) for x in xs], *xs, rtol=3e-4, atol=3e-4)


@pytest.mark.parametrize("rows", [67, 131])
def test_mat_vec_of_many_rows_takes_several_a_subgroup(as_gpu, plans, monkeypatch, rows):
    """A weight of many short rows (an LM head: MV_MANY_ROWS, lowered here to 64) takes
    MV_MANY_NR rows a subgroup on a GPU: eager's result, with the last workgroup's last
    rows past the weight's end (67 and 131 rows are not multiples of 4 rows a subgroup)."""
    from dynamo_vulkan.runtime.shaders import head_defines
    monkeypatch.setattr(gguf_lowering, "MV_MANY_ROWS", 64)
    name = "Q8_0"
    qt, k = quant_info(name).ggml_type, 640
    b = blocks_of(name, rows, k, 10)
    xs = [torch.randn(1, k), torch.randn(3, k)]
    with torch.no_grad():
        check(lambda *xs: [gguf_linear(x, b, qt, rows, k) for x in xs], *xs, rtol=3e-4, atol=3e-4)
    mv = [(p, d) for p in plans for d in p.dispatches if d.name == "gguf_matvec:Q8_0"]
    assert len(mv) == 2, [d.name for p in plans for d in p.dispatches]
    assert all(head_defines(p.sources[d.spirv_key]).get("NR") == str(gguf_lowering.MV_MANY_NR)
               for p, d in mv), [head_defines(p.sources[d.spirv_key]) for p, d in mv]


@pytest.mark.parametrize("chunks,tpr,cpl,want", [(72, 32, 1, 3), (80, 32, 1, 3), (192, 32, 1, 3),
                                                  (512, 32, 1, 4), (1792, 32, 1, 4), (4, 32, 1, 1),
                                                  (96, 256, 1, 1), (72, 32, 2, 4), (0, 32, 1, 4)])
def test_mat_vec_unroll_wastes_the_fewest_slots(monkeypatch, chunks, tpr, cpl, want):
    monkeypatch.setattr(gguf_lowering, "MV_CPL", cpl)
    assert gguf_lowering.mv_unroll(chunks, tpr) == want


@pytest.mark.parametrize("k", [576, 640, 1536, 96])
def test_mat_vec_rows_of_decoder_widths(k):
    """Row lengths whose chunks do not fill whole steps of 4 per thread (SmolLM2's 576 and
    1536, Gemma 3's 640) take a smaller unroll; one or several rows of x."""
    name = "Q8_0"
    qt = quant_info(name).ggml_type
    b = blocks_of(name, 70, k, 3)
    xs = [torch.randn(1, k), torch.randn(3, k)]
    with torch.no_grad():
        check(lambda *xs: [gguf_linear(x, b, qt, 70, k) for x in xs], *xs, rtol=3e-4, atol=3e-4)


class NormLinearsResidual(torch.nn.Module):
    """A decoder's pattern: an RMSNorm read by two GGUF linears, one output added to
    the residual stream (square weight) and, with `also_plain`, the norm read by an
    elementwise op too."""

    def __init__(self, name: str, k: int, also_plain: bool = False):
        super().__init__()
        qt = quant_info(name).ggml_type
        self.register_buffer("nw", torch.randn(k))
        self.sq = GGUFLinear(blocks_of(name, k, k, 5), qt, k, k)
        self.other = GGUFLinear(blocks_of(name, 24, k, 6), qt, 24, k)
        self.also_plain = also_plain

    def forward(self, x):
        from dynamo_vulkan.fused import rms_norm
        h = rms_norm(x, self.nw, 1e-6)
        out = [self.sq(h) + x, self.other(h)]
        if self.also_plain:
            out.append(h * 2)
        return out


@pytest.mark.parametrize("name", ["Q4_1", "Q6_K", "F16"])
@pytest.mark.parametrize("m", [1, 3, 8, 9])
def test_norm_and_residual_fold_into_the_matvec(as_gpu, plans, name, m):
    """At mat-vec sizes the norm is computed by each linear as it loads x and the
    residual added by the linear's kernel: two kernels in all. The tiled size keeps
    separate kernels and gives the same numbers."""
    torch.manual_seed(1)
    k = cols_of(name)
    model = NormLinearsResidual(name, k)
    x = torch.randn(m, k)
    with torch.no_grad():
        check(model, x, **tolerances(k, model(x)))
    names = [d.name for p in plans for d in p.dispatches]
    if m <= gguf_lowering.MATVEC_M:
        assert sorted(names) == [f"gguf_matvec:{name}"] * 2, names
        notes = [d.note for p in plans for d in p.dispatches]
        assert all(n.startswith("rms_norm + ") for n in notes), notes
        assert sorted(f"[{k}x{k}]^T + residual" in n for n in notes) == [False, True], notes
    else:
        assert "rowwise:rms_norm" in names and any(n.startswith("elementwise") for n in names)


def test_norm_with_another_reader_is_computed_once(as_gpu, plans):
    torch.manual_seed(2)
    model = NormLinearsResidual("Q8_0", 64, also_plain=True)
    x = torch.randn(1, 64)
    with torch.no_grad():
        check(model, x, **tolerances(64, model(x)))
    names = [d.name for p in plans for d in p.dispatches]
    assert names.count("rowwise:rms_norm") == 1, names


class LinearPostNorm(torch.nn.Module):
    """Gemma-3's pattern: a GGUF linear whose output is RMS-normalised, with `residual`
    added to a residual stream after; `also_raw` reads the linear's output too, `x_norm`
    normalises x first (a norm prologue on the same mat-vec), `gated` computes x as
    silu(gate) * up (a row loader on the same mat-vec)."""

    def __init__(self, name: str, rows: int, k: int, residual: bool, also_raw: bool = False,
                 x_norm: bool = False, gated: bool = False, heads: int = 0):
        super().__init__()
        qt = quant_info(name).ggml_type
        self.lin = GGUFLinear(blocks_of(name, rows, k, 13), qt, rows, k)
        self.register_buffer("pw", torch.randn(rows // heads if heads else rows))
        self.heads = heads
        self.register_buffer("xw", torch.randn(k))
        self.residual, self.also_raw, self.x_norm, self.gated = residual, also_raw, x_norm, gated

    def forward(self, x, res):
        from dynamo_vulkan.fused import rms_norm
        if self.gated:
            g, u = x.chunk(2, dim=-1)
            x = torch.nn.functional.silu(g) * u
        if self.x_norm:
            x = rms_norm(x, self.xw, 1e-5)
        o = self.lin(x)
        h = rms_norm(o.reshape(o.shape[0], self.heads, -1) if self.heads else o, self.pw, 1e-6)
        out = [res + h if self.residual else h]
        if self.also_raw:
            out.append(o * 2)
        return out


def _post_norm_inputs(model: LinearPostNorm, m: int, seed: int):
    torch.manual_seed(seed)
    k = model.lin.cols * (2 if model.gated else 1)
    return torch.randn(m, k), torch.randn(m, model.lin.rows)


def _check_calls(model: LinearPostNorm, m: int, calls: int = 3) -> None:
    """Compile once, then call with new inputs each time against eager: a counter of
    finished workgroups left unreset would leave the norm unwritten (stale output)."""
    f = compiled(model)
    for i in range(calls):
        x, res = _post_norm_inputs(model, m, 100 + i)
        with torch.no_grad():
            expected = model(x, res)
            got = f(x, res)
        torch.testing.assert_close(got, expected, **tolerances(model.lin.cols, expected))


def _post_norm_notes(plans) -> list:
    return [d.note for p in plans for d in p.dispatches if "post-norm" in d.note]


@pytest.mark.parametrize("name,rows", [("Q4_0", 65), ("Q4_K", 640), ("Q6_K", 40), ("Q8_0", 640),
                                       ("F16", 65)])
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("residual", [False, True])
def test_post_norm_folds_into_the_matvec(as_gpu, plans, name, rows, m, residual):
    """rms_norm(x W^T) (+ a residual) is one mat-vec kernel: its last workgroup to finish
    normalises the output. Rows of 65 and 640: several workgroups, the last partial with
    65; 40 rows: one row per workgroup (partial sums through shared memory)."""
    model = LinearPostNorm(name, rows, cols_of(name), residual)
    _check_calls(model, m)
    names = [d.name for p in plans for d in p.dispatches]
    assert names == [f"gguf_matvec:{name}"], names
    notes = _post_norm_notes(plans)
    tail = ("+ rms_norm + residual" if residual else "+ rms_norm") + " (post-norm by the last workgroup)"
    assert len(notes) == 1 and notes[0].endswith(tail), notes


@pytest.mark.parametrize("name,rows,heads", [("Q5_0", 1024, 4), ("Q8_0", 256, 1), ("Q4_K", 640, 5)])
@pytest.mark.parametrize("m", [1, 3])
def test_post_norm_of_each_head_folds_into_the_matvec(as_gpu, plans, name, rows, heads, m):
    """rms_norm over each head of a reshaped x W^T (Gemma 3's and Qwen3's q and k norms)
    is the mat-vec's grouped post-norm: one kernel, no norm of its own (one head: the
    plain post-norm, through the reshape)."""
    model = LinearPostNorm(name, rows, cols_of(name), residual=False, heads=heads)
    _check_calls(model, m)
    names = [d.name for p in plans for d in p.dispatches]
    assert names == [f"gguf_matvec:{name}"], names
    notes = _post_norm_notes(plans)
    assert len(notes) == 1 and (f"rms_norm of each {rows // heads} " in notes[0]) == (heads > 1), notes


@pytest.mark.parametrize("nr,wg", [(3, 64), (2, 32)])
def test_post_norm_with_several_rows_per_group(as_gpu, plans, monkeypatch, nr, wg):
    """Other mat-vec tunings: rows of W per row group, and a last workgroup whose last
    rows lie past the weight's end."""
    monkeypatch.setattr(gguf_lowering, "MV_NR", nr)
    monkeypatch.setattr(gguf_lowering, "MV_WG", wg)
    _check_calls(LinearPostNorm("Q5_K", 67, 768, residual=True), 3)
    assert len(_post_norm_notes(plans)) == 1


@pytest.mark.parametrize("x_norm,gated", [(True, False), (False, True)])
def test_post_norm_with_a_prologue(as_gpu, plans, x_norm, gated):
    """The mat-vec that normalises its output may normalise x too (a norm prologue) or
    compute x as it loads it (silu(gate) * up): one kernel for all of it."""
    model = LinearPostNorm("Q8_0", 65, 640, residual=True, x_norm=x_norm, gated=gated)
    _check_calls(model, 2)
    names = [d.name for p in plans for d in p.dispatches]
    assert names == ["gguf_matvec:Q8_0"], names
    assert _post_norm_notes(plans)[0].startswith("rms_norm + " if x_norm else "elementwise + ")


def test_post_norm_not_with_another_reader(as_gpu, plans):
    """The linear's output read by something else too: the norm stays its own kernel."""
    _check_calls(LinearPostNorm("Q4_K", 65, 768, residual=True, also_raw=True), 3)
    names = [d.name for p in plans for d in p.dispatches]
    assert "rowwise:rms_norm" in names and not _post_norm_notes(plans), names


def test_post_norm_not_for_a_split_weight(as_gpu, small_limit, plans):
    """A weight split across buffers (a dispatch per part) keeps the norm apart."""
    small_limit(SPLIT_LIMIT)
    _check_calls(LinearPostNorm("Q8_0", 101, 256, residual=True), 2)
    names = [d.name for p in plans for d in p.dispatches]
    assert names.count("gguf_matvec:Q8_0") == 3 and "rowwise:rms_norm" in names, names
    assert not _post_norm_notes(plans)


def test_post_norm_not_on_a_cpu_device(as_cpu, plans):
    """On lavapipe (a CPU device) the norm after a mat-vec stays its own kernel."""
    from dynamo_vulkan import device
    assert device.is_cpu()
    _check_calls(LinearPostNorm("Q4_0", 65, 640, residual=True), 2)
    names = [d.name for p in plans for d in p.dispatches]
    assert names == ["gguf_matvec:Q4_0", "rowwise:rms_norm"], names
    assert not _post_norm_notes(plans)


def test_norm_between_two_matvecs_is_the_prologue(as_gpu, plans):
    """linear -> rms_norm -> linears: the norm folds into the mat-vecs that read it, as
    before (one fold per norm), not into the one that produced it."""
    torch.manual_seed(9)
    a = GGUFLinear(blocks_of("Q8_0", 64, 64, 14), quant_info("Q8_0").ggml_type, 64, 64)
    model = NormLinearsResidual("Q8_0", 64)
    x = torch.randn(1, 64)
    with torch.no_grad():
        check(lambda x: model(a(x)), x, **tolerances(64, model(a(x))))
    notes = [d.note for p in plans for d in p.dispatches]
    assert len(notes) == 3 and sum(n.startswith("rms_norm + ") for n in notes) == 2, notes
    assert not _post_norm_notes(plans)


class GatedDown(torch.nn.Module):
    """A feed-forward's tail: act(gate) * up (halves of one linear's output, or a
    separate tensor) into a down projection; `extra` adds a broadcast scale, a constant
    and a bool mask to the expression."""

    def __init__(self, name: str, k: int, act: str, extra: bool = False):
        super().__init__()
        qt = quant_info(name).ggml_type
        self.down = GGUFLinear(blocks_of(name, 40, k, 7), qt, 40, k)
        self.register_buffer("scale", torch.randn(k))
        self.act, self.extra = act, extra

    def forward(self, gu):
        g, u = gu.chunk(2, dim=-1)
        a = torch.nn.functional.silu(g) if self.act == "silu" else \
            torch.nn.functional.gelu(g, approximate="tanh")
        h = torch.where(u > 0, a * u * self.scale, g * 0.5) if self.extra else a * u
        return self.down(h)


@pytest.mark.parametrize("name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K"])
@pytest.mark.parametrize("m,act,extra", [(1, "silu", False), (3, "gelu", False), (8, "silu", True),
                                         (1, "gelu", True), (9, "silu", False)])
def test_elementwise_producer_folds_into_the_matvec(as_gpu, plans, name, m, act, extra):
    """silu(gate) * up is computed by the down projection's mat-vec as it loads x: one
    kernel, reading two strided views of gate|up (and a broadcast vector, a constant and
    a mask with `extra`). Above mat-vec sizes it is its own kernel, same numbers."""
    torch.manual_seed(3)
    k = cols_of(name)
    model = GatedDown(name, k, act, extra)
    gu = torch.randn(m, 2 * k)
    with torch.no_grad():
        check(model, gu, **tolerances(k, [model(gu)]))
    names = [d.name for p in plans for d in p.dispatches]
    if m <= gguf_lowering.MATVEC_M:
        assert names == [f"gguf_matvec:{name}"], names
        assert plans[-1].dispatches[0].note.startswith("elementwise + ")
    else:
        assert any(n.startswith("elementwise") for n in names)


def _defines(plan, d) -> dict:
    """The #defines the lowering put at the head of a dispatch's source."""
    from dynamo_vulkan.runtime.shaders import head_defines
    return head_defines(plan.sources[d.spirv_key])


@pytest.mark.parametrize("k,nr,full", [(1024, 1, True), (4096, 2, True), (5600, 2, False)])
def test_long_rows_share_a_workgroup(as_gpu, plans, k, nr, full):
    """Rows of MV_WG_CHUNKS chunks or more take a whole workgroup per row group, two rows
    of W from MV_WG_NR_CHUNKS (x loaded once for both); FULL_STEPS where the steps tile
    the row (no clamped slot). Through the norm + residual, gated-x and post-norm
    fusions, against eager; 5600: 700 chunks, in steps of 3 per thread that overrun it."""
    torch.manual_seed(4)
    name = "Q4_0"
    norm = NormLinearsResidual(name, k)
    x = torch.randn(3, k)
    gated = GatedDown(name, k, "silu")
    gu = torch.randn(1, 2 * k)
    with torch.no_grad():
        check(norm, x, **tolerances(k, norm(x)))
        check(gated, gu, **tolerances(k, [gated(gu)]))
    _check_calls(LinearPostNorm(name, 40, k, True), 1, calls=2)
    kernels = [(p, d) for p in plans for d in p.dispatches if d.name.startswith("gguf_matvec")]
    assert len(kernels) == 4, [d.name for p in plans for d in p.dispatches]
    for p, d in kernels:
        defs = _defines(p, d)
        assert (int(defs["NR"]), int(defs["TPR"]), "FULL_STEPS" in defs) == (nr, d.spec[0], full), \
            (d.note, defs)


def test_elementwise_producer_of_a_3d_noncontiguous_view(as_gpu, plans):
    """x [2, 1, k] from a permuted tensor: each leaf keeps its own row offsets."""
    torch.manual_seed(4)
    k = 64
    lin = GGUFLinear(blocks_of("Q8_0", 16, k, 8), quant_info("Q8_0").ggml_type, 16, k)
    t = torch.randn(k, 1, 2).permute(2, 1, 0)           # [2, 1, k], k-stride 2
    with torch.no_grad():
        check(lambda t: lin(torch.relu(t) * 3.0), t, **tolerances(k, [lin(torch.relu(t) * 3.0)]))
    assert [d.name for p in plans for d in p.dispatches] == ["gguf_matvec:Q8_0"]


@pytest.mark.parametrize("name", ["Q4_0", "Q5_1", "Q4_K", "Q6_K", "F16"])
@pytest.mark.parametrize("m", [9, 70])
def test_tiled_matmul_with_k_split(as_gpu, plans, name, m):
    """Few tiles (a small model's prompt): K is split over more workgroups and the
    slices added by a second kernel; odd M and N, K not a multiple of the split."""
    torch.manual_seed(6)
    k = cols_of(name)
    lin = GGUFLinear(blocks_of(name, 67, k, 11), quant_info(name).ggml_type, 67, k)
    x = torch.randn(m, k)
    with torch.no_grad():
        check(lin, x, **tolerances(k, [lin(x)]))
    notes = [d.note for p in plans for d in p.dispatches]
    decoded = m >= gguf_lowering.DECODE_FIRST_M     # W decoded first, then the plain matmul
    assert any("splits" in n for n in notes) and len(notes) == 2 + decoded, notes
    assert any(" decoded for " in n for n in notes) == decoded, notes


def test_k_split_of_a_weight_split_across_buffers(as_gpu, small_limit, plans):
    """Each chunk of a split weight adds its slices into its own columns; the partial
    outputs stay within one buffer (fewer splits where they would not)."""
    small_limit(SPLIT_LIMIT)
    lin = GGUFLinear(blocks_of("Q8_0", 101, 256, 12), quant_info("Q8_0").ggml_type, 101, 256)
    x = torch.randn(9, 256)                  # (x itself must fit the small limit)
    with torch.no_grad():
        check(lin, x, **tolerances(256, [lin(x)]))
    parts = [(int(n.split("Q8_0[")[1].split("x")[0]), int(n.rsplit("K in ", 1)[1].split()[0]))
             for p in plans for d in p.dispatches if "K in" in (n := d.note)]
    # every chunk's partial outputs (splits x 9 rows x its columns) fit one buffer, and
    # the limit held some chunk to fewer splits than K alone allows (256 / 32)
    assert parts and all(s * 9 * rows * 4 <= SPLIT_LIMIT for rows, s in parts), parts
    assert any(1 < s < 8 for _, s in parts), parts


def test_k_splits_rule():
    from dynamo_vulkan.lowering import core
    ks = core.k_splits
    assert ks({"device_type": "PHYSICAL_DEVICE_TYPE_CPU"}, 4, 4096) == (1, 4096)
    assert ks({}, 300, 4096) == (1, 4096)                  # enough tiles already
    assert ks({"max_storage_buffer_range": 4 * 1000}, 2, 4096, 500) == (2, 2048)  # scratch fits
    for tiles, k in ((18, 576), (96, 576), (2, 1536), (4, 100), (1, 130)):
        splits, per = ks({}, tiles, k)
        assert per % 16 == 0 and (splits - 1) * per < k <= splits * per
        assert splits == 1 or per >= core.SPLIT_K_MIN - 15
    # max_bytes bounds the partial products (splits x outputs floats) below the buffer's
    assert ks({}, 2, 4096, 1 << 20, max_bytes=8 << 20) == (2, 2048)
    assert ks({}, 2, 4096, 1 << 20, max_bytes=(8 << 20) - 1) == (1, 4096)


@pytest.mark.parametrize("m,n,k", [(512, 3072, 576), (512, 576, 1536), (128, 4096, 640), (128, 576, 576)])
def test_gguf_split_partials_stay_within_their_budget(m, n, k):
    """A prompt's tiled GGUF product on a GPU splits K for more workgroups, but its partial
    products stay within GGUF_SPLIT_K's max_bytes (SmolLM2's 512-row prompt held 18 MiB of
    them, past its memory goal), splitting where the budget allows it."""
    from dynamo_vulkan.lowering import core, gguf
    tiles = -(-m // gguf.TILE) * -(-n // gguf.TILE)
    splits, per = core.k_splits({"max_storage_buffer_range": 1 << 32}, tiles, k, m * n, **gguf.GGUF_SPLIT_K)
    assert splits * m * n * 4 <= gguf.GGUF_SPLIT_K["max_bytes"] or splits == 1
    assert (splits > 1) == (2 * m * n * 4 <= gguf.GGUF_SPLIT_K["max_bytes"])


def test_a_cpu_device_keeps_prologues_as_their_own_kernels(as_cpu, plans):
    """On lavapipe (a CPU device) recomputing the norm or silu * up in every row group
    costs more than a kernel: the norm, the activation and the mat-vecs stay apart,
    same numbers. Planned as for a CPU device, so it holds on a GPU machine too."""
    torch.manual_seed(7)
    model = NormLinearsResidual("Q8_0", 64)
    gated = GatedDown("Q8_0", 64, "silu")
    x, gu = torch.randn(1, 64), torch.randn(1, 128)
    with torch.no_grad():
        check(model, x, **tolerances(64, model(x)))
        check(gated, gu, **tolerances(64, [gated(gu)]))
    names = [d.name for p in plans for d in p.dispatches]
    assert names.count("rowwise:rms_norm") == 1 and names.count("gguf_matvec:Q8_0") == 3, names
    assert not any(d.note.startswith(("rms_norm + ", "elementwise + "))
                   for p in plans for d in p.dispatches)


class _Chain(torch.nn.Module):
    """Three GGUF linears one after another, an elementwise kernel between each."""

    def __init__(self, lins):
        super().__init__()
        self.lins = torch.nn.ModuleList(lins)

    def forward(self, x):
        for lin in self.lins:
            x = torch.nn.functional.gelu(lin(x))
        return x


def test_weights_decoded_first_beside_the_previous_product(as_gpu, plans, monkeypatch):
    """A prompt's W decoded whole (gguf_dequant) runs in the barrier level of the product
    before it (lowering/schedule.py), in a buffer of its own there; results as eager's."""
    from vk import assert_copies_beside_products
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_M", 64)
    monkeypatch.setattr(schedule, "AHEAD_MIN_BYTES", 0)       # copies of 128 KiB
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    torch.manual_seed(3)
    lins = [GGUFLinear(blocks_of(name, 256, 256, i), quant_info(name).ggml_type, 256, 256)
            for i, name in enumerate(("Q4_K", "Q8_0", "Q6_K"))]
    chain = _Chain(lins)
    x = torch.randn(70, 256)
    with torch.no_grad():
        check(chain, x, **tolerances(256 * 3, chain(x)))
    assert assert_copies_beside_products(plans, "gguf_dequant", "matmul") == 2


@pytest.mark.parametrize("rows", [70, 1], ids=["residual", "bias row"])
def test_prompt_residual_added_by_the_matmul(as_gpu, plans, monkeypatch, rows):
    """A prompt's W decoded first (gguf_dequant + the plain matmul): a residual added to
    the product, or a bias row broadcast over its rows, goes into the matmul's epilogue
    (no add kernel); results as eager's."""
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_M", 64)
    monkeypatch.setattr(gguf_lowering, "DECODE_FIRST_WEIGHTS", 1)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    torch.manual_seed(4)
    lin = GGUFLinear(blocks_of("Q4_K", 96, 256, 5), quant_info("Q4_K").ggml_type, 96, 256)
    x, r = torch.randn(70, 256), torch.randn(rows, 96)
    model = LinearPlus(lin)
    with torch.no_grad():
        check(model, x, r, **tolerances(256, model(x, r)))
    (plan,) = plans
    r_buf = plan.inputs[-1].buffer                     # inputs: x, W's blocks, r
    readers = [d.name for d in plan.dispatches if r_buf in d.bindings]
    assert plan.dispatches[0].name == "gguf_dequant:Q4_K" and readers == [plan.dispatches[1].name] \
        and readers[0].startswith("matmul"), [(d.name, d.bindings) for d in plan.dispatches]
