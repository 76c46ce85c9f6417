"""Custom ops on raw GGUF weights, and the modules that hold such weights.

``torch.ops.dynamo_vulkan.gguf_linear(Tensor x, Tensor blocks, int qtype, int rows, int cols) -> Tensor``
    ``x`` [..., cols] float32; ``blocks`` the raw uint8 GGUF data of a weight W of logical
    shape [rows, cols] (GGUF ne = [cols, rows]); returns ``x @ W.T`` [..., rows] float32.
    CPU: dequantize and multiply (the reference). The Vulkan backend lowers it to a fused
    dequant-matmul on the quantized bytes.

``torch.ops.dynamo_vulkan.gguf_embedding(Tensor ids, Tensor blocks, int qtype, int rows, int cols) -> Tensor``
    Rows of a GGUF-stored [rows, cols] table (a token embedding) looked up by integer
    ``ids`` of any shape; returns [*ids.shape, cols] float32. Only the looked-up rows are
    dequantized, so the table stays quantized in memory.

Both ops have fake (meta) implementations for Dynamo. Registering is idempotent: a second
import (or a reload) of this module reuses the ops already defined.
"""

from __future__ import annotations

import torch
from torch import nn

from .quants import dequantize, quant_info, row_nbytes

__all__ = ["GGUFLinear", "GGUFEmbedding", "gguf_linear", "gguf_embedding", "NAMESPACE"]

NAMESPACE = "dynamo_vulkan"

# Rows dequantized at once by the CPU linear: bounds the float32 scratch to ~64 MiB per
# chunk, so a 262144 x 640 LM head does not need a 670 MB dequantized copy.
_CHUNK_ELEMS = 1 << 24


def _op_defined(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
        return True
    except (AttributeError, RuntimeError):
        return False


# the ops' registrations live as long as this Library object (its deletion removes them),
# so a reload of this module keeps the first one
_LIB = globals().get("_LIB") or torch.library.Library(NAMESPACE, "FRAGMENT")


def define_cpu_op(name: str, cpu, fake) -> None:
    """Define ``NAMESPACE::name`` with the schema of ``cpu``'s annotations, ``cpu`` as its
    CPU kernel and ``fake`` as its meta implementation (once: a second import reuses it).
    Not torch.library.custom_op: that runs its kernels behind torch._disable_dynamo, whose
    first call imports Dynamo (1.4 s on the CI machine) in processes that never compile,
    such as one running a stored graph on the host."""
    if _op_defined(name):
        return
    _LIB.define(name + torch.library.infer_schema(cpu, mutates_args=()))
    _LIB.impl(name, cpu, "CPU")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIB)


def _check_blocks(blocks: torch.Tensor, qtype: int, rows: int, cols: int, what: str) -> int:
    info = quant_info(qtype)
    torch._check(blocks.dtype == torch.uint8, lambda: f"{what}: blocks must be uint8, got {blocks.dtype}")
    rb = row_nbytes(info, cols)
    torch._check(
        blocks.numel() == rows * rb,
        lambda: f"{what}: {info.name} [{rows}, {cols}] needs {rows * rb} bytes, got {blocks.numel()}",
    )
    return rb


