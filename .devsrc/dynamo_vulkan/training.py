"""Training examples: a small GPT on a synthetic token stream and a small CNN on synthetic
images, trained with `torch.compile(backend="vulkan")` beside the same model in eager
PyTorch, their losses compared step by step.

    python -m dynamo_vulkan.training --model gpt --steps 50
    python -m dynamo_vulkan.training --model cnn --steps 20 --layers 2

What runs where: the compiled forward and backward graphs and the compiled optimizer step
run on Vulkan (on a CPU device such as lavapipe, prompt-sized graphs are placed on the host
unless DYNAMO_VULKAN_CPU_MATMUL=vulkan). The parameters and the optimizer's state are kept
on the GPU (keep_on_device) and read back once, at the end (read_back).
"""
from __future__ import annotations

import argparse
import copy
import logging
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from .examples import SmallCNN

log = logging.getLogger(__name__)


class GPT(nn.Module):
    """Token and position embeddings, pre-norm blocks (layer norm, causal SDPA, GELU MLP),
    a final layer norm, a linear head; forward(idx, targets) is the next tokens' mean
    cross-entropy."""

    def __init__(self, vocab: int = 256, dim: int = 384, heads: int = 6, ctx: int = 256,
                 layers: int = 6, dropout: float = 0.0):
        super().__init__()
        self.heads, self.vocab, self.dropout = heads, vocab, dropout
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(dim), qkv=nn.Linear(dim, 3 * dim), proj=nn.Linear(dim, dim),
            ln2=nn.LayerNorm(dim), fc=nn.Linear(dim, 4 * dim), out=nn.Linear(4 * dim, dim)))
            for _ in range(layers))
        self.lnf, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk.qkv(blk.ln1(x)).split(x.shape[-1], -1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self._drop(blk.proj(a.transpose(1, 2).reshape(b, t, -1)))
            x = x + self._drop(blk.out(F.gelu(blk.fc(blk.ln2(x)))))
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.view(-1, self.vocab), targets.view(-1))

    def _drop(self, x):
        return F.dropout(x, self.dropout, True) if self.training and self.dropout else x


def token_stream(vocab: int, length: int, seed: int = 0) -> torch.Tensor:
    """A synthetic text a model can learn: runs of an arithmetic progression modulo vocab
    whose start and step change at random, so the next token is predictable within a run."""
    g = torch.Generator().manual_seed(seed)
    out, pos = torch.empty(length, dtype=torch.long), 0
    while pos < length:
        n = int(torch.randint(8, 64, (), generator=g))
        start, step = (int(v) for v in torch.randint(0, vocab, (2,), generator=g))
        run = (start + step * torch.arange(min(n, length - pos))) % vocab
        out[pos:pos + run.numel()] = run
        pos += run.numel()
    return out


def token_batches(vocab: int, batch: int, seq: int, steps: int, seed: int = 0) -> list:
    """`steps` (inputs, targets) pairs of shape (batch, seq) cut from one token stream."""
    stream = token_stream(vocab, steps * batch * (seq + 1), seed)
    rows = stream.view(steps, batch, seq + 1)
    return [(r[:, :-1].contiguous(), r[:, 1:].contiguous()) for r in rows]


def image_batches(classes: int, batch: int, size: int, steps: int, seed: int = 0) -> list:
    """`steps` (images, labels) pairs: noise plus a per-class pattern, so labels are learnable."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(classes, 3, size, size, generator=g)
    out = []
    for _ in range(steps):
        y = torch.randint(0, classes, (batch,), generator=g)
        out.append((patterns[y] + torch.randn(batch, 3, size, size, generator=g), y))
    return out


class CNNLoss(nn.Module):
    """A SmallCNN whose forward(images, labels) is the cross-entropy."""

    def __init__(self, channels=(3, 16, 32, 64), classes: int = 10):
        super().__init__()
        self.net = SmallCNN(channels=channels, classes=classes)

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


@dataclass
class Workload:
    """A model whose forward(*batch) returns the loss, the batches, and the optimizer."""
    name: str
    model: nn.Module
    batches: list
    lr: float = 3e-4
    weight_decay: float = 0.1


def gpt_workload(layers=6, dim=384, heads=6, seq=256, batch=8, vocab=256, steps=50,
                 seed=0) -> Workload:
    torch.manual_seed(seed)
    model = GPT(vocab, dim, heads, seq, layers)
    return Workload(f"gpt {layers}x{dim} seq{seq} b{batch}", model,
                    token_batches(vocab, batch, seq, steps, seed))


def cnn_workload(channels=(3, 16, 32, 64), size=32, batch=32, classes=10, steps=50,
                 seed=0) -> Workload:
    torch.manual_seed(seed)
    model = CNNLoss(tuple(channels), classes)
    return Workload(f"cnn {'-'.join(map(str, channels))} {size}px b{batch}", model,
                    image_batches(classes, batch, size, steps, seed), lr=1e-3)


@dataclass
class Run:
    """One backend's training run: the loss and wall time of every step."""
    backend: str
    losses: list = field(default_factory=list)
    step_s: list = field(default_factory=list)
    model: nn.Module | None = None
    extra: dict = field(default_factory=dict)


