"""Every setting of dynamo_vulkan, in one frozen Config, read once per compile.

A setting comes from its environment variable (DYNAMO_VULKAN_*) or, overriding it, from
`torch.compile(model, backend="vulkan", options={name: value})`, where `name` is the
Config field. load() reads both; the backend keeps the result for the graphs of that
compile, hands it to the partitioner and, through the lowering Context, to the rules, and
makes it current() while it builds programs, so the cache and the device read the same
values. The README's settings table is settings_table()'s output (a test checks it).

A value outside what a setting allows is a ConfigError naming the variable or option, the
value and what is allowed; nothing is guessed ("maybe" is neither on nor off)."""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

FALLBACK_MODES = ("warn", "error", "silent")
# How long a submit's wait polls its fence before blocking, on a GPU: a blocked waiter is
# woken late and most calls' waits are short (docs/journal.md has the H100 numbers). Not on
# a CPU device (lavapipe), whose own threads do the work on the cores a polling thread takes.
DEFAULT_FENCE_SPIN_US = 1000
MAX_FENCE_SPIN_US = 10_000_000      # 10 s: a longer spin is a mistake, not a setting
MAX_DEVICE_INDEX = 1 << 16
FLAG_VALUES = {"1": True, "true": True, "yes": True, "on": True,
               "0": False, "false": False, "no": False, "off": False}
CPU_MATMUL_MODES = ("host", "vulkan")
INT_DOT_MODES = ("auto", "on", "off")
MATMUL_PRECISIONS = ("highest", "high", "medium")
TENSOR_CORE_MODES = ("auto", "off")   # auto first: the default
DEFAULT_CACHE_DIR = Path("~/.cache/dynamo_vulkan")


class ConfigError(ValueError):
    """An environment variable or compile option holds a value it does not allow, or an
    option has no such name."""


# --- how a setting's text (environment) or value (options) becomes a field -----------
def _text(where: str, raw) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"{where}={raw!r} must be a string")
    return raw.strip()


def _mode(modes: tuple) -> Callable:
    """One of `modes`, case-insensitive (empty: the first)."""
    def parse(where: str, raw) -> str:
        mode = _text(where, raw)
        if mode.lower() not in modes and mode:
            raise ConfigError(f"{where}={mode!r} is not one of {modes}")
        return mode.lower() or modes[0]
    return parse


def _flag(default: bool) -> Callable:
    """On or off: a bool, or 1/true/yes/on or 0/false/no/off (empty: `default`)."""
    def parse(where: str, raw) -> bool:
        if isinstance(raw, bool):
            return raw
        text = _text(where, raw)
        if not text:
            return default
        if text.lower() not in FLAG_VALUES:
            raise ConfigError(f"{where}={text[:40]!r} is neither on nor off: use one of "
                              f"{', '.join(FLAG_VALUES)}")
        return FLAG_VALUES[text.lower()]
    return parse


def _whole(hi: int, what: str) -> Callable:
    """A whole number in [0, hi] (empty or None: None)."""
    def parse(where: str, raw) -> int | None:
        if raw is None:
            return None
        text = str(raw).strip() if isinstance(raw, (int, str)) and not isinstance(raw, bool) else "?"
        if not text:
            return None
        if not re.fullmatch(r"[0-9]+", text) or int(text) > hi:
            shown = text[:40] if isinstance(raw, str) else raw
            raise ConfigError(f"{where}={shown!r} must be a whole number from 0 to {hi} ({what})")
        return int(text)
    return parse


def _path(default: Path | None) -> Callable:
    """A path, `~` expanded (empty or None: `default`)."""
    def parse(where: str, raw) -> Path | None:
        if raw is None:
            return default.expanduser() if default else None
        text = str(raw).strip() if isinstance(raw, os.PathLike) else _text(where, raw)
        return Path(text).expanduser() if text else (default.expanduser() if default else None)
    return parse


