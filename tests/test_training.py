"""Training through the backend: the forward, the backward graph and a compiled
optimizer step run on Vulkan and give eager's gradients, parameters and losses.

The models are small (a few ms a step on lavapipe); the backend's matmul kernels run
(DYNAMO_VULKAN_CPU_MATMUL=vulkan, conftest.py).
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo_vulkan
from dynamo_vulkan.examples import SmallCNN
from dynamo_vulkan.training import (GPT, cnn_workload, gpt_workload, max_relative_difference,
                                    train)
from vk import compiled, step_twins

RTOL = ATOL = 1e-4


def _mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 19), nn.SiLU(),
                          nn.Linear(19, 5))
    x, y = torch.randn(7, 12), torch.randint(0, 5, (7,))
    return model, lambda m: F.nll_loss(F.log_softmax(m(x), -1), y)


def _cnn():
    torch.manual_seed(0)
    model = SmallCNN(channels=(3, 4, 8), classes=5, pooled=3)     # overlapping pool windows
    x, y = torch.randn(2, 3, 11, 11), torch.randint(0, 5, (2,))
    return model, lambda m: F.cross_entropy(m(x), y)


def _gpt(batch: int = 2):
    torch.manual_seed(0)
    model = GPT(vocab=37, dim=32, heads=4, ctx=16, layers=2)
    idx, tgt = torch.randint(0, 37, (batch, 16)), torch.randint(0, 37, (batch, 16))
    return model, lambda m: m(idx, tgt)


def _gpt_batch_1():
    """Batch 1: the backward views the transpose of SDPA's saved output, which the
    forward's program returns contiguous where AOT traced the op's own layout
    (planner.specialise)."""
    return _gpt(batch=1)


def _new_reports(before: int):
    return dynamo_vulkan.reports()[before:]


@pytest.mark.parametrize("make", [_mlp, _cnn, _gpt, _gpt_batch_1], ids=["mlp", "cnn", "gpt", "gpt-batch-1"])
def test_gradients_equal_eager_and_backward_runs_on_vulkan(make):
    model, loss_of = make()
    ours = copy.deepcopy(model)
    loss_of(model).backward()
    before = len(dynamo_vulkan.reports())
    step = compiled(lambda: loss_of(ours))
    for _ in range(2):                 # the second call replays the recorded programs
        ours.zero_grad()
        loss = step()
        loss.backward()
    torch.testing.assert_close(loss, loss_of(model), rtol=RTOL, atol=ATOL)
    for (name, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=RTOL, atol=ATOL, msg=name)
    reports = _new_reports(before)
    assert [r.kind for r in reports] == ["forward", "backward"]
    for r in reports:
        assert not r.cpu_nodes, f"{r.kind} graph nodes on the CPU: {r.cpu_nodes}"
        assert r.vulkan_nodes and r.partitions >= 1
    if make is _cnn:
        assert not any("convolution_backward" in n.op for n in reports[1].nodes)   # decomposed


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_optimizer_step_on_vulkan_equals_eager(name, foreach):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    before = len(dynamo_vulkan.reports())
    _, _, ours = step_twins(model, name, foreach, steps=5)
    for (pname, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q, p, rtol=RTOL, atol=ATOL, msg=pname)
    reports = _new_reports(before)
    assert reports and all(r.kind == "inference" for r in reports)
    for r in reports:
        assert not r.cpu_nodes, f"step graph nodes on the CPU: {r.cpu_nodes}"
    assert sum(len(r.vulkan_nodes) for r in reports) > 0



def _traffic(before: dict, keys=("uploads", "upload_bytes", "readback_bytes")) -> dict:
    now = dynamo_vulkan.runtime_stats()
    return {k: now[k] - before[k] for k in keys}


def _train_mlp(keep: bool, steps: int = 5, batch: int = 4):
    """A small MLP trained with a compiled forward-backward and a compiled SGD (momentum)
    step beside its eager twin; the traffic counters of each step after the first two (the
    first makes the momentum buffers, the second's graph reads them: its first call uploads
    them)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    twin = copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, foreach=True)
            for m in (model, twin)]
    if keep:
        dynamo_vulkan.keep_on_device(model)
        dynamo_vulkan.keep_on_device(opts[0])
    x = torch.randn(batch, 6)
    loss_of = compiled(lambda: model(x).square().mean())
    step = compiled(opts[0].step)
    traffic, losses = [], []
    for i in range(steps):
        before = dynamo_vulkan.runtime_stats()
        for o in opts:
            o.zero_grad()
        loss = loss_of()
        loss.backward()
        step()
        expected = twin(x).square().mean()
        expected.backward()
        opts[1].step()
        losses.append((loss.detach(), expected.detach()))
        if i >= 2:
            traffic.append(_traffic(before))
    return model, twin, opts, traffic, losses


