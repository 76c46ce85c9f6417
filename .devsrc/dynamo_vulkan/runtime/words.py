"""Tensors as the 32-bit words GPU buffers hold: the one encoder that uploads (runtime/program.py)
and constants baked into a Plan (lowering/gguf.py) share."""
from __future__ import annotations

import numpy as np
import torch

from ..gguf.gpu_layout import gpu_rows
from .plan import NUMPY_OF_KIND, base_kind

TORCH_OF_KIND = {"f32": torch.float32, "i32": torch.int32, "b": torch.int32}
SMALL_INPUT = 4096     # elements up to which host_words converts through numpy
NUMPY_OF_DTYPE = {torch.float32: np.float32, torch.int64: np.int64, torch.int32: np.int32,
                  torch.bool: np.bool_}


def plain(t: torch.Tensor) -> torch.Tensor:
    """t detached, as a tensor numpy can read: autograd's zero tensors (a backward's
    _efficientzerotensor) hold no storage, so they become real zeros."""
    t = t.detach()
    return torch.zeros(t.shape, dtype=t.dtype) if t._is_zerotensor() else t


def host_words(t: torch.Tensor, kind: str, span=None) -> np.ndarray:
    """A tensor as the 32-bit words the GPU holds (int64 checked to fit int32;
    kind "u8": the raw bytes, 4 to a word, zero-padded, in the GPU order of GGUF rows
    when the kind names one; span (byte start, byte length, whole rows): only those
    bytes, without copying the rest)."""
    t = plain(t)
    if base_kind(kind) != "u8" and t.numel() <= SMALL_INPUT and t.dtype in NUMPY_OF_DTYPE:
        # a token, positions: numpy's few calls cost less than torch's ops per call
        a = t.reshape(-1).numpy()
        if a.dtype == np.int64 and a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise OverflowError(f"an int64 input holds {int(a.min())}..{int(a.max())}, which does "
                                "not fit the int32 that Vulkan kernels use")
        return np.ascontiguousarray(a, NUMPY_OF_KIND[kind]).view(np.uint32)
    if base_kind(kind) == "u8":
        b = gpu_rows(packed_bytes(t, span), kind)
        if b.size % 4:
            b = np.concatenate([b, np.zeros(4 - b.size % 4, np.uint8)])
        return b.view(np.uint32)
    if t.dtype == torch.int64 and t.numel():
        lo, hi = torch.aminmax(t)
        if lo < -2**31 or hi >= 2**31:
            raise OverflowError(f"an int64 input holds {int(lo)}..{int(hi)}, which does not fit "
                                "the int32 that Vulkan kernels use")
    t = t.to(TORCH_OF_KIND[kind]).contiguous().reshape(-1)
    return t.numpy().view(np.uint32)


def packed_bytes(t: torch.Tensor, span=None) -> np.ndarray:
    """The GGUF rows a "u8" tensor holds (uint8, flat, GGML's order; span: (byte start,
    byte length) of them), a view where the tensor is contiguous."""
    b = plain(t).contiguous().reshape(-1).view(torch.uint8)
    if span is not None:
        b = b[span[0]:span[0] + span[1]]
    return b.numpy()
