"""runtime/upload.py: batched uploads, and GGUF rows regrouped by the upload kernel
(shaders/upload.comp) exactly as gguf/gpu_layout.gpu_rows regroups them on the host."""
import numpy as np
import pytest
import torch

from dynamo_vulkan import device
from dynamo_vulkan.gguf.gpu_layout import REGROUP, bit_sources, packed_kind
from dynamo_vulkan.gguf.quants import QUANT_TYPES, quant_info
from dynamo_vulkan.runtime import upload
from dynamo_vulkan.runtime.program import download
from dynamo_vulkan.runtime.words import host_words, packed_bytes

pytestmark = pytest.mark.skipif(not device.is_available(), reason="no Vulkan device")

QTYPE = {t.name: q for q, t in QUANT_TYPES.items()}


def _storage(words: int):
    import kp
    mgr = device.manager()
    return mgr.tensor_t(np.full(max(1, words), 0xDEADBEEF, np.uint32), tensor_type=kp.TensorTypes.storage)


def _rows(name: str, rows: int, blocks: int, seed: int) -> tuple[np.ndarray, str]:
    """Random GGUF rows (every bit pattern: the regroup moves bits, whatever they mean)."""
    info = quant_info(name)
    data = np.random.default_rng(seed).integers(0, 256, rows * blocks * info.type_size, dtype=np.uint8)
    return data, packed_kind(QTYPE[name], blocks * info.block_size)


@pytest.mark.parametrize("name", sorted(REGROUP))
def test_bit_sources_are_a_permutation_of_the_block_bits(name):
    widths, sources = bit_sources(name)
    size = quant_info(name).type_size
    assert sum(widths) == size and sorted(sources.tolist()) == list(range(8 * size))


@pytest.mark.parametrize("on_device", [True, False], ids=["kernel", "host"])
@pytest.mark.parametrize("name", sorted(REGROUP))
def test_gguf_rows_land_in_the_gpu_order(name, on_device):
    # 7 rows of 3 blocks: rows of Q6_K and Q4_0 end off a word; a staging batch of 4 rows'
    # bytes splits the weight into pieces and submits
    data, kind = _rows(name, 7, 3, seed=len(name))
    row_bytes = 3 * quant_info(name).type_size
    want = host_words(torch.from_numpy(data), kind)
    dst = _storage(want.size)
    staging = -(-4 * row_bytes // 4) * 4
    with upload.Batch(device.manager(), regroup_on_device=on_device, staging_bytes=staging) as b:
        b.gguf_rows(dst, data, kind)
    np.testing.assert_array_equal(download(device.manager(), dst, want.size), want)


def test_a_span_of_rows_and_many_small_uploads_share_submits():
    mgr = device.manager()
    data, kind = _rows("Q4_K", 6, 2, seed=1)
    row_bytes = 2 * 144
    span = (2 * row_bytes, 3 * row_bytes)
    t = torch.from_numpy(data)
    want_rows = host_words(t, kind, span)
    rng = np.random.default_rng(2)
    smalls = [rng.integers(0, 2**32, n, dtype=np.uint32) for n in (1, 5, 257, 1000, 3)]
    dsts = [_storage(s.size) for s in smalls]
    rows_dst = _storage(want_rows.size)
    with upload.Batch(mgr, regroup_on_device=True, staging_bytes=4096) as b:
        for d, s in zip(dsts, smalls):
            b.words(d, s)
        b.gguf_rows(rows_dst, packed_bytes(t, span), kind)
    for d, s in zip(dsts, smalls):
        np.testing.assert_array_equal(download(mgr, d, s.size), s)
    np.testing.assert_array_equal(download(mgr, rows_dst, want_rows.size), want_rows)


def test_words_larger_than_the_staging_go_in_pieces():
    mgr = device.manager()
    words = np.random.default_rng(3).integers(0, 2**32, 10_001, dtype=np.uint32)
    dst = _storage(words.size)
    with upload.Batch(mgr, regroup_on_device=False, staging_bytes=4 * 1000) as b:
        b.words(dst, words)
    np.testing.assert_array_equal(download(mgr, dst, words.size), words)


def test_a_failed_batch_frees_its_memory_and_the_next_one_works():
    mgr = device.manager()
    dst = _storage(4)
    b = upload.Batch(mgr, regroup_on_device=False)
    with pytest.raises(RuntimeError, match="fill failed"):
        with b:
            b.words(dst, np.arange(4, dtype=np.uint32))
            b._items[0].fill = lambda out: (_ for _ in ()).throw(RuntimeError("fill failed"))
            b.close()
    assert b._staging is None and b._temp is None and not b._items
    with upload.Batch(mgr, regroup_on_device=False) as b:
        b.words(dst, np.arange(4, dtype=np.uint32) + 7)
    np.testing.assert_array_equal(download(mgr, dst, 4), np.arange(4) + 7)
