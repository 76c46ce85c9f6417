"""A Plan made real: kp tensors, algorithms, and ONE recorded sequence.

Calling a Program copies the streamed inputs into their staging memory,
submits the sequence once, and copies outputs out, waiting for the GPU only where
the host reads what the call wrote (settle()). Resident inputs
(parameters, buffers) are uploaded once and again only when their
`_version` changes; nothing else happens per node on the call path.
"""
from __future__ import annotations

import atexit
import functools
import logging
import math
import operator
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch.multiprocessing.reductions import StorageWeakRef

from .. import device, progress
from . import accumulate, placeholder, shaders, upload
from .plan import NUMPY_OF_KIND, Plan, barriers, base_kind, words_of
from .words import NUMPY_OF_DTYPE, host_words, packed_bytes

# Vulkan flag values (vulkan_core.h) for kp.OpMemoryBarrier.
SHADER_READ, SHADER_WRITE = 0x20, 0x40
TRANSFER_READ, TRANSFER_WRITE = 0x800, 0x1000
STAGE_COMPUTE, STAGE_TRANSFER = 0x800, 0x1000

SUBMIT_WITHOUT_WAIT = True   # calls whose outputs all stay on the GPU return at their submit
PROGRESS_BYTES = 256 << 20   # weight uploads of a call from which a progress bar shows
_VERSION = operator.attrgetter("_version")
_RECORDED = operator.attrgetter("version")      # a Resident's: its tensor's, on the GPU
_expired = torch.UntypedStorage._expired         # of a StorageWeakRef's cdata
# Programs share the device's temporaries (Scratch), the staging memory of a Program's
# inputs and outputs, and kp's queue: one call at a time in a process, whichever thread
# makes it (a call holds it until it returns: at its submit, or once its outputs are
# copied out).
RUN_LOCK = threading.RLock()


# Programs submitted without waiting (Program._defers: every output it copies out is left
# pending on the GPU), oldest first, with the sequence each ran. The host prepares the next
# program while they run: a training step's backward runs while autograd, the gradients'
# hooks and the optimizer step's call prepare. The queue runs them in order (each sequence
# starts with a global barrier); settle() waits for them where the host reads the GPU's
# memory or writes memory they read, and raises a failed check of theirs there.
_IN_FLIGHT: list = []


def settle(checks_only: bool = False) -> None:
    """Wait for the programs still running (only those with runtime checks, and the older
    ones, where checks_only: before anything else is submitted) and raise the first failed
    check among them. A program whose check failed wrote wrong values: nothing that reads
    them is submitted before the error is raised."""
    if not _IN_FLIGHT:
        return
    if checks_only:
        last = max((n for n, (program, _) in enumerate(_IN_FLIGHT) if program._checks is not None),
                   default=-1)
        if last < 0:
            return
    else:
        last = len(_IN_FLIGHT) - 1
    done = _IN_FLIGHT[:last + 1]
    del _IN_FLIGHT[:last + 1]
    failed = None
    for program, seq in done:
        seq.eval_await()
        if failed is None and program._checks is not None and program._checks[0]:
            failed = program
    if failed is not None:
        raise_failed_checks(failed.plan.checks, int(failed._checks[0]),
                            " (found after its program ran without a wait: the call that "
                            "raises is the next to read or submit)")


@atexit.register
def _settle_at_exit() -> None:
    """The device is not torn down under a running submit; a failed check nothing read is
    logged."""
    try:
        settle()
    except Exception as e:      # noqa: BLE001 - at exit only: nothing can raise to the caller
        logging.getLogger(__name__).warning("a compiled program's check failed: %s", e)


def serialised(fn):
    """fn under RUN_LOCK: building, recording and calling programs from several threads."""
    @functools.wraps(fn)
    def locked(*args, **kwargs):
        with RUN_LOCK:
            return fn(*args, **kwargs)
    return locked


_stats = {"submits": 0, "uploads": 0, "device_bytes": 0, "device_bytes_peak": 0, "staging_bytes": 0,
          "upload_bytes": 0, "input_bytes": 0, "output_bytes": 0, "readback_bytes": 0}


def runtime_stats() -> dict:
    """Process-wide counters: submits of compiled programs, weight uploads, and the
    bytes of the kp tensors that live programs and resident weights hold now (GPU
    memory: device_bytes, with its peak; host-visible staging: staging_bytes).
    Traffic between host and GPU, in bytes: upload_bytes (resident uploads),
    input_bytes and output_bytes (the streamed inputs and the outputs of calls),
    readback_bytes (graph-mutated resident tensors copied back, and read_back())."""
    return dict(_stats)


def _count(owner, device_bytes: int, staging_bytes: int = 0) -> None:
    """Count kp tensor bytes as held until `owner` (a Program or Resident) is collected."""
    _stats["device_bytes"] += device_bytes
    _stats["staging_bytes"] += staging_bytes
    _stats["device_bytes_peak"] = max(_stats["device_bytes_peak"], _stats["device_bytes"])
    weakref.finalize(owner, _uncount, device_bytes, staging_bytes)


def _uncount(device_bytes: int, staging_bytes: int) -> None:
    _stats["device_bytes"] -= device_bytes
    _stats["staging_bytes"] -= staging_bytes


class Resident:
    """A parameter or buffer's copy on the GPU, shared by every program that
    reads the same tensor; re-uploaded when the tensor's version moves."""

    _pool: dict[tuple, "Resident"] = {}
    _newer: dict[int, "Resident"] = {}    # id(tensor) -> its copy that a program updated only

    def __init__(self, mgr, t: torch.Tensor, kind: str, span=None):
        self.ref = weakref.ref(t)
        self.ptr = t.data_ptr()
        self.version = -1
        self.kind = kind
        self.span = span      # (byte start, byte length): one buffer of a split u8 tensor
        n = t.numel() if span is None else span[1]
        words = max(1, words_of(kind, n))
        self.tensor = mgr.tensor_t(np.empty(words, np.uint32), tensor_type=_kp().TensorTypes.storage)
        _count(self, 4 * words)
        self.mgr = mgr

    @classmethod
    def get(cls, mgr, t: torch.Tensor, kind: str, span=None) -> "Resident":
        key = (id(t), t.data_ptr(), tuple(t.shape), t.dtype, kind) + \
            (() if span is None else (tuple(span),))
        r = cls._pool.get(key)
        if r is None or r.ref() is not t:
            r = cls(mgr, t, kind, span)
            cls._pool[key] = r
            weakref.finalize(t, cls._pool.pop, key, None)
            weakref.finalize(t, cls._newer.pop, id(t), None)
        return r

    def stale(self, t: torch.Tensor) -> bool:
        return t._version != self.version

    def nbytes(self) -> int:
        return 4 * self.tensor.size()

    def stage(self, t: torch.Tensor, batch) -> None:
        """Add t's upload to `batch` (runtime/upload.py); synced() once it is submitted."""
        if base_kind(self.kind) == "u8":     # GGUF rows: regrouped as the batch stages them
            batch.gguf_rows(self.tensor, packed_bytes(t, self.span), self.kind)
        else:
            batch.words(self.tensor, host_words(t, self.kind, self.span))

    def synced(self, t: torch.Tensor) -> None:
        """t's data is on the GPU (its batch was submitted)."""
        self.version = t._version
        Resident._newer.pop(id(t), None)
        _stats["uploads"] += 1
        _stats["upload_bytes"] += self.nbytes()


