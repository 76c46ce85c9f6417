"""ATen op -> Vulkan kernel rules. Each family module registers its ops with
the `@lowering` decorator; this file is the index of families:

| module         | shader             | ops                                                  |
| -------------- | ------------------ | ---------------------------------------------------- |
| elementwise    | elementwise.comp   | arithmetic, math, comparisons, where, clamp, casts   |
| reduce         | reduce.comp        | sum, mean, prod, amax, amin, any, all, var, std      |
|                | argreduce.comp     | argmax, argmin, max/min.dim                          |
| rowwise        | rowwise.comp       | softmax, log_softmax, native_layer_norm              |
| matmul         | matmul.comp        | mm, bmm, addmm, baddbmm                              |
| index          | gather.comp (+ew)  | embedding, index_select, cat, slice/select_scatter   |
| views          | (none: metadata)   | view, reshape, permute, transpose, slice, expand ... |
| gguf           | gguf_*.comp        | dynamo_vulkan.gguf_linear, gguf_embedding (GGUF)     |
| conv           | conv.comp          | convolution 1d/2d/3d, groups, dilation, transposed   |
| pool           | pool, grid_sample  | max/avg/adaptive pooling 1d-3d (with indices), grid_sampler 2d/3d |
| norm           | (reduce + ew)      | batch_norm (all forms), group_norm                   |
| scan           | scan, segment, cumext | cumsum, cumprod, logcumsumexp, cummax/min, segment_reduce |
| indexing       | ew gathers, embedding_bag.comp | index.Tensor, gather, scatter(_add), embedding_bag |
| sort           | sort.comp          | sort, topk, kthvalue (rank per element)              |
| mathops        | elementwise.comp   | erfinv, erfc, lgamma, digamma, polygamma, i0, fmax, shifts, _trilinear ... |
| layout         | elementwise.comp   | constant_pad_nd, repeat, flip, *_copy views, scatters|
| search         | search, cdist.comp | searchsorted, bucketize (binary search), cdist, pdist |
| histogram      | histogram(dd).comp | histc, histogram, histogramdd (bin counts or edges, weights) |
| misc           | (the families)     | take, put, addmv, addbmm, (nan)median, nonzero_static |
"""
from .core import LOWERINGS, LoweringError, Rule, TRef, contiguous_strides, kind_of, lowering
from . import elementwise, reduce, rowwise, matmul, index, views, gguf  # noqa: F401  (register)
from . import conv, pool, norm, scan, indexing, sort, mathops, layout, search, histogram, misc  # noqa: F401  (register; ATen coverage families)

__all__ = ["LOWERINGS", "LoweringError", "Rule", "TRef", "contiguous_strides", "kind_of",
           "lowering", "decompositions"]


def decompositions() -> dict:
    """The core ATen decompositions, less those of ops lowered whole (misc.KEEP_WHOLE:
    their decompositions guard on data, which breaks tracing)."""
    from torch._decomp import core_aten_decompositions
    table = core_aten_decompositions()
    return {op: fn for op, fn in table.items() if op not in misc.KEEP_WHOLE}
