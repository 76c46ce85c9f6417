"""Environment toggles, read each time a graph is compiled (docs/design.md; the README lists them).

A value outside what a variable allows is a ConfigError naming the variable, the value
and what is allowed; nothing is guessed ("maybe" is neither on nor off)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

FALLBACK_MODES = ("warn", "error", "silent")
# How long a submit's wait polls its fence before blocking, on a GPU: a blocked waiter
# is woken late (H100: an empty submit+wait 33 us blocking, 11 us polling), and most
# calls' waits are short. Not on a CPU device (lavapipe), whose own threads do the work
# on the cores a polling thread would take.
DEFAULT_FENCE_SPIN_US = 1000
MAX_FENCE_SPIN_US = 10_000_000      # 10 s: a longer spin is a mistake, not a setting
MAX_DEVICE_INDEX = 1 << 16
FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}
CPU_MATMUL_MODES = ("host", "vulkan")
INT_DOT_MODES = ("auto", "on", "off")


class ConfigError(ValueError):
    """An environment variable holds a value it does not allow."""


def _mode(var: str, modes: tuple) -> str:
    """One of `modes` from environment variable `var` (unset or empty: the first)."""
    mode = os.environ.get(var, modes[0]).strip().lower() or modes[0]
    if mode not in modes:
        raise ConfigError(f"{var}={mode!r} is not one of {modes}")
    return mode


def _whole(var: str, hi: int, what: str) -> int | None:
    """A whole number in [0, hi] from `var`, or None when unset or empty."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return None
    if not re.fullmatch(r"[0-9]+", raw) or int(raw) > hi:
        raise ConfigError(f"{var}={raw[:40]!r} must be a whole number from 0 to {hi} ({what})")
    return int(raw)


def _dump_dir(var: str) -> Path | None:
    """The debug dump's directory from `var`, created now so that a path that cannot be a
    directory is reported here rather than as an OSError in the middle of a compile."""
    raw = os.environ.get(var, "").strip()
    if not raw:
        return None
    path = Path(raw).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise ConfigError(f"{var}={raw!r} must be a directory this process can create and "
                          f"write: {e.strerror or e}") from None
    return path


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
    device_index: int | None     # None: the preferred device (device.resolve_index)
    profile: bool
    fence_spin_us: int | None    # None: the device's default (see device.set_fence_spin)

    def key(self) -> str:
        """The parts of the config that change a compiled program."""
        return f"dev{self.device_index}-cpu_matmul:{cpu_matmul()}-int_dot:{int_dot()}"


def _flag(name: str, default: bool) -> bool:
    """On or off from `name`: 1/true/yes/on or 0/false/no/off (unset or empty: default)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() not in FLAG_VALUES:
        raise ConfigError(f"{name}={raw[:40]!r} is neither on nor off: use one of "
                          f"{', '.join(FLAG_VALUES)}")
    return FLAG_VALUES[raw.lower()]


def load() -> Config:
    fallback = _mode("DYNAMO_VULKAN_FALLBACK", FALLBACK_MODES)
    dev = _whole("DYNAMO_VULKAN_DEVICE", MAX_DEVICE_INDEX, "a device index")
    cache_dir = os.environ.get("DYNAMO_VULKAN_CACHE_DIR", "").strip()
    return Config(
        cache_enabled=_flag("DYNAMO_VULKAN_CACHE", True),
        cache_dir=Path(cache_dir).expanduser() if cache_dir else Path.home() / ".cache" / "dynamo_vulkan",
        debug_dump=_dump_dir("DYNAMO_VULKAN_DEBUG_DUMP"),
        fallback=fallback,
        device_index=dev,
        profile=_flag("DYNAMO_VULKAN_PROFILE", False),
        fence_spin_us=_whole("DYNAMO_VULKAN_FENCE_SPIN_US", MAX_FENCE_SPIN_US,
                             "microseconds to poll the fence; 0 blocks at once"),
    )
