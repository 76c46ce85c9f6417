"""dynamo_vulkan: torch.compile(model, backend="vulkan") on any Vulkan GPU.

The backend is found through the torch_dynamo_backends entry point, so no
import is needed to use it; this package also offers device queries, cache
controls and partition reports.
"""
from .cache import cache_stats, clear_cache
from .device import device_info, is_available

__all__ = ["cache_stats", "clear_cache", "device_info", "is_available", "reports",
           "runtime_stats"]


def reports():
    from .backend import reports as _r
    return _r()


def runtime_stats():
    from .runtime.program import runtime_stats as _s
    return _s()
