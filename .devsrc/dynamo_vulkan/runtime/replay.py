"""A one-step greedy decode Plan replayed k times in one submit.

The Plan of a compiled step (token [1, 1] and position [1] in, the greedy token out)
is copied k times into one sequence, and between copies a one-invocation kernel
(shaders/step_feed.comp) feeds each step's token to the next and sets its position
from the call's k positions. The GPU thus runs k steps per submit, while torch.compile
traces and lowers one step: a k-step graph's tracing and lowering grows with k, and
every call of it pays Dynamo's and aot_autograd's wrappers and the Program's checks of
its hundreds of inputs, which the replay pays once per k tokens (docs/journal.md,
session 29, has the numbers). The idea is CUDA graphs' replay in
torch.compile's "reduce-overhead" mode, with the feedback done on the GPU.
"""
from __future__ import annotations

import dataclasses

from . import shaders
from .plan import Buffer, Dispatch, InputSpec, OutputSpec, Plan

FEED = "step_feed"


class NotReplayable(ValueError):
    """A step Plan that is not one token and one position in, one token out."""


@dataclasses.dataclass(frozen=True)
class StepPorts:
    """Where a step Plan takes its token and position and gives its token."""
    token: int        # input index of the token [1, 1]
    position: int     # input index of the position [1]

    @classmethod
    def of(cls, plan: Plan) -> "StepPorts":
        streamed = [i for i, s in enumerate(plan.inputs) if s.buffer is not None and not s.resident]
        shapes = {tuple(plan.inputs[i].shape): i for i in streamed}
        if len(streamed) != 2 or set(shapes) != {(1, 1), (1,)}:
            raise NotReplayable("a replayed step takes exactly a token [1, 1] and a position [1] "
                                f"from the host; this one takes {[plan.inputs[i].shape for i in streamed]}")
        for i in streamed:
            if plan.buffers[plan.inputs[i].buffer].kind != "i32" or plan.inputs[i].chunks:
                raise NotReplayable(f"input {i} is not one int32 word on the GPU")
        if len(plan.outputs) != 1 or plan.outputs[0].buffer is None or \
                tuple(plan.outputs[0].shape) not in ((1,), (1, 1)) or \
                plan.buffers[plan.outputs[0].buffer].kind != "i32":
            raise NotReplayable("a replayed step gives exactly one token (one int32 word) back; "
                                f"this one gives {[o.shape for o in plan.outputs]}")
        return cls(token=shapes[(1, 1)], position=shapes[(1,)])


def replay_plan(step: Plan, k: int) -> Plan:
    """The Plan of k steps of `step` in one sequence: inputs as the step's, but for the
    position input, which becomes the k positions [k]; one output, the k tokens [k]."""
    if k < 1:
        raise ValueError(f"a replay runs k >= 1 steps, got {k}")
    ports = StepPorts.of(step)
    tok_in = step.inputs[ports.token].buffer
    pos_in = step.inputs[ports.position].buffer
    tok_out = step.outputs[0].buffer
    buffers = [dataclasses.replace(b) for b in step.buffers]
    buffers[pos_in].role = "temp"           # now written by the feed kernel, not the host
    buffers[tok_out].role = "temp"          # read by the feed kernel; the host reads `tokens`
    positions, tokens = len(buffers), len(buffers) + 1
    buffers += [Buffer(k, "input", "i32"), Buffer(k, "output", "i32")]
    key, source = shaders.kernel_source(FEED, {})

    def feed(s: int) -> Dispatch:
        return Dispatch(name=FEED, spirv_key=key, bindings=[tok_in, pos_in, tok_out, positions, tokens],
                        writes=[0, 1, 4], spec=[s, k], groups=(1, 1, 1),
                        note=f"step {s} of {k}" if s < k else f"token {k} of {k}")
    dispatches = []
    for s in range(k):
        dispatches.append(feed(s))
        base = len(dispatches)         # a dispatch's `disjoint` names earlier ones by index
        dispatches += [dataclasses.replace(d, disjoint=[(b, i + base) for b, i in d.disjoint])
                       for d in step.dispatches]
    dispatches.append(feed(k))
    inputs = list(step.inputs)
    inputs[ports.position] = InputSpec(positions, "torch.int64", (k,), False)
    return Plan(buffers=buffers, dispatches=dispatches, inputs=inputs,
                outputs=[OutputSpec(tokens, "torch.int64", (k,))],
                sources={**step.sources, key: source}, mutations=list(step.mutations),
                check_buffer=step.check_buffer, checks=list(step.checks))


def steps_prefix(replay: Plan, n: int) -> list[Dispatch]:
    """The dispatches of a k-step replay Plan that run its first n steps: up to and with
    the feed before step n, which records step n's token (its position read past the n
    the host wrote is never used)."""
    feeds = [i for i, d in enumerate(replay.dispatches) if d.name == FEED]
    if not 1 <= n < len(feeds) - 1:
        raise ValueError(f"a replay of {len(feeds) - 1} steps has no prefix of {n}")
    return replay.dispatches[:feeds[n] + 1]
