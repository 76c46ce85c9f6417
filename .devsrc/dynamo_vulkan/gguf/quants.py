"""GGUF quantization types: the table of supported types and a pure-torch dequantizer.

The dequantizer is vectorized over blocks (no Python loop over blocks) and is bit-exact
with ``gguf.quants.dequantize`` (the gguf Python package is the ground truth for the
block layouts; every formula below evaluates the same float32 operations in the same
order, so the results are identical, not merely close).

Layouts (bytes of one block, little endian; ``d``/``m``/``dmin`` are fp16):

====== ===== ===== ==========================================================
type   block bytes layout
====== ===== ===== ==========================================================
F32        1     4 float32
F16        1     2 float16
BF16       1     2 bfloat16
Q4_0      32    18 d, qs[16]            x = d * (nibble - 8)
Q4_1      32    20 d, m, qs[16]         x = d * nibble + m
Q5_0      32    22 d, qh[4], qs[16]     x = d * ((nibble | hbit << 4) - 16)
Q5_1      32    24 d, m, qh[4], qs[16]  x = d * (nibble | hbit << 4) + m
Q8_0      32    34 d, qs[32] (int8)     x = d * q
Q2_K     256    84 scales[16], qs[64], d, dmin
Q3_K     256   110 hmask[32], qs[64], scales[12], d
Q4_K     256   144 d, dmin, scales[12], qs[128]
Q5_K     256   176 d, dmin, scales[12], qh[32], qs[128]
Q6_K     256   210 ql[128], qh[64], scales[16] (int8), d
====== ===== ===== ==========================================================

Nibble order of the legacy types: byte ``j`` of ``qs`` holds element ``j`` in its low
nibble and element ``j + 16`` in its high nibble.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from .errors import UnsupportedQuantType

__all__ = [
    "QType",
    "QuantInfo",
    "QUANT_TYPES",
    "SUPPORTED_NAMES",
    "UnsupportedQuantType",
    "quant_info",
    "is_supported",
    "qtype_name",
    "row_nbytes",
    "tensor_nbytes",
    "dequantize",
]

QK_K = 256


class QType(IntEnum):
    """The GGML type ids (``gguf.GGMLQuantizationType`` values) of the supported types."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30


@dataclass(frozen=True)
class QuantInfo:
    name: str
    ggml_type: int  # the gguf.GGMLQuantizationType value
    block_size: int  # elements per block
    type_size: int  # bytes per block


