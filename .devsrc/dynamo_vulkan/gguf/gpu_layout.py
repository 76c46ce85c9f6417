"""The byte order GGUF rows take on the GPU (the same bytes, regrouped).

GGML's blocks interleave scales and quants (Q4_0: 2 bytes of scale, then 16 of
nibbles, 18 in all), so a kernel that reads them from 32-bit words needs two
loads and a select per word (blocks start at any even byte), and element j
sits beside element j + 16. Rows of the types below are regrouped once, as
they are uploaded, into regions of one field each, over all the row's blocks:
first every block's quants, then (per type) high bits, scales. In the quants,
chunk c of a block (elements 8c..8c+7) is one word for 4-bit types (nibble k:
element 8c + k) and two for Q8_0 (byte k), so a kernel thread reads its chunk
with one aligned load and decodes it without shifting (shaders/gguf_blocks.glsl).

A row keeps its size, so rows split over buffers (lowering/gguf.py RowChunks)
split the same way. Types not listed keep GGML's order. The CPU never sees this
order: it is made in host_words, from the caller's tensor, on each upload.
"""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .quants import QUANT_TYPES, quant_info, row_nbytes

U8 = "u8"      # a packed-bytes buffer's kind (runtime/plan.py); with a layout: U8/<type>/<row bytes>
PIECE_BYTES = 4 << 20   # bytes of rows gpu_rows regroups at a time, per thread
# threads that regroup pieces at once (numpy releases the GIL in its array operations;
# a 7B model's weights are seconds of work on one: docs/journal.md, session 31); each
# thread's temporaries are a few times PIECE_BYTES, which the upload's host memory grows by
MAX_THREADS = 8


