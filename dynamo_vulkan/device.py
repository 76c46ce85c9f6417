"""The Vulkan device: one kp.Manager per process, and what we know of it.

Devices are described through the loader (vkinfo.py: name, type, driver, limits,
memory, extensions), and the subgroup size the kernels run with is measured with a
one-dispatch probe shader, which is right on every driver. The measurement is kept in
the disk cache, keyed by the device and driver, so a later process creates no probe
pipeline (the driver's first, ~1 s on NVIDIA's). Without DYNAMO_VULKAN_DEVICE a GPU is
preferred to a CPU implementation such as lavapipe.
"""
from __future__ import annotations

import json
import threading

from . import cache, prerequisites, vkinfo

_lock = threading.Lock()
_managers: dict[int, object] = {}
_failures: dict[int, str] = {}
_info: dict[int, dict] = {}
_physical: list[dict] | None = None   # the loader's devices, asked once

# Conservative defaults (Vulkan 1.1 minimums or lavapipe's values).
DEFAULT_LIMITS = {
    "max_storage_buffer_range": 128 << 20,
    "max_compute_shared_memory_size": 16384,
    "max_push_constants_size": 128,
    "max_compute_work_group_count": (65535, 65535, 65535),
    "max_compute_work_group_invocations": 128,
}
# the default device's order of preference: a GPU before a software (CPU) device
TYPE_PREFERENCE = ("discrete_gpu", "integrated_gpu", "virtual_gpu", "other", "cpu")
NO_DEVICE = ("no Vulkan device found: install your GPU's Vulkan driver (Mesa: apt-get install "
             "mesa-vulkan-drivers, which also has lavapipe for machines without a GPU)")


class VulkanUnavailable(RuntimeError):
    """No usable Vulkan device (no loader, no driver, no kp or glslc, or a bad device index)."""


def physical_devices() -> list[dict]:
    """The loader's physical devices (vkinfo.physical_devices), asked once per process;
    [] when there is no loader or driver."""
    global _physical
    with _lock:
        if _physical is None:
            try:
                _physical = vkinfo.physical_devices()
            except vkinfo.LoaderMissing:
                _physical = []
        return _physical


def prefetch_physical_devices() -> None:
    """Ask the loader for its devices on a daemon thread: creating an instance and
    describing the devices takes ~0.2 s on NVIDIA's driver, in ctypes calls that release
    the GIL, so a process importing torch meanwhile (`import dynamo_vulkan` does) finds the
    list made. A failure here is left to the first caller of physical_devices, which
    asks again and reports it."""
    def ask():
        try:
            physical_devices()
        except Exception:   # noqa: BLE001  (asked again, and raised, where it is needed)
            pass
    threading.Thread(target=ask, name="dynamo_vulkan-devices", daemon=True).start()


def preferred_index(devices: list[dict]) -> int:
    """The device used without DYNAMO_VULKAN_DEVICE: the first of the most preferred type."""
    if not devices:
        return 0
    rank = {t: i for i, t in enumerate(TYPE_PREFERENCE)}
    return min(devices, key=lambda d: (rank.get(d.get("type"), len(rank)), d["index"]))["index"]


def resolve_index(index: int | None = None) -> int:
    """`index`, else DYNAMO_VULKAN_DEVICE, else the preferred device's index."""
    from . import config
    if index is None:
        index = config.current().device_index
    return preferred_index(physical_devices()) if index is None else index


def list_devices() -> list[dict]:
    """The Vulkan devices of this machine: index, name, type, driver, api_version,
    subgroup_size (as the driver reports it), memory (device-local bytes),
    max_storage_buffer_range (the largest buffer a kernel binds), max_memory_allocation_size,
    features (the optional extensions dynamo_vulkan may use), cooperative_matrix (the
    matrix shapes and types its tensor cores multiply, as vkinfo.matrix_shape_name
    writes them) and selected (the device compiled graphs run on: DYNAMO_VULKAN_DEVICE's,
    else the preferred one)."""
    devices = physical_devices()
    chosen = resolve_index()
    keys = ("index", "name", "type", "api_version", "subgroup_size", "memory",
            "max_storage_buffer_range", "max_memory_allocation_size", "features")
    out = []
    for d in devices:
        e = {k: d.get(k) for k in keys}
        e["driver"] = " ".join(filter(None, (d.get("driver_name"), d.get("driver_info")))) or None
        e["cooperative_matrix"] = [vkinfo.matrix_shape_name(s) for s in d.get("cooperative_matrix_shapes", [])]
        e["selected"] = d["index"] == chosen
        out.append(e)
    return out


