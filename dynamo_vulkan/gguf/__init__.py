"""GGUF support: quant types and dequantization, the ``gguf_linear`` custom op, the file reader.

Importing this package registers ``torch.ops.dynamo_vulkan.gguf_linear`` and
``torch.ops.dynamo_vulkan.gguf_embedding``.
"""

from .errors import GGUFError, GGUFFileNotFoundError, UnsupportedQuantType
from .quants import QType, QuantInfo, QUANT_TYPES, SUPPORTED_NAMES, dequantize, quant_info, tensor_nbytes
from . import op
from .op import GGUFEmbedding, GGUFLinear

__all__ = [
    "GGUFError",
    "GGUFFileNotFoundError",
    "UnsupportedQuantType",
    "QType",
    "QuantInfo",
    "QUANT_TYPES",
    "SUPPORTED_NAMES",
    "dequantize",
    "quant_info",
    "tensor_nbytes",
    "GGUFLinear",
    "GGUFEmbedding",
    "GGUFFile",
    "open_gguf",
]


def __getattr__(name):  # the reader imports the gguf package: load it only when asked
    if name in ("GGUFFile", "open_gguf", "reader"):
        from . import reader

        return reader if name == "reader" else getattr(reader, name)
    raise AttributeError(name)
