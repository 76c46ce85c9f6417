"""ATen op -> Vulkan kernel rules. Each family module registers its ops with
the `@lowering` decorator; this file is the index of families:

| module         | shader             | ops                                                  |
| -------------- | ------------------ | ---------------------------------------------------- |
| elementwise    | elementwise.comp   | arithmetic, math, comparisons, where, clamp, casts   |
| reduce         | reduce.comp        | sum, mean, amax, amin, any, all                      |
| rowwise        | rowwise.comp       | softmax, log_softmax, native_layer_norm              |
| matmul         | matmul.comp        | mm, bmm, addmm, baddbmm                              |
| index          | gather.comp (+ew)  | embedding, index_select, cat, slice/select_scatter   |
| views          | (none: metadata)   | view, reshape, permute, transpose, slice, expand ... |
| gguf           | gguf_*.comp        | dynamo_vulkan.gguf_linear, gguf_embedding (GGUF)     |
"""
from .core import LOWERINGS, LoweringError, Rule, TRef, contiguous_strides, kind_of, lowering
from . import elementwise, reduce, rowwise, matmul, index, views, gguf  # noqa: F401  (register)

__all__ = ["LOWERINGS", "LoweringError", "Rule", "TRef", "contiguous_strides", "kind_of",
           "lowering"]