def _gguf_linear_cpu(x: torch.Tensor, blocks: torch.Tensor, qtype: int, rows: int, cols: int) -> torch.Tensor:
    rb = _check_blocks(blocks, qtype, rows, cols, "gguf_linear")
    torch._check(x.shape[-1] == cols, lambda: f"gguf_linear: x has {x.shape[-1]} features, weight has {cols}")
    x = x.to(torch.float32)
    b = blocks.reshape(rows, rb)
    chunk = max(1, _CHUNK_ELEMS // max(cols, 1))
    if rows <= chunk:
        return torch.matmul(x, dequantize(b, qtype, rows, cols).t())
    out = x.new_empty(*x.shape[:-1], rows)
    for r0 in range(0, rows, chunk):
        r1 = min(rows, r0 + chunk)
        w = dequantize(b[r0:r1], qtype, r1 - r0, cols)
        out[..., r0:r1] = torch.matmul(x, w.t())
    return out


def _gguf_linear_fake(x, blocks, qtype, rows, cols):
    _check_blocks(blocks, qtype, rows, cols, "gguf_linear")
    torch._check(x.shape[-1] == cols, lambda: f"gguf_linear: x has {x.shape[-1]} features, weight has {cols}")
    return x.new_empty((*x.shape[:-1], rows), dtype=torch.float32)


def _gguf_embedding_cpu(ids: torch.Tensor, blocks: torch.Tensor, qtype: int, rows: int, cols: int) -> torch.Tensor:
    rb = _check_blocks(blocks, qtype, rows, cols, "gguf_embedding")
    flat = ids.reshape(-1).to(torch.int64)
    picked = blocks.reshape(rows, rb).index_select(0, flat)
    return dequantize(picked, qtype, flat.numel(), cols).reshape(*ids.shape, cols)


def _gguf_embedding_fake(ids, blocks, qtype, rows, cols):
    _check_blocks(blocks, qtype, rows, cols, "gguf_embedding")
    return blocks.new_empty((*ids.shape, cols), dtype=torch.float32)


define_cpu_op("gguf_linear", _gguf_linear_cpu, _gguf_linear_fake)
define_cpu_op("gguf_embedding", _gguf_embedding_cpu, _gguf_embedding_fake)

gguf_linear = getattr(torch.ops, NAMESPACE).gguf_linear
gguf_embedding = getattr(torch.ops, NAMESPACE).gguf_embedding


def _as_blocks(blocks) -> torch.Tensor:
    if not isinstance(blocks, torch.Tensor):
        import numpy as np

        blocks = torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8).copy())
    if blocks.dtype != torch.uint8:
        raise TypeError(f"GGUF blocks must be uint8, got {blocks.dtype}")
    if blocks.dim() == 1 and blocks.is_contiguous():
        return blocks  # the same tensor object: a tied LM head shares the embedding's buffer
    return blocks.contiguous().reshape(-1)


class _GGUFBlocksModule(nn.Module):
    """A module holding a [rows, cols] GGUF tensor as raw blocks (a uint8 buffer named
    `blocks`, not a Parameter), checked against the size its type and shape need."""

    def __init__(self, blocks, qtype: int, rows: int, cols: int, name: str | None = None):
        super().__init__()
        info = quant_info(qtype, name)
        self.qtype = int(info.ggml_type)
        self.rows = int(rows)
        self.cols = int(cols)
        self.weight_name = name
        blocks = _as_blocks(blocks)
        need = self.rows * row_nbytes(info, self.cols)
        if blocks.numel() != need:
            raise ValueError(f"{name or type(self).__name__}: {info.name} [{rows}, {cols}] needs "
                             f"{need} bytes, got {blocks.numel()}")
        self.register_buffer("blocks", blocks)


class GGUFLinear(_GGUFBlocksModule):
    """``y = x @ W.T (+ bias)`` with W kept as raw GGUF blocks (a uint8 buffer, not a Parameter)."""

    def __init__(self, blocks, qtype: int, rows: int, cols: int, bias: torch.Tensor | None = None, name: str | None = None):
        super().__init__(blocks, qtype, rows, cols, name)
        if bias is not None:
            bias = bias.detach().to(torch.float32).reshape(self.rows)
            self.register_buffer("bias", bias)
        else:
            self.bias = None

    @property
    def in_features(self) -> int:
        return self.cols

    @property
    def out_features(self) -> int:
        return self.rows

    @property
    def qtype_name(self) -> str:
        return quant_info(self.qtype).name

    @classmethod
    def from_float(cls, weight: torch.Tensor, qtype, bias: torch.Tensor | None = None) -> "GGUFLinear":
        """Quantize a float [rows, cols] weight with the gguf package (types it can quantize)."""
        import gguf
        import numpy as np

        info = quant_info(qtype)
        w = weight.detach().to(torch.float32).cpu().numpy()
        data = gguf.quants.quantize(w, gguf.GGMLQuantizationType(info.ggml_type))
        blocks = torch.from_numpy(np.ascontiguousarray(data).view(np.uint8).reshape(-1).copy())
        return cls(blocks, info.ggml_type, weight.shape[0], weight.shape[1], bias)

    def dequantized_weight(self) -> torch.Tensor:
        return dequantize(self.blocks, self.qtype, self.rows, self.cols)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = gguf_linear(x, self.blocks, self.qtype, self.rows, self.cols)
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return f"in_features={self.cols}, out_features={self.rows}, qtype={self.qtype_name}, bias={self.bias is not None}"


class GGUFEmbedding(_GGUFBlocksModule):
    """A [rows, cols] lookup table kept as raw GGUF blocks; only looked-up rows are dequantized."""

    @property
    def num_embeddings(self) -> int:
        return self.rows

    @property
    def embedding_dim(self) -> int:
        return self.cols

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return gguf_embedding(ids, self.blocks, self.qtype, self.rows, self.cols)

    def extra_repr(self) -> str:
        return f"{self.rows}, {self.cols}, qtype={quant_info(self.qtype).name}"
