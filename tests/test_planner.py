"""Temporaries sharing memory. Within a plan (lowering/planner.assign_buffers): no two
that live at once share a buffer, each buffer holds its largest occupant, and a graph
whose intermediates shrink and grow stays correct. Across programs (runtime/program.Scratch):
interleaved calls of programs sharing their temporaries stay correct; and a partition
keeps the programs of its latest input layouts only (backend.PROGRAMS_KEPT)."""
import random

import pytest
import torch

from dynamo_vulkan.runtime.plan import Buffer, Dispatch, Plan
from dynamo_vulkan.lowering.planner import assign_buffers
from vk import check


@pytest.fixture
def share_levels(monkeypatch):
    """Temporaries of any size share a buffer with others of their barrier level (these
    plans' dispatches write nothing: one level) where no other buffer is free."""
    from dynamo_vulkan.lowering import planner
    monkeypatch.setattr(planner, "SAME_LEVEL_BYTES", 0)


def test_a_level_keeps_its_temporaries_apart():
    """assign_buffers: temporaries live apart in dispatch order but in one barrier level
    (a reader, then a writer of another) share no buffer where that would add a barrier:
    a buffer of another level goes first; a small one takes a new buffer; one of
    SAME_LEVEL_BYTES or more shares (memory before levels), and the plan's levels are
    the same as with every temporary apart wherever nothing shares."""
    from dynamo_vulkan.lowering import planner
    from dynamo_vulkan.runtime.plan import barriers, levels

    def plan_of(words):
        # W0 writes t0; R0 reads t0 and writes t1 (level 1); W2 writes t2, then R2 reads
        # t2: t1's life ends at R0 and t2's starts at W2, both in level 1
        bufs = [Buffer(4, "input"), Buffer(4, "output")] + [Buffer(w, "temp") for w in words]
        d = lambda name, b, w: Dispatch(name, "s", b, w, [], (1, 1, 1))
        return Plan(buffers=bufs, dispatches=[
            d("W0", [2, 0], [0]), d("R0", [3, 2], [0]), d("W2", [4, 0], [0]),
            d("R2", [1, 4, 3], [0])])
    apart = plan_of([8, 8, 8])
    want = barriers(apart.dispatches)
    small = plan_of([8, 8, 8])
    assign_buffers(small)
    assert barriers(small.dispatches) == want
    assert small.dispatches[1].bindings[0] != small.dispatches[2].bindings[0]
    words = planner.SAME_LEVEL_BYTES // 4
    big = plan_of([words, words, words])
    assign_buffers(big)
    # t0 (level 0-1) and t2 (level 1-2) meet in level 1; t1 lives to R2 (level 2): only t0's
    # buffer is free for t2, in a level t0 also lives in: shared, the level splits
    assert sum(b.role == "temp" for b in big.buffers) == 2
    assert sum(barriers(big.dispatches)) == sum(want) + 1
    # levels: the first one, then one per barrier (W0 | R0 W2 | R2 apart; one more shared)
    assert (levels(apart.dispatches), levels(big.dispatches), levels([])) == (3, 4, 0)


def _plan(temps: list[tuple[int, int, int]]) -> tuple[Plan, list[tuple[int, int, int]]]:
    """A plan with one input and, for each (words, first, last), a temporary bound by
    dispatches first and last (the input bound by every dispatch)."""
    n = max(last for _, _, last in temps) + 1
    plan = Plan(buffers=[Buffer(4, "input")] + [Buffer(w, "temp") for w, _, _ in temps])
    for i in range(n):
        bound = [0] + [1 + t for t, (_, a, z) in enumerate(temps) if i in (a, z)]
        plan.dispatches.append(Dispatch(name="k", spirv_key="k", bindings=bound, writes=[], spec=[],
                                        groups=(1, 1, 1)))
    return plan, temps


