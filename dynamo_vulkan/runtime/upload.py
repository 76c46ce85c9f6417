"""Host data into device-only kp tensors, many uploads to a submit (runtime/program.py's
resident weights and constants).

An upload of its own (a staging tensor made, filled, copied twice on the GPU and freed, in a
sequence of its own) costs about 1.7 ms on the H100's driver, most of it allocating the
host-visible memory: a model's first call made hundreds. A Batch stages its uploads'
words in one host-visible tensor, copies it into one device temporary in one transfer,
and writes each upload into its destination with a kernel (shaders/upload.comp), one
submit per STAGING_BYTES. GGUF rows are staged as the file holds them and, on a GPU, the
kernel puts them in the GPU order of their type (gguf/gpu_layout.py) on the way, where
the host took seconds for a 7B model; a CPU device (lavapipe) regroups them on the host,
which is the same processor and does it faster than the kernel's bit gathers.
"""
from __future__ import annotations

import numpy as np

from ..gguf.gpu_layout import REGROUP, U8, bit_sources, gpu_rows, row_bytes_of
from .. import device
from . import shaders
from .plan import groups_for

STAGING_BYTES = 32 << 20   # a batch's staging tensor (host-visible) and temporary (device)
GROUP = 256                # the kernel's local size


class _Item:
    """One write into dst: `words` words from the staging at src_word, filled by
    fill(uint8 view of its bytes); regroup names the GGUF type the kernel regroups (rows of
    row_bytes, nbytes in all), or is None for a copy."""
    __slots__ = ("dst", "dst_word", "words", "fill", "regroup", "nbytes", "row_bytes", "src_word")

    def __init__(self, dst, dst_word, words, fill, regroup=None, nbytes=0, row_bytes=0):
        self.dst, self.dst_word, self.words, self.fill = dst, dst_word, words, fill
        self.regroup, self.nbytes, self.row_bytes = regroup, nbytes, row_bytes
        self.src_word = 0