def _optimizer(w: Workload, model: nn.Module):
    return torch.optim.AdamW(model.parameters(), lr=w.lr, weight_decay=w.weight_decay,
                             foreach=True)


def train(w: Workload, backend: str = "vulkan", device: str = "cpu",
          dtype: torch.dtype = torch.float32) -> Run:
    """Train a copy of w.model over w.batches: backend "eager" (on `device`: "cpu" or
    "cuda"; `dtype` float64 gives the reference that fp32 runs are held to) or "vulkan"
    (the forward-backward and the optimizer step each compiled, the parameters and the
    optimizer's state kept on the GPU and read back at the end)."""
    if dtype != torch.float32 and backend != "eager":
        raise ValueError(f"a {dtype} run is eager's reference; backend {backend!r} trains in float32")
    model = copy.deepcopy(w.model).to(device=device, dtype=dtype).train()
    opt = _optimizer(w, model)
    run = Run(backend, model=model)
    if backend == "vulkan":
        import dynamo_vulkan
        dynamo_vulkan.keep_on_device(model)
        dynamo_vulkan.keep_on_device(opt)
        forward = torch.compile(model, backend="vulkan", dynamic=False)
        step = torch.compile(opt.step, backend="vulkan", dynamic=False)
    elif backend == "eager":
        forward, step = model, opt.step
    else:
        raise ValueError(f"backend {backend!r} is not 'eager' or 'vulkan'")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    traffic = _traffic_counter() if backend == "vulkan" else None
    for batch in w.batches:
        batch = tuple(t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)
                      for t in batch)
        sync()
        before = traffic() if traffic else None
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = forward(*batch)
        loss.backward()
        step()
        value = loss.detach().item()      # waits for the step's results (CUDA: synchronises)
        sync()
        run.step_s.append(time.perf_counter() - t0)
        run.losses.append(value)
        if traffic:
            after = traffic()
            for k in after:
                run.extra.setdefault(k, []).append(after[k] - before[k])
    if backend == "vulkan":
        import dynamo_vulkan
        dynamo_vulkan.read_back(model)
        dynamo_vulkan.read_back(opt)
    return run


def _traffic_counter():
    """A function giving the bytes sent so far each way between host and GPU (runtime_stats:
    gpu_to_host counts the outputs copied out and the tensors read back) and the submits."""
    import dynamo_vulkan

    def now() -> dict:
        s = dynamo_vulkan.runtime_stats()
        return {"gpu_to_host_bytes": s["output_bytes"] + s["readback_bytes"],
                "host_to_gpu_bytes": s["input_bytes"] + s["upload_bytes"],
                "submits": s["submits"]}
    return now


def max_relative_difference(losses, reference) -> float:
    """max over steps of |loss - reference| / |reference|."""
    return max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(losses, reference))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("gpt", "cnn"), default="gpt")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=None, help="default: gpt 8, cnn 32")
    p.add_argument("--layers", type=int, default=None, help="gpt: blocks (default 6); cnn: conv "
                   "blocks (default 3)")
    p.add_argument("--dim", type=int, default=384, help="gpt: model width")
    p.add_argument("--seq", type=int, default=256, help="gpt: tokens per sequence")
    p.add_argument("--no-eager", action="store_true", help="leave out the eager CPU run")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if a.model == "gpt":
        w = gpt_workload(layers=a.layers or 6, dim=a.dim, heads=max(1, a.dim // 64), seq=a.seq,
                         batch=a.batch or 8, steps=a.steps)
    else:
        channels = (3, 16, 32, 64, 128, 256)[:(a.layers or 3) + 1]
        w = cnn_workload(channels=channels, batch=a.batch or 32, steps=a.steps)
    import dynamo_vulkan
    before = len(dynamo_vulkan.reports())
    ours = train(w, "vulkan")
    reports = dynamo_vulkan.reports()[before:]
    cpu = sum(len(r.cpu_nodes) for r in reports)
    ref = None if a.no_eager else train(w, "eager")
    for i, loss in enumerate(ours.losses):
        line = f"step {i:3d}  loss {loss:.6f}  {ours.step_s[i] * 1e3:9.1f} ms"
        if ref is not None:
            line += f"  eager {ref.losses[i]:.6f}  {ref.step_s[i] * 1e3:9.1f} ms"
        log.info("%s", line)
    for r in reports:          # each graph (forward, backward, optimizer step): where it ran
        log.info("%s", r.summary())
    log.info("%s: %d nodes on the CPU", w.name, cpu)
    if len(ours.losses) > 1:        # the first step uploads the weights and makes the state
        steady = {k: sum(v[1:]) / (len(v) - 1) for k, v in ours.extra.items()}
        log.info("per step after the first: %d bytes GPU to host, %d bytes host to GPU, "
                 "%.1f submits", steady["gpu_to_host_bytes"], steady["host_to_gpu_bytes"],
                 steady["submits"])
    if ref is not None:
        log.info("largest relative loss difference from eager: %.2e",
                 max_relative_difference(ours.losses, ref.losses))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
