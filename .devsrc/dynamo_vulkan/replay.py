"""Public API: one compiled step replayed k times per GPU submit.

A step function (token [1, 1] and position [1] in, the next token out) compiled with
``backend="vulkan"`` is called once through torch.compile; its graph's one Vulkan
program and the inputs of that call are captured, and :meth:`StepReplayer.replay`
then runs k copies of its Plan in one sequence (runtime/replay.py), each step's
token fed to the next on the GPU. Callers (the LLM's greedy decoding) need nothing
of the backend or the runtime beyond this module.
"""
from __future__ import annotations

import logging
import operator

import torch

from . import backend
from .runtime.program import Program, StaleBinding
from .runtime.replay import NotReplayable, StepPorts, replay_plan, steps_prefix

__all__ = ["NotReplayable", "StaleBinding", "StepReplayer"]

log = logging.getLogger(__name__)
MAX_PREFIXES = 2     # recorded shorter replays kept (the last calls' of a few lengths)


class StepReplayer:
    """The replays of ``compiled(token, position)``, a step compiled for the vulkan backend.

    :meth:`step` calls it through torch.compile and binds the replays to that call's
    inputs (weights, caches); its graph must lower whole to one Vulkan program taking
    only the token and position from the host, else ``why_not`` says why and nothing
    replays. :meth:`replay` runs n of k steps in one submit; it raises StaleBinding when
    a bound input is no longer the tensor it was (then :meth:`step` binds again)."""

    def __init__(self, compiled):
        self.compiled = compiled
        self.sub = None              # the step graph's VulkanSubgraph
        self.args: list | None = None     # its inputs at the last step through torch.compile
        self.step_program = None     # its Program (whose tensors and kernels replays share)
        self.plan = None             # its Plan, and where it takes the token and position
        self.ports = None
        self.programs: dict = {}     # k -> Program of the k-step replay
        self.prefixes: dict = {}     # (k, n) -> its sequence running only the first n steps
        self.why_not: str | None = None   # set: the step does not replay

    @property
    def bound(self) -> bool:
        """Whether the last step captured the program and inputs that replays use."""
        return self.why_not is None and self.args is not None

    def step(self, token: torch.Tensor, position: torch.Tensor):
        """One step through torch.compile: its output; on the first call (or after the
        step compiled again) finds its one Vulkan program, and binds its inputs."""
        if self.sub is not None:
            self.sub.remember_args = True
        try:
            with backend.capture_partitions() as got:
                out = self.compiled(token, position)
        finally:
            if self.sub is not None:
                self.sub.remember_args = False
        if got:                  # compiled (again, after torch._dynamo.reset()): a new program
            self._adopt(got)
        elif self.sub is None and self.why_not is None:
            # compiled without a Vulkan partition (the backend ran it on the CPU: no usable
            # device or kp), or ran eagerly: nothing to replay
            self.why_not = "the step ran without a Vulkan program"
            log.info("greedy steps compile a k-step graph: %s", self.why_not)
        if self.sub is not None:
            if self.programs:
                self.step_program.release()
            args, self.sub.remembered_args = self.sub.remembered_args, None
            if args is None:
                raise RuntimeError("the replayed step's Vulkan program was not called by its graph")
            if self.args is None or self._bound(args) != self._bound(self.args):
                self.forget()             # other weights or caches: bind them again
                self.step_program = next(iter(self.sub.programs.values()))
            self.args = args
        return out

    def build(self, k: int) -> Program:
        """The k-step replay's Program (built once per k; its sequence is recorded when
        first run)."""
        prog = self.programs.get(k)
        if prog is None:
            prog = self.programs[k] = Program(replay_plan(self.plan, k), self.args, self.sub.cfg.profile,
                                              self.sub.bumped, share=self.step_program)
            self.step_program.release()      # recorded again for the next binding step
        return prog

    def replay(self, token: int, positions: torch.Tensor, k: int) -> torch.Tensor:
        """The tokens of n = len(positions) <= k steps after ``token``, from the k-step
        replay in one submit. StaleBinding (the replays forgotten) when a bound input
        changed: call :meth:`step` to bind again."""
        n = positions.shape[0]
        prog, seq = self._prefix(k, n)
        args = list(self.args)
        args[self.ports.token] = torch.tensor([[token]])
        args[self.ports.position] = positions
        try:
            # the KV caches' versions bumped as the step graph's aot_autograd wrapper does
            (out,) = prog.call_unwrapped(args, seq)
        except StaleBinding:         # a resident input is no longer what it was bound to
            self.forget()
            raise
        return out[:n]

    def prepare(self, k: int, n: int) -> None:
        """Record the first-n-steps sequence of the k-step replay now (a warm-up), not at
        the first call that asks for it."""
        self._prefix(k, n)

    def forget(self) -> None:
        """Drop the replays built on the inputs bound so far."""
        self.programs.clear()
        self.prefixes.clear()

    def _prefix(self, k: int, n: int):
        """The k-step replay's Program and its sequence for the first n steps (None: all k).
        Recorded when first asked for: ~20 us of host time per dispatch, once; its
        commands hold GPU memory (Program.release)."""
        prog = self.build(k)
        if not n or n == k:
            return prog, None
        seq = self.prefixes.get((k, n))
        if seq is None:
            if len(self.prefixes) >= MAX_PREFIXES:     # each holds GPU memory
                del self.prefixes[next(iter(self.prefixes))]
            seq = self.prefixes[k, n] = prog.record(steps_prefix(prog.plan, n))[0]
        return prog, seq

    def _bound(self, args: list) -> list:
        """The identities of the inputs a replay binds (all but the token and position)."""
        skip = (self.ports.token, self.ports.position)
        return [id(a) for i, a in enumerate(args) if i not in skip]

    def _adopt(self, got: list) -> None:
        """Take the step graph's one VulkanSubgraph, or say in why_not why there is none."""
        for _, subs in got:
            for sub in subs:
                sub.remember_args = False
        self.sub = self.step_program = self.plan = self.ports = self.args = None
        self.forget()
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
        self.why_not = None
        self.sub, self.step_program, self.plan, self.ports = sub, progs[0], progs[0].plan, ports