def _state_bytes(model) -> int:
    """Bytes of the parameters and their momentum buffers (SGD's state)."""
    return 2 * 4 * sum(p.numel() for p in model.parameters())


def _assert_same_training(model, twin, opts, losses) -> None:
    for got, expected in losses:
        torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=RTOL, atol=ATOL, msg=name)
        torch.testing.assert_close(opts[0].state[q]["momentum_buffer"],
                                   opts[1].state[p]["momentum_buffer"], rtol=RTOL, atol=ATOL)


def test_parameters_updated_on_the_gpu_are_not_uploaded_again():
    model, twin, opts, traffic, losses = _train_mlp(keep=False)
    for t in traffic:      # each step copies the updated tensors back, and uploads nothing
        assert t == {"uploads": 0, "upload_bytes": 0, "readback_bytes": _state_bytes(model)}, t
    _assert_same_training(model, twin, opts, losses)


def test_kept_parameters_and_state_are_read_back_only_when_asked():
    model, twin, opts, traffic, losses = _train_mlp(keep=True)
    assert traffic and all(t == {"uploads": 0, "upload_bytes": 0, "readback_bytes": 0}
                           for t in traffic), traffic
    assert not torch.equal(model[0].weight, twin[0].weight)      # the host copy is stale
    before = dynamo_vulkan.runtime_stats()
    dynamo_vulkan.read_back(model)           # the parameters and their last gradients
    dynamo_vulkan.read_back(opts[0])         # the momentum buffers
    assert _traffic(before)["readback_bytes"] == _state_bytes(model) * 3 // 2
    _assert_same_training(model, twin, opts, losses)
    before = dynamo_vulkan.runtime_stats()
    dynamo_vulkan.read_back(model)                                # nothing newer on the GPU
    assert _traffic(before)["readback_bytes"] == 0


def test_kept_parameters_are_read_back_for_a_forward_placed_on_the_host(monkeypatch):
    """On a CPU device a prompt-sized forward runs on the host: it reads the parameters
    that the optimizer step updated on the GPU back first."""
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "host")
    before = len(dynamo_vulkan.reports())
    model, twin, opts, traffic, losses = _train_mlp(keep=True, batch=64)
    forward = next(r for r in _new_reports(before) if r.kind == "forward")
    if not forward.cpu_nodes:
        pytest.skip("the device placed the forward on the GPU (not a CPU device)")
    assert all(t["readback_bytes"] > 0 for t in traffic), traffic
    dynamo_vulkan.read_back(opts[0])
    _assert_same_training(model, twin, opts, losses)


def _dropout(p, training=True):
    return compiled(lambda x: F.dropout(x, p, training=training))


def _bound(p: float, n: int) -> float:
    """Six standard deviations of a keep-rate over n draws."""
    return 6 * (p * (1 - p) / n) ** 0.5


