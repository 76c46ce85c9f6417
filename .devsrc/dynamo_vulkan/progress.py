"""What a slow first run is doing: one INFO line per phase (tracing, reading a stored
graph, compiling kernels, building pipelines) on the ``dynamo_vulkan.progress`` logger,
and tqdm bars over kernels and pipelines when there are more than a few, shown on a
terminal while that logger is on. The CLIs turn it on (off with -q); a library user
turns it on with logging."""
from __future__ import annotations

import logging

log = logging.getLogger("dynamo_vulkan.progress")
BAR_FROM = 8        # items (kernels, pipelines) from which a step shows a bar


def phase(message: str, *args) -> None:
    log.info(message, *args)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def bar(total: int, desc: str, unit: str):
    """A tqdm bar over `total` items, or one that shows nothing (few items, the progress
    logger off, no terminal, or no tqdm); close() it when done."""
    if total < BAR_FROM or not log.isEnabledFor(logging.INFO):
        return _NoBar()
    try:
        from tqdm.auto import tqdm
    except ImportError:        # a dependency, but running must not need it
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=None)
