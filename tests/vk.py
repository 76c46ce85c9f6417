"""Shared by the kernel tests: compile with backend="vulkan", compare with eager."""
from __future__ import annotations

import pytest
import torch

import dynamo_vulkan


class LinearPlus(torch.nn.Module):
    """lin(x) + r: a residual of the product's shape, or a bias row (Qwen2's q, k, v)."""

    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, x, r):
        return self.lin(x) + r


def compiled(fn):
    return torch.compile(fn, backend="vulkan", dynamic=False, fullgraph=False)


def check(fn, *args, rtol=1e-4, atol=1e-4, all_vulkan=True, **kwargs):
    """Run fn eagerly and through Vulkan on the same inputs; assert they match
    and, with all_vulkan, that no node of the newest graph ran on the CPU."""
    n_reports = len(dynamo_vulkan.reports())
    expected = fn(*args, **kwargs)
    got = compiled(fn)(*args, **kwargs)
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
    reports = dynamo_vulkan.reports()[n_reports:]
    assert reports, "nothing was compiled"
    if all_vulkan:
        cpu = [n for r in reports for n in r.cpu_nodes]
        assert not cpu, f"nodes fell back to the CPU: {cpu}"
        assert sum(len(r.vulkan_nodes) for r in reports) > 0
    return got


def noncontig(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout (every other element of a wider tensor)."""
    wide = torch.empty(t.shape[:-1] + (t.shape[-1] * 2,), dtype=t.dtype) if t.dim() else t.clone()
    if t.dim() == 0:
        return wide
    view = wide[..., ::2]
    view.copy_(t)
    return view


def lowered_plan(fn, args, resident):
    """The plan the planner lowers for fn(*args) (resident: which args stay on the GPU)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dynamo_vulkan import device
    from dynamo_vulkan.lowering import planner

    gm = make_fx(fn)(*args)
    planner.specialise(gm, args)
    return planner.lower(gm, args, resident, device.device_info())


def require_int_dot() -> None:
    """Fail where kp lacks patch 7 (a setup fault: run scripts/setup.sh); skip on a device
    that has no integer dot products at all (lavapipe and the H100 have them)."""
    import kp
    if not hasattr(kp, "integer_dot_product"):
        pytest.fail("kp was built without kp patch 07-integer-dot-product: run scripts/setup.sh")
    from dynamo_vulkan import device
    if not device.device_info().get("integer_dot_product"):
        pytest.skip("the Vulkan device has no VK_KHR_shader_integer_dot_product")


def levels(plan) -> list[list]:
    """The plan's dispatches grouped by barrier level (the kernels that run concurrently)."""
    from dynamo_vulkan.runtime.plan import barriers
    out = []
    for d, wait in zip(plan.dispatches, barriers(plan.dispatches)):
        if wait or not out:
            out.append([])
        out[-1].append(d)
    return out


def assert_copies_beside_products(plans, copy: str, product: str) -> int:
    """Every weight copy (dispatch names starting with `copy`) but each plan's first shares
    its barrier level with a product (`product`), and binds no buffer that another
    dispatch of that level binds. Returns how many did."""
    beside = 0
    for p in plans:
        seen = 0
        for level in levels(p):
            for d in level:
                if not d.name.startswith(copy):
                    continue
                seen += 1
                others = {b for e in level if e is not d for b in e.bindings}
                assert not set(d.bindings[w] for w in d.writes) & others, [e.name for e in level]
                if seen > 1:
                    assert any(e.name.startswith(product) for e in level), [e.name for e in level]
                    beside += 1
    return beside


def optimizer(name: str, params, foreach: bool = True):
    """SGD (momentum), Adam or AdamW as the optimizer tests run them."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01, foreach=foreach)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=foreach)


def step_twins(model, name: str, foreach: bool, steps: int):
    """model and a copy trained side by side for `steps` steps of optimizer `name`, eager's
    step against ours compiled: (eager's optimizer, ours, our copy of the model)."""
    import copy
    ours = copy.deepcopy(model)
    eager_opt, our_opt = optimizer(name, model.parameters(), foreach), optimizer(name, ours.parameters(), foreach)
    step = compiled(our_opt.step)
    for _ in range(steps):
        x = torch.randn(4, model[0].in_features)
        for m in (model, ours):
            m.zero_grad()
            m(x).square().mean().backward()
        eager_opt.step()
        step()
    return eager_opt, our_opt, ours
