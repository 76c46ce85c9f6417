"""Two-level cache: in memory (this process) and on disk (across processes).

Disk entries are written atomically (temp file + rename) and carry a SHA-256
of their payload; an entry that does not verify is deleted and rebuilt.
"""
from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections import defaultdict
from pathlib import Path

from . import config

log = logging.getLogger(__name__)

MAGIC = b"DVKC1\n"
_stats: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
_memory: dict[tuple[str, str], object] = {}


def count(level: str, event: str) -> None:
    _stats[level][event] += 1


def cache_stats() -> dict[str, dict[str, int]]:
    """Hits and misses of each cache level, e.g. {'spirv': {'disk_hits': 3, ...}}."""
    return {level: dict(events) for level, events in _stats.items()}


def reset_stats() -> None:
    _stats.clear()


def clear_cache(disk: bool = True) -> None:
    """Forget compiled programs held in memory and, with disk=True, delete the on-disk cache."""
    _memory.clear()
    from .runtime import shaders
    shaders.clear_memory()
    if disk:
        root = config.load().cache_dir
        if root.is_dir():
            for p in root.rglob("*.bin"):
                p.unlink(missing_ok=True)


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


def _path(cfg: config.Config, level: str, key: str) -> Path:
    return cfg.cache_dir / level / key[:2] / f"{key}.bin"


def disk_get(level: str, key: str) -> bytes | None:
    cfg = config.load()
    if not cfg.cache_enabled:
        return None
    path = _path(cfg, level, key)
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    head = len(MAGIC) + 32
    if len(blob) < head or not blob.startswith(MAGIC) or \
            hashlib.sha256(blob[head:]).digest() != blob[len(MAGIC):head]:
        log.warning("dynamo_vulkan cache entry %s is damaged; rebuilding it", path)
        count(level, "corrupt")
        path.unlink(missing_ok=True)
        return None
    return blob[head:]


def disk_put(level: str, key: str, payload: bytes) -> None:
    cfg = config.load()
    if not cfg.cache_enabled:
        return
    path = _path(cfg, level, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + hashlib.sha256(payload).digest() + payload)
        os.replace(tmp, path)
    except OSError as e:  # a read-only or full disk must not break compilation
        log.warning("dynamo_vulkan could not write cache entry %s: %s", path, e)
