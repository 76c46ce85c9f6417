"""Environment toggles, read each time a graph is compiled (see DESIGN.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

FALLBACK_MODES = ("warn", "error", "silent")
# How long a submit's wait polls its fence before blocking, on a GPU: a blocked waiter
# is woken late (H100: an empty submit+wait 33 us blocking, 11 us polling), and most
# calls' waits are short. Not on a CPU device (lavapipe), whose own threads do the work
# on the cores a polling thread would take.
DEFAULT_FENCE_SPIN_US = 1000
CPU_MATMUL_MODES = ("host", "vulkan")
INT_DOT_MODES = ("auto", "on", "off")


def _mode(var: str, modes: tuple) -> str:
    """One of `modes` from environment variable `var` (unset or empty: the first)."""
    mode = os.environ.get(var, modes[0]).strip().lower() or modes[0]
    if mode not in modes:
        raise ValueError(f"{var}={mode!r} is not one of {modes}")
    return mode


def cpu_matmul() -> str:
    """DYNAMO_VULKAN_CPU_MATMUL: where a CPU Vulkan device's (lavapipe's) prompt-sized matrix
    products, and the graphs that hold them, run: "host" (default), through torch on the
    same CPU, whose BLAS is 10-35x faster than lavapipe's compiled kernels (2-core AMD EPYC,
    2026-11-24: fp32 128x576 @ 576x1536, 63.7 ms on lavapipe, 1.8 in torch); "vulkan", in
    our kernels (the tests use it, to check them). GPUs always run them in our kernels."""
    return _mode("DYNAMO_VULKAN_CPU_MATMUL", CPU_MATMUL_MODES)


def int_dot() -> str:
    """DYNAMO_VULKAN_INT_DOT: the GGUF mat-vec's integer-dot path (x as three int8 planes,
    fp32-accurate; lowering/gguf.py). "auto" (default): on GPUs created with
    shaderIntegerDotProduct, for the weights where it measured faster (big ones with a
    norm or elementwise prologue folded in, or big ones of the 4-bit and 6-bit types:
    gguf.INT_DOT_*);
    "on": for every eligible one-row mat-vec (an error where the device lacks the
    feature); "off": never."""
    return _mode("DYNAMO_VULKAN_INT_DOT", INT_DOT_MODES)


@dataclass(frozen=True)
class Config:
    cache_enabled: bool
    cache_dir: Path
    debug_dump: Path | None
    fallback: str
    device_index: int
    profile: bool
    fence_spin_us: int | None    # None: the device's default (see device.set_fence_spin)

    def key(self) -> str:
        """The parts of the config that change a compiled program."""
        return f"dev{self.device_index}-cpu_matmul:{cpu_matmul()}-int_dot:{int_dot()}"


def _flag(name: str, default: str) -> bool:
    return os.environ.get(name, default).strip().lower() not in ("0", "false", "no", "off", "")


def load() -> Config:
    fallback = os.environ.get("DYNAMO_VULKAN_FALLBACK", "warn").strip().lower()
    if fallback not in FALLBACK_MODES:
        raise ValueError(
            f"DYNAMO_VULKAN_FALLBACK={fallback!r} is not one of {FALLBACK_MODES}")
    dev = os.environ.get("DYNAMO_VULKAN_DEVICE", "0").strip() or "0"
    if not dev.isdigit():
        raise ValueError(f"DYNAMO_VULKAN_DEVICE={dev!r} must be a device index (0, 1, ...)")
    dump = os.environ.get("DYNAMO_VULKAN_DEBUG_DUMP", "").strip()
    cache_dir = os.environ.get("DYNAMO_VULKAN_CACHE_DIR", "").strip()
    spin = os.environ.get("DYNAMO_VULKAN_FENCE_SPIN_US", "").strip()
    if spin and not spin.isdigit():
        raise ValueError(f"DYNAMO_VULKAN_FENCE_SPIN_US={spin!r} must be a whole number of "
                         "microseconds (0 blocks on the fence at once)")
    return Config(
        cache_enabled=_flag("DYNAMO_VULKAN_CACHE", "1"),
        cache_dir=Path(cache_dir) if cache_dir else Path.home() / ".cache" / "dynamo_vulkan",
        debug_dump=Path(dump) if dump else None,
        fallback=fallback,
        device_index=int(dev),
        profile=_flag("DYNAMO_VULKAN_PROFILE", "0"),
        fence_spin_us=int(spin) if spin else None,
    )
