"""Repetition, presence and frequency penalties on a step's logits, as llama.cpp defines
them (its ``--repeat-penalty``, ``--presence-penalty``, ``--frequency-penalty`` over the
last ``--repeat-last-n`` tokens of the context, the prompt's included).

For each distinct token among those last tokens, with ``c`` its count there: its logit
is divided by ``repeat_penalty`` when positive and multiplied by it otherwise, then
``c * frequency_penalty + presence_penalty`` is subtracted. They apply before
temperature, so greedy decoding (temperature 0) takes the argmax of the penalised
logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["Penalties", "MAX_REPEAT_PENALTY", "MAX_PRESENCE_FREQUENCY"]

MAX_REPEAT_PENALTY = 100.0
MAX_PRESENCE_FREQUENCY = 100.0
MAX_REPEAT_LAST_N = 1 << 20


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class Penalties:
    """``repeat_penalty`` (1: off) over the last ``repeat_last_n`` tokens (0: none, -1:
    the whole context), ``presence_penalty`` and ``frequency_penalty`` (0: off)."""
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self):
        if not (_number(self.repeat_penalty) and 0 < self.repeat_penalty <= MAX_REPEAT_PENALTY):
            raise ValueError(f"repeat_penalty must be in (0, {MAX_REPEAT_PENALTY:g}] (1: off), "
                             f"got {self.repeat_penalty!r}")
        if isinstance(self.repeat_last_n, bool) or not isinstance(self.repeat_last_n, int) or \
                not -1 <= self.repeat_last_n <= MAX_REPEAT_LAST_N:
            raise ValueError(f"repeat_last_n must be a whole number from -1 (the whole context) to "
                             f"{MAX_REPEAT_LAST_N}, got {self.repeat_last_n!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (_number(v) and abs(v) <= MAX_PRESENCE_FREQUENCY):
                raise ValueError(f"{name} must be from -{MAX_PRESENCE_FREQUENCY:g} to "
                                 f"{MAX_PRESENCE_FREQUENCY:g} (0: off), got {v!r}")

    @property
    def active(self) -> bool:
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)

    def window(self, context: list[int]) -> list[int]:
        """The tokens the penalties look at: the last repeat_last_n of ``context``."""
        if self.repeat_last_n == 0:
            return []
        return context if self.repeat_last_n < 0 else context[-self.repeat_last_n:]

    def apply(self, logits: torch.Tensor, context: list[int]) -> torch.Tensor:
        """``logits`` ([vocab], or any shape holding one row) penalised for the tokens of
        ``context`` (the prompt and the tokens generated so far): a new float32 row, or
        ``logits`` itself when no penalty is on."""
        if not self.active:
            return logits
        out = logits.reshape(-1).to(torch.float32).clone()
        recent = self.window(context)
        if not recent:
            return out
        ids, counts = torch.unique(torch.tensor(recent, dtype=torch.int64), return_counts=True)
        sel = out[ids]
        if self.repeat_penalty != 1.0:
            sel = torch.where(sel > 0, sel / self.repeat_penalty, sel * self.repeat_penalty)
        out[ids] = sel - counts.to(torch.float32) * self.frequency_penalty - self.presence_penalty
        return out