def _writable_dir(where: str, raw) -> Path | None:
    """The debug dump's directory, created now so that a path that cannot be a directory
    is reported here rather than as an OSError in the middle of a compile."""
    path = _path(None)(where, raw)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise ConfigError(f"{where}={str(raw)!r} must be a directory this process can create "
                          f"and write: {e.strerror or e}") from None
    return path


def _matmul_precision(where: str, raw) -> str:
    """torch's float32 matmul precision names (empty: torch.get_float32_matmul_precision()
    now, at compile time, so a compile keeps the setting it was made under)."""
    text = _text(where, raw).lower()
    if not text:
        import torch
        text = torch.get_float32_matmul_precision()
    if text not in MATMUL_PRECISIONS:
        raise ConfigError(f"{where}={text!r} is not one of {MATMUL_PRECISIONS}")
    return text


def _setting(env: str, parse: Callable, values: str, doc: str, key: bool = False):
    """A Config field: its environment variable, its parser, the values the README shows,
    what it does, and whether it changes a compiled program (then it is in Config.key())."""
    return field(metadata={"env": env, "parse": parse, "values": values, "doc": doc, "key": key})


@dataclass(frozen=True)
class Config:
    device_index: int | None = _setting(          # None: the preferred device (device.resolve_index)
        "DYNAMO_VULKAN_DEVICE", _whole(MAX_DEVICE_INDEX, "a device index"), "N",
        "which Vulkan device (default: the first GPU, else a software device)", key=True)
    fallback: str = _setting(
        "DYNAMO_VULKAN_FALLBACK", _mode(FALLBACK_MODES), "warn\\|error\\|silent",
        "an unsupported node runs on the CPU with one warning per op (default), raises, or runs quietly")
    cpu_matmul: str = _setting(
        "DYNAMO_VULKAN_CPU_MATMUL", _mode(CPU_MATMUL_MODES), "host\\|vulkan",
        "on a CPU device, whether graphs with prompt-sized products run on the host (default; "
        "torch's BLAS is many times faster there) or on Vulkan (the tests use it, to check the kernels)",
        key=True)
    int_dot: str = _setting(
        "DYNAMO_VULKAN_INT_DOT", _mode(INT_DOT_MODES), "auto\\|on\\|off",
        "the GGUF mat-vec's integer-dot path: where the device has it and it is faster "
        "(default), for every eligible mat-vec (an error without the feature), or never", key=True)
    matmul_precision: str = _setting(
        "DYNAMO_VULKAN_MATMUL_PRECISION", _matmul_precision, "highest\\|high\\|medium",
        "fp32 matmuls: exact fp32 (highest), or on a device's tensor cores fp16 scaled per row and "
        "column with TF32-class error (high, medium; bf16x3 or bf16 where the device lacks fp16 "
        "partial sums); default torch.get_float32_matmul_precision() at compile time",
        key=True)
    tensor_cores: str = _setting(
        "DYNAMO_VULKAN_TENSOR_CORES", _mode(TENSOR_CORE_MODES), "auto\\|off",
        "tensor-core (cooperative-matrix) matmuls where the device has them, for fp32 under "
        "precision high or medium and for fp16/bf16 tensors (default), or never", key=True)
    glslc_coopmat: Path | None = _setting(       # None: shaders.default_coopmat_glslc(), else PATH
        "DYNAMO_VULKAN_GLSLC_COOPMAT", _path(None), "FILE",
        "the glslc for tensor-core kernels (default: the one scripts/setup.sh puts in the venv, "
        "else `glslc-coopmat` on PATH; without one, fp32 kernels)")
    cache_enabled: bool = _setting(
        "DYNAMO_VULKAN_CACHE", _flag(True), "1\\|0",
        "the on-disk cache (default on) of SPIR-V, plans, traced LLM graphs (a second `generate` of a "
        "model skips Dynamo, for any prompt length) and the device's pipeline cache")
    cache_dir: Path = _setting(
        "DYNAMO_VULKAN_CACHE_DIR", _path(DEFAULT_CACHE_DIR), "DIR",
        f"where it lives (default `{DEFAULT_CACHE_DIR}`)")
    model_dir: Path = _setting(
        "DYNAMO_VULKAN_MODEL_DIR", _path(DEFAULT_CACHE_DIR / "models"), "DIR",
        f"where assembled model files are kept (default `{DEFAULT_CACHE_DIR / 'models'}`)")
    debug_dump: Path | None = _setting(
        "DYNAMO_VULKAN_DEBUG_DUMP", _writable_dir, "DIR",
        "per graph: the FX graph, the partition report, the lowered program, GLSL and SPIR-V")
    strict: bool = _setting(
        "DYNAMO_VULKAN_STRICT", _flag(False), "1\\|0",
        "a bug in a lowering rule (an exception other than its declared refusal) raises instead of "
        "being logged as a bug while the node runs on the CPU (the tests set it)")
    profile: bool = _setting(
        "DYNAMO_VULKAN_PROFILE", _flag(False), "1", "GPU timestamps per kernel, printed as a table after each call")
    fence_spin_us: int | None = _setting(         # None: the device's default (device.set_fence_spin)
        "DYNAMO_VULKAN_FENCE_SPIN_US",
        _whole(MAX_FENCE_SPIN_US, "microseconds to poll the fence; 0 blocks at once"), "N",
        f"how long a call polls its fence before blocking (default {DEFAULT_FENCE_SPIN_US} on a GPU, "
        "0 on a CPU device)")

    def key(self) -> str:
        """The settings that change a compiled program (cache keys include it)."""
        return "-".join(f"{f.name}:{getattr(self, f.name)}" for f in dataclasses.fields(self)
                        if f.metadata["key"])

    def replace(self, **changes) -> "Config":
        """A copy with `changes` (field names and values, parsed as options are)."""
        return _build(os.environ, changes, base=self)


