"""The host side of a compiled training step: what each step costs the host in submits,
copies and fresh tensors must not grow back (issue 29: the host time of a GPT step).

The pending gradients' NaN placeholders (runtime/placeholder.py) are reused from step to step
while nothing else holds or wrote them; a step of dynamo_vulkan.training's GPT submits three
programs (forward, backward, optimizer step) and copies only the batch in and the loss out.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import dynamo_vulkan
from dynamo_vulkan.runtime import placeholder, program
from dynamo_vulkan.training import gpt_workload, train
from vk import compiled


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_placeholder_is_reused_only_while_no_one_holds_or_wrote_it():
    slots = placeholder.Placeholders()
    first = slots.get(0, (3, 5), torch.float32)
    assert first.isnan().all() and first.shape == (3, 5)
    second = slots.get(0, (3, 5), torch.float32)      # the first is alive: a new storage
    assert _storage(second) != _storage(first) and second.isnan().all()
    address = _storage(second)
    assert not placeholder.only_ours(address)
    del first, second
    assert placeholder.only_ours(address)
    filled = placeholder.fills()
    third = slots.get(0, (3, 5), torch.float32)        # nothing holds it: the same storage
    assert placeholder.fills() == filled
    assert _storage(third) == address and third.isnan().all() and third._version == 1
    third.view(-1)[4] = 1.0                            # written in place (through a view)
    del third
    fourth = slots.get(0, (3, 5), torch.float32)
    assert _storage(fourth) != address and fourth.isnan().all()
    address = _storage(fourth)
    placeholder.written(address)                       # read back into (no version moves)
    del fourth
    fifth = slots.get(0, (3, 5), torch.float32)
    assert _storage(fifth) != address and fifth.isnan().all()
    address = _storage(fifth)
    del fifth
    other_shape = slots.get(0, (5, 3), torch.float32)
    assert _storage(other_shape) != address and other_shape.shape == (5, 3)
    assert slots.get(1, (0, 4), torch.float32).shape == (0, 4)     # empty: nothing to keep


def _kept_mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9, foreach=True)
    dynamo_vulkan.keep_on_device(model)
    dynamo_vulkan.keep_on_device(opt)
    x = torch.randn(4, 6)
    return model, twin, opt, twin_opt, compiled(lambda: model(x).square().mean()), \
        compiled(opt.step), lambda: twin(x).square().mean()


def test_pending_gradients_reuse_their_placeholders_and_still_read_nan():
    """Step after step the .grad tensors a backward leaves pending sit on the same host
    storage (no new NaN fill) and read as NaN; one read back, written in place or still held
    gets a new placeholder; the training equals eager's throughout."""
    model, twin, opt, twin_opt, loss_of, step, twin_loss = _kept_mlp()
    params = list(model.parameters())
    seen, fills = [], []
    for i in range(6):
        fills.append(placeholder.fills())
        opt.zero_grad()
        twin_opt.zero_grad()
        loss_of().backward()
        twin_loss().backward()
        grads = [p.grad for p in params]
        assert all(g.isnan().all() for g in grads), i
        seen.append([_storage(g) for g in grads])
        if i == 3:
            dynamo_vulkan.read_back(model)      # the gradients' values into the placeholders
            for (name, p), g in zip(twin.named_parameters(), grads):
                torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4, msg=name)
        del grads
        step()
        twin_opt.step()
    fills.append(placeholder.fills())
    steps = [b - a for a, b in zip(fills, fills[1:])]
    assert steps[1:4] == [0, 0, 0] and steps[5] == 0, steps        # no NaN filled anew
    assert steps[4] == len(params), steps      # read back into: not NaN any more, not reused
    assert seen[1] == seen[2] == seen[3] and seen[4] == seen[5], seen
    held = params[0].grad                      # still held by the user across the next step
    opt.zero_grad()
    loss_of().backward()
    assert _storage(params[0].grad) != _storage(held) and params[0].grad.isnan().all()
    assert held.isnan().all()
    dynamo_vulkan.read_back(model)
    dynamo_vulkan.read_back(opt)
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-4, msg=name)


def test_a_gradient_written_in_place_gets_a_new_placeholder():
    model, _, opt, _, loss_of, step, _ = _kept_mlp()
    p = next(model.parameters())
    for _ in range(2):
        opt.zero_grad()
        loss_of().backward()
    address = _storage(p.grad)
    p.grad.zero_()                   # the user writes the pending .grad on the host
    opt.zero_grad()
    loss_of().backward()
    assert _storage(p.grad) != address and p.grad.isnan().all()