def _pack4(q: np.ndarray) -> np.ndarray:
    """[n, 2m] values < 16 -> [n, m] bytes, element 2j in the low nibble of byte j."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Legacy types' 16 bytes -> 32 values in element order (low nibbles first)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _q4_0(b):
    return [_pack4(_nibbles(b[:, 2:18])), b[:, 0:2]]


def _q4_1(b):
    return [_pack4(_nibbles(b[:, 4:20])), b[:, 0:4]]


def _q5_0(b):
    return [_pack4(_nibbles(b[:, 6:22])), b[:, 2:6], b[:, 0:2]]


def _q8_0(b):
    return [b[:, 2:34], b[:, 0:2]]


def _q4_k(b):
    n = b.shape[0]
    # element 64g + 32h + l is nibble h of qs[32g + l]; packed byte j of (g, h) holds
    # elements 2j and 2j + 1, the nibbles h of qs[32g + 2j] and qs[32g + 2j + 1]
    pair = b[:, 16:144].reshape(n, 4, 16, 2)
    b0, b1 = pair[..., 0], pair[..., 1]
    quants = np.stack([(b0 & 0x0F) | (b1 << 4), (b0 >> 4) | (b1 & 0xF0)], axis=2)
    s = b[:, 4:16].reshape(n, 3, 4)
    sd, sm, smd = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([sd & 0x3F, (smd & 0x0F) | ((sd >> 2) & 0x30)], axis=1)
    mn = np.concatenate([sm & 0x3F, (smd >> 4) | ((sm >> 2) & 0x30)], axis=1)
    # sub-block j: byte j = low nibbles of its scale and min; bits 4j.. of the word after
    # them = their high 2 bits each (no branch on j in the kernel)
    low = (sc & 0x0F) | ((mn & 0x0F) << 4)
    high = ((sc >> 4) | ((mn >> 4) << 2)).astype(np.uint32) << (4 * np.arange(8, dtype=np.uint32))
    high = np.bitwise_or.reduce(high, axis=1).astype("<u4").view(np.uint8).reshape(n, 4)
    return [quants.reshape(n, 128), np.concatenate([b[:, 0:4], low.astype(np.uint8), high], axis=1)]


def _q6_k(b):
    n = b.shape[0]
    # ql byte 64a + t holds the low nibbles of elements 128a + t (bits 0-3) and
    # 128a + 64 + t (bits 4-7). Chunk c's word: byte i = the low nibbles of its elements
    # i and i + 4, which sit in bytes t and t + 4 of one 64-byte half, at one shift.
    ql = b[:, 0:128].reshape(n, 2, 8, 2, 4)           # [a, chunk in half, i < 4 or not, i]
    q0, q1 = ql[:, :, :, 0], ql[:, :, :, 1]
    low = np.stack([(q0 & 0x0F) | (q1 << 4), (q0 >> 4) | (q1 & 0xF0)], axis=2)   # [a, shift, ...]
    # qh byte 32a + t holds the high bit pairs of elements 128a + 32s + t at bits 2s. A
    # chunk pair's word: byte i = high bit pairs of the even chunk's elements i, i + 4 at
    # bits 4, 6 and of the odd chunk's at bits 0, 2 (a shift puts either beside its nibble)
    qh = b[:, 128:192].reshape(n, 2, 1, 2, 2, 2, 4)   # [a, s, pair, chunk, i < 4 or not, i]
    v = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1, 1, 1, 1)) & 3
    high = (v[..., 0, 0, :] << 4) | (v[..., 0, 1, :] << 6) | v[..., 1, 0, :] | (v[..., 1, 1, :] << 2)
    return [low.reshape(n, 128), high.reshape(n, 64), b[:, 192:208], b[:, 208:210]]


# GGML type name -> [n, block bytes] -> the regions' per-block bytes, in row order
REGROUP = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}


def packed_kind(qtype: int, cols: int) -> str:
    """The buffer kind that GGUF rows of this type and length are stored as."""
    name = QUANT_TYPES[qtype].name
    return f"{U8}/{name}/{row_nbytes(qtype, cols)}" if name in REGROUP else U8


def row_bytes_of(kind: str) -> int | None:
    """The row size a regrouped kind names (None: GGML's order, any size)."""
    return None if kind == U8 else int(kind.rsplit("/", 1)[1])


def gpu_rows(data: np.ndarray, kind: str, out: np.ndarray | None = None) -> np.ndarray:
    """Whole rows of GGUF bytes (uint8, flat) in the GPU order of `kind`, written into
    `out` (uint8, as many bytes) when given. Regrouped PIECE_BYTES of rows at a time:
    numpy's temporaries are several times the bytes they regroup, so a 128 MiB chunk of a
    7B model's output head, regrouped whole, took about 0.5 GB more host memory."""
    if out is not None and out.size != data.size:
        raise ValueError(f"{data.size} bytes of GGUF rows, written into {out.size}")
    if kind == U8:
        if out is None:
            return data
        out[:] = data
        return out
    name, row_bytes = kind.split("/")[1], row_bytes_of(kind)
    info = quant_info(name)
    if data.size % row_bytes:
        raise ValueError(f"{data.size} bytes of {name} are not whole rows of {row_bytes}")
    rows, nb = data.size // row_bytes, row_bytes // info.type_size
    out = (np.empty(data.size, np.uint8) if out is None else out).reshape(rows, row_bytes)
    step = max(1, PIECE_BYTES // row_bytes)

    def piece(r0: int) -> None:
        r1 = min(rows, r0 + step)
        regions = REGROUP[name](data[r0 * row_bytes:r1 * row_bytes].reshape((r1 - r0) * nb, info.type_size))
        col = 0
        for r in regions:
            r = r.reshape(r1 - r0, -1)
            out[r0:r1, col:col + r.shape[1]] = r
            col += r.shape[1]
        if col != row_bytes:
            raise AssertionError(f"{name} GPU layout holds {col} bytes per row, not {row_bytes}")

    starts = range(0, rows, step)
    threads = min(MAX_THREADS, len(starts), len(os.sched_getaffinity(0)))
    if threads <= 1:
        for r0 in starts:
            piece(r0)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="gguf-regroup") as pool:
            for f in [pool.submit(piece, r0) for r0 in starts]:
                f.result()
    return out.reshape(-1)


@functools.lru_cache(maxsize=None)
def bit_sources(name: str) -> tuple[tuple[int, ...], np.ndarray]:
    """The regroup of `name`'s blocks as a bit permutation, for a kernel that regroups rows
    on the GPU (shaders/upload.comp): (each region's bytes per block, in row order; for
    every bit of one block's regrouped bytes, the bit of the GGML block it comes from).
    Found by regrouping one block per input bit, that bit alone set; a regroup that is
    not a permutation of the block's bits (a bit from two sources, or from none) raises."""
    info = quant_info(name)
    nbits = 8 * info.type_size
    probe = np.zeros((nbits, info.type_size), np.uint8)
    src = np.arange(nbits)
    probe[src, src // 8] = 1 << (src % 8)
    regions = REGROUP[name](probe)
    out = np.concatenate([r.reshape(nbits, -1) for r in regions], axis=1)
    widths = tuple(int(r.reshape(nbits, -1).shape[1]) for r in regions)
    bits = np.unpackbits(out, axis=1, bitorder="little")      # [source bit, output bit]
    hits = bits.sum(axis=0)
    zero = np.concatenate([r.reshape(1, -1) for r in REGROUP[name](np.zeros((1, info.type_size), np.uint8))],
                          axis=1)
    if out.shape[1] != info.type_size or (hits != 1).any() or zero.any():
        raise AssertionError(f"{name}'s GPU layout is not a permutation of its blocks' bits")
    return widths, bits.argmax(axis=0).astype(np.uint32)