class Scratch:
    """A temporary buffer shared by the Programs of a device: the i-th largest temporary
    buffer of every program is one kp tensor. A temporary lives within one call, and the
    queue runs calls one after another (each sequence starts with a global barrier, also
    where a call returned before the GPU finished), so programs never use one at the same
    time: the programs built for each prompt length, or a model's prefill and its decode
    step, need not each hold their own."""

    _slots: dict[tuple, "weakref.ref[Scratch]"] = {}     # (manager, rank) -> the newest

    def __init__(self, mgr, words: int, slot: tuple):
        self.mgr, self.words, self.slot = mgr, words, slot
        self.tensor = mgr.tensor_t(np.empty(words, np.uint32), tensor_type=_kp().TensorTypes.storage)
        _count(self, 4 * words)

    def superseded(self) -> bool:
        """Whether its slot now holds another (larger) one: only the programs bound to
        this one still use it."""
        ref = self._slots.get(self.slot)
        return ref is None or ref() is not self

    @classmethod
    def get(cls, mgr, rank: int, words: int) -> "Scratch":
        """The rank-th shared temporary, of at least `words` words: a larger one is made
        when the slot's is smaller (the programs bound to that one keep it)."""
        key = (id(mgr), rank)
        ref = cls._slots.get(key)
        s = ref() if ref is not None else None
        if s is None or s.words < words or s.mgr is not mgr:
            s = cls(mgr, words, key)
            cls._slots[key] = weakref.ref(s)
        return s


KEEP_ON_DEVICE = "_dynamo_vulkan_keep_on_device"


_KEPT_OPTIMIZERS: "weakref.WeakSet" = weakref.WeakSet()   # their state is kept too


def keep_on_device(obj):
    """Mark tensors that compiled graphs update in place as living on the GPU: a
    tensor (a KV cache), a module (its parameters and buffers) or an optimizer (its
    parameters, and its state, also the state it makes at its first step). Their
    updates are not copied back to the host tensors after each call, which then go
    stale until read_back(obj); a graph's nodes that run on the host read them
    back first. Writing a host tensor (bumping its version) uploads it again.
    A kept optimizer's compiled step also reads its parameters' gradients where a
    compiled backward left them on the GPU (see HANDED_DTYPES' note); those gradients are
    not copied to the host: the .grad of such a parameter reads as NaN until read_back
    (of the optimizer, the module or the .grad tensor), which the backend does itself
    where its graphs' host nodes read it.
    Mark before the first call. Returns obj."""
    if isinstance(obj, torch.Tensor):
        setattr(obj, KEEP_ON_DEVICE, True)
    elif isinstance(obj, torch.optim.Optimizer):
        _KEPT_OPTIMIZERS.add(obj)
        for group in obj.param_groups:
            for p in group["params"]:
                setattr(p, KEEP_ON_DEVICE, True)
                _watch_gradients(p)
    elif isinstance(obj, torch.nn.Module):
        for t in [*obj.parameters(), *obj.buffers()]:
            setattr(t, KEEP_ON_DEVICE, True)
    else:
        raise TypeError(f"keep_on_device takes a tensor, a module or an optimizer, not "
                        f"{type(obj).__name__}")
    return obj


GRADIENT_HOOKS = "_dynamo_vulkan_gradient_hooks"
_ARRIVING: dict[int, int] = {}   # id(parameter) -> address of the pending gradient it steals


def _watch_gradients(p: torch.Tensor) -> None:
    """Hooks around the accumulation of a kept optimizer's parameter's gradient, which a
    compiled backward may leave pending on the GPU (gradient_may_stay_on_gpu)."""
    if getattr(p, GRADIENT_HOOKS, False) or not p.requires_grad:
        return
    setattr(p, GRADIENT_HOOKS, True)
    ref = weakref.ref(p)
    p.register_hook(functools.partial(_gradient_arrives, ref))
    p.register_post_accumulate_grad_hook(_gradient_accumulated)


MIXED_ON_HOST = "_dynamo_vulkan_gradient_mixed"
_UNCLAIMED: dict[int, tuple] = {}   # id(parameter) -> (backward pass, address): on its way


def gradient_may_stay_on_gpu(consumer, shape) -> bool:
    """Whether a backward's gradient for autograd node `consumer` may stay pending on the
    GPU: it accumulates into the .grad of a kept optimizer's parameter (whose hooks see
    it), outside a double backward, and it is the first gradient of that parameter in this
    backward pass (autograd sums a parameter's gradients from several graphs on the host
    before its hooks run: an earlier one pending is read back, and this one is not left
    pending)."""
    p = getattr(consumer, "variable", None)
    if p is None or not getattr(p, GRADIENT_HOOKS, False) or getattr(p, MIXED_ON_HOST, False) \
            or tuple(p.shape) != tuple(shape) or torch.is_grad_enabled():
        return False
    task, address = _UNCLAIMED.get(id(p), (None, None))
    if task is None or task != torch._C._current_graph_task_id():
        return True
    e = _HELD.get(address)
    if e is not None and e.pending and not e.claimed:
        _settle(e)
    return False


def _on_its_way(e: "_Held", p: torch.Tensor) -> None:
    """Record a pending gradient that autograd is to deliver to p in this backward pass."""
    e.param = weakref.ref(p)
    _UNCLAIMED[id(p)] = (torch._C._current_graph_task_id(), e.address)


_ADDED: dict[int, int] = {}      # id(parameter) -> address of its .grad, added to on the GPU