@pytest.mark.parametrize("p", [0.1, 0.5, 0.85])
def test_dropout_on_vulkan_keeps_1_minus_p_and_scales_exactly(p):
    before = len(dynamo_vulkan.reports())
    x = torch.randn(61, 2 * 331)[:, ::2]             # odd sizes, not contiguous
    y = _dropout(p)(x)
    assert not any(r.cpu_nodes for r in _new_reports(before))
    kept = y != 0
    n = kept.numel()
    assert abs(kept.float().mean().item() - (1 - p)) < _bound(p, n)
    # neighbours draw independently: both kept as often as (1 - p)^2
    both = (kept.reshape(-1)[:-1] & kept.reshape(-1)[1:]).float().mean().item()
    assert abs(both - (1 - p) ** 2) < _bound((1 - p) ** 2, n)
    assert torch.equal(y[kept], x[kept] * (1 / (1 - p)))       # eager's float scale, exactly
    second = _dropout(p)(x) != 0                     # a new mask each call
    assert not torch.equal(second, kept)


def test_dropout_mask_repeats_with_the_seed_and_the_backward_reuses_it():
    torch.manual_seed(3)
    x = torch.randn(37, 53, requires_grad=True)
    g = torch.randn(37, 53)
    step = _dropout(0.3)
    torch.manual_seed(11)
    y = step(x)
    y.backward(g)
    torch.manual_seed(11)
    assert torch.equal(step(x), y)                   # the seed repeats the mask
    kept = y != 0
    torch.testing.assert_close(x.grad, g * kept * (1 / 0.7), rtol=0, atol=0)
    reports = dynamo_vulkan.reports()[-2:]
    assert [r.kind for r in reports] == ["forward", "backward"]
    assert not any(r.cpu_nodes for r in reports)