def test_a_gpt_step_submits_three_programs_and_copies_only_the_batch_and_the_loss():
    """Per step after the first two (compiles; the optimizer's state made, then read): three
    submits (forward, backward, optimizer step), the same bytes in every step (the batch, to
    the forward and again to the backward, and the loss's gradient), the loss out."""
    w = gpt_workload(layers=2, dim=32, heads=4, seq=16, batch=2, vocab=37, steps=5)
    ours = train(w, "vulkan")
    batch = sum(t.nbytes for t in w.batches[0])
    assert ours.extra["submits"][2:] == [3] * 3, ours.extra
    assert ours.extra["gpu_to_host_bytes"][2:] == [4] * 3, ours.extra
    sent = ours.extra["host_to_gpu_bytes"][2:]
    assert len(set(sent)) == 1 and sent[0] <= 2 * batch + 4, ours.extra


def _kept_linear():
    """A Linear whose SGD optimizer is keep_on_device, its loss and step compiled, beside an
    eager twin: (model, twin, our optimizer, twin's optimizer, step)."""
    torch.manual_seed(0)
    model = nn.Linear(5, 4)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    dynamo_vulkan.keep_on_device(model)
    dynamo_vulkan.keep_on_device(opt)
    return model, twin, opt, twin_opt, compiled(opt.step)


def test_the_backward_and_the_optimizer_step_return_at_their_submit():
    """A backward whose gradients all stay on the GPU, and the optimizer step after it,
    return while the GPU runs them (the host prepares the next program meanwhile); the
    forward, whose loss the host reads, waits. The results are the waiting runtime's, to
    the bit, and equal eager's."""
    model, twin, opt, twin_opt, step = _kept_linear()
    x = torch.randn(6, 5)
    loss_fn = compiled(lambda: model(x).square().mean())
    for n in range(4):
        opt.zero_grad()
        loss = loss_fn()
        assert not program._IN_FLIGHT           # the loss was copied out: the forward waited
        loss.backward()
        backward = len(program._IN_FLIGHT)
        step()
        if n >= 2:          # the first steps make the optimizer's state (outputs to the host)
            assert backward == 1 and len(program._IN_FLIGHT) == 2, (n, backward, program._IN_FLIGHT)
        twin_opt.zero_grad()
        twin(x).square().mean().backward()
        twin_opt.step()
    dynamo_vulkan.read_back(model)
    assert not program._IN_FLIGHT               # reading the GPU's memory waits first
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_submits_without_a_wait_give_the_waiting_runtimes_bits(monkeypatch):
    """A GPT's training steps with every eligible submit returning at once, and with every
    submit waited for: the same losses and parameters, bit for bit (no embedding, whose
    gradient adds with atomics in any order: a CNN)."""
    from dynamo_vulkan.training import cnn_workload
    w = cnn_workload(channels=(3, 4, 8), size=12, batch=4, steps=4)
    runs = []
    for wait in (False, True):
        monkeypatch.setattr(program, "SUBMIT_WITHOUT_WAIT", not wait)
        deferred = []
        monkeypatch.setattr(program.Program, "_defers", lambda self, seq, f=program.Program._defers:
                            deferred.append(f(self, seq)) or deferred[-1])
        runs.append((train(w, "vulkan"), sum(deferred)))
    (run, n), (waited, none) = runs
    assert n >= 2 * len(w.batches) - 2 and none == 0, (n, none)
    assert run.losses == waited.losses
    for p, q in zip(run.model.parameters(), waited.model.parameters()):
        assert torch.equal(p, q)


class _PickRows(torch.autograd.Function):
    """y itself forward; its gradient's rows picked by `rows` backward: an index that only
    the backward reads."""

    @staticmethod
    def forward(ctx, y, rows):
        ctx.save_for_backward(rows)
        return y.clone()

    @staticmethod
    def backward(ctx, g):
        rows, = ctx.saved_tensors
        return g.index_select(0, rows), None


def test_a_failed_check_of_a_backward_that_did_not_wait_raises_before_anything_runs_after_it():
    """A backward whose index is out of range returns at its submit; the optimizer step after
    it raises the backward's IndexError before it submits, so no parameter takes the wrong
    gradient, and training goes on with eager's results."""
    model, twin, opt, twin_opt, step = _kept_linear()
    x = torch.randn(4, 5)
    loss_fn = compiled(lambda x, rows: _PickRows.apply(model(x), rows).square().sum())
    good, bad = torch.tensor([3, 1, 2, 0]), torch.tensor([3, 1, 7, 0])
    for rows in (good, good, bad, good):
        opt.zero_grad()
        loss_fn(x, rows).backward()
        if rows is bad:
            submits = dynamo_vulkan.runtime_stats()["submits"]
            with pytest.raises(IndexError, match="index_select.*without a wait"):
                step()
            assert dynamo_vulkan.runtime_stats()["submits"] == submits
            continue
        step()
        twin_opt.zero_grad()
        _PickRows.apply(twin(x), rows).square().sum().backward()
        twin_opt.step()
    dynamo_vulkan.read_back(model)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
