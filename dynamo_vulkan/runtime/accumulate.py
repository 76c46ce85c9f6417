"""Gradients of micro-batches accumulated on the GPU (runtime/program.py's gradient hooks).

A kept optimizer's parameter whose .grad a compiled backward left on the GPU gets a buffer
of its own (an accumulator) when that .grad must outlive the backward's output buffer: the
next backward moves it there (a copy) instead of reading it back, and adds its own
gradient into it (shaders/accumulate.comp). The kernels are queued and submitted together
before anything reads or writes those buffers again (flush): one submit per backward.
"""
from __future__ import annotations

import weakref

import numpy as np
import torch

from . import shaders
from .plan import groups_for, words_of

GROUP = 256            # the kernel's local size

_queue: list = []      # (manager, kp algorithm, dst kp tensor) to submit
# (id(dst), id(src), words, copy) -> (kp algorithm, dst, src): dst is an accumulator, whose
# entries go with its parameter (_forget); the entry holds src (a program's buffer) alive
_algorithms: dict = {}
_accumulators: dict = {}   # id(parameter) -> its kp tensor, while the parameter lives


def accumulator(mgr, p: torch.Tensor, words: int, count):
    """The parameter's accumulator of `words` words (a device-only kp tensor), made on
    first use; count(owner, bytes) records the GPU memory it holds."""
    acc = _accumulators.get(id(p))
    if acc is None or acc.size() != words:
        import kp
        if acc is None:
            weakref.finalize(p, _forget, id(p))
        else:
            _drop_algorithms(acc)
        acc = mgr.tensor_t(np.zeros(words, np.uint32), tensor_type=kp.TensorTypes.storage)
        _accumulators[id(p)] = acc
        count(acc, 4 * words)
    return acc


def _forget(pid: int) -> None:
    """A parameter is gone: its accumulator and the kernels that write it go too (with
    the buffers they held)."""
    acc = _accumulators.pop(pid, None)
    if acc is not None:
        _drop_algorithms(acc)


def _drop_algorithms(dst) -> None:
    for key in [k for k, v in _algorithms.items() if v[1] is dst]:
        del _algorithms[key]


def queue(mgr, dst, src, n: int, copy: bool) -> None:
    """dst = src (copy) or dst += src over n float32 elements, at the next flush()."""
    key = (id(dst), id(src), n, copy)
    got = _algorithms.get(key)
    if got is None:
        _, source = shaders.kernel_source("accumulate", {})
        spv = shaders.compile_source(source, "accumulate")
        got = _algorithms[key] = (mgr.algorithm([dst, src], spv, list(groups_for(n, GROUP)),
                                                np.array([n, int(copy)], np.uint32),
                                                np.zeros(0, np.uint32)), dst, src)
    _queue.append((mgr, got[0], dst))


def flush() -> None:
    """Submit the queued kernels (in order; a barrier where one reads or writes what an
    earlier one wrote) and wait."""
    if not _queue:
        return
    import kp
    from .program import (SHADER_READ, SHADER_WRITE, STAGE_COMPUTE, STAGE_TRANSFER, TRANSFER_WRITE,
                          settle)
    settle(checks_only=True)    # a gradient from a program whose check failed is not added
    todo = list(_queue)
    _queue.clear()
    for mgr in {id(m): m for m, _, _ in todo}.values():
        seq = mgr.sequence()
        seq.record(kp.OpGlobalBarrier(TRANSFER_WRITE | SHADER_WRITE, SHADER_READ | SHADER_WRITE,
                                      STAGE_TRANSFER | STAGE_COMPUTE, STAGE_COMPUTE))
        written: set = set()
        for m, algorithm, dst in todo:
            if m is not mgr:
                continue
            if id(dst) in written:
                seq.record(kp.OpGlobalBarrier(SHADER_WRITE, SHADER_READ | SHADER_WRITE,
                                              STAGE_COMPUTE, STAGE_COMPUTE))
                written.clear()
            written.add(id(dst))
            seq.record(kp.OpDispatchBare(algorithm))
        seq.eval()


def float_words(kind: str, n: int) -> int | None:
    """Words of n elements of a kind the kernel adds (float32), else None."""
    return words_of(kind, n) if kind == "f32" else None
