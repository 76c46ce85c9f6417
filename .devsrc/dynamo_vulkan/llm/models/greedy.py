"""Several greedy decode steps in one call, so one compiled graph (one GPU submit)
produces ``k`` tokens.

A decode call on a GPU costs a fixed submit round trip and host work (torch.compile's
guards, copying inputs in and tokens out: just under 1 ms per call on the H100's host,
measured for Gemma 3) plus the step's kernels. With the argmax computed in the graph and
fed straight to the next step's embedding lookup, and the positions known ahead
(``start_pos + i``), the round trip and the host work around it are paid once per ``k``
tokens. The caller drops tokens after an end-of-sequence token; the cache slots they
wrote are overwritten by the next prompt's prefill or never attended to.
"""

from __future__ import annotations

import itertools
import time

import torch
from torch import nn

from dynamo_vulkan.replay import StaleBinding, StepReplayer

__all__ = ["GreedySteps", "StepReplay"]


class GreedySteps(nn.Module):
    """``forward(token [1, 1], positions [k]) -> [k]`` int64: the greedy tokens after
    ``token``, which sits at ``positions[0]``; the decoder's KV cache gains the
    ``positions`` (consecutive: ``start + arange(k)``).

    k is the length of ``positions``, so it is part of the input shapes that a compiled
    graph is specialised and guarded on (module attributes may be unguarded; see
    generate.compile_decoder)."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    @staticmethod
    def positions(start: int, k: int) -> torch.Tensor:
        if k < 1:
            raise ValueError(f"steps per call must be >= 1, got {k}")
        return torch.arange(start, start + k, dtype=torch.int64)

    def forward(self, token: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        tok = token.reshape(1, 1).to(torch.int64)
        out = []
        for i in range(positions.shape[0]):
            logits = self.decoder(tok, positions[i])           # [1, vocab]
            tok = torch.argmax(logits, dim=-1, keepdim=True)  # [1, 1], first index of the max
            out.append(tok.reshape(1))
        return torch.cat(out)


class StepReplay:
    """Greedy decoding k steps per submit by replaying one compiled step
    (dynamo_vulkan.replay) instead of compiling a k-step graph: compile time does not grow
    with k, and the host work of a torch.compile call is paid once per k tokens.

    ``compiled`` is ``GreedySteps`` over ``decoder`` compiled for the vulkan backend.
    Its one-step graph (positions of length 1) is compiled on the first step and must
    lower whole to one Vulkan program taking only the token and position from the host;
    otherwise ``why_not`` says why and each call runs ``compiled`` with k positions
    instead. After :meth:`begin` (each generate() call), if the decoder's parameters or
    buffers are other tensors than when the replay bound them, the first call runs one
    step through ``compiled`` to bind them again."""

    def __init__(self, compiled, decoder=None, why_not: str | None = None):
        self.compiled = compiled
        self.decoder = decoder
        self.replayer = StepReplayer(compiled)
        self.seen: list | None = None     # the decoder's tensors at the last binding step
        self.why_not = why_not       # set: not replayed (the k-step graph instead)
        self.fresh = False
        self.binds = 0               # steps run through torch.compile
        self.step_s: float | None = None   # wall time per step of the last call

    def begin(self) -> None:
        """A new generation: the next call binds the decoder's tensors again if they are
        not those bound (a step through torch.compile)."""
        self.fresh = self.replayer.bound and self.decoder is not None and self._tensors() == self.seen

    def _tensors(self) -> list:
        d = self.decoder
        return None if d is None else [id(t) for t in itertools.chain(d.parameters(), d.buffers())]

    def steps_within(self, seconds: float, k: int) -> int:
        """The power of two of steps, at most k, that the last call's time per step fits
        in ``seconds`` (k when not replayed: the k-step graph runs k)."""
        if not self.replays or self.step_s is None:
            return k
        fit = max(1, int(seconds / self.step_s))
        return min(k, 1 << (fit.bit_length() - 1))

    @property
    def replays(self) -> bool:
        """Whether calls replay the step (known after the first step; any n <= k then),
        rather than run the k-step graph (n = k only)."""
        return self.why_not is None

    def warm(self, token: int, start: int, k: int) -> None:
        """Compile the step graph (writing the cache slot at ``start``, which a later step
        rewrites) and, when it replays, build its k-step replay."""
        if self.why_not is None:
            self.step(token, start)
        if self.why_not is None:
            self.replayer.build(k)     # a call of fewer steps records its sequence when first run

    def prepare(self, k: int, counts) -> None:
        """Record the k-step replay's sequences of these step counts now (a warm-up), so
        that no timed call records one (about 20 us of host time per dispatch: a 7B's 16
        steps, ~0.1 s)."""
        if self.why_not is None and self.fresh:
            for n in sorted(set(counts)):
                if 0 < n <= k:
                    self.replayer.prepare(k, n)

    def __call__(self, token: int, start: int, k: int, n: int | None = None) -> list[int]:
        """The greedy tokens after ``token`` at position ``start``: n (default k) of them,
        n <= k, from the k-step replay (or the k-step graph: n = k); or one (the step that
        binds the inputs again after begin())."""
        n = k if n is None else n
        if not 1 <= n <= k:
            raise ValueError(f"a call of up to {k} steps cannot run {n}")
        if self.why_not is not None:
            if n != k:
                raise ValueError(f"the {k}-step graph runs {k} steps, not {n}")
            return self.compiled(torch.tensor([[token]]), GreedySteps.positions(start, k)).tolist()
        if not self.fresh:
            return self.step(token, start)
        t0 = time.perf_counter()
        try:
            out = self.replayer.replay(token, GreedySteps.positions(start, n), k)
        except StaleBinding:         # a resident input is no longer what it was bound to
            return self.step(token, start)
        self.step_s = (time.perf_counter() - t0) / n
        return out.tolist()

    def step(self, token: int, start: int) -> list[int]:
        """One step through torch.compile, keeping the step graph's inputs (and, on the
        first call, finding its one Vulkan program)."""
        self.binds += 1
        out = self.replayer.step(torch.tensor([[token]]), GreedySteps.positions(start, 1))
        if self.replayer.why_not is not None:
            self.why_not = self.replayer.why_not
        elif self.replayer.bound:
            self.seen, self.fresh = self._tensors(), True
        return out.tolist()
