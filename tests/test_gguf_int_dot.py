"""The integer-dot GGUF mat-vec (gguf_xplanes + gguf_matvec_idot: x as three int8 planes,
packed dot products) against the CPU op, forced on with DYNAMO_VULKAN_INT_DOT=on (lavapipe
is created with shaderIntegerDotProduct by kp patch 7): odd row counts, one row, offset x,
a residual, a weight split over buffers, x with zero, tiny and huge blocks; and which
mat-vecs take it."""
from __future__ import annotations

import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan import device
from dynamo_vulkan.gguf import GGUFLinear
from dynamo_vulkan.gguf.op import gguf_linear
from dynamo_vulkan.gguf.quants import quant_info
from dynamo_vulkan.lowering import gguf as gguf_lowering
from dynamo_vulkan.lowering import gguf_int_dot as int_dot_lowering
from gguf_fixtures import blocks_of
from vk import LinearPlus, check, compiled, lowered_plan, require_int_dot

TYPES = int_dot_lowering.INT_DOT_TYPES


@pytest.fixture(autouse=True)
def _int_dot_on(monkeypatch):
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "on")
    require_int_dot()


def _tol(expected: torch.Tensor) -> dict:
    """fp32 accuracy: the planes hold x to ~2^-24 of each block's largest value."""
    return {"rtol": 2e-5, "atol": 2e-5 * float(expected.abs().max())}


def _kernels(plans) -> list[str]:
    return [d.name.split(":")[0] for p in plans for d in p.dispatches]


# rows of W on 16 bytes, and not (Q6_K at 256 and 768 columns; the rest at 96: every
# 16-byte read then made of words, or of halves where rows start on 2 bytes)
SHAPES = [(name, rows, cols) for name in TYPES for rows, cols in (
    (1, 256), (7, 512), (65, 768)) + (() if name.endswith("_K") else ((9, 96),))]


@pytest.mark.parametrize("nr,wg,unroll", [(2, 64, 1), (1, 32, 2), (2, 64, 2), (2, 8, 3), (1, 8, 4)])   # 8 x 3, 8 x 4: blocks past the row
@pytest.mark.parametrize("name,rows,cols", SHAPES)
def test_matches_cpu(plans, monkeypatch, name, rows, cols, nr, wg, unroll):
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_SHAPES", {(None, kind): (nr, wg) for kind in ("few", "long", "many")})
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_UNROLL", unroll)
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_UNROLLS", {})
    torch.manual_seed(0)
    lin = GGUFLinear(blocks_of(name, rows, cols, rows), quant_info(name).ggml_type, rows, cols)
    for x in (torch.randn(1, cols), torch.randn(1, cols + 3)[:, 3:], torch.randn(1, 1, cols)):
        with torch.no_grad():
            check(lin, x, **_tol(lin(x)))
    assert _kernels(plans[-1:]) == ["gguf_xplanes", "gguf_matvec_idot"]


@pytest.mark.parametrize("precision,count", [("highest", 3), ("high", 2), ("medium", 2)])
@pytest.mark.parametrize("name", TYPES)
def test_planes_follow_the_matmul_precision(plans, monkeypatch, name, precision, count):
    """Three planes (fp32 accuracy) under "highest"; two under "high" and "medium", which
    allow TF32-class error: x to ~2^-16 of each block's largest value, so the products
    stay within 1e-4 of the largest (TF32's 2^-11 is ~5e-4 of each element)."""
    monkeypatch.setenv("DYNAMO_VULKAN_MATMUL_PRECISION", precision)
    torch.manual_seed(5)
    rows, cols = 65, 768
    lin = GGUFLinear(blocks_of(name, rows, cols, 11), quant_info(name).ggml_type, rows, cols)
    for x in (torch.randn(1, cols), torch.randn(1, cols + 1)[:, 1:]):
        with torch.no_grad():
            want = lin(x)
            tol = _tol(want) if count == 3 else {"rtol": 1e-4, "atol": 1e-4 * float(want.abs().max())}
            check(lin, x, **tol)
    notes = [d.note for d in plans[-1].dispatches if d.name.startswith("gguf_xplanes")]
    assert notes == [f"[1x{cols}] as {count} int8 planes"], notes