class Batch:
    """Uploads into device-only kp tensors of one manager, submitted STAGING_BYTES at a time
    and at close() (a `with` block closes it): a destination is written once its batch
    has been submitted, so read nothing of them before. The host data is read when its
    part is submitted: keep it unchanged until close()."""

    def __init__(self, mgr, regroup_on_device: bool | None = None, staging_bytes: int = STAGING_BYTES):
        """regroup_on_device: whether the kernel regroups GGUF rows (default: on a GPU, not
        on a CPU device)."""
        self.mgr = mgr
        self.regroup_on_device = not device.is_cpu() if regroup_on_device is None else regroup_on_device
        self.capacity = staging_bytes // 4
        self._items: list[_Item] = []
        self._pending = 0           # words staged by the items not yet submitted
        self._staging = self._temp = None
        self._tables: dict = {}     # GGUF type name -> its bit_sources table (kp tensor)
        self._spv: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None:
            self.close()
        else:
            self._free()

    # ------------------------------------------------------------------ adding uploads
    def words(self, dst, words: np.ndarray) -> None:
        """dst[0:len(words)] = words (uint32)."""
        flat = words.reshape(-1).view(np.uint32)
        for w0 in range(0, flat.size, self.capacity):
            part = flat[w0:w0 + self.capacity]
            self._add(_Item(dst, w0, part.size, _copy_words(part)))

    def gguf_rows(self, dst, data: np.ndarray, kind: str) -> None:
        """dst's bytes = the GGUF rows `data` (uint8, whole rows) in the GPU order of `kind`
        (runtime/words.host_words' bytes), the last word's rest zero."""
        name = kind.split("/")[1] if kind != U8 else None
        row_bytes = row_bytes_of(kind)
        # pieces of whole rows (a multiple of 4 rows, so that each starts on a word), or of
        # words for bytes in GGML's order
        step = 4 * self.capacity if row_bytes is None else \
            max(4, (4 * self.capacity // row_bytes) // 4 * 4) * row_bytes
        if row_bytes is not None and step > 4 * self.capacity:
            raise ValueError(f"a staging batch of {4 * self.capacity} bytes cannot hold 4 rows of "
                             f"{row_bytes} bytes")
        on_device = self.regroup_on_device and name in REGROUP
        for b0 in range(0, data.size, step):
            part = data[b0:b0 + step]
            words = -(-part.size // 4)
            if on_device:
                self._add(_Item(dst, b0 // 4, words, _copy_bytes(part), name, part.size, row_bytes))
            else:
                self._add(_Item(dst, b0 // 4, words, _regrouped(part, kind)))

    def _add(self, item: _Item) -> None:
        if item.words == 0:
            return
        if self._pending + item.words > self.capacity:
            self._submit(last=False)
        item.src_word = self._pending
        self._pending += item.words
        self._items.append(item)

    # ------------------------------------------------------------------ submitting
    def _submit(self, last: bool) -> None:
        """Stage the pending uploads, copy them to the device and write each into its
        destination: one submit, waited for. A batch submitted all at once (`last`, the
        first time) takes staging memory of its own size."""
        if not self._items:
            return
        import kp

        from .program import SHADER_READ, STAGE_COMPUTE, STAGE_TRANSFER, TRANSFER_WRITE, settle
        settle()        # programs still running may read the buffers written here
        mgr = self.mgr
        if self._staging is None:
            size = self._pending if last else self.capacity
            self._staging = mgr.tensor_t(np.zeros(size, np.uint32), tensor_type=kp.TensorTypes.host)
            self._temp = mgr.tensor_t(np.empty(size, np.uint32), tensor_type=kp.TensorTypes.storage)
        staged = _staging_bytes(self._staging)
        algorithms = []
        try:
            for it in self._items:
                it.fill(staged[4 * it.src_word:4 * (it.src_word + it.words)])
                algorithms.append(self._algorithm(it))
            seq = mgr.sequence()
            seq.record(kp.OpTensorCopy([self._staging, self._temp]))
            seq.record(kp.OpGlobalBarrier(TRANSFER_WRITE, SHADER_READ, STAGE_TRANSFER, STAGE_COMPUTE))
            for algo in algorithms:
                seq.record(kp.OpDispatchBare(algo))
            seq.eval()
        finally:
            for algo in algorithms:
                algo.destroy()
            self._items, self._pending = [], 0

    def close(self) -> None:
        """Submit what is pending and free the staging memory."""
        try:
            self._submit(last=True)
        finally:
            self._free()

    def _free(self) -> None:
        for t in (self._staging, self._temp, *self._tables.values()):
            if t is not None:
                t.destroy()
        self._staging = self._temp = None
        self._tables = {}
        self._items, self._pending = [], 0

    def _algorithm(self, it: _Item):
        regroup = it.regroup is not None
        if regroup not in self._spv:
            _, source = shaders.kernel_source("upload", {"REGROUP": 1} if regroup else {})
            self._spv[regroup] = shaders.compile_source(source, "upload")
        tensors = [it.dst, self._temp]
        if regroup:
            tensors.append(self._table(it.regroup))
        push = np.array([it.src_word, it.dst_word, it.words, it.nbytes, it.row_bytes], np.uint32)
        return self.mgr.algorithm(tensors, self._spv[regroup], list(groups_for(it.words, GROUP)),
                                  np.array([GROUP], np.uint32), push)

    def _table(self, name: str):
        """The kernel's table for GGUF type `name` (a device tensor, uploaded once a batch)."""
        t = self._tables.get(name)
        if t is None:
            import kp
            widths, sources = bit_sources(name)
            if len(widths) > 4:
                raise ValueError(f"{name}'s GPU layout has {len(widths)} regions; the upload "
                                 "kernel reads at most 4")
            words = np.concatenate([np.array(widths + (0,) * (4 - len(widths)), np.uint32), sources])
            t = self._tables[name] = self.mgr.tensor_t(words)
            self.mgr.sequence().record(kp.OpTensorSyncDevice([t])).eval()
        return t


def _staging_bytes(t) -> np.ndarray:
    from .program import staging_view
    return staging_view(t).view(np.uint8)


def _copy_words(part: np.ndarray):
    def fill(out: np.ndarray) -> None:
        out.view(np.uint32)[:] = part
    return fill


def _copy_bytes(part: np.ndarray):
    def fill(out: np.ndarray) -> None:
        out[:part.size] = part
        out[part.size:] = 0
    return fill


def _regrouped(part: np.ndarray, kind: str):
    def fill(out: np.ndarray) -> None:
        gpu_rows(part, kind, out[:part.size])
        out[part.size:] = 0
    return fill
