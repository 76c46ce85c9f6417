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
from vk import compiled

RTOL = ATOL = 1e-4


class TinyGPT(nn.Module):
    """Token and position embeddings, pre-norm blocks (layer norm, causal SDPA, GELU MLP),
    a linear head and the cross-entropy of the next tokens."""

    def __init__(self, vocab=37, dim=32, heads=4, ctx=16, layers=2):
        super().__init__()
        self.heads, self.vocab = heads, vocab
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(dim), qkv=nn.Linear(dim, 3 * dim), proj=nn.Linear(dim, dim),
            ln2=nn.LayerNorm(dim), fc=nn.Linear(dim, 4 * dim), out=nn.Linear(4 * dim, dim)))
            for _ in range(layers))
        self.lnf, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            q, k, v = blk.qkv(blk.ln1(x)).split(x.shape[-1], -1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk.proj(a.transpose(1, 2).reshape(b, t, -1))
            x = x + blk.out(F.gelu(blk.fc(blk.ln2(x))))
        return F.cross_entropy(self.head(self.lnf(x)).view(-1, self.vocab), targets.view(-1))


def _mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 19), nn.SiLU(),
                          nn.Linear(19, 5))
    x, y = torch.randn(7, 12), torch.randint(0, 5, (7,))
    return model, lambda m: F.nll_loss(F.log_softmax(m(x), -1), y)


def _cnn():
    torch.manual_seed(0)
    model = SmallCNN(channels=(3, 4, 8), classes=5, pooled=1)
    x, y = torch.randn(2, 3, 9, 9), torch.randint(0, 5, (2,))
    return model, lambda m: F.cross_entropy(m(x), y)


def _gpt():
    torch.manual_seed(0)
    model = TinyGPT()
    idx, tgt = torch.randint(0, 37, (2, 16)), torch.randint(0, 37, (2, 16))
    return model, lambda m: m(idx, tgt)


def _new_reports(before: int):
    return dynamo_vulkan.reports()[before:]


@pytest.mark.parametrize("make", [_mlp, _cnn, _gpt], ids=["mlp", "cnn", "gpt"])
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


def _optimizer(name: str, params, foreach: bool):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, foreach=foreach)
    if name == "adam":
        return torch.optim.Adam(params, lr=0.01, foreach=foreach)
    return torch.optim.AdamW(params, lr=0.01, weight_decay=0.1, foreach=foreach)


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_optimizer_step_on_vulkan_equals_eager(name, foreach):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 9), nn.Tanh(), nn.Linear(9, 3))
    ours = copy.deepcopy(model)
    eager_opt = _optimizer(name, model.parameters(), foreach)
    our_opt = _optimizer(name, ours.parameters(), foreach)
    before = len(dynamo_vulkan.reports())
    step = compiled(our_opt.step)
    for _ in range(5):
        x = torch.randn(4, 6)
        for m in (model, ours):
            m.zero_grad()
            m(x).square().mean().backward()
        eager_opt.step()
        step()
    for (pname, p), q in zip(model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(q, p, rtol=RTOL, atol=ATOL, msg=pname)
    reports = _new_reports(before)
    assert reports and all(r.kind == "inference" for r in reports)
    for r in reports:
        assert not r.cpu_nodes, f"step graph nodes on the CPU: {r.cpu_nodes}"
    assert sum(len(r.vulkan_nodes) for r in reports) > 0