@serialised     # buffers and records that programs use
def _gradient_arrives(ref, grad: torch.Tensor) -> None:
    """Before autograd accumulates `grad` into the parameter's .grad: a pending gradient
    that the parameter steals (no .grad yet, the layout autograd keeps) stays pending; one
    added to a pending .grad is added on the GPU, in the parameter's accumulator (autograd's
    addition on the host then adds what the host copies hold, which nothing reads); any
    other addition on the host reads both back first."""
    p = ref()
    if p is None:
        return
    task, address = _UNCLAIMED.pop(id(p), (None, None))
    if task == torch._C._current_graph_task_id() and \
            grad.untyped_storage().data_ptr() != address and \
            (e := _HELD.get(address)) is not None and e.pending and not e.claimed:
        setattr(p, MIXED_ON_HOST, True)     # its gradients are not left on the GPU again
        raise RuntimeError(
            f"dynamo_vulkan: a gradient of a parameter of shape {tuple(p.shape)} that a compiled "
            "backward left on the GPU (its optimizer is keep_on_device) was summed by autograd "
            "with another gradient of it on the host (the parameter is used by eager code "
            "too); this step's gradient is lost. Its gradients are copied to the host from "
            "now on: run the step again")
    if pending(grad) and not torch.is_grad_enabled():
        e = _HELD[grad.untyped_storage().data_ptr()]
        if p.grad is None and p.is_contiguous():
            e.param, e.claimed = ref, True
            _ARRIVING[id(p)] = e.address
            return
        n = max(1, grad.numel())
        if p.grad is not None and pending(p.grad) and \
                accumulate.float_words(e.kind, n) is not None:
            into = _HELD[p.grad.untyped_storage().data_ptr()]
            if into.kind == e.kind and into.shape == e.shape:
                into.param, into.claimed = ref, True
                acc = _to_accumulator(into, p)
                accumulate.queue(into.mgr, acc, e.buffer, n, copy=False)
                _ADDED[id(p)] = into.address
                return
    materialise([grad] + ([p.grad] if p.grad is not None else []))


def _to_accumulator(e: "_Held", p: torch.Tensor):
    """The parameter's accumulator, holding e's value (a copy queued if it is elsewhere)."""
    n = e.count
    acc = accumulate.accumulator(e.mgr, p, e.buffer.size(), _count)
    if e.buffer is not acc:
        _release(acc)
        accumulate.queue(e.mgr, acc, e.buffer, n, copy=True)
        if _HOLDS.get(id(e.buffer)) == e.address:
            del _HOLDS[id(e.buffer)]
        e.buffer = acc
        _HELD[e.address] = e
        _HOLDS[id(acc)] = e.address
    return acc


@serialised     # buffers and records that programs use
def _gradient_accumulated(p: torch.Tensor) -> None:
    """After accumulation: where autograd copied a pending gradient instead of stealing it,
    or replaced a .grad added to on the GPU, the host's new .grad gets the GPU's value; an
    addition on the GPU moved .grad's version, which its record follows."""
    added = _ADDED.pop(id(p), None)
    address = _ARRIVING.pop(id(p), None) if added is None else added
    g = p.grad
    if address is None or g is None:
        return
    e = _HELD.get(address)
    if g.untyped_storage().data_ptr() == address:
        if added is not None and e is not None:
            e.version = g._version
        return
    if e is None or not e.pending:
        raise RuntimeError(f"dynamo_vulkan: a gradient of shape {tuple(g.shape)} left on the GPU "
                           "was copied by autograd after its buffer was overwritten")
    _download_into(g.untyped_storage(), e)


def _optimizer_state(opt) -> list:
    return [v for state in opt.state.values() for v in state.values()
            if isinstance(v, torch.Tensor)]


def is_kept_on_device(t: torch.Tensor) -> bool:
    if getattr(t, KEEP_ON_DEVICE, False):
        return True
    for opt in list(_KEPT_OPTIMIZERS):
        if any(v is t for v in _optimizer_state(opt)):
            setattr(t, KEEP_ON_DEVICE, True)
            return True
    return False


@serialised
def read_back(obj):
    """Copy the GPU's copies of keep_on_device tensors into them where a program updated
    them on the GPU since: a tensor, a module's parameters, their gradients and buffers, or
    an optimizer's parameters, their gradients and state. Returns obj."""
    if isinstance(obj, torch.optim.Optimizer):
        params = [p for g in obj.param_groups for p in g["params"]]
        tensors = params + _optimizer_state(obj)
    elif isinstance(obj, torch.nn.Module):
        params = list(obj.parameters())
        tensors = params + list(obj.buffers())
    else:
        params, tensors = [], [obj]
    refresh_host(tensors + [p.grad for p in params if p.grad is not None])
    return obj


def refresh_host(tensors) -> None:
    """read_back the tensors among `tensors` whose GPU copy a program updated since (eager
    code, such as a graph's nodes placed on the host, is about to read them), and the
    pending hand-offs among them."""
    materialise(tensors)
    if not Resident._newer:
        return
    for t in tensors:
        r = Resident._newer.get(id(t)) if isinstance(t, torch.Tensor) else None
        if r is not None and r.ref() is t:
            _read_back_one(t, r)


def _read_back_one(t: torch.Tensor, r: Resident) -> None:
    words = download(r.mgr, r.tensor, max(1, t.numel()))
    _stats["readback_bytes"] += 4 * words.size
    with torch.no_grad():
        t.copy_(torch.from_numpy(words.view(NUMPY_OF_KIND[r.kind]).copy()[:t.numel()])
                .view(t.shape))
    r.version = t._version
    Resident._newer.pop(id(t), None)


# Hand-offs: a forward graph's outputs that only its backward reads (saved activations),
# while the output buffer each came from still holds its value, are read by the backward's
# program from that buffer: no upload. Autograd hands the backward another tensor object
# on the same storage, so a hand-off is found by its storage (weakly referenced: a storage
# freed is no hand-off) until the buffer is written again. A backward's gradients hand off
# to a compiled optimizer step the same way, where the optimizer is keep_on_device (the
# user may read and change .grad: an in-place op bumps its version, which makes the step
# upload it; a write through .data does not, and is not seen).
# A hand-off may also be lazy (pending): its host tensor is not written when the program
# returns; it is read back when a host reader needs it (materialise: a graph's nodes on the
# host, a program that cannot bind the buffer, read_back) or before its buffer is written
# again, if its storage is still alive.
# Dtypes whose host copy is the buffer's words exactly:
HANDED_DTYPES = (torch.float32, torch.int32, torch.int64, torch.bool)


class _Held:
    """What a kp output buffer holds: the value of a host tensor's storage at a version."""

    __slots__ = ("storage", "address", "version", "shape", "dtype", "buffer", "mgr", "kind",
                 "visible", "pending", "param", "claimed")

    def __init__(self, buffer, mgr, t: torch.Tensor, kind: str, visible: bool, pending: bool):
        storage = t.untyped_storage()
        self.storage = StorageWeakRef(storage)
        self.address = storage.data_ptr()
        self.version, self.shape, self.dtype = t._version, tuple(t.shape), t.dtype
        self.buffer, self.mgr, self.kind = buffer, mgr, kind
        self.visible = visible      # whether the user sees the tensor (a gradient)
        self.pending = pending      # the host tensor does not hold the value yet
        self.param = None           # weakref to the parameter whose gradient it is
        self.claimed = False        # whether it became that parameter's .grad

    @property
    def count(self) -> int:
        """Elements of the value (a 0-d value has one; so does an empty one's buffer)."""
        return max(1, math.prod(self.shape))

    def alive(self):
        """The storage, or None where it was freed or only its placeholder slot holds it
        (runtime/placeholder.py: no one can read it)."""
        if _expired(self.storage.cdata) or placeholder.only_ours(self.address):
            return None
        return torch.UntypedStorage._new_with_weak_ptr(self.storage.cdata)


