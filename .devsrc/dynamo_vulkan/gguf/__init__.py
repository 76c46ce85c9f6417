"""GGUF's quantized formats as the compiler knows them: quant types and dequantization,
the ``gguf_linear`` and ``gguf_embedding`` custom ops, the GPU row layout. The file
reader, the tokenizer and the models built from a file are the LLM side's
(:mod:`dynamo_vulkan.llm`).

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
]