def _check_sharing(plan: Plan, temps) -> int:
    """Asserts the assignment is sound; returns the words the temporaries take."""
    where = {}     # temp index -> its physical buffer, read off the dispatches' bindings
    for t, (_, a, _) in enumerate(temps):
        d = plan.dispatches[a].bindings
        where[t] = d[1 + sorted(u for u, (_, a2, z2) in enumerate(temps) if a in (a2, z2)).index(t)]
    for t, (w, a, z) in enumerate(temps):
        phys = plan.buffers[where[t]]
        assert phys.role == "temp" and phys.words >= w, (t, phys)
        for u, (_, a2, z2) in enumerate(temps):
            if u != t and where[u] == where[t]:
                assert z < a2 or z2 < a, f"temps {t} and {u} live at once in buffer {where[t]}"
    assert plan.buffers[0].role == "input" and plan.buffers[0].words == 4
    return sum(b.words for b in plan.buffers if b.role == "temp")


def test_a_big_temporary_reuses_the_small_ones_buffer_grown_once(share_levels):
    # small, then a big one after it, then small again: one big buffer serves all three
    # (first-use order with exact-fit reuse needed the small buffer and a big one)
    plan, temps = _plan([(10, 0, 1), (100, 2, 3), (10, 4, 5)])
    assign_buffers(plan)
    assert _check_sharing(plan, temps) == 100


def test_temporaries_that_live_at_once_get_buffers_of_their_own(share_levels):
    # 9 (dispatches 4-5) first, alone; 7 (0-4) meets it at 4; 5 (1-2) fits beside 9; 3
    # (2-3) meets 5 and 7: 9 + 7 + 3. First-use order found no free buffer for 9: 24
    plan, temps = _plan([(7, 0, 4), (5, 1, 2), (3, 2, 3), (9, 4, 5)])
    assign_buffers(plan)
    assert _check_sharing(plan, temps) == 19


def test_random_lifetimes_are_never_shared_while_live():
    rng = random.Random(0)
    for _ in range(50):
        temps = []
        for _ in range(rng.randint(1, 30)):
            a = rng.randint(0, 40)
            temps.append((rng.randint(1, 1000), a, a + rng.randint(0, 8)))
        plan, temps = _plan(temps)
        assign_buffers(plan)
        used = _check_sharing(plan, temps)
        live = max(sum(w for w, a, z in temps if a <= i <= z) for i in range(len(plan.dispatches)))
        assert live <= used <= sum(w for w, _, _ in temps)


def test_intermediates_that_shrink_and_grow_stay_correct():
    # widths 3 -> 40 -> 5 -> 64 -> 2: buffers shared by temporaries of other sizes
    w1, w2, w3, w4 = (torch.randn(40, 3), torch.randn(5, 40), torch.randn(64, 5), torch.randn(2, 64))

    def fn(x):
        h = torch.relu(x @ w1.T)
        h = torch.tanh(h @ w2.T) * 2
        h = torch.sigmoid(h @ w3.T) + h.sum(-1, keepdim=True)
        return (h @ w4.T).exp() - 1
    check(fn, torch.randn(7, 3))
    check(fn, torch.randn(1, 3))


def _programs(fn, *shapes):
    """Compile fn (dynamic shapes), call it on inputs of each shape; its one partition."""
    from dynamo_vulkan import backend
    c = torch.compile(fn, backend="vulkan", dynamic=True)
    with backend.capture_partitions() as got:
        for s in shapes:
            x = torch.randn(s)
            torch.testing.assert_close(c(x), fn(x), rtol=1e-4, atol=1e-4)
    (sub,) = [s for _, subs in got for s in subs]
    return c, sub


def _rowwise_a(x):
    return torch.softmax(x * 3, -1).cumsum(-1) + torch.softmax(x, 0).amax(0)


def _rowwise_b(x):
    return torch.log_softmax(x - 1, -1).cumsum(-1) * torch.softmax(x.exp(), 0).sum(0)


