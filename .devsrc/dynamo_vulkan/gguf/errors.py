"""Exceptions of the GGUF loader, shared by the quant table, the reader and the models."""

from __future__ import annotations


class GGUFError(ValueError):
    """A GGUF file cannot be used: missing, truncated/corrupt, or not supported."""


class GGUFFileNotFoundError(GGUFError, FileNotFoundError):
    """The GGUF file does not exist."""


class UnsupportedQuantType(GGUFError):
    """A tensor is stored in a GGUF quantization type this package cannot decode."""

    def __init__(self, qtype, tensor_name: str | None = None):
        self.qtype = qtype
        self.tensor_name = tensor_name
        from .quants import SUPPORTED_NAMES, qtype_name  # local: avoid an import cycle

        where = f" (tensor {tensor_name!r})" if tensor_name else ""
        super().__init__(
            f"unsupported GGUF quantization type {qtype_name(qtype)}{where}; "
            f"supported: {', '.join(SUPPORTED_NAMES)}"
        )