@pytest.mark.parametrize("name", TYPES)
def test_residual_is_added_by_the_kernel(plans, name):
    torch.manual_seed(1)
    rows, cols = 33, 256
    model = LinearPlus(GGUFLinear(blocks_of(name, rows, cols, 5), quant_info(name).ggml_type, rows, cols))
    x, r = torch.randn(1, cols), torch.randn(1, rows)
    with torch.no_grad():
        check(model, x, r, **_tol(model(x, r)))
    assert _kernels(plans[-1:]) == ["gguf_xplanes", "gguf_matvec_idot"]
    assert plans[-1].dispatches[-1].note.endswith("+ residual (integer dot products)")


def test_blocks_of_zeros_tiny_and_huge_values(plans):
    """Each block has its own scale: a block of zeros, one of 1e-30 and one of 1e30 beside
    normal ones keep fp32 accuracy (per block, relative to its own largest value); a NaN
    in x makes every output NaN, as in eager."""
    torch.manual_seed(2)
    name, rows, cols = "Q8_0", 16, 256
    lin = GGUFLinear(blocks_of(name, rows, cols, 7), quant_info(name).ggml_type, rows, cols)
    x = torch.randn(1, cols)
    x[0, :32] = 0
    x[0, 32:64] *= 1e-30
    huge = x.clone()
    huge[0, 64:96] *= 1e30
    nan = x.clone()
    nan[0, 100] = float("nan")
    with torch.no_grad():
        check(lin, x, **_tol(lin(x)))
        f = compiled(lin)
        torch.testing.assert_close(f(huge), lin(huge), rtol=2e-5, atol=0)
        got = f(nan)
    assert "gguf_matvec_idot" in _kernels(plans)
    assert got.isnan().all(), got       # as eager: every row's dot meets the NaN


def test_split_weight_writes_each_chunks_columns(plans, monkeypatch):
    """A weight over the buffer limit: one mat-vec per chunk, each writing its rows' columns
    of the output, all reading one planes dispatch, with no barrier between them."""
    info = device.device_info()
    monkeypatch.setitem(info, "max_storage_buffer_range", 40 * 272)
    monkeypatch.setitem(info, "name", f"{info['name']} (test limit {40 * 272})")
    torch.manual_seed(3)
    name, rows, cols = "Q8_0", 101, 256
    lin = GGUFLinear(blocks_of(name, rows, cols, 9), quant_info(name).ggml_type, rows, cols)
    x = torch.randn(1, cols)
    with torch.no_grad():
        check(lin, x, **_tol(lin(x)))
    names = _kernels(plans[-1:])
    assert names.count("gguf_matvec_idot") == 3 and names.count("gguf_xplanes") == 1, names
    from dynamo_vulkan.runtime.plan import barriers
    waits = [w for d, w in zip(plans[-1].dispatches, barriers(plans[-1].dispatches))
             if d.name.startswith("gguf_matvec_idot")]
    assert waits == [True, False, False], waits     # the chunks run side by side


class SameX(torch.nn.Module):
    """Three linears of one x (q, k, v) and one of another."""

    def __init__(self, name: str, cols: int):
        super().__init__()
        qt = quant_info(name).ggml_type
        self.lins = torch.nn.ModuleList(GGUFLinear(blocks_of(name, r, cols, r), qt, r, cols)
                                        for r in (16, 9, 9, 5))

    def forward(self, x, y):
        q, k, v, o = self.lins
        return q(x), k(x), v(x), o(y)


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0"])
def test_matvecs_of_one_x_share_its_planes(plans, name):
    torch.manual_seed(4)
    model = SameX(name, 256)
    x, y = torch.randn(1, 256), torch.randn(1, 256)
    with torch.no_grad():
        expected = model(x, y)
        check(model, x, y, **_tol(torch.cat(expected, 1)))
    names = _kernels(plans[-1:])
    assert names.count("gguf_matvec_idot") == 4 and names.count("gguf_xplanes") == 2, names


def _plan(name: str, rows: int, cols: int, m: int = 1):
    qt = quant_info(name).ggml_type
    return lowered_plan(lambda x, b: gguf_linear(x, b, qt, rows, cols),
                        [torch.randn(m, cols), blocks_of(name, rows, cols, 1)], [False, True])