@pytest.mark.parametrize("p,training", [(0.0, True), (1.0, True), (0.4, False)])
def test_dropout_that_draws_nothing(p, training):
    x = torch.randn(5, 7)
    x[0, 0] = float("nan")
    torch.testing.assert_close(_dropout(p, training)(x), F.dropout(x, p, training=training),
                               equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("size,out", [((7, 5), (3, 2)), ((2, 2), (3, 3))], ids=["shrink", "overlap"])
def test_adaptive_avg_pool_backward_on_vulkan(size, out):
    x = torch.randn(2, 3, *size, requires_grad=True)
    g = torch.randn(2, 3, *out)
    twin = x.detach().clone().requires_grad_()
    before = len(dynamo_vulkan.reports())
    compiled(lambda x: F.adaptive_avg_pool2d(x, out))(x).backward(g)
    F.adaptive_avg_pool2d(twin, out).backward(g)
    torch.testing.assert_close(x.grad, twin.grad, rtol=RTOL, atol=ATOL)
    reports = _new_reports(before)
    assert [r.kind for r in reports] == ["forward", "backward"]
    assert not any(r.cpu_nodes for r in reports)


@pytest.mark.parametrize("which", ["gpt", "cnn"])
def test_training_losses_equal_eager_every_step_with_no_cpu_node(which):
    """dynamo_vulkan.training's loop (AdamW; parameters, batch-norm statistics and optimizer
    state kept on the GPU): every step's loss within 1e-4 of eager's, relatively, and the
    forward, backward and optimizer-step graphs wholly on Vulkan."""
    if which == "gpt":
        w = gpt_workload(layers=2, dim=32, heads=4, seq=16, batch=2, vocab=37, steps=6)
    else:
        w = cnn_workload(channels=(3, 4, 8), size=12, batch=2, classes=5, steps=6)
    before = len(dynamo_vulkan.reports())
    ours = train(w, "vulkan")
    reports = _new_reports(before)
    ref = train(w, "eager")
    assert max_relative_difference(ours.losses, ref.losses) <= 1e-4, (ours.losses, ref.losses)
    assert {(r.kind, r.role) for r in reports} == \
        {("forward", None), ("backward", None), ("inference", "optimizer step")}
    assert "inference graph" in reports[-1].summary() and "(optimizer step)" in reports[-1].summary()
    assert not [n for r in reports for n in r.cpu_nodes]
    # GPU to host per step: the loss only (no saved activation, gradient or parameter)
    assert ours.extra["gpu_to_host_bytes"][1:] == [4] * (len(ours.losses) - 1), ours.extra
    for (name, b), c in zip(ref.model.named_buffers(), ours.model.buffers()):   # read back
        torch.testing.assert_close(c, b, rtol=RTOL, atol=ATOL, msg=name)


def test_a_float64_reference_run():
    """train(dtype=float64) is eager's reference for where fp32 ends: the same model and
    batches in float64, whose losses the fp32 runs' sit close to; our backend trains in
    float32 only, and says so."""
    w = cnn_workload(channels=(3, 4, 8), size=12, batch=2, classes=5, steps=3)
    exact, fp32 = train(w, "eager", dtype=torch.float64), train(w, "eager")
    assert next(exact.model.parameters()).dtype == torch.float64
    assert max_relative_difference(fp32.losses, exact.losses) < 1e-5
    with pytest.raises(ValueError, match="trains in float32"):
        train(w, "vulkan", dtype=torch.float64)


def test_saved_activations_and_gradients_are_handed_on_on_the_gpu():
    """The forward's saved activations stay in its output buffers, where the backward's
    program reads them, and the backward's gradients in its, where a keep_on_device
    optimizer's step reads them: per step the host sends only the batch (to the forward,
    and again to the backward, which reads the input itself) and the loss's gradient.
    A gradient changed on the host in place is uploaded again."""
    model, twin, opts, traffic, losses = _train_mlp(keep=True)
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    loss_fn, step = compiled(lambda: model(x).square().mean()), compiled(opts[0].step)
    for _ in range(3):
        before = dynamo_vulkan.runtime_stats()
        opts[0].zero_grad()
        loss_fn().backward()
        step()
        assert _traffic(before, ("input_bytes",))["input_bytes"] == 2 * x.nbytes + 4
    opts[0].zero_grad()
    loss_fn().backward()
    assert all(p.grad.isnan().all() for p in model.parameters())   # on the GPU only
    dynamo_vulkan.read_back(model)          # the gradients (and parameters) to the host
    assert not any(p.grad.isnan().any() for p in model.parameters())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)    # in place: versions move
    before = dynamo_vulkan.runtime_stats()
    step()
    assert _traffic(before, ("input_bytes",))["input_bytes"] == sum(
        4 * p.numel() for p in model.parameters())              # the clipped gradients
    for _ in range(3):                                          # the twin catches up
        opts[1].zero_grad()
        twin(x).square().mean().backward()
        opts[1].step()
    opts[1].zero_grad()
    twin(x).square().mean().backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.01)
    opts[1].step()
    dynamo_vulkan.read_back(model)
    dynamo_vulkan.read_back(opts[0])
    _assert_same_training(model, twin, opts, losses)


