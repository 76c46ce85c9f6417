"""The lowering's settings as they are now, for a plan's cache key.

The lowering modules' upper-case constants (sizes, shapes by weight type, thresholds)
decide what a plan holds as much as the rules' code does, and tests and sweeps set them in
place, which the files' bytes (runtime.shaders.sources_hash) do not show: a plan built
under other values must not be taken for this one."""
from __future__ import annotations

import functools
import importlib
import pkgutil

from .. import cache


@functools.lru_cache(maxsize=1)
def _module_names() -> tuple[str, ...]:
    """Every module of this package, so that the hash covers the same ones in every
    process, whichever of them it has imported so far."""
    pkg = importlib.import_module(__package__)
    return tuple(sorted(f"{__package__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)))


def canonical(v) -> str | None:
    """v's text, the same in every process (sets and dicts in sorted order), or None for a
    value that is not made of numbers and strings (its repr may hold an address)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return repr(v)
    if isinstance(v, (tuple, list, set, frozenset, dict)):
        items = [(canonical(k), canonical(x)) for k, x in v.items()] if isinstance(v, dict) \
            else [(canonical(x), "") for x in v]
        if any(a is None or b is None for a, b in items):
            return None
        if isinstance(v, (set, frozenset, dict)):
            items.sort()
        return type(v).__name__ + repr(items)
    return None


def settings_hash() -> str:
    """Hash of every upper-case constant of the lowering modules as it is now (a value that
    is not plain data counts by its name only)."""
    parts = []
    for name in _module_names():
        mod = importlib.import_module(name)
        parts += [(name, k, canonical(v)) for k, v in sorted(vars(mod).items()) if k.isupper()]
    return cache.digest(*parts)
