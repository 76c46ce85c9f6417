"""Elementwise fusion (lowering/fusion.py): chains run as one kernel and still
match eager across kinds, broadcasting and scalars."""
import pytest
import torch
import torch.nn.functional as F

from vk import check, noncontig


def _kernels(plans, family="elementwise"):
    return [d for p in plans for d in p.dispatches if d.name.startswith(family)]


def test_rmsnorm_tail_is_one_kernel(plans):
    x, w = torch.randn(5, 33), torch.randn(33)
    check(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w, x, w)
    # the mean computes pow as it loads x (reduce.py X_LAZY), then the fused tail
    assert len(_kernels(plans)) == 1
    assert [d.note for d in _kernels(plans, "reduce")] == ["mean elementwise (5, 33) dims=[1]"]


def test_swiglu_is_one_kernel(plans):
    g, u = torch.randn(4, 7), torch.randn(4, 7)
    check(lambda g, u: F.silu(g) * u + 1.0, g, u)
    assert len(_kernels(plans)) == 1


def test_broadcast_inside_a_chain(plans):
    a, b, c = torch.randn(3, 1), torch.randn(1, 4), noncontig(torch.randn(2, 3, 4))
    check(lambda a, b, c: torch.exp(a - 1.0) * b + c.abs(), a, b, c)
    assert len(_kernels(plans)) == 1


def test_kinds_change_along_a_chain():
    x = torch.randn(6, 5)
    i = torch.randint(-4, 5, (6, 5), dtype=torch.int32)
    check(lambda x, i: torch.where((x > 0.2) & (i != 0), x * 2.0, (i * 3).float() - 1.0), x, i)
    check(lambda x: ((x * 10.0).to(torch.int32) % 3 == 1).float() + 0.5, x)


def test_intermediate_with_two_users_and_a_constant_fill():
    x = torch.randn(8)
    e = torch.exp
    check(lambda x: (lambda y: (y + 1.0, y * 2.0))(e(x)), x)      # exp has two users
    check(lambda x: torch.where(x > 0, torch.full_like(x, float("-inf")), x), x)


def test_a_shape_reader_does_not_keep_a_value_apart(plans):
    """full_like(d, w) reads d's shape only (torch's lerp decomposes its weight so): d,
    whose values one consumer reads, folds into it; one kernel for the lerp, of a
    difference too, as eager's."""
    a, b = torch.randn(6, 5), torch.randn(6, 5)
    check(lambda a, b: (lambda d: a + torch.full_like(d, 0.1) * d)(b - a), a, b)
    check(lambda a, b: torch.lerp(a, b, 0.1), a, b)
    assert len(_kernels(plans)) == 2, [d.note for d in _kernels(plans)]


def _check_mutation(fn, *args):
    """fn mutates its arguments: eager and Vulkan, each on its own copies, end equal."""
    from vk import compiled
    eager, ours = [a.clone() for a in args], [a.clone() for a in args]
    if any(not a.is_contiguous() for a in args):
        eager, ours = [noncontig(a) for a in eager], [noncontig(a) for a in ours]
    expected = fn(*eager)
    got = compiled(fn)(*ours)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(ours, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_input_update_computed_in_its_own_buffer(plans, layout):
    """An in-place update of an input (copy_ of an expression back into it) is one
    kernel that writes the input's buffer, not a temporary and a copy."""
    p, g = torch.randn(6, 8), torch.randn(6, 8)
    if layout == "strided":
        p = noncontig(p)

    def step(p, g):
        p.mul_(0.9).add_(g, alpha=0.1)
    _check_mutation(step, p, g)
    assert len(_kernels(plans)) == 1


def test_updated_moment_read_by_the_parameter_update(plans):
    """An optimizer's moment: copied back into its input and read by the parameter's
    update, which computes it again (one kernel with both outputs: copy_groups.py). The
    parameter is the graph's first input (Dynamo orders inputs by first use), as in a
    torch.optim step, so its copy-back comes first and writes none of the moment's
    inputs before the moment's kernel; in the other order the parameter's update is
    computed apart, then both copied by one kernel (two in all), still exact."""
    p, m, g = torch.randn(5, 7), torch.randn(5, 7), torch.randn(5, 7)

    def step(p, m, g):
        p.add_(m.lerp_(g, 0.1) * -0.5)
    _check_mutation(step, p, m, g)
    assert [len(d.writes) for d in _kernels(plans)] == [2]

    def moment_first(p, m, g):
        m.lerp_(g, 0.1)
        p.sub_(m * 0.5)
    plans.clear()
    _check_mutation(moment_first, p, m, g)
    assert [len(d.writes) for d in _kernels(plans)] == [1, 2]


@pytest.mark.parametrize("case", ["broadcast-row", "transposed", "swap", "size1"])
def test_input_update_that_reads_its_input_elsewhere(case):
    """Updates whose expression reads the input at other elements, or reads an input that
    another update writes first, stay equal to eager (computed apart, then copied)."""
    if case == "broadcast-row":
        fn, args = (lambda p, q: p.copy_(p[:1] * 2.0 + q)), (torch.randn(5, 4), torch.randn(5, 4))
    elif case == "transposed":
        fn, args = (lambda p: p.copy_(p.t() + 1.0)), (torch.randn(5, 5),)
    elif case == "size1":
        fn, args = (lambda p, q: p.mul_(q).add_(1.0)), (torch.randn(1, 1), torch.randn(1, 1))
    else:
        def fn(a, b):
            na, nb = b * 2.0, a + 1.0
            a.copy_(na)
            b.copy_(nb)
        args = (torch.randn(3, 4), torch.randn(3, 4))
    _check_mutation(fn, *args)


def test_counter_copied_back_before_its_readers():
    """A graph whose copy_ of a counter (a step count) comes before the nodes that read
    the new count, as some torch versions order an optimizer step: the readers must see
    the count once incremented, not the copy-back's result incremented again."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dynamo_vulkan import backend

    def f(step, p):
        new = step + 1.0
        torch.ops.aten.copy_.default(step, new)
        torch.ops.aten.copy_.default(p, p * new + 1.0)
    args = (torch.full((4,), 3.0), torch.randn(4))
    gm = make_fx(f)(*[a.clone() for a in args])
    eager, ours = [a.clone() for a in args], [a.clone() for a in args]
    gm(*eager)
    backend.compile_graph(gm, [a.clone() for a in args])(list(ours))     # boxed: a list
    for a, b in zip(ours, eager):
        torch.testing.assert_close(a, b)


def test_clone_before_a_batched_product_is_a_view(plans):
    """AOT's matmul of 4-d operands clones an expanded, transposed operand to contiguous
    and views it 3-d for bmm: where that view exists on the transposed temporary itself
    the product reads it strided, no copy kernel, as of a graph input that no node writes;
    a view that needs the copy (the heads permuted out of the batch dims) keeps it.
    Results as eager's."""
    def copies():
        return [d.note for d in _kernels(plans) if d.note.endswith("<- float($0)")]
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)
    check(lambda q, k: torch.matmul(q * 2, (k + 1).transpose(-1, -2)), q, k)
    assert not copies(), [d.note for d in _kernels(plans)]
    check(lambda q, k: torch.matmul(q * 2, (k + 1).permute(1, 0, 2, 3)), q, torch.randn(3, 2, 8, 6))
    assert copies()
    plans.clear()         # inputs no node writes: read in place too
    check(lambda q, k: torch.matmul(q, k.transpose(-1, -2)), q, k)
    assert not copies(), [d.note for d in _kernels(plans)]