def test_programs_share_temporaries_and_stay_correct_interleaved():
    # two graphs, and one graph at two shapes: the largest temporaries of each program are
    # one buffer (calls never overlap), so interleaved calls must not see each other's
    ca, a = _programs(_rowwise_a, (37, 129), (5, 129))
    cb, b = _programs(_rowwise_b, (37, 129))
    pa = list(a.programs.values())
    pb = list(b.programs.values())
    assert len(pa) == 2 and len(pb) == 1
    shared = {id(s) for p in pa + pb for s in p._scratch}
    assert pa[0]._scratch and len(shared) < sum(len(p._scratch) for p in pa + pb)
    assert pa[0]._scratch[0] is pb[0]._scratch[0]   # the largest: same shape, same size
    for _ in range(2):
        for fn, c, s in ((_rowwise_a, ca, (37, 129)), (_rowwise_b, cb, (37, 129)),
                         (_rowwise_a, ca, (5, 129))):
            x = torch.randn(s)
            torch.testing.assert_close(c(x), fn(x), rtol=1e-4, atol=1e-4)


def test_a_partition_keeps_the_programs_of_its_latest_shapes():
    from dynamo_vulkan import backend
    # shrinking shapes: each program's temporaries fit the shared ones, none is replaced
    shapes = [(n, 33) for n in range(3 + backend.PROGRAMS_KEPT + 1, 2, -1)]
    c, sub = _programs(_rowwise_a, *shapes)
    assert len(sub.programs) == backend.PROGRAMS_KEPT
    x = torch.randn(shapes[0])       # its program was dropped: built again, still right
    torch.testing.assert_close(c(x), _rowwise_a(x), rtol=1e-4, atol=1e-4)
    assert len(sub.programs) == backend.PROGRAMS_KEPT
    assert list(sub.programs)[-1] == next(k for k in sub.programs if k[0][0] == tuple(shapes[0]))


def test_programs_holding_replaced_temporaries_are_dropped(monkeypatch):
    """Growing shapes (a chat's longer prompts) make larger shared temporaries each time:
    the older programs that still hold replaced ones are dropped, least recently used
    first, until those are no larger than the newest program's; a dropped shape is built
    again and still right."""
    from dynamo_vulkan.runtime import program
    # shared temporaries of their own: earlier tests' larger ones would otherwise already
    # fit these shapes (test_greedy's did), and none would be replaced
    monkeypatch.setattr(program.Scratch, "_slots", {})
    shapes = [(n, 257) for n in (40, 90, 130, 190, 260, 600)]
    c, sub = _programs(_rowwise_a, *shapes)
    progs = list(sub.programs.values())
    newest = progs[-1]
    replaced = {id(s): s.words for p in progs[:-1] for s in p.superseded_scratch()}
    assert sum(replaced.values()) <= newest.scratch_words()
    assert len(progs) < len(shapes)        # the 600-row program's temporaries replaced others
    assert next(iter(sub.programs))[0][0] != shapes[0]    # the oldest went first
    for s in (shapes[0], shapes[-1], shapes[1]):
        x = torch.randn(s)
        torch.testing.assert_close(c(x), _rowwise_a(x), rtol=1e-4, atol=1e-4)


def test_barriers_between_writers_of_one_buffer():
    """A write to a buffer written since the last barrier waits for it, unless the
    earlier writer is one the dispatch is disjoint from (a split weight's chunks writing
    their own columns); a reader of the buffer waits for both."""
    from dynamo_vulkan.runtime.plan import barriers

    def d(bindings, writes, disjoint=()):
        return Dispatch("k", "s", bindings, writes, [], (1, 1, 1), disjoint=list(disjoint))

    assert barriers([d([0, 1], [0]), d([0, 1], [0], [(0, 0)]), d([0, 2], [0], [(0, 0), (0, 1)]),
                     d([2, 0], [0])]) == [False, False, False, True]
    assert barriers([d([0, 1], [0]), d([0, 1], [0])]) == [False, True]
    assert barriers([d([0, 1], [0]), d([0, 3], [1], [(0, 0)]), d([0, 1], [0], [(0, 0)])]) == \
        [False, False, True]            # the third writes what the second reads
    assert barriers([d([0, 1], [0]), d([0, 2], [0], [(0, 0)]), d([4, 0], [0])]) == [False, False, True]


