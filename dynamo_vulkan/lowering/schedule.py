"""Dispatch order: copies of weights moved beside earlier products; a step's mask ranges
moved to where the mask is ready.

A prompt's GGUF weight decoded whole into the tensor cores' fp16 copy (or into fp32) is a
function of the program's weights alone. Left where its rule emits it, just before its
product, it takes a barrier level of its own, streaming at bandwidth while the GPU's
arithmetic idles. Emitted instead right after the product that read the copy before it,
it runs in that product's level, on the processors and bandwidth the product leaves free
(a 7B's q, o and down products fill fewer workgroups than an H100 has SMs).

Its temporaries then live from the start of that level, so that assign_buffers never
gives them a buffer that another dispatch of the level binds.

A decode step's mask ranges (attention's mask_ranges.comp) are made when its first
attention is lowered, right before it: there they would put a barrier between that
attention and the cache scatters beside it. They read only the mask, so they move to the
first level where it is ready (hoist_early)."""
from __future__ import annotations

from ..runtime.plan import Plan, barriers

# copies moved back past this many earlier copies' products at most: one keeps two copies
# alive at once (the 7B's largest pair, gate|up and down, 406 MB)
AHEAD_DEPTH = 1
# copies of fewer bytes stay where they are: one of a few MiB takes microseconds, which
# beside a product saves less than the memory its earlier start holds is worth to a small
# model (SmolLM2's prompt: 3.4 MiB more, past its memory goal; docs/journal.md, session 45)
AHEAD_MIN_BYTES = 16 << 20
# kernels hoist_early moves to the first level where their inputs are ready
EARLY = ("mask_ranges",)


def _movable(plan: Plan, index: int, first: dict, written: set) -> bool:
    """Whether dispatch `index` reads only buffers no dispatch writes (constants,
    parameters) and writes only temporaries it binds first, of AHEAD_MIN_BYTES or more,
    and orders no other way."""
    d = plan.dispatches[index]
    outs = {d.bindings[w] for w in d.writes}
    ins = set(d.bindings) - outs
    return bool(outs) and not d.disjoint and \
        sum(4 * plan.buffers[b].words for b in outs) >= AHEAD_MIN_BYTES and \
        all(plan.buffers[b].role in ("const", "param") and b not in written for b in ins) and \
        all(plan.buffers[b].role == "temp" and first[b] == index for b in outs)


def move_copies_ahead(plan: Plan, copies: set[int], depth: int = AHEAD_DEPTH) -> dict[int, int]:
    """Reorder plan.dispatches: each dispatch of `copies` (indices; those that read only
    the program's weights, see _movable) goes right after the last reader of the copy
    `depth` before it, where that reader comes before it. Returns {temporary: the index
    from which it is live} for assign_buffers: the start of the barrier level it joined."""
    ds = plan.dispatches
    first, last = {}, {}
    for i, d in enumerate(ds):
        for b in d.bindings:
            first.setdefault(b, i)
            last[b] = i
    written = {d.bindings[w] for d in ds for w in d.writes}
    copies = sorted(copies)
    after: dict[int, list[int]] = {}          # reader index -> copies emitted right after it
    for n, i in enumerate(copies):
        if n < depth or not _movable(plan, i, first, written):
            continue
        prev = ds[copies[n - depth]]
        reader = max(last[prev.bindings[w]] for w in prev.writes)
        if reader < i:
            after.setdefault(reader, []).append(i)
    moved = {i for group in after.values() for i in group}
    if not moved:
        return {}
    order = []
    for i in range(len(ds)):
        if i not in moved:
            order.append(i)
        order.extend(after.get(i, ()))
    position = {old: new for new, old in enumerate(order)}
    plan.dispatches = [ds[i] for i in order]
    for d in plan.dispatches:
        d.disjoint = [(b, position[i]) for b, i in d.disjoint]
    starts = _level_starts(plan.dispatches)
    return {ds[i].bindings[w]: starts[position[i]] for i in moved for w in ds[i].writes}


def _level_starts(ds: list) -> list[int]:
    """For each dispatch, the index of the first dispatch of its barrier level."""
    starts, level_start = [], 0
    for i, wait in enumerate(barriers(ds)):
        level_start = i if wait else level_start
        starts.append(level_start)
    return starts


def hoist_early(plan: Plan, names: tuple = EARLY) -> dict[int, int]:
    """Move each dispatch named in `names` that writes only buffers it binds first to the end
    of the first barrier level after the last dispatch writing a buffer it reads, where that
    level comes before its own: it then joins that level with no barrier of its own, and
    its readers wait for nothing new. Returns {old index: new index} for every dispatch
    ({} when none moved)."""
    ds = list(plan.dispatches)
    order = list(range(len(ds)))          # order[new index] = old index
    moved_any = False
    for old in [i for i, d in enumerate(ds) if d.name in names]:
        i = order.index(old)
        d = ds[i]
        outs = {d.bindings[w] for w in d.writes}
        reads = set(d.bindings) - outs
        if not outs or any(b in outs for e in ds[:i] for b in e.bindings):
            continue
        writer = max((j for j in range(i) if any(ds[j].bindings[w] in reads for w in ds[j].writes)),
                     default=-1)
        starts = _level_starts(ds)
        # the level after the writer's (the first level where nothing it reads is written)
        target = next((j for j in range(writer + 1, i + 1) if starts[j] == j), i) if writer >= 0 else 0
        if target >= starts[i]:
            continue
        at = next(j for j in range(target + 1, i + 1) if starts[j] == j)    # that level's end
        ds.insert(at, ds.pop(i))
        order.insert(at, order.pop(i))
        moved_any = True
    if not moved_any:
        return {}
    position = {o: n for n, o in enumerate(order)}
    for d in ds:
        d.disjoint = [(b, position[j]) for b, j in d.disjoint]
    plan.dispatches = ds
    return position
