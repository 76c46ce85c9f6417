"""The Vulkan device: one kp.Manager per process, and what we know of it.

kp reports only a few properties, so limits that kernels depend on are taken
from `vulkaninfo` when it is installed and the subgroup size is measured with a
one-dispatch probe shader, which is right on every driver.
"""
from __future__ import annotations

import logging
import re
import subprocess
import threading

log = logging.getLogger(__name__)

_lock = threading.Lock()
_managers: dict[int, object] = {}
_failures: dict[int, str] = {}
_info: dict[int, dict] = {}

# Conservative defaults (Vulkan 1.1 minimums or lavapipe's values).
DEFAULT_LIMITS = {
    "max_storage_buffer_range": 128 << 20,
    "max_compute_shared_memory_size": 16384,
    "max_push_constants_size": 128,
    "max_compute_work_group_count": (65535, 65535, 65535),
    "max_compute_work_group_invocations": 128,
}


class VulkanUnavailable(RuntimeError):
    """No usable Vulkan device (no loader, no driver, or a bad device index)."""


def manager(index: int | None = None):
    """The process-wide kp.Manager for device `index` (default: DYNAMO_VULKAN_DEVICE)."""
    from . import config
    if index is None:
        index = config.load().device_index
    with _lock:
        if index in _managers:
            return _managers[index]
        if index in _failures:
            raise VulkanUnavailable(_failures[index])
        try:
            import kp
        except ImportError as e:  # pragma: no cover - set-up problem
            _failures[index] = f"the kp package is not importable ({e}); run scripts/setup.sh"
            raise VulkanUnavailable(_failures[index]) from e
        count = _device_count()
        if count == 0:
            _failures[index] = ("no Vulkan device found (is a driver installed? on a machine "
                                "without a GPU: apt-get install mesa-vulkan-drivers)")
            raise VulkanUnavailable(_failures[index])
        if count is not None and index >= count:
            _failures[index] = (f"DYNAMO_VULKAN_DEVICE={index} but only {count} Vulkan "
                                f"device(s) exist (0..{count - 1})")
            raise VulkanUnavailable(_failures[index])
        try:
            mgr = kp.Manager(index)
        except Exception as e:  # kp raises RuntimeError when no instance/device
            _failures[index] = f"Vulkan device {index} could not be opened: {e}"
            raise VulkanUnavailable(_failures[index]) from e
        _managers[index] = mgr
    set_fence_spin(config.load().fence_spin_us, index)   # outside the lock: it asks device_info
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


def _device_count() -> int | None:
    """Physical devices the loader sees, asked through ctypes so a missing
    driver gives 0 instead of a crash inside kp. None if it cannot be asked."""
    import ctypes
    try:
        lib = ctypes.CDLL("libvulkan.so.1")
    except OSError:
        return 0

    class AppInfo(ctypes.Structure):
        _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p),
                    ("pApplicationName", ctypes.c_char_p), ("applicationVersion", ctypes.c_uint32),
                    ("pEngineName", ctypes.c_char_p), ("engineVersion", ctypes.c_uint32),
                    ("apiVersion", ctypes.c_uint32)]

    class InstanceInfo(ctypes.Structure):
        _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p), ("flags", ctypes.c_uint32),
                    ("pApplicationInfo", ctypes.POINTER(AppInfo)),
                    ("enabledLayerCount", ctypes.c_uint32), ("ppEnabledLayerNames", ctypes.c_void_p),
                    ("enabledExtensionCount", ctypes.c_uint32),
                    ("ppEnabledExtensionNames", ctypes.c_void_p)]

    app = AppInfo(0, None, b"dynamo_vulkan", 0, b"none", 0, (1 << 22) | (1 << 12))
    info = InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    inst = ctypes.c_void_p()
    if lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(inst)) != 0:
        return 0
    try:
        n = ctypes.c_uint32(0)
        if lib.vkEnumeratePhysicalDevices(inst, ctypes.byref(n), None) != 0:
            return 0
        return int(n.value)
    finally:
        lib.vkDestroyInstance(inst, None)


