"""Copies into graph inputs that share kernels (lowering/copy_groups.py): an optimizer
step's updates as a few multi-output kernels, and every copy still reading the values
graph order gives it."""
from __future__ import annotations


import pytest
import torch
import torch.nn as nn

from vk import compiled, step_twins


def _elementwise(plans):
    return [d for p in plans for d in p.dispatches if d.name.startswith("elementwise")]


def _run(fn, *args):
    """fn on copies of args, eager and compiled: (eager's args after, ours after)."""
    ref = [a.clone() for a in args]
    fn(*ref)
    ours = [a.clone() for a in args]
    torch._dynamo.reset()
    compiled(fn)(*ours)
    return ref, ours


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_optimizer_step_writes_its_state_in_one_kernel_a_shape(plans, name):
    """Every parameter's new value and moments come from one kernel per parameter shape
    (two parameters of a shape share it), the step counts from one more: the updates equal
    eager's, state included."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 3))
    eager_opt, our_opt, ours = step_twins(model, name, True, steps=3)
    for p, q in zip(model.parameters(), ours.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
        for key, value in eager_opt.state[p].items():
            torch.testing.assert_close(our_opt.state[q][key], value, rtol=1e-5, atol=1e-6, msg=key)
    last = plans[-1]
    kernels = _elementwise([last])
    shapes = {tuple(p.shape) for p in model.parameters()}        # (6, 6), (6,), (3, 6), (3,)
    counted = 1 if name != "sgd" else 0                          # the step counts' kernel
    assert len(kernels) == len(shapes) + counted, [d.name for d in kernels]
    written = [d.bindings[w] for d in last.dispatches for w in d.writes]
    assert len(written) == len(set(written))                     # each state once


def test_a_copy_that_reads_an_input_a_later_copy_writes_gets_its_old_values(plans):
    """a's copy reads b, which b's copy writes after it: one kernel writes both inputs,
    loading b's element before it stores it."""
    def f(a, b):
        a.copy_(a * 2 + b)
        b.copy_(b - 1)

    ref, ours = _run(f, torch.randn(7, 5), torch.randn(7, 5))
    for r, o in zip(ref, ours):
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    (plan,) = plans
    inputs = {i.buffer for i in plan.inputs}
    writers = [d for d in plan.dispatches if inputs & {d.bindings[w] for w in d.writes}]
    assert len(writers) == 1 and {writers[0].bindings[w] for w in writers[0].writes} == inputs


def _ref(buf, shape=(4,), strides=(1,)):
    from dynamo_vulkan.lowering.core import TRef
    return TRef(buf, shape, strides, 0, "f32")


def test_a_copy_joins_a_kernel_only_where_it_reads_what_was_there_before():
    """_Group.takes: copy 1 (b <- b + 1) joins copy 0 (a <- f(b)) where 0 reads b's own
    elements; not where 0 reads b broadcast (another invocation would read an element 1
    already wrote), nor where 1 reads a (it wants 0's new values), nor at another shape,
    nor past the group's binding limit."""
    from dynamo_vulkan.lowering.copy_groups import _Group
    a, b = _ref(0), _ref(1)

    def group(first_reads, limit=12):
        g = _Group((4,), limit)
        g.add(0, first_reads, a)
        return g

    assert group([b]).takes([b], b)
    assert not group([_ref(1, (4,), (0,))]).takes([b], b)
    assert not group([b]).takes([a, b], b)
    assert not group([b]).takes([_ref(1, (2,))], _ref(1, (2,)))
    assert group([b], limit=3).takes([_ref(2)], b)
    assert not group([b], limit=2).takes([_ref(2)], b)


def test_a_swap_through_the_inputs(plans):
    """a <- b and b <- a: each reads the other's old values."""
    def f(a, b):
        t = a.clone()
        a.copy_(b)
        b.copy_(t)

    ref, ours = _run(f, torch.randn(9), torch.randn(9))
    for r, o in zip(ref, ours):
        torch.testing.assert_close(o, r, rtol=0, atol=0)