def test_which_matvecs_take_it(monkeypatch):
    """"on": one-row mat-vecs of the types it decodes. "auto"
    (the default): on a GPU, weights of INT_DOT_AUTO_WEIGHTS or more and rows of
    INT_DOT_MIN_COLS, of every type it decodes but Q8_0. "off": none."""
    kernels = lambda *a: [d.name.split(":")[0] for d in _plan(*a).dispatches]  # noqa: E731
    idot = ["gguf_xplanes", "gguf_matvec_idot"]
    assert kernels("Q4_0", 8, 256) == idot
    assert kernels("Q8_0", 8, 256) == idot
    assert kernels("Q4_0", 8, 256, 2) == ["gguf_matvec"]         # two rows of x
    assert kernels("Q4_K", 8, 256) == idot
    assert kernels("Q6_K", 8, 256) == idot
    assert kernels("Q5_0", 8, 256) == ["gguf_matvec"]            # no integer decoding
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "off")
    assert kernels("Q4_0", 8, 256) == ["gguf_matvec"]
    monkeypatch.delenv("DYNAMO_VULKAN_INT_DOT")                  # auto
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_AUTO_WEIGHTS", 8 * 256)
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_MIN_COLS", 256)
    info = device.device_info()
    monkeypatch.setitem(info, "device_type", "PHYSICAL_DEVICE_TYPE_CPU")
    assert kernels("Q4_1", 8, 256) == ["gguf_matvec"]            # a CPU device (lavapipe)
    monkeypatch.setitem(info, "device_type", "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU")
    assert kernels("Q4_1", 8, 256) == idot
    assert kernels("Q4_K", 8, 256) == idot
    assert kernels("Q6_K", 8, 256) == idot
    assert kernels("Q4_0", 8, 256) == idot
    assert kernels("Q8_0", 8, 256) == ["gguf_matvec"]            # not faster unshared
    assert kernels("Q4_1", 7, 256) == ["gguf_matvec"]            # under the size
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_AUTO_WEIGHTS", 8 * 32)
    assert kernels("Q4_1", 8, 32) == ["gguf_matvec"]             # rows too short
    monkeypatch.setitem(info, "integer_dot_product", False)
    assert kernels("Q4_1", 8, 256) == ["gguf_matvec"]


def test_modes_and_a_device_without_the_feature(monkeypatch):
    from dynamo_vulkan import config
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "sometimes")
    with pytest.raises(ValueError, match="DYNAMO_VULKAN_INT_DOT='sometimes'"):
        config.load()
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "on")
    monkeypatch.setitem(device.device_info(), "integer_dot_product", False)
    with pytest.raises(Exception, match="without shaderIntegerDotProduct"):
        _plan("Q4_0", 8, 256)
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "auto")
    assert [d.name.split(":")[0] for d in _plan("Q4_0", 8, 256).dispatches] == ["gguf_matvec"]


class NormQKV(torch.nn.Module):
    """q, k and v of one RMS-normalised x, v with a residual."""

    def __init__(self, name: str, cols: int):
        super().__init__()
        qt = quant_info(name).ggml_type
        self.nw = torch.nn.Parameter(torch.rand(cols) + 0.5, requires_grad=False)
        self.lins = torch.nn.ModuleList(GGUFLinear(blocks_of(name, r, cols, r), qt, r, cols)
                                        for r in (16, 8, 8))

    def forward(self, x, r):
        from dynamo_vulkan.fused import rms_norm
        h = rms_norm(x, self.nw, 1e-6)
        q, k, v = self.lins
        return q(h), k(h), v(h) + r


@pytest.mark.parametrize("name,cols", [(t, 512) for t in TYPES] + [("Q4_0", 800), ("Q8_0", 800)])
def test_rms_norm_goes_into_the_shared_planes(as_gpu, plans, name, cols):
    """Planned as for a GPU (where a norm folds into the mat-vecs that read it): the norm
    is computed once, by the planes kernel, for all three mat-vecs. 800 columns: a row
    that the planes' sum of squares does not cover in whole steps of four loads."""
    torch.manual_seed(5)
    model = NormQKV(name, cols)
    x, r = torch.randn(1, cols) * 3, torch.randn(1, 8)
    with torch.no_grad():
        expected = model(x, r)
        check(model, x, r, **_tol(torch.cat(expected, 1)))
    names = _kernels(plans[-1:])
    assert sorted(names) == ["gguf_matvec_idot"] * 3 + ["gguf_xplanes"], names
    notes = [d.note for d in plans[-1].dispatches]
    assert notes[0].startswith("rms_norm + ") and notes[0].endswith("as 3 int8 planes"), notes
    from dynamo_vulkan.runtime.shaders import head_defines
    planes = plans[-1].dispatches[0]
    assert "X_VEC4" in head_defines(plans[-1].sources[planes.spirv_key])   # x read 4 at a time


