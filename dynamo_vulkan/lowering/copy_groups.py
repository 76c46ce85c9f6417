"""Copies into graph inputs that share kernels: a run of consecutive copy_ nodes (an
optimizer step's new parameters, moments and step counts) as a few multi-output kernels.

Each copy_ computes an elementwise expression straight into its input's buffer
(planner._copied_into_inputs); one kernel a copy made AdamW four kernels a parameter.
Copies of one shape share a kernel here (elementwise.ew_outputs), which loads every
operand's element before it stores any output's: every copy in it reads the values the
inputs held before the kernel. Graph order asks for exactly that where a copy reads no
input that an earlier copy of its kernel writes, and reads an input that a later copy of
its kernel writes only as that copy's own element (the same view: no other invocation
reads it). Between kernels, a copy that reads an input another one writes runs before that
one where it comes first in the graph (it wants the old values), after it where it comes
later (the new ones). Where no order of the kernels keeps all of that, each copy runs
alone, in graph order.
"""
from __future__ import annotations

import heapq

from .core import TRef
from .elementwise import KernelGroup, ew_outputs, max_buffers
from .fusion import Lazy, fold


def reads_of(src, dst: TRef) -> list[TRef]:
    """The tensors that src's expression (a Lazy, or a TRef copied as it is) loads."""
    leaves = fold("$0", [src], dst.kind, dst.kind, None, dst.shape)[1] if isinstance(src, Lazy) else [src]
    return [t for t in leaves if isinstance(t, TRef)]


def same_view(t: TRef, u: TRef) -> bool:
    """Whether t and u are the same elements of the same buffer in the same order."""
    return (t.buf, t.offset, tuple(t.strides), tuple(t.shape)) == \
        (u.buf, u.offset, tuple(u.strides), tuple(u.shape))


def emit_copies(ctx, items: list[tuple[object, TRef]]) -> None:
    """Compute each (src, dst) of a run of copies, in graph order, into dst (src: a Lazy
    or a TRef of dst's shape, which reads dst's buffer only as dst: planner.lower)."""
    reads = [reads_of(src, dst) for src, dst in items]
    dsts = [dst for _, dst in items]
    groups: list[_Group] = []
    limit = max_buffers(ctx.caps)
    for j in range(len(items)):
        home = next((g for g in groups if g.takes(reads[j], dsts[j])), None)
        if home is None:
            home = _Group(tuple(dsts[j].shape), limit)
            groups.append(home)
        home.add(j, reads[j], dsts[j])
    order = _ordered([g.members for g in groups], reads, dsts)
    if order is None:
        order = [[j] for j in range(len(items))]
    for g in order:
        ew_outputs(ctx, [items[j] for j in g])


class _Group(KernelGroup):
    """Copies that share one kernel: the group's record, its members and the tensors they
    read of each buffer."""

    def __init__(self, shape: tuple, limit: int):
        super().__init__(shape, limit)
        self.members, self.reads = [], {}

    def takes(self, reads: list[TRef], dst: TRef) -> bool:
        """Whether a copy of dst reading `reads` (later in the graph than every member) may
        join: as KernelGroup.fits, writing no buffer a member writes either, while the
        members read its buffer only as dst."""
        return dst.buf not in self.written and self.fits(dst.shape, {t.buf for t in reads}, dst.buf) and \
            all(same_view(t, dst) for t in self.reads.get(dst.buf, ()))

    def add(self, j: int, reads: list[TRef], dst: TRef) -> None:
        self.members.append(j)
        self.note({t.buf for t in reads}, dst.buf)
        for t in reads:
            self.reads.setdefault(t.buf, []).append(t)


def _ordered(groups: list[list[int]], reads, dsts) -> list[list[int]] | None:
    """The groups in an order that gives each copy the values graph order gives it (the
    earliest copy first among the free ones), or None where there is none."""
    where = {j: gi for gi, g in enumerate(groups) for j in g}
    writers: dict[int, list[int]] = {}
    for k in where:
        writers.setdefault(dsts[k].buf, []).append(k)
    after: list[set] = [set() for _ in groups]        # group -> groups that must follow it
    for j, gj in where.items():
        for buf in {t.buf for t in reads[j]} | {dsts[j].buf}:
            for k in writers.get(buf, ()):
                gk = where[k]
                if gk == gj:
                    continue
                if k < j:
                    after[gk].add(gj)         # j wants k's new values (or writes after it)
                else:
                    after[gj].add(gk)         # j wants the buffer as it was (or writes first)
    waiting = [0] * len(groups)
    for gi in range(len(groups)):
        for gn in after[gi]:
            waiting[gn] += 1
    free = [(g[0], gi) for gi, g in enumerate(groups) if not waiting[gi]]
    heapq.heapify(free)
    order = []
    while free:
        _, gi = heapq.heappop(free)
        order.append(groups[gi])
        for gn in after[gi]:
            waiting[gn] -= 1
            if not waiting[gn]:
                heapq.heappush(free, (groups[gn][0], gn))
    return order if len(order) == len(groups) else None
