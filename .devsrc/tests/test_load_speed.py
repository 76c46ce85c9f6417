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


# ---------------------------------------------------------------------- tokenizer merges

from dynamo_vulkan.llm import merges as M  # noqa: E402


def plain_spm_merges(tokens, scores):
    """The merges of a SentencePiece vocabulary one split at a time (the reference)."""
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    cand = [(-scores[i], i, k) for t, i in vocab.items() for k in range(1, len(t))
            if t[:k] in vocab and t[k:] in vocab]
    cand.sort()
    return [(tokens[i][:k], tokens[i][k:]) for _, i, k in cand]


def spm_vocab(seed: int, n: int = 3000, alphabet: str = "ab\u2581\u00e9\u4e2d\U0001F600<>") -> tuple[list, list]:
    """Single characters, short random texts, then texts glued from earlier tokens (so many
    of their splits are tokens) of up to 40 characters, a few repeated; scores with ties."""
    rng = np.random.default_rng(seed)
    tokens = list(alphabet)
    while len(tokens) < n // 2:
        tokens.append("".join(rng.choice(list(alphabet), int(rng.integers(2, 6)))))
    while len(tokens) < n:
        t = "".join(tokens[j] for j in rng.integers(0, len(tokens), int(rng.integers(2, 4))))
        if len(t) <= 40:
            tokens.append(t)
    tokens += tokens[100:110]                     # repeated texts: the first id counts
    scores = rng.integers(-20, 0, len(tokens)).astype(float).tolist()
    return tokens, scores


@pytest.mark.parametrize("seed", [0, 1])
def test_spm_merges_equal_the_plain_ones(seed):
    tokens, scores = spm_vocab(seed)
    lens = np.bincount([len(t) for t in tokens])
    assert lens[2:M._VECTOR_MAX_LEN].max() >= M._VECTOR_MIN_ROWS   # some lengths vectorised
    assert len(lens) > M._VECTOR_MAX_LEN + 1                        # some too long for it
    got = M.spm_merges(tokens, scores)
    assert len(got) > len(tokens) // 2
    assert got == plain_spm_merges(tokens, scores)


def test_spm_merges_with_hash_collisions(monkeypatch):
    """Texts whose row hashes collide (code points summed) are still told apart exactly,
    and a length whose tokens share a hash compares the texts themselves."""
    monkeypatch.setattr(M, "_MULTIPLIERS", np.ones(M._VECTOR_MAX_LEN, np.uint64))
    tokens, scores = spm_vocab(2, n=1500, alphabet="abcd")
    assert {"ab", "ba"} <= set(tokens)
    assert M.spm_merges(tokens, scores) == plain_spm_merges(tokens, scores)


@pytest.mark.parametrize("texts", [["ab", "cd"], ["ab", "ba", "cd"]])   # keys unique, and not
def test_same_length_membership_is_exact(monkeypatch, texts):
    monkeypatch.setattr(M, "_MULTIPLIERS", np.ones(M._VECTOR_MAX_LEN, np.uint64))   # "ab" ~ "ba"
    group = M._SameLength(np.array(texts, dtype="<U2"))
    assert group.unique == (len(texts) == 2)
    queries = ["ab", "ba", "dc", "cd", "zz", "aa"]
    rows = np.array(queries, dtype="<U2").view(np.uint32).reshape(len(queries), 2)
    assert group.contains(rows).tolist() == [q in texts for q in queries]


def test_spm_merges_of_texts_with_nul():
    """numpy pads unicode texts with NULs: texts ending in NUL are still told apart
    (each is compared only with texts of its own length)."""
    tokens, scores = spm_vocab(3, n=400, alphabet="ab\x00")
    assert any(t.endswith("\x00") for t in tokens)
    assert M.spm_merges(tokens, scores) == plain_spm_merges(tokens, scores)


def test_spm_merges_of_tiny_vocabularies():
    assert M.spm_merges([], []) == []
    assert M.spm_merges(["a"], [0.0]) == []
    assert M.spm_merges(["a", "b", "ab", "ba"], [0.0, 0.0, -1.0, -0.5]) == [("b", "a"), ("a", "b")]


def test_split_merges_only_where_it_is_llama_cpps_cut():
    vocab = {t: i for i, t in enumerate(["a", "b", "ab", " ", " a"])}
    assert M.split_merges(["a b", "ab a"]) == [("a", "b"), ("ab", "a")]
    assert M.split_merges([]) == []
    for bad in (["a b", "a b"], ["ab"], ["  a"], ["a b c"], ["ab", "a b c"]):
        assert M.split_merges(bad) is None, bad
    # llama.cpp cuts at the first space after the first character
    assert M.bpe_merges(["  a", "a b", "a b"], vocab) == [(" ", "a"), ("a", "b")]


class _VocabOnly:
    """The metadata from_gguf reads, without a file."""

    path, architecture = "vocab-only.gguf", "llama"

    def __init__(self, **values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


def test_gpt2_tokenizer_drops_merges_llama_cpp_skips():
    """Merges tokenizers refuses (a piece or a result that is no token), a repeated one and
    one without a space give the tokenizer of the merges llama.cpp keeps."""
    from gguf_fixtures import TINY_MERGES, tiny_vocab
    from dynamo_vulkan.llm.tokenizer import GGUFTokenizer

    tokens, types = tiny_vocab()
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types}
    junk = ["Ġ zq", "h l", "h e", "e"]
    clean = GGUFTokenizer.from_gguf(_VocabOnly(**meta, **{"tokenizer.ggml.merges": TINY_MERGES}))
    mixed = GGUFTokenizer.from_gguf(_VocabOnly(**meta, **{"tokenizer.ggml.merges": TINY_MERGES[:5] + junk + TINY_MERGES[5:]}))

    def merges_of(tok):
        import json
        return [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                for m in json.loads(tok.tokenizer.to_str())["model"]["merges"]]

    assert M.split_merges(TINY_MERGES) is not None
    assert merges_of(mixed) == merges_of(clean) == [tuple(m.split(" ")) for m in TINY_MERGES]
    text = "hello the world, hell"
    assert mixed.encode(text) == clean.encode(text)


def test_own_block_sizes_are_the_gguf_packages():
    """The reader sizes tensors of the types we decode from our table (no gguf import)."""
    import gguf
    from dynamo_vulkan.gguf.quants import QUANT_TYPES
    from dynamo_vulkan.llm.reader import _type_sizes

    for t, info in QUANT_TYPES.items():
        assert (info.block_size, info.type_size) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t)], info.name
        assert _type_sizes(t) == (info.block_size, info.type_size)
    iq2 = int(gguf.GGMLQuantizationType.IQ2_XXS)
    assert iq2 not in QUANT_TYPES and _type_sizes(iq2) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.IQ2_XXS]
    with pytest.raises(GGUFError, match="unknown tensor type id 9999"):
        _type_sizes(9999)
