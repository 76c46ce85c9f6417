"""Positional reads of a file's byte ranges into caller-owned buffers, large ones by a few
threads at once.

``os.preadv`` copies from the page cache straight into the buffer: no mapping whose pages
count in the process's RSS, no page faults on the file, and the GIL is released during the
copy, so threads reading different pieces of a large tensor run in parallel. Where the
platform lacks ``preadv`` a seek and ``readinto`` under a lock do the same one piece at a
time.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Sequence

__all__ = ["read_spans", "PIECE_BYTES", "MAX_THREADS"]

PIECE_BYTES = 4 << 20            # bytes one read call fills; a span longer than this is split
MAX_THREADS = 8                  # read threads at most (fewer on a machine with fewer cores)

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _threads() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_THREADS, cores or 1))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_threads(), thread_name_prefix="gguf-read")
        return _pool


def _forget_executor() -> None:
    """A forked child has none of its parent's threads: it starts its own pool when it reads."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_executor)


class _Source:
    """One open file read at given offsets, thread-safely."""

    def __init__(self, fh):
        self.fh = fh
        self.fd = fh.fileno()
        self.lock = threading.Lock()

    def read_into(self, buf: memoryview, offset: int) -> None:
        """Fill ``buf`` with the bytes at ``offset``; EOFError where the file ends first."""
        done, n = 0, len(buf)
        while done < n:
            got = self._read_some(buf[done:], offset + done)
            if got == 0:
                raise EOFError(f"the file ends at byte {offset + done}, before byte {offset + n}")
            done += got

    def read_all(self, jobs: Sequence[tuple[memoryview, int]]) -> None:
        for buf, offset in jobs:
            self.read_into(buf, offset)

    def _read_some(self, buf: memoryview, offset: int) -> int:
        if hasattr(os, "preadv"):
            return os.preadv(self.fd, [buf], offset)
        with self.lock:
            self.fh.seek(offset)
            return self.fh.readinto(buf) or 0


def read_spans(fh, spans: Sequence[tuple[int, memoryview]], *, piece: int | None = None,
               threads: int | None = None) -> None:
    """Fill each ``(offset, buffer)`` of ``spans`` with the bytes of the open binary file
    ``fh`` at that offset, in reads of at most ``piece`` bytes. Where there are at least
    two pieces, up to ``threads`` threads (default: up to MAX_THREADS, no more than the
    cores) each read a run of neighbouring pieces, the calling thread one of them: one
    hand-over per thread, not per piece, as each costs a GIL switch. A file that ends
    before a span does raises EOFError."""
    piece = piece or PIECE_BYTES
    if piece < 1:
        raise ValueError(f"piece must be >= 1 byte, got {piece}")
    threads = _threads() if threads is None else threads
    src = _Source(fh)
    jobs = []
    for offset, buf in spans:
        buf = memoryview(buf).cast("B")
        for start in range(0, len(buf), piece):
            jobs.append((buf[start:start + piece], offset + start))
    n = min(threads, len(jobs))
    if n <= 1:
        src.read_all(jobs)
        return
    runs = [jobs[i * len(jobs) // n:(i + 1) * len(jobs) // n] for i in range(n)]
    pool = _executor() if threads >= _threads() else ThreadPoolExecutor(threads - 1, "gguf-read")
    try:
        futures = [pool.submit(src.read_all, run) for run in runs[1:]]
        try:
            src.read_all(runs[0])
        finally:
            wait(futures)               # every piece done before an error is raised
        for f in futures:
            f.result()
    finally:
        if pool is not _pool:
            pool.shutdown()