def test_the_group_order_follows_what_each_copy_reads():
    """copy_groups._ordered: a copy that reads a buffer an earlier copy writes runs after
    it, one that reads a buffer a later copy writes runs before it; groups that would need
    both orders at once have none (emit_copies then runs every copy alone)."""
    from dynamo_vulkan.lowering import copy_groups
    ref = _ref
    a, b, c = ref(0), ref(1), ref(2, (2,))
    # 0: a <- b (b as it was), 1: c <- a[0] broadcast (a as 0 wrote it), 2: b <- c (c as 1
    # wrote it)
    reads, dsts = [[b], [ref(0, (2,), (0,))], [ref(2, (4,), (0,))]], [a, c, b]
    order = copy_groups._ordered([[0], [1], [2]], reads, dsts)
    assert order == [[0], [1], [2]]
    assert copy_groups._ordered([[2], [1], [0]], reads, dsts) == [[0], [1], [2]]
    # 0 and 2 in one kernel: 1 must follow it (a) and precede it (c)
    assert copy_groups._ordered([[0, 2], [1]], reads, dsts) is None


def test_copies_beyond_the_binding_limit_split(plans, monkeypatch):
    """Five same-shaped copies, each binding two buffers (its input and the value that
    functionalization computed for it), under a limit of four buffers a kernel: three
    kernels of two, two and one copies, results unchanged."""
    from dynamo_vulkan.lowering import elementwise
    monkeypatch.setattr(elementwise, "MAX_BUFFERS", 4)

    def f(*xs):
        for x in xs:
            x.copy_(x * 3 - 1)

    ref, ours = _run(f, *[torch.randn(6) for _ in range(5)])
    for r, o in zip(ref, ours):
        torch.testing.assert_close(o, r, rtol=0, atol=0)
    (plan,) = plans
    inputs = {i.buffer for i in plan.inputs}
    writers = [d for d in plan.dispatches if inputs & {d.bindings[w] for w in d.writes}]
    assert all(len(set(d.bindings)) <= 4 for d in writers)
    assert sorted(len(d.writes) for d in writers) == [1, 2, 2]


def test_an_input_copied_from_another_view_of_itself():
    """copy_(a, a.T) (which eager refuses, and a graph could still hold) reads elements
    that other invocations write: the view is copied out first, then into a."""
    import torch.fx as fx

    from dynamo_vulkan import device
    from dynamo_vulkan.lowering import planner

    g = fx.Graph()
    a = g.placeholder("a")
    g.call_function(torch.ops.aten.copy_.default, (a, g.call_function(torch.ops.aten.t.default, (a,))))
    g.output(())
    x = torch.randn(5, 5)
    gm = fx.GraphModule(torch.nn.Module(), g)
    planner.specialise(gm, [x])
    plan = planner.lower(gm, [x], [False], device.device_info())
    (buf,) = [i.buffer for i in plan.inputs]
    first, second = plan.dispatches
    assert first.bindings[1] == buf and first.bindings[0] != buf
    assert second.bindings[second.writes[0]] == buf and second.bindings[1] == first.bindings[0]


def test_a_run_of_copies_goes_on_past_nodes_without_kernels(plans):
    """copy_, a view (no kernel), copy_: one run, one kernel for both inputs; the view's
    reader after the run sees the new values."""
    import torch.fx as fx

    from dynamo_vulkan import device
    from dynamo_vulkan.lowering import planner

    aten = torch.ops.aten
    g = fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    g.call_function(aten.copy_.default, (a, g.call_function(aten.add.Tensor, (a, 1.0))))
    flat = g.call_function(aten.view.default, (a, [12]))
    g.call_function(aten.copy_.default, (b, g.call_function(aten.mul.Tensor, (b, 2.0))))
    g.output((g.call_function(aten.mul.Tensor, (flat, 3.0)),))
    xs = [torch.randn(3, 4), torch.randn(3, 4)]
    gm = fx.GraphModule(torch.nn.Module(), g)
    planner.specialise(gm, xs)
    plan = planner.lower(gm, xs, [False, False], device.device_info())
    inputs = [i.buffer for i in plan.inputs]
    copies, reader = plan.dispatches
    assert sorted(copies.bindings[w] for w in copies.writes) == sorted(inputs)
    assert inputs[0] in reader.bindings