def is_available(index: int | None = None) -> bool:
    try:
        manager(index)
        return True
    except VulkanUnavailable:
        return False


def _vulkaninfo(index: int) -> dict:
    """Limits and driver of device `index` parsed from `vulkaninfo` (empty if absent)."""
    try:
        out = subprocess.run(["vulkaninfo"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    sections = re.split(r"\nGPU(\d+):\n", out)
    # sections = [preamble, "0", body0, "1", body1, ...]
    bodies = {int(sections[i]): sections[i + 1] for i in range(1, len(sections) - 1, 2)}
    body = bodies.get(index)
    if body is None:
        return {}

    def grab(key, conv=int):
        m = re.search(rf"\b{key}\s*=\s*(.+)", body)
        return conv(m.group(1).strip().split()[0]) if m else None

    res = {
        "driver_name": grab("driverName", str),
        "driver_info": grab("driverInfo", str),
        "api_version": grab("apiVersion", str),
        "device_type": grab("deviceType", str),
        "max_storage_buffer_range": grab("maxStorageBufferRange", lambda s: int(s, 0)),
        "max_compute_shared_memory_size": grab("maxComputeSharedMemorySize", lambda s: int(s, 0)),
        "max_push_constants_size": grab("maxPushConstantsSize", lambda s: int(s, 0)),
        "max_memory_allocation_size": grab("maxMemoryAllocationSize", lambda s: int(s, 0)),
        "timestamp_period_ns": grab("timestampPeriod", float),
    }
    m = re.search(r"maxComputeWorkGroupCount:\s*count\s*=\s*3\s*((?:\s*\d+)+)", body)
    if m:
        res["max_compute_work_group_count"] = tuple(int(v) for v in m.group(1).split())
    return {k: v for k, v in res.items() if v is not None}


def device_info(index: int | None = None) -> dict:
    """Name, driver, limits and subgroup size of the device (empty dict if none)."""
    from . import config
    if index is None:
        index = config.load().device_index
    if index in _info:
        return _info[index]
    try:
        mgr = manager(index)
    except VulkanUnavailable as e:
        return {"available": False, "reason": str(e)}
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
    info.update(_vulkaninfo(index))
    info["subgroup_size"] = _probe_subgroup_size(mgr)
    # shaderIntegerDotProduct enabled when the device was created (kp patch 7; the flag is
    # the last created device's, and manager() above created this one or found it made)
    import kp
    info["integer_dot_product"] = bool(getattr(kp, "integer_dot_product", lambda: False)())
    _info[index] = info
    return info


def is_cpu(info: dict | None = None) -> bool:
    """Whether the device (info from device_info(); the default device's without it) is
    a CPU implementation such as lavapipe: compute there is the bottleneck, not the
    barriers and submits that several GPU-side choices trade against."""
    info = device_info() if info is None else info
    return "cpu" in str(info.get("device_type", "")).lower()


def _probe_subgroup_size(mgr) -> int:
    import numpy as np
    from .runtime.shaders import compile_source
    src = """#version 450
#extension GL_KHR_shader_subgroup_basic : require
layout(local_size_x = 64) in;
layout(binding = 0) buffer Out { uint o[]; };
void main() { if (gl_LocalInvocationID.x == 0) o[0] = gl_SubgroupSize; }
"""
    t = mgr.tensor_t(np.zeros(1, dtype=np.uint32))
    algo = mgr.algorithm([t], compile_source(src, "subgroup_probe"), (1, 1, 1), [], [])
    import kp
    mgr.sequence().record(kp.OpAlgoDispatch(algo)).record(kp.OpTensorSyncLocal([t])).eval()
    size = int(t.data()[0])
    return size if size > 0 else 32
