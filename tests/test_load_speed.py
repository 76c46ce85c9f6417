"""The fast paths of loading a GGUF model give exactly what the plain ones give: positional,
threaded reads of tensor bytes (llm/file_read.py, GGUFFile.raw/raw_concat) and the
vectorised tokenizer construction (its merges)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from dynamo_vulkan.gguf import GGUFError  # noqa: E402
from dynamo_vulkan.llm import file_read  # noqa: E402
from dynamo_vulkan.llm.reader import open_gguf  # noqa: E402

from gguf_fixtures import write_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def blob(tmp_path_factory) -> tuple[Path, bytes]:
    data = np.random.default_rng(0).integers(0, 256, 300_001, dtype=np.uint8).tobytes()
    path = tmp_path_factory.mktemp("read") / "blob.bin"
    path.write_bytes(data)
    return path, data


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf", "llama")


# spans: one byte, odd offsets and lengths, empty, a span of many pieces, the file's last byte
SPANS = [(0, 1), (7, 1000), (123, 0), (4097, 100_003), (299_000, 1001), (300_000, 1)]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("piece", [997, 4096, 1 << 20])
def test_read_spans_gives_the_files_bytes(blob, threads, piece):
    path, data = blob
    bufs = [np.full(n, 0xAA, np.uint8) for _, n in SPANS]
    with open(path, "rb") as fh:
        file_read.read_spans(fh, [(off, b) for (off, _), b in zip(SPANS, bufs)],
                             piece=piece, threads=threads)
    for (off, n), b in zip(SPANS, bufs):
        assert b.tobytes() == data[off:off + n], (off, n)


def test_read_spans_without_preadv(blob, monkeypatch):
    """The seek-and-readinto path of platforms without preadv reads the same bytes."""
    path, data = blob
    monkeypatch.delattr(os, "preadv", raising=False)
    bufs = [np.zeros(n, np.uint8) for _, n in SPANS]
    with open(path, "rb") as fh:
        file_read.read_spans(fh, [(off, b) for (off, _), b in zip(SPANS, bufs)], piece=5000, threads=4)
    for (off, n), b in zip(SPANS, bufs):
        assert b.tobytes() == data[off:off + n], (off, n)


@pytest.mark.parametrize("threads", [1, 2])
def test_read_spans_past_the_end_raises(blob, threads):
    path, data = blob
    buf = np.zeros(5000, np.uint8)
    with open(path, "rb") as fh, pytest.raises(EOFError, match=f"ends at byte {len(data)}"):
        file_read.read_spans(fh, [(0, np.zeros(3000, np.uint8)), (len(data) - 10, buf)], piece=1024,
                             threads=threads)
    assert buf[:10].tobytes() == data[-10:]


def test_read_spans_rejects_a_bad_piece(blob):
    with open(blob[0], "rb") as fh, pytest.raises(ValueError, match="piece"):
        file_read.read_spans(fh, [(0, np.zeros(4, np.uint8))], piece=-1)


@pytest.mark.parametrize("piece", [64, 1 << 20])      # tensors larger than a piece, and smaller
def test_raw_is_the_files_bytes(model_path, monkeypatch, piece):
    monkeypatch.setattr(file_read, "PIECE_BYTES", piece)
    data = model_path.read_bytes()
    with open_gguf(model_path) as f:
        assert max(i.nbytes for i in f.tensors.values()) > 64
        for info in f.tensors.values():
            got = f.raw(info.name)
            assert got.dtype == torch.uint8 and got.shape == (info.nbytes,)
            assert got.numpy().tobytes() == data[info.offset:info.offset + info.nbytes], info.name
        names = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "output_norm.weight"]
        joined = f.raw_concat(names)
        assert torch.equal(joined, torch.cat([f.raw(n) for n in names]))


def test_raw_matches_the_gguf_reader(model_path):
    """The gguf package's own reader (a mapping of the file) gives the same tensors."""
    names = ["blk.1.ffn_gate.weight", "blk.1.ffn_up.weight"]
    with open_gguf(model_path) as fast, open_gguf(model_path, parser="gguf") as slow:
        assert torch.equal(fast.raw_concat(names), slow.raw_concat(names))
        assert torch.equal(fast.raw(names[0]), slow.raw(names[0]))


def test_the_file_is_not_mapped_once_open(model_path):
    """Tensor data is read, not mapped: no page of the file counts in the process's RSS."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        pytest.skip("no /proc/self/maps on this platform")
    with open_gguf(model_path) as f:
        f.raw("token_embd.weight")
        assert str(model_path) not in maps.read_text()


def test_a_file_that_shrinks_after_opening_is_truncated(model_path, tmp_path):
    path = tmp_path / "shrinks.gguf"
    path.write_bytes(model_path.read_bytes())
    with open_gguf(path) as f:
        last = max(f.tensors.values(), key=lambda i: i.offset)
        os.truncate(path, last.offset + last.nbytes // 2)
        with pytest.raises(GGUFError, match=f"truncated GGUF file: it shrank.*{last.name}"):
            f.raw(last.name)
        first = min(f.tensors.values(), key=lambda i: i.offset)
        assert f.raw(first.name).numel() == first.nbytes


def test_closed_and_header_only_files_raise(model_path):
    f = open_gguf(model_path)
    f.close()
    with pytest.raises(GGUFError, match="closed"):
        f.raw("token_embd.weight")
    with open_gguf(model_path, header_only=True) as h, pytest.raises(GGUFError, match="header-only"):
        h.raw_concat(["token_embd.weight", "output_norm.weight"])
