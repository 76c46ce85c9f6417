"""The host side of a compiled training step: what each step costs the host in submits,
copies and fresh tensors must not grow back (issue 29: the host time of a GPT step).

The pending gradients' NaN placeholders (runtime/placeholder.py) are reused from step to step
while nothing else holds or wrote them; a step of dynamo_vulkan.training's GPT submits three
programs (forward, backward, optimizer step) and copies only the batch in and the loss out.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

import dynamo_vulkan
from dynamo_vulkan.runtime import placeholder
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