_HELD: dict[int, _Held] = {}    # storage address -> what holds its value
_HOLDS: dict[int, int] = {}     # id(kp tensor) -> the storage address whose value it holds


def _hold(buffer, mgr, t: torch.Tensor, kind: str, visible: bool = False,
          pending: bool = False, param=None) -> None:
    """Record that kp tensor `buffer` holds t's value (in t's words of `kind`); pending:
    t's host memory does not (yet); param: the parameter whose gradient t is."""
    _release(buffer)
    e = _Held(buffer, mgr, t, kind, visible, pending)
    if param is not None:
        _on_its_way(e, param)
    old = _HELD.get(e.address)      # another buffer's, of a storage freed since
    if old is not None and _HOLDS.get(id(old.buffer)) == e.address:
        del _HOLDS[id(old.buffer)]
    _HELD[e.address] = e
    _HOLDS[id(buffer)] = e.address


def _release(buffer) -> None:
    """`buffer` is about to be written: it holds no host tensor's value any more. A pending
    value that someone can still read is read back first."""
    held = _HOLDS.pop(id(buffer), None)
    e = _HELD.get(held) if held is not None else None
    if e is not None and e.buffer is buffer:
        del _HELD[held]
        if e.pending:
            _evict(e)


def _evict(e: _Held) -> None:
    """Read back a pending value whose buffer is about to be written, where its storage is
    alive: a saved activation (a forward called again before its backward), or a gradient
    that is still its parameter's .grad at the version the backward left (a second
    micro-batch's backward before the optimizer step)."""
    storage = e.alive()
    if storage is None:
        return
    if e.visible and e.param is not None:     # a parameter's gradient: moved to its accumulator
        p = e.param()
        g = p.grad if p is not None else None
        if g is not None and g.untyped_storage().data_ptr() != e.address:
            if e.claimed:
                return              # no longer its .grad
        elif g is not None and g._version != e.version:
            return                  # written on the host since
        elif accumulate.float_words(e.kind, 1) is not None:
            _to_accumulator(e, p)   # its .grad, or (none yet) about to become it
            return
    _settle(e, storage)


def _settle(e: _Held, storage=None) -> None:
    """A pending value read back into its host storage (`storage`, or e's own where it is
    still alive), which then holds it."""
    storage = storage if storage is not None else e.alive()
    if storage is not None:
        _download_into(storage, e)
        e.pending = False


def _download_into(storage, e: _Held) -> None:
    """Write the buffer's value into the storage (no version moves: autograd checks the
    versions of saved tensors)."""
    n = e.count
    accumulate.flush()
    words = _download_output(e.mgr, e.buffer, words_of(e.kind, n))
    _stats["readback_bytes"] += 4 * words.size
    a = words.view(NUMPY_OF_KIND[e.kind])[:n]
    if e.kind == "b":
        a = a != 0
    with torch.no_grad():
        host = torch.empty(0, dtype=e.dtype).set_(storage, 0, e.shape)
        host.copy_(torch.from_numpy(a.copy()).view(e.shape))
    placeholder.written(storage.data_ptr())


def materialise(tensors) -> None:
    """Read back the pending hand-offs among `tensors` (a host reader is about to read)."""
    if not _HELD:
        return
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            continue
        e = _HELD.get(t.untyped_storage().data_ptr())
        if e is not None and e.pending and e.version == t._version:
            _settle(e)


def pending(t: torch.Tensor) -> bool:
    """Whether t's host memory does not hold its value yet (a lazy hand-off)."""
    e = _HELD.get(t.untyped_storage().data_ptr())
    return e is not None and e.pending and e.version == t._version and not e.storage.expired()


def _kept_gradient(t: torch.Tensor) -> bool:
    """Whether t is the .grad of a parameter of a keep_on_device optimizer."""
    address = t.untyped_storage().data_ptr()
    return any(p.grad is not None and p.grad.untyped_storage().data_ptr() == address
               for opt in list(_KEPT_OPTIMIZERS) for g in opt.param_groups for p in g["params"])


def _still_holds(buffer, t: torch.Tensor) -> bool:
    """Whether kp tensor `buffer` holds t's current value: _held_in(t) names `buffer` (the
    common case of a hand-off, checked from the buffer's side in fewer steps)."""
    address = _HOLDS.get(id(buffer))
    e = _HELD.get(address) if address is not None else None
    return e is not None and e.buffer is buffer and e.version == t._version and \
        t.untyped_storage().data_ptr() == address and e.shape == t.shape and \
        not t.storage_offset() and t.is_contiguous() and not _expired(e.storage.cdata)


def _held_in(t) -> tuple | None:
    """(kp tensor, kind, whether the user sees t) holding t's current value, or None."""
    if not isinstance(t, torch.Tensor) or t.storage_offset() or not t.is_contiguous():
        return None
    address = t.untyped_storage().data_ptr()
    e = _HELD.get(address)
    if e is None or e.version != t._version or e.shape != tuple(t.shape) or \
            _HOLDS.get(id(e.buffer)) != address or e.storage.expired():
        return None
    return e.buffer, e.kind, e.visible


def _kp():
    import kp
    return kp


def staging_view(t) -> np.ndarray:
    """A writable numpy view of a kp device tensor's mapped staging memory.

    kp's Tensor.data() built against pybind11 3 returns a view whose stride is
    0 (every element aliases the first); rebuild it with the element stride."""
    d = t.data()
    if d.ndim != 1 or d.strides[0] != d.itemsize:
        d = np.lib.stride_tricks.as_strided(d, shape=(t.size(),), strides=(d.itemsize,))
    return d


def _sync_device(mgr, t) -> None:
    """Copy a kp device tensor's staging memory into its device buffer."""
    settle()
    mgr.sequence().record(_kp().OpTensorSyncDevice([t])).eval()


def download(mgr, src, words: int) -> np.ndarray:
    """Words of a device-only kp tensor, through a staging tensor freed after."""
    settle()
    kp = _kp()
    staging = mgr.tensor_t(np.zeros(src.size(), np.uint32))
    mgr.sequence().record(kp.OpMemoryBarrier([src], SHADER_WRITE, TRANSFER_READ,
                                             STAGE_COMPUTE, STAGE_TRANSFER)) \
        .record(kp.OpTensorCopy([src, staging])) \
        .record(kp.OpMemoryBarrier([staging], TRANSFER_WRITE, TRANSFER_READ,
                                   STAGE_TRANSFER, STAGE_TRANSFER)) \
        .record(kp.OpTensorSyncLocal([staging])).eval()
    out = staging_view(staging)[:words].copy()
    staging.destroy()
    return out