def _layered_plan() -> Plan:
    """Three products, each reading the copy of its weight (P: param -> temp) and the
    previous product's output through a kernel of its own (N), as a prompt's GGUF linears
    on the tensor cores do: P1 M1 N2 P2 M2 N3 P3 M3, copies equal in size."""
    bufs = [Buffer(8, "param"), Buffer(8, "param"), Buffer(8, "param"), Buffer(4, "input"),
            Buffer(4, "output")] + [Buffer(8, "temp") for _ in range(3)] + \
        [Buffer(4, "temp") for _ in range(4)]
    w, x, out, c, h = (0, 1, 2), 3, 4, (5, 6, 7), (8, 9, 10, 11)   # h: y1 h2 y2 h3

    def d(name, bindings, writes=(0,)):
        return Dispatch(name, "s", list(bindings), list(writes), [], (1, 1, 1))
    return Plan(buffers=bufs, dispatches=[
        d("P1", [c[0], w[0]]), d("M1", [h[0], x, c[0]]), d("N2", [h[1], h[0]]),
        d("P2", [c[1], w[1]]), d("M2", [h[2], h[1], c[1]]), d("N3", [h[3], h[2]]),
        d("P3", [c[2], w[2]]), d("M3", [out, h[3], c[2]])])


def _levels(plan: Plan) -> list[list[str]]:
    from dynamo_vulkan.runtime.plan import barriers
    levels = []
    for d, wait in zip(plan.dispatches, barriers(plan.dispatches)):
        if wait or not levels:
            levels.append([])
        levels[-1].append(d.name)
    return levels


def test_weight_copies_run_beside_the_previous_product(monkeypatch, share_levels):
    """schedule.move_copies_ahead: each weight's copy after the first goes into the level
    of the product that read the copy before it, and keeps a buffer of its own there
    (without its earlier start the copies, live apart in dispatch order, would share one
    buffer and the level would split on it); copies under AHEAD_MIN_BYTES stay put."""
    from dynamo_vulkan.lowering import schedule
    from dynamo_vulkan.lowering.schedule import move_copies_ahead
    monkeypatch.setattr(schedule, "AHEAD_MIN_BYTES", 4 * 8 + 1)      # the copies hold 8 words
    plan = _layered_plan()
    assert move_copies_ahead(plan, {0, 3, 6}) == {}
    assert [d.name for d in plan.dispatches] == [d.name for d in _layered_plan().dispatches]
    monkeypatch.setattr(schedule, "AHEAD_MIN_BYTES", 4 * 8)
    plan = _layered_plan()
    assert _levels(plan) == [["P1"], ["M1"], ["N2", "P2"], ["M2"], ["N3", "P3"], ["M3"]]
    live_from = move_copies_ahead(plan, {0, 3, 6})
    assert [d.name for d in plan.dispatches] == ["P1", "M1", "P2", "N2", "M2", "P3", "N3", "M3"]
    assert live_from == {6: 1, 7: 4}
    assign_buffers(plan, live_from)
    assert _levels(plan) == [["P1"], ["M1", "P2"], ["N2"], ["M2", "P3"], ["N3"], ["M3"]]
    at = {d.name: d for d in plan.dispatches}
    assert len({at["P1"].bindings[0], at["P2"].bindings[0], at["P3"].bindings[0]}) >= 2
    assert at["P2"].bindings[0] not in at["M1"].bindings
    assert at["P3"].bindings[0] not in at["M2"].bindings

    plan = _layered_plan()                 # dispatch order alone: the level splits
    move_copies_ahead(plan, {0, 3, 6})
    assign_buffers(plan)
    assert ["M1", "P2"] not in _levels(plan)