def option_names() -> tuple[str, ...]:
    """The names torch.compile's options may set: Config's fields."""
    return tuple(f.name for f in dataclasses.fields(Config))


def _build(environ, options: dict, base: Config | None = None) -> Config:
    """A Config from `options`, else `base`'s fields (or, without base, `environ`'s)."""
    unknown = sorted(set(options) - set(option_names()))
    if unknown:
        raise ConfigError(f"unknown dynamo_vulkan option(s) {', '.join(map(repr, unknown))}: "
                          f"the options are {', '.join(option_names())}")
    values = {}
    for f in dataclasses.fields(Config):
        parse = f.metadata["parse"]
        if f.name in options:
            values[f.name] = parse(f"options[{f.name!r}]", options[f.name])
        elif base is not None:
            values[f.name] = getattr(base, f.name)
        else:
            values[f.name] = parse(f.metadata["env"], environ.get(f.metadata["env"], ""))
    return Config(**values)


def load(options: dict | None = None) -> Config:
    """The settings: each from `options` (torch.compile's, by field name) where given, else
    from its environment variable, else its default."""
    return _build(os.environ, dict(options or {}))


_current: contextvars.ContextVar[Config | None] = contextvars.ContextVar("dynamo_vulkan_config",
                                                                          default=None)


def current() -> Config:
    """The Config of the compile or program build in progress in this thread (using()),
    else the environment's (load())."""
    cfg = _current.get()
    return cfg if cfg is not None else load()


@contextlib.contextmanager
def using(cfg: Config):
    """Make `cfg` current() while the block runs (the cache and the device read it)."""
    token = _current.set(cfg)
    try:
        yield cfg
    finally:
        _current.reset(token)


def settings_table() -> str:
    """The README's table of settings, one row per Config field."""
    rows = ["| variable | option | effect |", "|---|---|---|"]
    for f in dataclasses.fields(Config):
        m = f.metadata
        rows.append(f"| `{m['env']}={m['values']}` | `{f.name}` | {m['doc']} |")
    return "\n".join(rows)