def test_a_forward_called_again_before_the_backward_still_gives_eager_gradients():
    """The second call of the forward overwrites the buffers that held the first's saved
    activations: the first backward then uploads them from the host, and each backward's
    gradients are still eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    twin = copy.deepcopy(model)
    loss_of = compiled(lambda x: model(x).square().mean())
    xs = [torch.randn(4, 6), torch.randn(4, 6)]
    for m, f in ((model, loss_of), (twin, lambda x: twin(x).square().mean())):
        f(xs[1]).backward()            # the backward's program binds the forward's buffers
        m.zero_grad()
        first, second = f(xs[0]), f(xs[1])
        first.backward()
        grads = [p.grad.clone() for p in m.parameters()]
        second.backward()
        m.first_grads = grads
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=RTOL, atol=ATOL, msg=name)
    for a, b in zip(model.first_grads, twin.first_grads):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("micro", [2, 4])
@pytest.mark.parametrize("summed", [False, True], ids=["backward-each", "one-backward"])
def test_gradients_of_micro_batches_accumulate_on_the_gpu(micro, summed):
    """Gradients of a kept optimizer's parameters accumulate over micro-batches on the GPU:
    each step sends the host only the losses, and the step, the gradients read back and the
    parameters equal eager's. one-backward: one backward through the compiled forward called
    for every micro-batch; autograd sums the calls' gradients on the host, so they are read
    back (and each forward call reads the previous call's saved activations back), and
    still equal eager's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    twin = copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, foreach=True)
            for m in (model, twin)]
    dynamo_vulkan.keep_on_device(model)
    dynamo_vulkan.keep_on_device(opts[0])
    loss_of = compiled(lambda x: model(x).square().mean())
    step = compiled(opts[0].step)
    for i in range(4):
        xs = [torch.randn(4, 6) for _ in range(micro)]
        before = dynamo_vulkan.runtime_stats()
        for o in opts:
            o.zero_grad()
        losses = [loss_of(x) for x in xs] if summed else []
        if summed:
            sum(losses).backward()
        for x in xs:
            if not summed:
                losses.append(loss_of(x))
                losses[-1].backward()
            twin(x).square().mean().backward()
        if i == 3:
            grads = [p.grad for p in model.parameters()]
            assert summed or all(g.isnan().all() for g in grads)     # on the GPU only
            dynamo_vulkan.read_back(model)
            for (name, p), g in zip(twin.named_parameters(), grads):
                torch.testing.assert_close(g, p.grad, rtol=RTOL, atol=ATOL, msg=name)
        step()
        opts[1].step()
        if 0 < i < 3 and not summed:
            assert _traffic(before, ("output_bytes", "readback_bytes")) == \
                {"output_bytes": 4 * micro, "readback_bytes": 0}
    dynamo_vulkan.read_back(model)
    dynamo_vulkan.read_back(opts[0])
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(q, p, rtol=RTOL, atol=ATOL, msg=name)


def test_accumulators_and_their_kernels_go_with_their_parameter():
    """A parameter's GPU accumulator and the kernels queued into it (which hold the source
    buffers alive) are dropped when the parameter is collected, and when the accumulator is
    remade for a new size: nothing of a deleted model stays on the GPU through them."""
    import gc

    import kp
    import numpy as np

    from dynamo_vulkan import device
    from dynamo_vulkan.runtime import accumulate
    mgr = device.manager()
    held = []
    p = torch.zeros(3)
    acc = accumulate.accumulator(mgr, p, 64, lambda owner, n: held.append(n))
    src = mgr.tensor_t(np.ones(64, np.uint32), tensor_type=kp.TensorTypes.storage)
    accumulate.queue(mgr, acc, src, 64, copy=True)
    accumulate.flush()
    assert held == [256] and any(v[1] is acc for v in accumulate._algorithms.values())
    bigger = accumulate.accumulator(mgr, p, 128, lambda owner, n: held.append(n))
    assert bigger is not acc and not any(v[1] is acc for v in accumulate._algorithms.values())
    accumulate.queue(mgr, bigger, src, 64, copy=False)
    accumulate.flush()
    pid = id(p)
    del p
    gc.collect()
    assert pid not in accumulate._accumulators
    assert not any(v[1] is bigger for v in accumulate._algorithms.values())


def test_a_kept_gradient_summed_with_an_eager_one_raises_then_goes_to_the_host():
    """A parameter of a kept optimizer that eager code also uses gets two gradients, which
    autograd sums on the host before the parameter's hooks see them: the compiled one, left
    on the GPU, is lost, which raises; from then on its gradients go to the host, and a
    step run again equals eager's."""
    torch.manual_seed(0)
    model = nn.Linear(5, 3)
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=True)
    dynamo_vulkan.keep_on_device(model)
    dynamo_vulkan.keep_on_device(opt)
    f = compiled(lambda x: model(x).square().mean())
    x = torch.randn(4, 5)

    def loss(m, fn):
        return fn(x) + m.weight.sum()          # the eager use of the weight
    with pytest.raises(RuntimeError, match="summed by autograd"):
        loss(model, f).backward()
    model.zero_grad()
    loss(model, f).backward()
    loss(twin, lambda x: twin(x).square().mean()).backward()
    dynamo_vulkan.read_back(model)
    for (name, p), q in zip(twin.named_parameters(), model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=RTOL, atol=ATOL, msg=name)