def _download_output(mgr, src, words: int) -> np.ndarray:
    """download for any kp tensor: a program's output buffer (device memory with its own
    staging) is copied into its staging memory (kp's copy op would also copy the source's
    staging memory over the copy's on the host side)."""
    if src.tensor_type() == _kp().TensorTypes.storage:
        return download(mgr, src, words)
    settle()
    kp = _kp()
    mgr.sequence().record(kp.OpMemoryBarrier([src], SHADER_WRITE, TRANSFER_READ,
                                             STAGE_COMPUTE, STAGE_TRANSFER)) \
        .record(kp.OpTensorSyncLocal([src])).eval()
    return staging_view(src)[:words].copy()


def _algorithm_key(d) -> tuple:
    """One kp algorithm serves every dispatch of the same kernel, constants, buffers and
    grid."""
    return (d.spirv_key, tuple(d.spec), tuple(d.bindings), tuple(d.groups))


class Program:
    """bumped[i]: the caller (aot_autograd's runtime wrapper) increments input i's
    version once per call because the graph mutates it, before it calls the graph.
    A resident copy holds its tensor's value at the version the last upload or update
    left (exactly: a training step's forward reading parameters that an optimizer step
    updated on the GPU uploads nothing); a program that mutates the tensor accepts that
    one bump more at its call, as the caller made it, not a write."""

    @serialised
    def __init__(self, plan: Plan, args: list, profile: bool = False, bumped=None, share=None):
        """share: a Program whose plan's buffers are this plan's first ones (a replay of its
        step, runtime/replay.py) and which never runs at the same time (the queue runs calls
        in order, and a call waits for a running one of its family before it writes their
        staging): its kp tensors and algorithms serve this program too, so it holds no second
        copy of them (H100, SmolLM2: ~220 pipelines and descriptor sets, the step's temps)."""
        kp = _kp()
        self.plan = plan
        self.mgr = mgr = device.manager()
        self.profile = profile
        self._family = share._family if share is not None else self    # who shares its staging (itself too)
        storage = kp.TensorTypes.storage
        self.tensors: list = [None] * len(plan.buffers)
        self._staging: dict[int, np.ndarray] = {}
        self.residents: list = []          # (arg index, Resident)
        self.streamed: list = []           # (arg index, staging array, kind, byte span)
        self.handed: list = []             # (arg index, kp tensor, its staging, kind): hand-offs
        mutated = {i for i, _ in plan.mutations}
        for i, spec in enumerate(plan.inputs):
            if spec.buffer is None or spec.chunks or spec.resident or i in mutated or \
                    share is not None:
                continue
            held_in = _held_in(args[i])
            if held_in is not None and held_in[1] == plan.buffers[spec.buffer].kind and \
                    held_in[0].size() == plan.buffers[spec.buffer].words and \
                    (not held_in[2] or _kept_gradient(args[i])):
                self.tensors[spec.buffer] = held_in[0]    # read where the producer left it
                self.handed.append((i, held_in[0], staging_view(held_in[0]), held_in[1]))
        for i, spec in enumerate(plan.inputs):
            if spec.buffer is None or not spec.resident:
                continue
            kind = plan.buffers[spec.buffer].kind
            for b, span in _spans(spec):
                r = Resident.get(mgr, args[i], kind, span)
                self.tensors[b] = r.tensor
                self.residents.append((i, r))
        held = staged = 0
        self._scratch: list[Scratch] = []
        temps = sorted((b for b, buf in enumerate(plan.buffers) if buf.role == "temp"),
                       key=lambda b: (-plan.buffers[b].words, b))
        rank_of = {b: r for r, b in enumerate(temps)}
        with upload.Batch(mgr) as consts:
            for b, buf in enumerate(plan.buffers):
                if self.tensors[b] is not None or buf.role == "unused":
                    continue
                if share is not None and b < len(share.tensors) and share.tensors[b] is not None \
                        and share.plan.buffers[b].words == buf.words:
                    self.tensors[b] = share.tensors[b]
                    if b in share._staging:
                        self._staging[b] = share._staging[b]
                    continue
                if buf.role == "temp":
                    self._scratch.append(Scratch.get(mgr, rank_of[b], buf.words))
                    self.tensors[b] = self._scratch[-1].tensor
                    continue
                empty = np.empty(buf.words, np.uint32)
                held += 4 * buf.words
                if buf.role in ("input", "output"):
                    self.tensors[b] = mgr.tensor_t(empty)           # device + staging
                    self._staging[b] = staging_view(self.tensors[b])
                    staged += 4 * buf.words
                else:
                    self.tensors[b] = mgr.tensor_t(empty, tensor_type=storage)
                    if buf.role == "const":
                        consts.words(self.tensors[b], np.ascontiguousarray(buf.const, np.uint32))
        handed = {i for i, *_ in self.handed}
        for i, spec in enumerate(plan.inputs):
            if spec.buffer is not None and not spec.resident and i not in handed:
                for b, span in _spans(spec):
                    self.streamed.append((i, self._staging[b], plan.buffers[b].kind, span))
        self.outputs = []
        self._out_buffers = []     # (output index, kp tensor): the outputs it hands off
        self._can_hand_off = []    # those it could
        self._visible = False      # whether the user sees them (gradients)
        self._lazy: frozenset = frozenset()   # hand-offs the recorded sequence leaves on the GPU
        self._placeholders = placeholder.Placeholders()   # the visible ones' host tensors
        for o in plan.outputs:
            if o.const is not None:
                self.outputs.append((None, None, "const", o.const))
            elif o.buffer is None:
                self.outputs.append((None, o.alias, None, None))
            else:
                n = int(np.prod(o.shape)) if o.shape else 1
                kind = plan.buffers[o.buffer].kind
                self.outputs.append((self._staging[o.buffer][:n], o.shape, kind,
                                     getattr(torch, o.dtype.replace("torch.", ""))))
                if plan.buffers[o.buffer].role == "output" and self.outputs[-1][3] in HANDED_DTYPES:
                    self._can_hand_off.append((len(self.outputs) - 1, self.tensors[o.buffer]))
        # the kernels' check word (runtime checks: plan.checks), zeroed before each submit
        self._checks = None if plan.check_buffer is None else self._staging[plan.check_buffer]
        # random kernels' seed, drawn from torch's default generator per call
        self._seed = None if plan.seed_buffer is None else self._staging[plan.seed_buffer]
        self.mutations = []        # (arg index, staging words, kind, Resident or None, bump)
        self.kept = []             # (arg index, Resident, bump): updated on the GPU only
        self._readbacks = []       # (resident kp tensor, device tensor it is copied into)
        resident_of = dict(self.residents)
        for i, b in plan.mutations:
            r, bump = resident_of.get(i), int(bool(bumped and bumped[i]))
            if r is None:
                staging = self._staging[b]
            elif is_kept_on_device(args[i]):
                self.kept.append((i, r, bump))   # read_back() refreshes the host copy
                continue
            else:
                rb = mgr.tensor_t(np.empty(plan.buffers[b].words, np.uint32))
                held, staged = held + 4 * plan.buffers[b].words, staged + 4 * plan.buffers[b].words
                self._readbacks.append((self.tensors[b], rb))
                staging = staging_view(rb)
            self.mutations.append((i, staging[:max(1, args[i].numel())], plan.buffers[b].kind,
                                   r, bump))
        _count(self, held, staged)
        self._staged_outputs = [n for n, o in enumerate(self.outputs) if o[0] is not None]
        self._out_bytes = sum(s.nbytes for s, _, kind, _ in self.outputs if kind != "const"
                              and s is not None)
        self._readback_bytes = sum(4 * rb.size() for _, rb in self._readbacks)
        # the fast check of the residents (see _residents_current)
        self._res_args = [i for i, _ in self.residents]
        self._res_refs = [r.ref for _, r in self.residents]
        self._res_ptrs = [r.ptr for _, r in self.residents]
        self._res_seen: list | None = None      # versions after the last call
        moved = {id(m[3]): m[4] for m in self.mutations if m[3] is not None}
        moved.update((id(r), bump) for _, r, bump in self.kept)
        # per resident: the bump its caller adds before each call (0 unless it is moved)
        self._res_bump = [moved.get(id(r), 0) for _, r in self.residents]
        self._res_moved = [(n, r, self._res_bump[n]) for n, (_, r) in enumerate(self.residents)
                           if id(r) in moved]
        # (arg index, Resident) of the inputs its caller bumps before each call
        self._bumped = [(i, r) for i, r, bump in self.kept + [(m[0], m[3], m[4]) for m in self.mutations]
                        if bump and r is not None]
        self._kept_args = [i for i, _, _ in self.kept]
        self._kept_res = [r for _, r, _ in self.kept]
        self._res_objs = [r for _, r in self.residents]
        self._res_bumped = any(self._res_bump)
        # one kp algorithm per kernel, constants, buffers and grid
        self._algorithms: dict = share._algorithms if share is not None else {}
        self.sequence, self._labels = self.record(plan.dispatches)

    def hand_off(self, outputs, visible: bool = False) -> None:
        """Hand these outputs (indices) off to the programs that read them next: saved
        activations, which only the backward reads; or (visible) gradients, which the user
        sees, and which only a keep_on_device optimizer's step reads from the GPU."""
        self._out_buffers = [(n, b) for n, b in self._can_hand_off if n in outputs]
        self._visible = visible

    def _lazy_buffers(self) -> set:
        """The output buffers this program's sequence leaves on the GPU: those of its lazy
        hand-offs, where no other output reads the same buffer."""
        lazy = {id(b) for n, b in self._out_buffers if n in self._lazy}
        eager = {id(self.tensors[o.buffer]) for n, o in enumerate(self.plan.outputs)
                 if o.buffer is not None and n not in self._lazy}
        return lazy - eager

    def scratch_words(self) -> int:
        """Words of the shared temporaries this program is bound to."""
        return sum(s.words for s in self._scratch)

    def superseded_scratch(self) -> list:
        """Its shared temporaries that a later program replaced by larger ones."""
        return [s for s in self._scratch if s.superseded()]

    @serialised
    def release(self) -> None:
        """Free the recorded sequence until the next call records it again: recorded
        commands take GPU memory, which the H100's driver grows 4 MiB at a time (five
        sequences of 217 to 6,944 dispatches: 4 MiB, whether each had a command pool of
        its own or all shared one)."""
        self.sequence = None

    def _build_algorithms(self, dispatches: list) -> None:
        """The kp algorithms (a descriptor set each, and a pipeline that kp shares among
        those of the same kernel and constants: patch 11) that `dispatches` need and this
        program lacks: their kernels compiled at once (shaders.compile_many), then the
        algorithms built on a thread each where kp builds them without the GIL (patch 8):
        the first of a pipeline compiles it in the driver."""
        plan, mgr = self.plan, self.mgr
        todo = {}
        for d in dispatches:
            key = _algorithm_key(d)
            if key not in self._algorithms:
                todo.setdefault(key, d)
        # each distinct kernel's SPIR-V once (a digest of its source per lookup costs; a
        # decoder's hundreds of dispatches share a few dozen kernels)
        kernels = {d.spirv_key: d.name for d in todo.values()}
        shaders.compile_many((plan.sources[k], name) for k, name in kernels.items())
        spirv = {k: shaders.compile_source(plan.sources[k], name) for k, name in kernels.items()}
        nogil = getattr(mgr, "algorithm_nogil", None)
        empty = np.zeros(0, np.uint32)

        def build(d):
            tensors = [self.tensors[b] for b in d.bindings]
            spv = spirv[d.spirv_key]
            spec = np.array(d.spec, np.uint32)
            if nogil is not None:
                return nogil(tensors, spv, list(d.groups), spec.tolist())
            return mgr.algorithm(tensors, spv, list(d.groups), spec, empty)
        workers = min(len(todo), os.cpu_count() or 1) if nogil is not None else 1
        shown = progress.bar(len(todo), "building pipelines", "pipeline")
        if len(todo) >= progress.BAR_FROM:
            progress.phase("building %d algorithms (%d distinct pipelines) on %d threads", len(todo),
                           len({(d.spirv_key, tuple(d.spec)) for d in todo.values()}), workers)

        def build_shown(d):
            algorithm = build(d)
            shown.update()
            return algorithm
        try:
            if workers > 1:
                with ThreadPoolExecutor(max_workers=workers) as pool:
                    built = list(pool.map(build_shown, todo.values()))
            else:
                built = [build_shown(d) for d in todo.values()]
        finally:
            shown.close()
        self._algorithms.update(zip(todo, built))

    @serialised
    def record(self, dispatches: list):
        """(kp sequence, profile labels) running `dispatches` (the plan's, or a prefix of
        them: runtime/replay.py runs fewer steps of a replay this way) between this
        program's input and output copies; algorithms are shared with its other sequences."""
        kp = _kp()
        plan, mgr = self.plan, self.mgr
        n_ts = 2 * len(dispatches) + 2 if self.profile else 0
        seq = mgr.sequence(total_timestamps=n_ts)
        handed = {i for i, *_ in self.handed}
        ins = [self.tensors[b] for i, s in enumerate(plan.inputs)
               if not s.resident and i not in handed for b in s.buffers()]
        if plan.check_buffer is not None:
            ins.append(self.tensors[plan.check_buffer])
        if plan.seed_buffer is not None:
            ins.append(self.tensors[plan.seed_buffer])
        labels = []
        if ins:
            seq.record(kp.OpTensorSyncDevice(ins))
            labels.append("copy inputs in")
        # One barrier orders this sequence's input copies and the uploads and kernels
        # of earlier submits before its kernels; then one per hazard between kernels.
        seq.record(kp.OpGlobalBarrier(TRANSFER_WRITE | SHADER_WRITE, SHADER_READ | SHADER_WRITE,
                                      STAGE_TRANSFER | STAGE_COMPUTE, STAGE_COMPUTE))
        labels.append(None)
        self._build_algorithms(dispatches)
        for d, wait in zip(dispatches, barriers(dispatches)):
            if wait:
                seq.record(kp.OpGlobalBarrier(SHADER_WRITE, SHADER_READ | SHADER_WRITE,
                                              STAGE_COMPUTE, STAGE_COMPUTE))
                labels.append(None)
            seq.record(kp.OpDispatchBare(self._algorithms[_algorithm_key(d)]))
            labels.append(f"{d.name} {d.note}")
        resident = {b for spec in plan.inputs if spec.resident for b in spec.buffers()}
        lazy = self._lazy_buffers()
        outs = [self.tensors[b] for b in sorted(
            {o.buffer for o in plan.outputs if o.buffer is not None} |
            ({plan.check_buffer} if plan.check_buffer is not None else set()) |
            {b for _, b in plan.mutations if b not in resident}) if id(self.tensors[b]) not in lazy]
        for src, rb in self._readbacks:     # mutated weights/buffers: copy out to host too
            seq.record(kp.OpMemoryBarrier([src], SHADER_WRITE, TRANSFER_READ,
                                          STAGE_COMPUTE, STAGE_TRANSFER))
            seq.record(kp.OpTensorCopy([src, rb]))
            seq.record(kp.OpMemoryBarrier([rb], TRANSFER_WRITE, TRANSFER_READ,
                                          STAGE_TRANSFER, STAGE_TRANSFER))
            labels += [None, "copy mutated buffer", None]
            outs.append(rb)
        if outs:
            seq.record(kp.OpTensorSyncLocal(outs))
            labels.append("copy outputs out")
        return seq, labels

    def _residents_current(self, ts: list) -> bool:
        """Whether every resident input is the tensor its GPU copy was made from, at the
        version this program left it, or (a program that bumps none) at the version its GPU
        copy holds: a training step's forward and backward, whose weights the optimizer
        step updated on the GPU. A few list passes instead of a Python loop per weight (a
        decoder binds hundreds)."""
        versions = list(map(_VERSION, ts))
        if versions != self._res_seen:
            if self._res_bumped or versions != list(map(_RECORDED, self._res_objs)):
                return False
        if not (all(map(operator.is_, map(operator.call, self._res_refs), ts)) and
                list(map(torch.Tensor.data_ptr, ts)) == self._res_ptrs):
            return False
        self._res_seen = versions
        return True

    @serialised
    def __call__(self, args, sequence=None, lazy=frozenset()):
        """The outputs for `args`; `sequence`: one of this program's record()ings to run
        instead of the whole plan (its outputs then hold what it wrote). lazy: indices of
        hand-off outputs whose host tensors are left pending (see _Held): only the GPU
        holds their value until a host reader materialises them; a dict names the
        parameter whose gradient each is."""
        try:
            seq, defer = self._prepare(args, sequence, lazy)
        except BaseException:
            self._absorb_bumps(args)        # nothing was submitted
            raise
        self._submit(seq, sequence is None, wait=False)
        if defer:
            _IN_FLIGHT.append((self, seq))
        try:            # the host's share of the outputs while the GPU runs
            out = [None] * len(self.outputs)
            for n in self._lazy:      # pending; a visible one reads as NaN until read back
                _, shape, _, dtype = self.outputs[n]
                out[n] = self._placeholders.get(n, shape, dtype) if self._visible and \
                    dtype.is_floating_point else torch.empty(shape, dtype=dtype)
            for n, buffer in self._out_buffers:
                if n in self._lazy:
                    _hold(buffer, self.mgr, out[n], self.outputs[n][2], self._visible, True,
                          lazy.get(n) if isinstance(lazy, dict) else None)
        finally:
            if not defer:
                self._submit(seq, sequence is None, wait=True)
                settle()        # the earlier ones finished before it (its first barrier)
        if not defer and self._checks is not None and self._checks[0]:
            raise_failed_checks(self.plan.checks, int(self._checks[0]))
        if self.profile and sequence is None:
            self._report()
        for i, staging, kind, r, bump in self.mutations:
            t = args[i]
            with torch.no_grad():
                t.copy_(torch.from_numpy(staging.view(NUMPY_OF_KIND[kind]).copy()).view(t.shape))
            if r is not None:
                r.version = t._version          # the GPU copy holds this value
        if self.kept:       # a whole optimizer's state: list passes, not a loop of lookups
            kept = [args[i] for i in self._kept_args]
            for r, v in zip(self._kept_res, map(_VERSION, kept)):
                r.version = v
            Resident._newer.update(zip(map(id, kept), self._kept_res))
        seen = self._res_seen
        for n, r, bump in self._res_moved:    # what the caller's bump before the next call makes them
            seen[n] = r.version + bump
        for n, (staging, shape, kind, dtype) in enumerate(self.outputs):
            if n in self._lazy:
                continue
            if staging is None:
                out[n] = dtype if kind == "const" else args[shape]   # a size, or an input
                continue
            a = staging.view(NUMPY_OF_KIND[kind])
            if kind == "b":
                a = a != 0
            want = NUMPY_OF_DTYPE.get(dtype)
            if want is not None:     # one numpy copy into the caller's dtype
                out[n] = torch.from_numpy(a.astype(want)).view(shape)
            else:
                out[n] = torch.from_numpy(a.copy()).to(dtype).view(shape)
        for n, buffer in self._out_buffers:
            if n not in self._lazy:
                _hold(buffer, self.mgr, out[n], self.outputs[n][2], self._visible, False)
        return out

    def _prepare(self, args, sequence, lazy) -> tuple:
        """Everything a call does before its submit: (the sequence to submit, whether the
        call returns without waiting for it)."""
        if any(p._family is self._family for p, _ in _IN_FLIGHT):
            settle()            # its (or its family's) staging memory is written below
        accumulate.flush()      # additions that read buffers this call may write
        now = frozenset(n for n, _ in self._out_buffers if n in lazy)
        if now != self._lazy:
            self._lazy, self.sequence = now, None      # recorded again, without their copies
        ts = [args[i] for i in self._res_args]
        if not self._residents_current(ts):
            self._res_seen = None
            self._sync_residents(args)
            self._res_seen = [r.version for _, r in self.residents]
        sent = 0
        if _HELD or Resident._newer:    # pending hand-offs; kept tensors newer on the GPU
            refresh_host([args[i] for i, *_ in self.streamed])
        for i, staging, kind, span in self.streamed:
            words = host_words(args[i], kind, span)
            staging[:words.size] = words        # an empty input has 0 words in a 1-word buffer
            sent += words.nbytes
        for i, buffer, staging, kind in self.handed:
            if _still_holds(buffer, args[i]):
                continue
            held_in = _held_in(args[i])
            if held_in is not None and held_in[0] is not buffer and held_in[1] == kind and \
                    held_in[0].size() == buffer.size():
                raise StaleBinding(i)     # another program produces it now: bind its buffer
            if held_in is None or held_in[0] is not buffer:
                materialise([args[i]])
                _release(buffer)    # a pending value there is read back before the upload
                accumulate.flush()
                words = host_words(args[i], kind)     # not the value left there: upload it
                staging[:words.size] = words
                sent += words.nbytes
                _sync_device(self.mgr, buffer)
                _hold(buffer, self.mgr, args[i], kind)
        for _, buffer in self._out_buffers:
            _release(buffer)
        accumulate.flush()          # gradients moved to their accumulators first
        _stats["input_bytes"] += sent
        _stats["output_bytes"] += self._out_bytes - sum(
            self.outputs[n][0].nbytes for n in self._lazy)
        _stats["readback_bytes"] += self._readback_bytes
        if self._checks is not None:
            self._checks[0] = 0
        if self._seed is not None:
            self._seed[:2] = torch.randint(0, 1 << 32, (2,)).numpy().astype(np.uint32)
        if sequence is None and self.sequence is None:
            self.sequence, self._labels = self.record(self.plan.dispatches)
        settle(checks_only=True)    # an earlier program's failed check raises before this runs
        return sequence or self.sequence, self._defers(sequence)

    def _submit(self, seq, own: bool, wait: bool) -> None:
        """seq's submit, or (wait) the wait for it; a driver's failure raised as a SubmitError
        (`own`: seq is the program's recorded sequence, which the next call records again)."""
        try:
            if not wait and seq.is_running():
                seq.eval_await()        # a wait that an interrupt cut short
            seq.eval_await() if wait else seq.eval_async()
        except Exception as e:
            if own:
                self.sequence = None
            raise SubmitError(f"the Vulkan submit of a compiled program ({len(self.plan.dispatches)} "
                              f"kernels) failed: {e}. The next call records and submits it "
                              "again; if the device was lost, restart the process") from e
        if not wait:
            _stats["submits"] += 1

    def _absorb_bumps(self, args) -> None:
        """The caller bumped the versions of the inputs this program mutates, and the call
        raised before it submitted: their GPU copies still hold their values."""
        for i, r in self._bumped:
            if args[i]._version == r.version + 1:
                r.version = args[i]._version

    def _defers(self, sequence) -> bool:
        """Whether this call submits without waiting: the host reads nothing the call writes
        (every output it would copy out is a pending hand-off; no mutation is copied back)
        and no profile is asked for."""
        return SUBMIT_WITHOUT_WAIT and sequence is None and not self.profile and \
            not self.mutations and not self._readbacks and \
            all(n in self._lazy for n in self._staged_outputs)

    def _sync_residents(self, args) -> None:
        """Upload the resident inputs whose GPU copy is stale, in one upload batch (a submit
        per runtime/upload.STAGING_BYTES), with a progress bar when they add up to
        PROGRESS_BYTES or more (a model's first call)."""
        todo = []
        for n, (i, r) in enumerate(self.residents):
            t = args[i]
            if r.ref() is not t or r.ptr != t.data_ptr():
                raise StaleBinding(i)
            if self._res_bump[n] and t._version == r.version + 1:
                r.version = t._version      # the caller's bump before this call: nothing written
            if r.stale(t):
                todo.append((t, r))
        if not todo:
            return
        total = sum(r.nbytes() for _, r in todo)
        bar = _progress(total) if total >= PROGRESS_BYTES else None
        try:
            with upload.Batch(self.mgr) as batch:
                for t, r in todo:
                    r.stage(t, batch)
                    if bar is not None:
                        bar.update(r.nbytes())
        finally:
            if bar is not None:
                bar.close()
        for t, r in todo:
            r.synced(t)

    def call_unwrapped(self, args, sequence=None):
        """__call__ for a caller that is not the aot_autograd wrapper the program was built
        for (a replay of its step, runtime/replay.py): it bumps the versions of the inputs
        that wrapper would bump, before the call as the wrapper does, so the GPU copies
        stay in step with them and are not uploaded again."""
        _increment_versions([(args[i], r) for i, r in self._bumped])
        return self(args, sequence)

    def _report(self):
        ts = np.array(self.sequence.get_timestamps(), dtype=np.float64)
        period = device.device_info().get("timestamp_period_ns", 1.0)
        us = np.diff(ts) * period / 1e3     # one timestamp before and one after each op
        rows = [f"{t:10.1f} us  {label}" for label, t in zip(self._labels, us) if label]
        plog = logging.getLogger("dynamo_vulkan.profile")
        if plog.level == logging.NOTSET:     # DYNAMO_VULKAN_PROFILE=1 asks for the table
            plog.setLevel(logging.INFO)
            if not logging.getLogger().handlers:
                plog.addHandler(logging.StreamHandler())
        plog.info(
            "GPU time per kernel:\n%s\n%10.1f us  total", "\n".join(rows), float(us.sum()))


