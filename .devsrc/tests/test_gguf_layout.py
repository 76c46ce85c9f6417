"""The GPU order of GGUF rows (dynamo_vulkan/gguf/gpu_layout.py), read back element by
element the way shaders/gguf_blocks.glsl reads it and held to the CPU's dequantize:
this checks the layout on its own, apart from any kernel."""
import numpy as np
import pytest
import torch

from dynamo_vulkan.gguf import gpu_layout
from dynamo_vulkan.gguf.quants import dequantize, quant_info
from dynamo_vulkan.runtime.plan import base_kind

from gguf_fixtures import blocks_of


def f16(b):
    return float(b.view(np.float16)[0])


def word(row, o):
    return int.from_bytes(row[o:o + 4].tobytes(), "little")


def element(name, row, nb, e):
    """Element e of a regrouped row, decoded as the shader does."""
    ch, k, b = e // 8, e % 8, e // quant_info(name).block_size
    nib = (word(row, 4 * ch) >> (4 * k)) & 15
    if name == "Q4_0":
        return f16(row[16 * nb + 2 * b:][:2]) * (nib - 8)
    if name == "Q4_1":
        return f16(row[16 * nb + 4 * b:][:2]) * nib + f16(row[16 * nb + 4 * b + 2:][:2])
    if name == "Q5_0":
        q = nib | ((word(row, 16 * nb + 4 * b) >> (e % 32)) & 1) << 4
        return f16(row[20 * nb + 2 * b:][:2]) * (q - 16)
    if name == "Q8_0":
        return f16(row[32 * nb + 2 * b:][:2]) * int(row[8 * ch + k:][:1].view(np.int8)[0])
    if name == "Q4_K":
        s, j = 128 * nb + 16 * b, (ch >> 2) & 7
        low, high = int(row[s + 4 + j]), word(row, s + 12) >> (4 * j)
        sc, mn = (low & 15) | (high & 3) << 4, (low >> 4) | (high & 12) << 2
        return f16(row[s:][:2]) * sc * nib - f16(row[s + 2:][:2]) * mn
    if name == "Q6_K":
        i, up = k % 4, k // 4
        q = (word(row, 4 * ch) >> (8 * i + 4 * up)) & 15
        q |= ((word(row, 128 * nb + 4 * (ch >> 1)) >> (8 * i + 4 * (1 - ch % 2) + 2 * up)) & 3) << 4
        sc = int(row[192 * nb + 16 * b + ((ch & 31) >> 1):][:1].view(np.int8)[0])
        return f16(row[208 * nb + 2 * b:][:2]) * sc * (q - 32)
    raise KeyError(name)


@pytest.mark.parametrize("name", sorted(gpu_layout.REGROUP))
def test_regrouped_rows_decode_to_the_same_values(name):
    info = quant_info(name)
    rows, cols = 3, 2 * 256 if info.block_size == 256 else 96    # Q4_0 rows of 3 blocks too
    data = blocks_of(name, rows, cols, 1).numpy()
    kind = gpu_layout.packed_kind(info.ggml_type, cols)
    rb = len(data) // rows
    assert kind == f"u8/{name}/{rb}" and base_kind(kind) == "u8"
    gpu = gpu_layout.gpu_rows(data, kind)
    assert gpu.size == data.size
    nb = cols // info.block_size
    got = np.array([[element(name, gpu[r * rb:(r + 1) * rb], nb, e) for e in range(cols)]
                    for r in range(rows)], np.float32)
    want = dequantize(torch.from_numpy(data), info.ggml_type, rows, cols).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", ["F16", "Q5_1", "Q3_K", "Q5_K"])
def test_other_types_keep_ggml_order(name):
    data = blocks_of(name, 2, 256, 0).numpy()
    kind = gpu_layout.packed_kind(quant_info(name).ggml_type, 256)
    assert kind == "u8"
    assert gpu_layout.gpu_rows(data, kind) is data


def test_partial_rows_are_refused():
    kind = gpu_layout.packed_kind(quant_info("Q4_0").ggml_type, 64)
    with pytest.raises(ValueError, match="whole rows of 36"):
        gpu_layout.gpu_rows(np.zeros(40, np.uint8), kind)
