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
import logging
import operator
import time

import torch
from torch import nn

__all__ = ["GreedySteps", "StepReplay"]

log = logging.getLogger(__name__)
MAX_PREFIXES = 2     # recorded shorter replays kept (the last calls' of a few lengths)


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
    (runtime/replay.py) instead of compiling a k-step graph: compile time does not grow
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
        self.sub = None              # the step graph's VulkanSubgraph
        self.args: list | None = None     # its inputs at the last step through torch.compile
        self.seen: list | None = None     # the decoder's tensors then (their identities)
        self.step_program = None     # its Program (whose tensors and kernels replays share)
        self.plan = None             # its Plan, and where it takes the token and position
        self.ports = None
        self.programs: dict = {}     # k -> Program of the k-step replay
        self.prefixes: dict = {}     # (k, n) -> its sequence running only the first n steps
        self.why_not = why_not       # set: not replayed (the k-step graph instead)
        self.fresh = False
        self.binds = 0               # steps run through torch.compile
        self.step_s: float | None = None   # wall time per step of the last call

    def begin(self) -> None:
        """A new generation: the next call binds the decoder's tensors again if they are
        not those bound (a step through torch.compile)."""
        self.fresh = self.args is not None and self.decoder is not None and self._tensors() == self.seen

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
            self._program(k)     # a call of fewer steps records its sequence when first run

    def _prefix(self, k: int, n: int):
        """The k-step replay's Program and its sequence for the first n steps (None: all k).
        Recorded when first asked for: ~20 us of host time per dispatch, once; its
        commands hold GPU memory (Program.release)."""
        from ..runtime.replay import steps_prefix

        prog = self._program(k)
        if not n or n == k:
            return prog, None
        seq = self.prefixes.get((k, n))
        if seq is None:
            if len(self.prefixes) >= MAX_PREFIXES:     # each holds GPU memory
                del self.prefixes[next(iter(self.prefixes))]
            seq = self.prefixes[k, n] = prog.record(steps_prefix(prog.plan, n))[0]
        return prog, seq

    def _program(self, k: int):
        from ..runtime.program import Program
        from ..runtime.replay import replay_plan

        prog = self.programs.get(k)
        if prog is None:
            prog = self.programs[k] = Program(replay_plan(self.plan, k), self.args, self.sub.cfg.profile,
                                                 self.sub.bumped, share=self.step_program)
            self.step_program.release()      # recorded again for the next binding step
        return prog

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
        from ..runtime.program import StaleBinding

        prog, seq = self._prefix(k, n)
        args = list(self.args)
        args[self.ports.token] = torch.tensor([[token]])
        args[self.ports.position] = GreedySteps.positions(start, n)
        t0 = time.perf_counter()
        try:
            # the KV caches' versions bumped as the step graph's aot_autograd wrapper does
            (out,) = prog.call_unwrapped(args, seq)
        except StaleBinding:         # a resident input is no longer what it was bound to
            self._forget()
            return self.step(token, start)
        self.step_s = (time.perf_counter() - t0) / n
        return out[:n].tolist()

    def _forget(self) -> None:
        """Drop the replays built on the inputs bound so far."""
        self.programs.clear()
        self.prefixes.clear()

    def step(self, token: int, start: int) -> list[int]:
        """One step through torch.compile, keeping the step graph's inputs (and, on the
        first call, finding its one Vulkan program)."""
        from .. import backend

        tok, pos = torch.tensor([[token]]), GreedySteps.positions(start, 1)
        self.binds += 1
        if self.sub is not None:
            self.sub.remember_args = True
        try:
            with backend.capture_partitions() as got:
                out = self.compiled(tok, pos)
        finally:
            if self.sub is not None:
                self.sub.remember_args = False
        if got:                  # compiled (again, after torch._dynamo.reset()): a new program
            self._adopt(got)
        if self.sub is not None:
            if self.programs:
                self.step_program.release()
            args, self.sub.remembered_args = self.sub.remembered_args, None
            if args is None:
                raise RuntimeError("the replayed step's Vulkan program was not called by its graph")
            if self.args is None or self._bound(args) != self._bound(self.args):
                self._forget()             # other weights or caches: bind them again
                self.step_program = next(iter(self.sub.programs.values()))
            self.args, self.seen, self.fresh = args, self._tensors(), True
        return out.tolist()

    def _bound(self, args: list) -> list:
        """The identities of the inputs a replay binds (all but the token and position)."""
        skip = (self.ports.token, self.ports.position)
        return [id(a) for i, a in enumerate(args) if i not in skip]

    def _adopt(self, got: list) -> None:
        """Take the step graph's one VulkanSubgraph, or say in why_not why there is none."""
        from ..runtime.program import Program
        from ..runtime.replay import NotReplayable, StepPorts

        for _, subs in got:
            for sub in subs:
                sub.remember_args = False
        self.sub = self.step_program = self.plan = self.ports = self.args = None
        self._forget()
        try:
            if len(got) != 1 or len(got[0][1]) != 1:
                raise NotReplayable(f"the step compiled to {len(got)} graph(s) with "
                                    f"{sum(len(s) for _, s in got)} Vulkan partition(s), not one of each")
            gm, (sub,) = got[0]
            host = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output") and
                    not (n.op == "call_module" and getattr(gm, n.target) is sub) and
                    not (n.op == "call_function" and n.target is operator.getitem)]
            if host:
                raise NotReplayable(f"the step runs {[str(n.target) for n in host]} outside its "
                                    "Vulkan program")
            progs = list(sub.programs.values())
            if len(progs) != 1 or not isinstance(progs[0], Program):
                raise NotReplayable("the step's partition did not lower to one Vulkan program")
            ports = StepPorts.of(progs[0].plan)
        except NotReplayable as e:
            self.why_not = str(e)
            log.info("greedy steps compile a k-step graph: %s", e)
            return
        self.sub, self.step_program, self.plan, self.ports = sub, progs[0], progs[0].plan, ports