class GatedDown(torch.nn.Module):
    """A down projection of silu(gate) * up, with a residual (a decoder's FFN end)."""

    def __init__(self, name: str, cols: int):
        super().__init__()
        self.down = GGUFLinear(blocks_of(name, 24, cols, 11), quant_info(name).ggml_type, 24, cols)

    def forward(self, g, u, r):
        return self.down(torch.nn.functional.silu(g) * u) + r


@pytest.mark.parametrize("name", TYPES)
def test_elementwise_producer_goes_into_the_planes(as_gpu, plans, name):
    """Planned as for a GPU (where an elementwise producer folds into the mat-vec's load):
    silu(gate) * up is computed by the planes kernel as it loads x, no kernel of its own."""
    torch.manual_seed(6)
    model = GatedDown(name, 768)
    g, u, r = torch.randn(1, 768), torch.randn(1, 768), torch.randn(1, 24)
    with torch.no_grad():
        check(model, g, u, r, **_tol(model(g, u, r)))
    assert _kernels(plans[-1:]) == ["gguf_xplanes", "gguf_matvec_idot"]
    notes = [d.note for d in plans[-1].dispatches]
    assert notes[0].startswith("elementwise + "), notes
    assert notes[1].endswith("+ residual (integer dot products)"), notes


def test_auto_takes_it_where_a_prologue_is_folded_in(as_gpu, plans, monkeypatch):
    """"auto" on a GPU: a mat-vec with an elementwise (or norm) prologue takes it for every
    type from INT_DOT_PROLOGUE_WEIGHTS and rows of INT_DOT_MIN_COLS; without one,
    Q8_0 keeps the fp32 kernel (the sizes set small here, to fit the test's weights)."""
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "auto")
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_PROLOGUE_WEIGHTS", 24 * 512)
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_MIN_COLS", 768)
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_AUTO_WEIGHTS", 24 * 512)
    torch.manual_seed(7)
    for cols, want in ((768, ["gguf_xplanes", "gguf_matvec_idot"]), (512, ["gguf_matvec"])):
        model = GatedDown("Q8_0", cols)     # 512: rows too short for it
        g, u, r = torch.randn(1, cols), torch.randn(1, cols), torch.randn(1, 24)
        with torch.no_grad():
            check(model, g, u, r, **_tol(model(g, u, r)))
        assert _kernels(plans[-1:]) == want, cols
    with torch.no_grad():
        check(model.down, g, **_tol(model.down(g)))     # no prologue: Q8_0 stays fp32
    assert _kernels(plans[-1:]) == ["gguf_matvec"]


class NormHead(torch.nn.Module):
    """A final RMSNorm and the LM head after it."""

    def __init__(self, name: str, rows: int, cols: int):
        super().__init__()
        self.nw = torch.nn.Parameter(torch.rand(cols) + 0.5, requires_grad=False)
        self.head = GGUFLinear(blocks_of(name, rows, cols, 13), quant_info(name).ggml_type, rows, cols)

    def forward(self, x):
        from dynamo_vulkan.fused import rms_norm
        return self.head(rms_norm(x, self.nw, 1e-6))


@pytest.mark.parametrize("mode,want", [("auto", ["gguf_xplanes", "gguf_matvec_idot"]),
                                       ("off", ["rowwise", "gguf_matvec"])])
