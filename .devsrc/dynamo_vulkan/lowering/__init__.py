"""ATen op -> Vulkan kernel rules. Each family module registers its ops with
the `@lowering` decorator (registry.py), one `OpSpec` record per op next to its
rule; `spec_of(target)` reads it. This file is the index of families:

| module      | shader             | ops                                                              |
| ----------- | ------------------ | ---------------------------------------------------------------- |
| elementwise | elementwise.comp   | arithmetic, math, comparisons, where, clamp, casts               |
| reduce      | reduce.comp        | sum, mean, prod, amax, amin, any, all, var, std, p-norms         |
|             | argreduce.comp     | argmax, argmin, max/min.dim                                      |
| rowwise     | rowwise.comp       | softmax, log_softmax, native_layer_norm, dynamo_vulkan.rms_norm  |
| attention   | attention.comp     | dynamo_vulkan.attention (KV-cache attention, online softmax)     |
| matmul      | matmul/matvec.comp | mm, bmm, addmm, baddbmm (few rows: the mat-vec kernels)          |
| index       | gather.comp (+ew)  | embedding, index_select, cat, slice/select_scatter, index_put    |
| views       | (none: metadata)   | view, reshape, permute, transpose, slice, expand ...             |
| gguf        | gguf_*.comp        | dynamo_vulkan.gguf_linear, gguf_embedding (GGUF)                 |
| conv        | conv.comp          | convolution 1d/2d/3d: groups, stride, dilation, transposed       |
| pool        | pool.comp          | max/avg/adaptive pooling 1d-3d (with indices), max-pool backward |
|             | grid_sample.comp   | grid_sampler 2d/3d                                               |
| norm        | (reduce + ew)      | batch_norm (all forms), group_norm                               |
| scan        | scan.comp          | cumsum, cumprod, logcumsumexp                                    |
|             | cumext.comp        | cummax, cummin                                                   |
|             | segment.comp       | segment_reduce                                                   |
| indexing    | (ew gathers)       | index.Tensor, gather, scatter, scatter_add/reduce                |
|             | embedding_bag.comp | embedding_bag (sum, mean, max)                                   |
| sort        | sort.comp          | sort, topk, kthvalue, (nan)median (rank per element)             |
| mathops     | (ew)               | erfinv, erfc, (l/di/poly/i)gamma(c), i0, fmax, shifts, ...      |
| layout      | (ew)               | constant_pad_nd, repeat, flip, *_copy views, scatters            |
| search      | search.comp        | searchsorted, bucketize                                          |
|             | cdist.comp         | cdist, pdist                                                     |
| histogram   | histogram(dd).comp | histc, histogram, histogramdd                                    |
| misc        | (the families)     | take, put, addmv, addbmm, median, nonzero_static, native_dropout |
"""
import functools

from .core import LoweringError, RuleBugError, TRef, contiguous_strides, kind_of
from .registry import (DuplicateLoweringError, Lowered, OpSpec, Request, lowering, spec_of,
                       specs)
from . import elementwise, reduce, rowwise, matmul, index, views, gguf  # noqa: F401  (register)
from . import conv, pool, norm, scan, indexing, sort  # noqa: F401  (register: coverage families)
from . import mathops, layout, search, histogram, misc, attention  # noqa: F401  (register)

__all__ = ["DuplicateLoweringError", "LoweringError", "Lowered", "OpSpec", "Request", "RuleBugError",
           "TRef", "contiguous_strides", "kind_of", "lowering", "spec_of", "specs", "decompositions"]


@functools.cache
def decompositions() -> dict:
    """The core ATen decompositions, less those of ops lowered whole (OpSpec.keep_whole:
    their decompositions guard on data, which breaks tracing), with decomp_overrides'
    in place of those whose outputs would not be what the op's backward reads, and
    backward_decomps' for backward ops that core ATen keeps whole, and optimizer_decomps'
    per-tensor forms of the optimizers' _foreach_ ops. Built once per process (the core
    table takes a good part of a second to build) and shared: callers only read it."""
    from torch._decomp import core_aten_decompositions
    from .backward_decomps import BACKWARD_DECOMPOSITIONS
    from .decomp_overrides import OVERRIDES
    from .optimizer_decomps import optimizer_decompositions
    table = core_aten_decompositions()
    whole = {t for t, spec in specs().items() if spec.keep_whole}
    table = {op: fn for op, fn in table.items() if op not in whole}
    table.update(OVERRIDES)
    table.update(BACKWARD_DECOMPOSITIONS)
    table.update(optimizer_decompositions())
    return table