def unavailable_reason(index: int) -> str | None:
    """Why device `index` cannot be used (every missing prerequisite in one line), or None."""
    try:
        vkinfo.loader()
        loader = None
    except vkinfo.LoaderMissing as e:
        loader = f"the Vulkan loader is missing ({e}): {prerequisites.LOADER}"
    problems = [p for p in prerequisites.problems()
                if not (loader and p.startswith(prerequisites.KP_NO_LOADER))]
    devices = physical_devices()
    if loader:
        problems.insert(0, loader)
    elif not devices:
        problems.append(NO_DEVICE)
    elif index >= len(devices):
        problems.append(f"DYNAMO_VULKAN_DEVICE={index} but only {len(devices)} Vulkan "
                        f"device(s) exist (0..{len(devices) - 1}; dynamo_vulkan.list_devices() lists them)")
    return "; ".join(problems) if problems else None


def manager(index: int | None = None):
    """The process-wide kp.Manager for device `index` (default: resolve_index())."""
    from . import config
    index = resolve_index(index)
    if index in _managers:
        return _managers[index]
    reason = None if index in _failures else unavailable_reason(index)
    identity = _identity(index) if reason is None else None     # asked outside the lock
    with _lock:
        if index in _managers:
            return _managers[index]
        if index in _failures:
            raise VulkanUnavailable(_failures[index])
        if reason is not None:
            _failures[index] = reason
            raise VulkanUnavailable(reason)
        import kp
        try:
            mgr = kp.Manager(index)
        except Exception as e:  # kp raises RuntimeError when no instance/device
            _failures[index] = f"Vulkan device {index} could not be opened: {e}"
            raise VulkanUnavailable(_failures[index]) from e
        _managers[index] = mgr
        # before its first pipeline (the subgroup probe's, in device_info below)
        from .runtime import pipeline_cache
        pipeline_cache.seed(mgr, index, identity)
    set_fence_spin(config.current().fence_spin_us, index)   # outside the lock: it asks device_info
    return mgr


def set_fence_spin(us: int | None, index: int | None = None) -> None:
    """How long each submit's wait polls its fence before it blocks (kp patch 6; None:
    config.DEFAULT_FENCE_SPIN_US on a GPU, 0 on a CPU device). The fence itself is one
    per sequence, reset per submit, not made afresh as kp 0.9 does, which costs ~0.5 ms
    per submit on the H100's driver."""
    import kp
    from . import config
    if us is None:
        us = 0 if is_cpu(device_info(index)) else config.DEFAULT_FENCE_SPIN_US
    kp.set_fence_spin_us(int(us))


def is_available(index: int | None = None) -> bool:
    try:
        manager(index)
        return True
    except VulkanUnavailable:
        return False


def _described(index: int) -> dict:
    """device_info's fields from the loader's description of device `index`."""
    devices = physical_devices()
    if index >= len(devices):
        return {}
    d = devices[index]
    keys = ("driver_name", "driver_info", "api_version", "max_storage_buffer_range",
            "max_compute_shared_memory_size", "max_push_constants_size", "max_memory_allocation_size",
            "max_storage_buffers_per_stage",
            "max_compute_work_group_count", "max_compute_work_group_invocations",
            "timestamp_period_ns", "memory", "features")
    out = {k: d[k] for k in keys if d.get(k) is not None}
    out["device_type"] = f"PHYSICAL_DEVICE_TYPE_{d['type'].upper()}"
    return out


def device_info(index: int | None = None) -> dict:
    """Name, type, driver, limits and (measured) subgroup size of the device compiled
    graphs run on, or of device `index`; {"available": False, "reason": ...} if none."""
    index = resolve_index(index)
    if index in _info:
        return _info[index]
    try:
        mgr = manager(index)
    except VulkanUnavailable as e:
        return {"available": False, "reason": str(e)}
    if index in _info:             # made while the manager was opened (set_fence_spin asks)
        return _info[index]
    props = mgr.get_device_properties()
    info = dict(DEFAULT_LIMITS)
    info.update({
        "available": True,
        "index": index,
        "name": props.get("device_name", "unknown"),
        "max_compute_work_group_invocations": props.get("max_work_group_invocations", 128),
        "max_compute_work_group_count": tuple(props.get("max_work_group_count", (65535,) * 3)),
        "timestamps_supported": bool(props.get("timestamps_supported", False)),
    })
    info.update(_described(index))
    info["subgroup_size"] = _subgroup_size(mgr, index)
    # shaderIntegerDotProduct enabled when the device was created (kp patch 7; the flag is
    # the last created device's, and manager() above created this one or found it made)
    import kp
    info["integer_dot_product"] = bool(getattr(kp, "integer_dot_product", lambda: False)())
    info.update(_matrix_caps(kp, index))
    _info[index] = info
    return info