def test_norm_before_a_weight_of_many_rows_goes_into_the_planes(as_gpu, plans, monkeypatch, mode, want):
    """A norm before a weight of more than NORM_MAX_ROWS rows (an LM head, a fused gate|up):
    on the integer-dot path the planes normalise x once, whatever the rows, so the norm
    gets no kernel of its own; on the fp32 path it keeps its kernel (every row group would
    normalise x again). The limits set small here, to fit the test's weight."""
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", mode)
    monkeypatch.setattr(gguf_lowering, "NORM_MAX_ROWS", 16)
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_PROLOGUE_WEIGHTS", 24 * 512)
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_MIN_COLS", 512)
    torch.manual_seed(8)
    model = NormHead("Q4_K", 40, 512)
    x = torch.randn(1, 512) * 3
    with torch.no_grad():
        check(model, x, **_tol(model(x)))
    assert _kernels(plans[-1:]) == want


class AttentionOut(torch.nn.Module):
    """Decode attention, its heads joined into one row, the output projection and the
    residual: a decoder layer's o."""

    def __init__(self, name: str, hq: int, d: int, rows: int = 24):
        super().__init__()
        self.hq, self.d = hq, d
        self.o = GGUFLinear(blocks_of(name, rows, hq * d, 17), quant_info(name).ggml_type, rows, hq * d)

    def forward(self, q, k, v, mask, res):
        from dynamo_vulkan.fused import attention
        out = attention(q, k, v, mask, 1.0)
        return self.o(out.transpose(0, 1).reshape(1, 1, self.hq * self.d)) + res


@pytest.mark.parametrize("precision,count", [("highest", 3), ("high", 2)])
@pytest.mark.parametrize("name", TYPES)
def test_decode_attention_writes_the_output_projections_planes(as_gpu, plans, monkeypatch, name,
                                                                 precision, count):
    """Decode attention's merge writes its output's int8 planes (per head, whole blocks of
    32) in the layout and byte order the output projection's weight type reads: o takes
    integer dots with no planes kernel and no level of its own; a row whose every key is
    masked (NaN, as eager's) gives NaN through the planes' scales."""
    monkeypatch.setenv("DYNAMO_VULKAN_MATMUL_PRECISION", precision)
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_MIN_COLS", 256)
    hq, hkv, c, d = 4, 2, 256, 64
    torch.manual_seed(9)
    model = AttentionOut(name, hq, d)
    q, k, v = torch.randn(hq, 1, d), torch.randn(hkv, c, d) * 2, torch.randn(hkv, c, d) * 3
    res = torch.randn(1, 1, 24)
    fn = compiled(model)
    for live in (100, 1, 0):
        mask = torch.zeros(1, c, dtype=torch.bool)
        mask[0, :live] = True
        with torch.no_grad():
            want, got = model(q, k, v, mask, res), fn(q, k, v, mask, res)
        tol = _tol(want) if count == 3 else {"rtol": 1e-4, "atol": 1e-4 * float(want.abs().max())}
        torch.testing.assert_close(got, want, **(tol if live else {}), equal_nan=True)
        assert got.isnan().all() == (live == 0)
    assert not dynamo_vulkan.reports()[-1].cpu_nodes
    assert _kernels(plans[-1:]) == ["mask_ranges", "attention", "gguf_matvec_idot"]
    assert plans[-1].dispatches[1].note.endswith(f"(with its output's {count} int8 planes)")


def test_attention_output_read_twice_keeps_the_planes_kernel(as_gpu, plans, monkeypatch):
    """An attention output read by something beside the projection gets no planes from the
    merge (planes_for_reader follows one reader only): o makes its own where it takes
    integer dots."""
    monkeypatch.setattr(int_dot_lowering, "INT_DOT_MIN_COLS", 256)
    hq, hkv, c, d = 4, 2, 256, 64
    model = AttentionOut("Q4_K", hq, d)

    def twice(q, k, v, mask, res):
        from dynamo_vulkan.fused import attention
        out = attention(q, k, v, mask, 1.0)
        return model.o(out.transpose(0, 1).reshape(1, 1, hq * d)) + res, out * 2
    torch.manual_seed(10)
    mask = torch.ones(1, c, dtype=torch.bool)
    args = (torch.randn(hq, 1, d), torch.randn(hkv, c, d), torch.randn(hkv, c, d), mask, torch.randn(1, 1, 24))
    with torch.no_grad():
        check(twice, *args, **_tol(model(*args)))
    att = [d.note for d in plans[-1].dispatches if d.name == "attention"]
    assert len(att) == 1 and "merged by the last" in att[0] and "int8 planes" not in att[0], att
    assert "gguf_xplanes" in _kernels(plans[-1:])