class SubmitError(RuntimeError):
    """A compiled program's submit failed in the driver (out of memory, a lost device)."""


class KernelIndexError(IndexError, RuntimeError):
    """An index a kernel met out of range: an IndexError, as eager's indexing raises, and a
    RuntimeError, as eager's gather and scatter raise."""


def raise_failed_checks(checks: list[str], word: int, where: str = "") -> None:
    """Raise the first failed check of plan.checks (bit min(k, 31) of `word` is check k);
    `where` ends the message."""
    failed = [c for k, c in enumerate(checks) if word >> min(k, 31) & 1]
    exc, _, message = failed[0].partition(": ")
    more = f" (and {len(failed) - 1} more failed checks)" if len(failed) > 1 else ""
    cls = {"IndexError": KernelIndexError, "OverflowError": OverflowError}.get(exc, RuntimeError)
    raise cls(message + more + where)


def _progress(total: int):
    """A tqdm bar over `total` bytes of weight uploads (None without tqdm); it shows on a
    terminal only (tqdm's disable=None)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:     # a dependency, but running must not need it
        return None
    return tqdm(total=total, desc="uploading weights", unit="B", unit_scale=True,
                unit_divisor=1024, leave=False, disable=None)


def _increment_versions(moved: list) -> None:
    """Bump the versions of the (tensor, Resident) pairs' tensors (one call each: older
    torch's increment_version takes one tensor)."""
    for t, _ in moved:
        torch.autograd.graph.increment_version(t)


def _spans(spec) -> list:
    """(buffer, byte span or None) for each buffer holding an input."""
    if spec.chunks:
        return [(b, (start, length)) for b, start, length in spec.chunks]
    return [(spec.buffer, None)]


class StaleBinding(Exception):
    """A resident input is a different tensor than the one the program was recorded with."""
