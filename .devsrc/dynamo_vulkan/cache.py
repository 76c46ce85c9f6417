"""Two-level cache: in memory (this process) and on disk (across processes).

Disk entries are written atomically (temp file + rename) and carry a SHA-256
of their payload; an entry that does not verify is deleted and rebuilt. A
checksum proves no authorship, so the directory itself must be private: it is
created 0700, and one that others can write (it, or a parent that is not
sticky) or that another user owns is refused with a warning, and this process
caches in memory only. Payloads are data, never pickles (plans: runtime/plan.py).
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections import defaultdict
from pathlib import Path

from . import config

log = logging.getLogger(__name__)

MAGIC = b"DVKC1\n"
TMP_PREFIX = ".tmp-"       # an entry being written; renamed over the entry when whole
_stats: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
_memory: dict[tuple[str, str], object] = {}
# configured cache directory -> the resolved directory it was checked as, or None: refused
_roots: dict[Path, Path | None] = {}


def count(level: str, event: str) -> None:
    _stats[level][event] += 1


def cache_stats() -> dict[str, dict[str, int]]:
    """Hits and misses of each cache level, e.g. {'spirv': {'disk_hits': 3, ...}}."""
    return {level: dict(events) for level, events in _stats.items()}


def reset_stats() -> None:
    """Zero the counters of cache_stats (tests count the events of one compile)."""
    _stats.clear()


def untrusted_reason(path: Path) -> str | None:
    """Why the directory `path` (resolved, no symlinks) cannot hold a cache that this user's
    processes load, or None: it must be a directory this user owns that no one else can
    write, under parents owned by this user or root that no one else can write unless they
    are sticky (/tmp: others may add names there but not rename or remove ours)."""
    if not hasattr(os, "geteuid"):       # no POSIX owners (Windows): the ACLs decide
        return None
    uid = os.geteuid()
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"its group or other users can write it (mode {stat.S_IMODE(st.st_mode):04o})"
    for parent in path.parents:
        st = os.stat(parent)
        if st.st_uid not in (uid, 0):
            return f"its parent {parent} is owned by uid {st.st_uid}, neither this user nor root"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return (f"its parent {parent} can be written by its group or other users and is not "
                    f"sticky (mode {stat.S_IMODE(st.st_mode):04o})")
    return None


def _prepare(path: Path) -> Path | None:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        real = path.resolve(strict=True)
        why = untrusted_reason(real)
    except OSError as e:
        why = f"it cannot be created or read ({e.strerror or e})"
    if why is None:
        return real
    log.warning("dynamo_vulkan: not using the disk cache %s: %s. Compiled programs are cached "
                "in memory only; set DYNAMO_VULKAN_CACHE_DIR to a private directory (mode 0700) "
                "or DYNAMO_VULKAN_CACHE=0", path, why)
    return None


def cache_root(cfg: config.Config | None = None) -> Path | None:
    """The disk cache's directory, resolved, created 0700 and checked once per process;
    None when the disk cache is off or the directory is refused (see untrusted_reason).
    Entries are read and written under the resolved path, so a symlink swapped later
    cannot redirect them."""
    cfg = cfg or config.current()
    if not cfg.cache_enabled:
        return None
    if cfg.cache_dir not in _roots:
        _roots[cfg.cache_dir] = _prepare(cfg.cache_dir)
    return _roots[cfg.cache_dir]


def _is_ours(name: str) -> bool:
    return name.endswith(".bin") or name.startswith(TMP_PREFIX)


def clear_cache(disk: bool = True) -> None:
    """Forget compiled programs held in memory and, with disk=True, delete the on-disk
    cache's entries and any temporary files that interrupted writes left (a directory
    where an entry belongs is removed too). The directory is checked again afterwards."""
    _memory.clear()
    from .runtime import shaders
    shaders.clear_memory()
    _roots.clear()
    if not disk:
        return
    root = cache_root()
    if root is None:
        return
    failed = []
    for top, dirs, files in os.walk(root):           # symlinks are not followed
        for name in [d for d in dirs if _is_ours(d)]:
            dirs.remove(name)
            p = os.path.join(top, name)
            try:
                os.unlink(p) if os.path.islink(p) else shutil.rmtree(p)
            except OSError as e:
                failed.append(f"{p} ({e.strerror or e})")
        for name in files:
            if _is_ours(name):
                try:
                    os.unlink(os.path.join(top, name))
                except FileNotFoundError:
                    pass
                except OSError as e:
                    failed.append(f"{os.path.join(top, name)} ({e.strerror or e})")
    if failed:
        log.warning("dynamo_vulkan: clear_cache could not remove %d entries: %s",
                    len(failed), ", ".join(failed[:5]))


def digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def memory_get(level: str, key: str):
    return _memory.get((level, key))


def memory_put(level: str, key: str, value) -> None:
    _memory[(level, key)] = value


def _path(root: Path, level: str, key: str) -> Path:
    return root / level / key[:2] / f"{key}.bin"


def disk_get(level: str, key: str) -> bytes | None:
    """An entry's verified payload, or None: none, unreadable, or damaged (then it is
    deleted where the directory allows, and the caller rebuilds it)."""
    root = cache_root()
    if root is None:
        return None
    path = _path(root, level, key)
    try:
        blob = path.read_bytes()
    except OSError:                 # none yet, unreadable, or a directory in its place
        return None
    head = len(MAGIC) + 32
    if len(blob) < head or not blob.startswith(MAGIC) or \
            hashlib.sha256(blob[head:]).digest() != blob[len(MAGIC):head]:
        log.warning("dynamo_vulkan cache entry %s is damaged; rebuilding it", path)
        count(level, "corrupt")
        try:
            path.unlink(missing_ok=True)
        except OSError:             # a read-only cache: the rebuilt entry is not stored either
            pass
        return None
    return blob[head:]


def disk_load(level: str, key: str, decode, errors: tuple, what: str):
    """An entry's payload as decode(payload) makes it, counted as a disk hit; or None,
    counted as a miss: none stored, damaged, or refused by decode (one of `errors`: then
    also counted corrupt, with a warning that it is not `what`), and the caller rebuilds it."""
    blob = disk_get(level, key)
    if blob is not None:
        try:
            value = decode(blob)
        except errors as e:
            log.warning("dynamo_vulkan cache entry %s/%s is not %s (%s); rebuilding it", level, key, what, e)
            count(level, "corrupt")
        else:
            count(level, "disk_hits")
            return value
    count(level, "misses")
    return None


def disk_put(level: str, key: str, payload: bytes) -> None:
    """Store an entry atomically; a failure (read-only or full disk) is a warning, and
    the temporary file is removed on every way out, an interrupt included."""
    root = cache_root()
    if root is None:
        return
    path = _path(root, level, key)
    tmp = None
    try:
        path.parent.parent.mkdir(mode=0o700, exist_ok=True)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
        tmp = None
    except OSError as e:  # a read-only or full disk must not break compilation
        log.warning("dynamo_vulkan could not write cache entry %s: %s", path, e)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
