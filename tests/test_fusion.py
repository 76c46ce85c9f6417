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
    assert len(_kernels(plans)) == 2       # pow (before the mean), then the fused tail


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
