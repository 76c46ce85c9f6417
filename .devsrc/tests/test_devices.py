"""Devices: what list_devices() reports, the structures it is read through, and which
device is used by default (a GPU before a software device) or by DYNAMO_VULKAN_DEVICE."""
import ctypes

import pytest

import dynamo_vulkan
from dynamo_vulkan import device, vkinfo

KEYS = {"index", "name", "type", "driver", "api_version", "subgroup_size", "memory",
        "max_storage_buffer_range", "max_memory_allocation_size", "features", "cooperative_matrix",
        "selected"}


def _fake(*types):
    return [{"index": i, "type": t, "name": f"dev{i}"} for i, t in enumerate(types)]


def test_structures_match_vulkan_core_h():
    """Sizes and offsets of the C structures on LP64 (x86_64, aarch64) as vulkan_core.h
    lays them out: a field missed or mistyped moves every later one."""
    assert ctypes.sizeof(vkinfo.Properties) == 824 and vkinfo.Properties.limits.offset == 296
    assert vkinfo.Limits.maxStorageBufferRange.offset == 28
    assert vkinfo.Limits.maxComputeSharedMemorySize.offset == 216
    assert vkinfo.Limits.timestampPeriod.offset == 424
    assert vkinfo.Limits.nonCoherentAtomSize.offset == 496
    assert ctypes.sizeof(vkinfo.Properties2) == 840
    assert ctypes.sizeof(vkinfo.DriverProperties) == 536
    assert ctypes.sizeof(vkinfo.MemoryProperties) == 520
    assert ctypes.sizeof(vkinfo.SubgroupProperties) == ctypes.sizeof(vkinfo.Maintenance3Properties) == 32
    assert vkinfo.version_string((1 << 22) | (3 << 12) | 230) == "1.3.230"


def test_list_devices_reports_this_machine():
    devices = dynamo_vulkan.list_devices()
    assert devices and all(set(d) == KEYS for d in devices)
    assert [d["index"] for d in devices] == list(range(len(devices)))
    assert sum(d["selected"] for d in devices) == 1
    for d in devices:
        assert d["type"] in vkinfo.DEVICE_TYPES.values() and d["name"] and d["driver"]
        assert d["memory"] > 0 and d["max_storage_buffer_range"] >= 1 << 27   # Vulkan's minimum
        assert d["subgroup_size"] > 0 and d["subgroup_size"] & (d["subgroup_size"] - 1) == 0
        assert set(d["features"]) <= set(vkinfo.FEATURE_EXTENSIONS.values())
        # the tensor cores' shapes: none without the feature (lavapipe 22.3 has none)
        assert isinstance(d["cooperative_matrix"], list)
        assert all({"m", "n", "k"} <= set(s) for s in d["cooperative_matrix"])


def test_device_info_agrees_with_the_listing():
    """device_info() of the selected device: the loader's description, the subgroup size
    measured on it, and the device type spelled as the planners read it."""
    info = dynamo_vulkan.device_info()
    listed = next(d for d in dynamo_vulkan.list_devices() if d["selected"])
    assert info["index"] == listed["index"] and info["name"] == listed["name"]
    assert info["device_type"] == f"PHYSICAL_DEVICE_TYPE_{listed['type'].upper()}"
    assert info["max_storage_buffer_range"] == listed["max_storage_buffer_range"]
    assert device.is_cpu(info) == (listed["type"] == "cpu")
    if listed["type"] == "cpu":          # lavapipe reports the size it runs with
        assert info["subgroup_size"] == listed["subgroup_size"]


@pytest.mark.parametrize("types, want", [
    (("cpu",), 0),
    (("cpu", "discrete_gpu"), 1),
    (("cpu", "integrated_gpu", "discrete_gpu"), 2),
    (("cpu", "integrated_gpu"), 1),
    (("virtual_gpu", "cpu"), 0),
    (("discrete_gpu", "discrete_gpu"), 0),
    (("other", "cpu"), 0),
    ((), 0),
])
def test_a_gpu_is_preferred_to_a_software_device(types, want):
    assert device.preferred_index(_fake(*types)) == want


def test_default_and_explicit_device(monkeypatch):
    monkeypatch.setattr(device, "physical_devices", lambda: _fake("cpu", "discrete_gpu"))
    monkeypatch.delenv("DYNAMO_VULKAN_DEVICE", raising=False)
    assert device.resolve_index() == 1
    assert [d["selected"] for d in device.list_devices()] == [False, True]
    monkeypatch.setenv("DYNAMO_VULKAN_DEVICE", "0")
    assert device.resolve_index() == 0 and device.resolve_index(1) == 1
    assert [d["selected"] for d in device.list_devices()] == [True, False]


def test_index_past_the_devices_says_how_to_list_them(monkeypatch):
    monkeypatch.setattr(device, "physical_devices", lambda: _fake("cpu"))
    reason = device.unavailable_reason(3)
    assert "DYNAMO_VULKAN_DEVICE=3 but only 1 Vulkan device(s) exist" in reason
    assert "list_devices()" in reason


def test_the_device_list_asked_ahead_on_a_thread(monkeypatch):
    """prefetch_physical_devices asks the loader on a thread (import dynamo_vulkan starts
    it while torch imports): its answer is the one later callers get, and a failure there
    is silent and left to the next caller, who asks again and sees it."""
    import threading
    calls = []

    def failing():
        calls.append(threading.current_thread().name)
        raise RuntimeError("the loader broke")
    monkeypatch.setattr(device, "_physical", None)
    monkeypatch.setattr(device.vkinfo, "physical_devices", failing)
    device.prefetch_physical_devices()
    for t in threading.enumerate():
        if t.name == "dynamo_vulkan-devices":
            t.join(10)
    assert calls == ["dynamo_vulkan-devices"] and device._physical is None
    with pytest.raises(RuntimeError, match="the loader broke"):
        device.physical_devices()
    assert len(calls) == 2

    monkeypatch.setattr(device.vkinfo, "physical_devices", lambda: _fake("cpu", "discrete_gpu"))
    device.prefetch_physical_devices()
    for t in threading.enumerate():
        if t.name == "dynamo_vulkan-devices":
            t.join(10)
    assert device._physical == _fake("cpu", "discrete_gpu") == device.physical_devices()
