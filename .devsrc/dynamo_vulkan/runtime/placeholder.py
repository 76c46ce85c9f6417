"""NaN-filled host tensors that stand for a program's pending visible outputs (the gradients a
compiled backward leaves on the GPU for a keep_on_device optimizer), reused from call to call.

A pending gradient's host tensor reads as NaN until it is read back (runtime/program.py). Filling
a fresh tensor with NaN for every gradient of every step costs the host as much as copying the
gradients out would (a 6-layer GPT of 11M parameters: 44 MB of page faults and stores a step).
A program's output keeps the storage of its last placeholder (through a detached alias, which
shares the tensor's version counter but is not a reference autograd counts): the next call hands
out a new tensor on that storage, not filled again, when nothing else holds the storage (the
user dropped the .grad: zero_grad(set_to_none=True)) and nothing wrote it since: no in-place op
(the version counter) and no read-back (`written`). Otherwise it fills a new one. A write that
bypasses the version counter (through .data or numpy) is not seen: the next placeholder then
shows that value instead of NaN (a host read of a pending gradient is a misuse either way).
"""
from __future__ import annotations

import math
import weakref

import torch
from torch.multiprocessing.reductions import StorageWeakRef

_use_count = torch._C._storage_Use_Count


def _count_of_one_holder() -> int:
    """What _use_count reads for a storage that one tensor holds (it counts its own lookup
    through the weak reference in some builds)."""
    t = torch.empty(1)
    return _use_count(StorageWeakRef(t.untyped_storage()).cdata)


_ONE_HOLDER = _count_of_one_holder()


class _Slot:
    """One output's last placeholder: its alias, version, and whether it still holds NaN."""

    __slots__ = ("alias", "version", "ref", "clean", "__weakref__")

    def __init__(self, t: torch.Tensor):
        self.alias = t.detach()             # shares t's storage and version counter
        self.version = t._version
        self.ref = StorageWeakRef(self.alias.untyped_storage())
        self.clean = True

    def reusable(self, shape, dtype) -> bool:
        a = self.alias
        return self.clean and a._version == self.version and a.dtype == dtype and \
            a.shape == shape and _use_count(self.ref.cdata) == _ONE_HOLDER


# storage address -> the slot whose alias holds it (the alias keeps the address unique)
_BY_ADDRESS: "weakref.WeakValueDictionary[int, _Slot]" = weakref.WeakValueDictionary()
_filled = [0]      # placeholders filled with NaN so far (not reused)


def fills() -> int:
    """How many placeholders were filled anew so far in this process."""
    return _filled[0]


class Placeholders:
    """A program's placeholders, one slot per output index."""

    def __init__(self):
        self._slots: dict[int, _Slot] = {}

    def get(self, n: int, shape, dtype: torch.dtype) -> torch.Tensor:
        """A NaN-reading host tensor of `shape` for output n (a new tensor object every call,
        which autograd may steal as a .grad)."""
        shape = torch.Size(shape)
        s = self._slots.get(n)
        if s is not None and s.reusable(shape, dtype):
            t = torch.empty(0, dtype=dtype).set_(s.alias.untyped_storage(), 0, shape)
            s.alias, s.version = t.detach(), t._version
            return t
        t = torch.full(shape, float("nan"), dtype=dtype)
        _filled[0] += 1
        if math.prod(shape) == 0:        # no storage address of its own to track
            self._slots.pop(n, None)
            return t
        s = self._slots[n] = _Slot(t)
        _BY_ADDRESS[t.untyped_storage().data_ptr()] = s
        return t


def only_ours(address: int) -> bool:
    """Whether the storage at `address` is a placeholder's that no tensor but its slot's alias
    holds (the user dropped it: no one can read it)."""
    s = _BY_ADDRESS.get(address)
    return s is not None and _use_count(s.ref.cdata) <= _ONE_HOLDER


def written(address: int) -> None:
    """The storage at `address` was written without its version moving (a read-back): a
    placeholder there no longer reads as NaN."""
    s = _BY_ADDRESS.get(address)
    if s is not None:
        s.clean = False