_SIZES = {
    QType.F32: (1, 4),
    QType.F16: (1, 2),
    QType.BF16: (1, 2),
    QType.Q4_0: (32, 2 + 16),
    QType.Q4_1: (32, 2 + 2 + 16),
    QType.Q5_0: (32, 2 + 4 + 16),
    QType.Q5_1: (32, 2 + 2 + 4 + 16),
    QType.Q8_0: (32, 2 + 32),
    QType.Q2_K: (QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    QType.Q3_K: (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    QType.Q4_K: (QK_K, 2 + 2 + 12 + QK_K // 2),
    QType.Q5_K: (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    QType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}

QUANT_TYPES: dict[int, QuantInfo] = {
    int(t): QuantInfo(t.name, int(t), bs, ts) for t, (bs, ts) in _SIZES.items()
}
SUPPORTED_NAMES: tuple[str, ...] = tuple(i.name for i in QUANT_TYPES.values())
_BY_NAME = {i.name: i for i in QUANT_TYPES.values()}


def qtype_name(qtype) -> str:
    """A readable name for a type id, a gguf enum member or a name, supported or not."""
    if isinstance(qtype, str):
        return qtype
    name = getattr(qtype, "name", None)
    if name:
        return name
    try:
        import gguf  # the full enum knows the types we don't support

        return gguf.GGMLQuantizationType(int(qtype)).name
    except Exception:
        return f"type {qtype!r}"


def quant_info(qtype, tensor_name: str | None = None) -> QuantInfo:
    """The table entry of ``qtype`` (an int id, a gguf enum member, or a name such as ``"Q4_K"``).

    Raises :class:`UnsupportedQuantType` naming the type (and the tensor, when given)."""
    if isinstance(qtype, QuantInfo):
        return qtype
    if isinstance(qtype, str):
        info = _BY_NAME.get(qtype.upper())
    else:
        try:
            info = QUANT_TYPES.get(int(qtype))
        except (TypeError, ValueError):
            info = None
    if info is None:
        raise UnsupportedQuantType(qtype, tensor_name)
    return info


def is_supported(qtype) -> bool:
    try:
        quant_info(qtype)
        return True
    except UnsupportedQuantType:
        return False


def row_nbytes(qtype, cols: int) -> int:
    """Bytes of one row of ``cols`` elements."""
    info = quant_info(qtype)
    if cols % info.block_size:
        raise ValueError(f"row length {cols} is not a multiple of the {info.name} block size {info.block_size}")
    return cols // info.block_size * info.type_size


def tensor_nbytes(qtype, rows: int, cols: int) -> int:
    """Bytes of a [rows, cols] tensor stored as ``qtype``."""
    return rows * row_nbytes(qtype, cols)


# --------------------------------------------------------------------------- helpers


def _shifts(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def _half(b: torch.Tensor) -> torch.Tensor:
    """[n, 2] uint8 (little-endian fp16) -> [n, 1] float32."""
    return b.contiguous().view(torch.float16).to(torch.float32)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """Legacy-type nibbles: [n, 16] bytes -> [n, 32] values (low nibbles first)."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=1)


def _bits32(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] bytes of a little-endian uint32 -> [n, 32] bits, bit j at column j."""
    n = qh.shape[0]
    return ((qh.reshape(n, 4, 1) >> _shifts(*range(8)).reshape(1, 1, 8)) & 1).reshape(n, 32)


# --------------------------------------------------------------------------- per-type kernels
# Each takes [n_blocks, type_size] uint8 and returns [n_blocks, block_size] float32.


def _deq_f32(b):
    return b.contiguous().view(torch.float32)


def _deq_f16(b):
    return b.contiguous().view(torch.float16).to(torch.float32)


def _deq_bf16(b):
    return (b.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32)


def _deq_q4_0(b):
    d = _half(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).to(torch.float32) - 8.0
    return d * q


def _deq_q4_1(b):
    d = _half(b[:, 0:2])
    m = _half(b[:, 2:4])
    q = _nibbles(b[:, 4:20]).to(torch.float32)
    return d * q + m


def _deq_q5_0(b):
    d = _half(b[:, 0:2])
    qh = _bits32(b[:, 2:6])
    q = (_nibbles(b[:, 6:22]) | (qh << 4)).to(torch.float32) - 16.0
    return d * q


def _deq_q5_1(b):
    d = _half(b[:, 0:2])
    m = _half(b[:, 2:4])
    qh = _bits32(b[:, 4:8])
    q = (_nibbles(b[:, 8:24]) | (qh << 4)).to(torch.float32)
    return d * q + m


def _deq_q8_0(b):
    d = _half(b[:, 0:2])
    q = b[:, 2:34].contiguous().view(torch.int8).to(torch.float32)
    return q * d


def _deq_q2_k(b):
    n = b.shape[0]
    scales = b[:, 0:16]
    qs = b[:, 16:80]
    d = _half(b[:, 80:82])
    dmin = _half(b[:, 82:84])
    dl = (d * (scales & 0x0F).to(torch.float32)).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    # element 128*g + 32*s + l comes from bits 2s..2s+1 of qs[32*g + l]
    q = (qs.reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6).reshape(1, 1, 4, 1)) & 3
    q = q.reshape(n, 16, 16).to(torch.float32)
    return (dl * q - ml).reshape(n, QK_K)


def _deq_q3_k(b):
    n = b.shape[0]
    hmask = b[:, 0:32]
    qs = b[:, 32:96]
    scales = b[:, 96:108]
    d = _half(b[:, 108:110])
    # 16 6-bit scales: low 4 bits from bytes 0..7 (low nibbles, then high nibbles),
    # high 2 bits from bytes 8..11 (bit pairs 0, 2, 4, 6)
    lo = ((scales[:, 0:8].reshape(n, 1, 8) >> _shifts(0, 4).reshape(1, 2, 1)) & 0x0F).reshape(n, 16)
    hi = ((scales[:, 8:12].reshape(n, 1, 4) >> _shifts(0, 2, 4, 6).reshape(1, 4, 1)) & 3).reshape(n, 16)
    sc = (lo | (hi << 4)).to(torch.float32) - 32.0
    dl = (d * sc).reshape(n, 16, 1)
    ql = ((qs.reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6).reshape(1, 1, 4, 1)) & 3).reshape(n, 16, 16)
    qh = ((hmask.reshape(n, 1, 1, 32) >> _shifts(*range(8)).reshape(1, 1, 8, 1)) & 1).reshape(n, 16, 16)
    # a clear high bit means "subtract 4"
    q = ql.to(torch.float32) - ((qh ^ 1) << 2).to(torch.float32)
    return (dl * q).reshape(n, QK_K)


def _k_scale_min(scales: torch.Tensor):
    """Q4_K/Q5_K: 12 bytes -> eight 6-bit scales and eight 6-bit mins."""
    n = scales.shape[0]
    s = scales.reshape(n, 3, 4)
    sd, sm, smd = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([sd & 0x3F, (smd & 0x0F) | ((sd >> 2) & 0x30)], dim=1)
    mn = torch.cat([sm & 0x3F, (smd >> 4) | ((sm >> 2) & 0x30)], dim=1)
    return sc, mn


def _k_sub_scales(b):
    """Q4_K/Q5_K blocks' d * scale and dmin * min per sub-block of 32, [n, 8, 1] each."""
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    dd = (_half(b[:, 0:2]) * sc.to(torch.float32)).reshape(n, 8, 1)
    dm = (_half(b[:, 2:4]) * mn.to(torch.float32)).reshape(n, 8, 1)
    return dd, dm


def _deq_q4_k(b):
    n = b.shape[0]
    dd, dm = _k_sub_scales(b)
    q = (b[:, 16:144].reshape(n, 4, 1, 32) >> _shifts(0, 4).reshape(1, 1, 2, 1)) & 0x0F
    q = q.reshape(n, 8, 32).to(torch.float32)
    return (dd * q - dm).reshape(n, QK_K)


def _deq_q5_k(b):
    n = b.shape[0]
    dd, dm = _k_sub_scales(b)
    qh = ((b[:, 16:48].reshape(n, 1, 1, 32) >> _shifts(*range(8)).reshape(1, 1, 8, 1)) & 1).reshape(n, 8, 32)
    ql = ((b[:, 48:176].reshape(n, 4, 1, 32) >> _shifts(0, 4).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    q = (ql | (qh << 4)).to(torch.float32)
    return (dd * q - dm).reshape(n, QK_K)


def _deq_q6_k(b):
    n = b.shape[0]
    ql = b[:, 0:128]
    qh = b[:, 128:192]
    sc = b[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
    d = _half(b[:, 208:210])
    dd = (d * sc).reshape(n, 16, 1)
    lo = ((ql.reshape(n, 2, 1, 64) >> _shifts(0, 4).reshape(1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    hi = ((qh.reshape(n, 2, 1, 32) >> _shifts(0, 2, 4, 6).reshape(1, 1, 4, 1)) & 3).reshape(n, 8, 32)
    q = ((lo | (hi << 4)).to(torch.float32) - 32.0).reshape(n, 16, 16)
    return (dd * q).reshape(n, QK_K)


_KERNELS = {
    QType.F32: _deq_f32,
    QType.F16: _deq_f16,
    QType.BF16: _deq_bf16,
    QType.Q4_0: _deq_q4_0,
    QType.Q4_1: _deq_q4_1,
    QType.Q5_0: _deq_q5_0,
    QType.Q5_1: _deq_q5_1,
    QType.Q8_0: _deq_q8_0,
    QType.Q2_K: _deq_q2_k,
    QType.Q3_K: _deq_q3_k,
    QType.Q4_K: _deq_q4_k,
    QType.Q5_K: _deq_q5_k,
    QType.Q6_K: _deq_q6_k,
}


def dequantize(blocks: torch.Tensor, qtype, rows: int, cols: int, tensor_name: str | None = None) -> torch.Tensor:
    """Decode the raw GGUF bytes of a [rows, cols] tensor to float32 [rows, cols].

    ``blocks`` is uint8 of any shape holding exactly ``tensor_nbytes(qtype, rows, cols)``
    bytes (row-major: each row is ``cols / block_size`` consecutive blocks)."""
    info = quant_info(qtype, tensor_name)
    if blocks.dtype != torch.uint8:
        raise TypeError(f"GGUF blocks must be uint8, got {blocks.dtype}")
    if cols % info.block_size:
        raise ValueError(
            f"{tensor_name or 'tensor'}: row length {cols} is not a multiple of the "
            f"{info.name} block size {info.block_size}"
        )
    n_blocks = rows * cols // info.block_size
    if blocks.numel() != n_blocks * info.type_size:
        raise ValueError(
            f"{tensor_name or 'tensor'}: {info.name} [{rows}, {cols}] needs "
            f"{n_blocks * info.type_size} bytes, got {blocks.numel()}"
        )
    b = blocks.reshape(n_blocks, info.type_size)
    out = _KERNELS[QType(info.ggml_type)](b)
    return out.reshape(rows, cols)