def _matrix_caps(kp, index: int) -> dict:
    """What device `index` was created with for 16-bit and tensor-core kernels (kp patch 10:
    shader_float16, storage_buffer_16bit, bfloat16, bfloat16_cooperative_matrix,
    cooperative_matrix) and, where cooperative matrices are on, the shapes and types its
    tensor cores multiply (vkinfo's dicts: m, n, k, a, b, c, result, scope), which the
    matmul lowering chooses its tiles from."""
    enabled = dict(getattr(kp, "enabled_features", dict)())
    caps = {name: bool(enabled.get(name, False)) for name in
            ("shader_float16", "storage_buffer_16bit", "bfloat16", "bfloat16_cooperative_matrix",
             "cooperative_matrix")}
    devices = physical_devices()
    shapes = devices[index].get("cooperative_matrix_shapes", []) if index < len(devices) else []
    caps["cooperative_matrix_shapes"] = tuple(
        tuple(sorted(s.items())) for s in shapes) if caps["cooperative_matrix"] else ()
    return caps


def is_cpu(info: dict | None = None) -> bool:
    """Whether the device (info from device_info(); the default device's without it) is
    a CPU implementation such as lavapipe: compute there is the bottleneck, not the
    barriers and submits that several GPU-side choices trade against."""
    info = device_info() if info is None else info
    return "cpu" in str(info.get("device_type", "")).lower()


_PROBE = """#version 450
#extension GL_KHR_shader_subgroup_basic : require
layout(local_size_x = 64) in;
layout(binding = 0) buffer Out { uint o[]; };
void main() { if (gl_LocalInvocationID.x == 0) o[0] = gl_SubgroupSize; }
"""
# what a probe's answer depends on: the device, its driver and the probe itself
_PROBE_KEYS = ("name", "vendor_id", "device_id", "driver_version", "driver_name", "driver_info",
               "api_version", "pipeline_cache_uuid")


def _identity(index: int) -> dict | None:
    """What a probe's answer on device `index` depends on, or None where unknown."""
    devices = physical_devices()
    ident = {k: devices[index].get(k) for k in _PROBE_KEYS} if index < len(devices) else None
    return None if ident is None or ident["pipeline_cache_uuid"] is None else ident


def subgroup_key(index: int) -> str | None:
    """The disk cache key of device `index`'s subgroup size: its identity and driver, the
    kp build and the probe; None where the device has no identity to key it by."""
    ident = _identity(index)
    return None if ident is None else cache.digest("subgroup", ident, prerequisites.KP_VERSION, _PROBE)


def _subgroup_size(mgr, index: int) -> int:
    """The probe's subgroup size for device `index`, from the disk cache where an entry for
    this device, driver, kp build and probe verifies (a damaged or out-of-range one is
    measured again and replaced)."""
    key = subgroup_key(index)
    if key is None:
        return _probe_subgroup_size(mgr)

    def decode(blob: bytes) -> int:
        doc = json.loads(blob)
        size = doc["subgroup_size"]
        if doc["device"] != _identity(index):
            raise ValueError("an entry of another device")
        if not (type(size) is int and 1 <= size <= 256 and size & (size - 1) == 0):
            raise ValueError(f"subgroup size {size!r}")
        return size
    size = cache.disk_load("subgroup", key, decode, (ValueError, KeyError, TypeError), "a subgroup size")
    if size is not None:
        return size
    size = _probe_subgroup_size(mgr)
    cache.disk_put("subgroup", key, json.dumps({"subgroup_size": size, "device": _identity(index)}).encode())
    return size


def _probe_subgroup_size(mgr) -> int:
    import numpy as np
    from .runtime.shaders import compile_source
    t = mgr.tensor_t(np.zeros(1, dtype=np.uint32))
    algo = mgr.algorithm([t], compile_source(_PROBE, "subgroup_probe"), (1, 1, 1), [], [])
    import kp
    mgr.sequence().record(kp.OpAlgoDispatch(algo)).record(kp.OpTensorSyncLocal([t])).eval()
    size = int(t.data()[0])
    return size if size > 0 else 32
