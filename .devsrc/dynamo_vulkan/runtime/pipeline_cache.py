"""The device's Vulkan pipeline cache kept in the disk cache, across processes.

kp builds every pipeline of a device through one vk::PipelineCache (patch 11), which
starts empty in each process, so a new process compiles all its kernels in the driver
again: on a GPU the largest part of a second run's start. kp patch 13 reads that cache's
bytes (vkGetPipelineCacheData) and creates a device's cache from earlier bytes before
its first pipeline. seed() does the latter when a manager is opened; save() writes the
bytes back when this process created pipelines since (at exit, or when called).

An entry is keyed by the device's identity and driver (vendor and device ids, driver
version, pipelineCacheUUID) and the kp build, and its bytes must start with the header
the device expects (Manager.pipeline_cache_header); an entry that does not is ignored
with a warning, and the driver also ignores data it cannot use, so a foreign or damaged
entry costs only the compiles it would have saved.
"""
from __future__ import annotations

import atexit
import logging
import threading

from .. import cache, prerequisites

log = logging.getLogger(__name__)
LEVEL = "pipelines"

_lock = threading.Lock()
# device index -> [manager, disk key, kp.pipelines_built() when last seeded or saved,
# the bytes seeded or last saved]
_devices: dict[int, list] = {}
_exit_hook = False


def key(mgr, identity: dict | None) -> str | None:
    """The disk cache key of a device's pipeline cache; None where the device has no
    identity to key it by (vkinfo's description) or kp cannot read its cache."""
    if identity is None or not hasattr(mgr, "pipeline_cache_header"):
        return None
    return cache.digest(LEVEL, identity, prerequisites.KP_VERSION, mgr.pipeline_cache_header())


def _built() -> int:
    import kp
    return int(kp.pipelines_built())


def seed(mgr, index: int, identity: dict | None) -> bool:
    """Create device `index`'s pipeline cache from the disk cache's entry (call before its
    first pipeline); True where an entry was handed to the driver. Registers save() for
    the process's exit either way, so the pipelines it builds are kept."""
    global _exit_hook
    k = key(mgr, identity)
    if k is None or cache.cache_root() is None:
        return False
    seeded = b""
    blob = cache.disk_get(LEVEL, k)
    if blob is None:
        cache.count(LEVEL, "misses")
    elif not blob.startswith(mgr.pipeline_cache_header()):
        log.warning("dynamo_vulkan cache entry %s/%s is not this device's pipeline cache (another "
                    "device, driver or damaged data); ignored, the pipelines are compiled again", LEVEL, k)
        cache.count(LEVEL, "corrupt")
    elif mgr.seed_pipeline_cache(blob):
        cache.count(LEVEL, "disk_hits")
        seeded = blob
    else:
        log.warning("dynamo_vulkan cache entry %s/%s was not used: the device has a pipeline cache "
                    "already (a pipeline was built before it was seeded)", LEVEL, k)
        cache.count(LEVEL, "refused")
    with _lock:
        _devices[index] = [mgr, k, _built(), seeded]
        if not _exit_hook:
            atexit.register(save)
            _exit_hook = True
    return bool(seeded)


def save() -> int:
    """Write the pipeline cache of each seeded device that built pipelines since it was
    seeded or last saved, where the driver returns bytes that differ from those; returns
    how many entries were written. Nothing is written where the device gives no data."""
    written = 0
    with _lock:
        built = _built()
        for entry in _devices.values():
            mgr, k, since, last = entry
            if built == since:
                continue
            entry[2] = built
            data = mgr.pipeline_cache_data()
            if not data or data == last:
                continue
            if not data.startswith(mgr.pipeline_cache_header()):
                log.info("the driver's pipeline cache data does not start with its own header; not kept")
                continue
            cache.disk_put(LEVEL, k, data)
            cache.count(LEVEL, "saved")
            entry[3] = data
            written += 1
    return written


def forget(index: int | None = None) -> None:
    """Stop tracking device `index` (all with None): its manager is gone."""
    with _lock:
        if index is None:
            _devices.clear()
        else:
            _devices.pop(index, None)
