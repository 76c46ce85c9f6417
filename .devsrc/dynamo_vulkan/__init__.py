"""dynamo_vulkan: torch.compile(model, backend="vulkan") on any Vulkan GPU.

The backend is found through the torch_dynamo_backends entry point, so no
import is needed to use it; this package also offers device queries, cache
controls and partition reports.
"""
from importlib import metadata as _metadata

from .cache import cache_stats, clear_cache
from .device import device_info, is_available, is_cpu, list_devices
from .device import prefetch_physical_devices as _prefetch_physical_devices

_prefetch_physical_devices()    # while torch imports, below

from .runtime.program import keep_on_device, read_back, runtime_stats  # noqa: E402

try:
    __version__ = _metadata.version("dynamo-vulkan")
except _metadata.PackageNotFoundError:     # a source tree on sys.path, not installed
    __version__ = "0+unknown"

__all__ = ["VulkanFallbackError", "__version__", "cache_stats", "clear_cache", "device_info", "is_available",
           "is_cpu", "keep_on_device", "list_devices", "read_back", "reports", "runtime_stats"]


def reports():
    from .backend import reports as _r
    return _r()


def __getattr__(name):   # the backend (torch._dynamo, the lowering rules) loads only when asked
    if name == "VulkanFallbackError":
        from .backend import VulkanFallbackError
        return VulkanFallbackError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