def test_only_copies_of_unwritten_weights_move(monkeypatch):
    """A dispatch that reads a buffer some dispatch writes, or orders itself by
    Dispatch.disjoint, stays where it is; other dispatches' disjoint indices follow the
    new order."""
    from dynamo_vulkan.lowering import schedule
    from dynamo_vulkan.lowering.schedule import move_copies_ahead
    monkeypatch.setattr(schedule, "AHEAD_MIN_BYTES", 0)
    plan = _layered_plan()
    plan.dispatches.append(Dispatch("U", "s", [1], [0], [], (1, 1, 1)))    # writes W2
    assert move_copies_ahead(plan, {0, 3, 6}) == {7: 4}
    assert [d.name for d in plan.dispatches][:5] == ["P1", "M1", "N2", "P2", "M2"]
    plan = _layered_plan()
    plan.dispatches[3].disjoint = [(6, 0)]
    plan.dispatches[7].disjoint = [(11, 5)]                  # M3 beside N3's writes
    move_copies_ahead(plan, {0, 3, 6})
    assert [d.name for d in plan.dispatches] == ["P1", "M1", "N2", "P2", "M2", "P3", "N3", "M3"]
    assert plan.dispatches[7].disjoint == [(11, 6)]


def test_mask_ranges_move_to_where_the_mask_is_ready():
    """schedule.hoist_early: a mask_ranges dispatch emitted right before the attention that
    first reads it (after the scatters beside that attention) moves to the end of the
    level after the mask's writer, so the attention waits for nothing but its own inputs;
    one whose input is written in the level before it, or that writes a buffer bound
    earlier, stays; other dispatches' disjoint indices follow the new order."""
    from dynamo_vulkan.lowering.schedule import hoist_early
    bufs = [Buffer(4, "input"), Buffer(4, "temp"), Buffer(4, "temp"), Buffer(4, "temp"),
            Buffer(4, "temp"), Buffer(8, "temp"), Buffer(4, "output")]
    pos, mask, q, x, ranges, cache, out = range(7)

    def d(name, bindings, writes=(0,), disjoint=()):
        return Dispatch(name, "s", list(bindings), list(writes), [], (1, 1, 1), disjoint=list(disjoint))

    def plan_of(*ds):
        return Plan(buffers=list(bufs), dispatches=list(ds))

    # the mask from the position, q from x by two products, then the step's scatter, the
    # mask's ranges and the attention (disjoint from the scatter's cache row)
    plan = plan_of(d("mask", [mask, pos]), d("x", [x, pos]), d("q", [q, x]),
                   d("scatter", [cache, q]), d("mask_ranges", [ranges, mask]),
                   d("attention", [out, q, cache, mask, ranges], disjoint=[(cache, 3)]))
    assert _levels(plan) == [["mask", "x"], ["q"], ["scatter", "mask_ranges"], ["attention"]]
    moved = hoist_early(plan)
    assert [x.name for x in plan.dispatches] == ["mask", "x", "q", "mask_ranges", "scatter", "attention"]
    assert moved == {0: 0, 1: 1, 2: 2, 3: 4, 4: 3, 5: 5}
    assert _levels(plan) == [["mask", "x"], ["q", "mask_ranges"], ["scatter", "attention"]]
    assert plan.dispatches[5].disjoint == [(cache, 4)]

    # the mask written in the level just before: nowhere earlier to go
    plan = plan_of(d("x", [x, pos]), d("mask", [mask, x]), d("mask_ranges", [ranges, mask]),
                   d("attention", [out, q, mask, ranges]))
    assert hoist_early(plan) == {}
    # its output bound by an earlier dispatch: not moved
    plan = plan_of(d("mask", [mask, pos]), d("x", [x, pos]), d("q", [q, x]), d("r0", [ranges, x]),
                   d("mask_ranges", [ranges, mask]), d("attention", [out, q, mask, ranges]))
    assert hoist_early(plan) == {}
