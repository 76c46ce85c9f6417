"""Training steps (forward + backward + AdamW) of dynamo_vulkan.training's GPT and CNN:
the step time on Vulkan against eager CPU and eager torch CUDA, the losses of every step
against eager CPU's, where the nodes ran, and memory.

Where float32 ends: every fp32 run's losses are also held to the same run in float64 on
the CPU, beside eager CPU fp32's own distance from it. Adam and many steps amplify the
last bits of the gradients, so two fp32 implementations that sum in different orders
drift apart (the CNN's losses by up to ~1e-3, eager CUDA's included: docs/journal.md,
session 41); the float64 run says whether ours drifts more than fp32 itself does.

A step is timed from zero_grad to the loss read back after the optimizer step (CUDA
synchronised); the first WARM steps (compiles, the optimizer's first step) are left out of
the timing but not of the loss comparison. Our run keeps the parameters and the
optimizer's state on the GPU (keep_on_device), as the example does.
"""
from __future__ import annotations

import gc

import torch

from dynamo_vulkan.training import cnn_workload, gpt_workload, max_relative_difference, train

from ..harness import Target, placement_of
from ..record import Row
from ..timing import Stat

DESCRIPTION = "training step: GPT and CNN, forward + backward + AdamW (step time, losses vs eager CPU)"
WARM = 3            # steps left out of the timing
LOSS_RTOL = 1e-4    # issue 29: every step's loss within this of eager CPU's, relatively


def _train_cuda(w, precision: str):
    """Eager torch CUDA's run under our matmul precision (TF32 under "high", as torch
    defines it), torch's own setting restored after."""
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        return train(w, "eager", "cuda")
    finally:
        torch.set_float32_matmul_precision(saved)


def workloads(quick: bool) -> list:
    """Factories of dynamo_vulkan.training Workloads (issue 29's sizes; --quick: tiny)."""
    if quick:
        return [lambda: gpt_workload(layers=1, dim=32, heads=2, seq=16, batch=2, vocab=64, steps=5),
                lambda: cnn_workload(channels=(3, 4, 8), size=8, batch=2, classes=5, steps=5)]
    return [lambda: gpt_workload(layers=6, dim=384, heads=6, seq=256, batch=8, steps=50),
            lambda: cnn_workload(channels=(3, 16, 32, 64), size=32, batch=32, steps=50)]


def _stat(run) -> Stat:
    timed = run.step_s[WARM:] or run.step_s
    return Stat.of(t * 1e3 for t in timed)


def _per_step(run, key: str, unit: str = " B") -> str:
    """The median of a training run's per-step counter, after the first step."""
    counts = sorted(run.extra.get(key, [])[1:])
    return f"{counts[len(counts) // 2]}{unit}" if counts else "?"


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def run(bench) -> None:
    import dynamo_vulkan
    from dynamo_vulkan import config

    precision = config.load().matmul_precision
    for make in workloads(bench.quick):
        w = make()
        if bench.over_budget("train", w.name):
            continue
        ref = train(w, "eager")
        ref_ms = _stat(ref)
        exact = train(w, "eager", dtype=torch.float64).losses
        fp32_floor = max_relative_difference(ref.losses, exact)
        scale = max(abs(v) for v in ref.losses)
        # err <= tol holds where every step's loss is within LOSS_RTOL of eager's, relatively
        tol = LOSS_RTOL * min(abs(v) for v in ref.losses)
        bench.add(Row("train", w.name, "eager_cpu", ref_ms, err=0.0, ref_scale=scale, speedup=1.0,
                      note=f"{len(ref.losses)} steps, {torch.get_num_threads()} threads; losses "
                           f"within {fp32_floor:.1e} of the float64 run's (relative, worst step)"))

        before = len(dynamo_vulkan.reports())
        # the earlier workloads' programs and models (the last run's, which holds its
        # parameters' GPU copies) freed first, so the growth is this one's own
        ours = None
        torch._dynamo.reset()
        gc.collect()
        held = dynamo_vulkan.runtime_stats()["device_bytes"]
        try:
            ours = train(w, "vulkan")
        except Exception as e:
            bench.add(Row("train", w.name, "vulkan", None,
                          note=f"failed: {type(e).__name__}: {str(e)[:300]}"))
            bench.failures.append(f"train: {w.name} on vulkan: {e}")
            continue
        stats = dynamo_vulkan.runtime_stats()
        reports = dynamo_vulkan.reports()[before:]
        where = placement_of(reports)
        ms = _stat(ours)
        rel = max_relative_difference(ours.losses, ref.losses)
        rel64 = max_relative_difference(ours.losses, exact)
        bench.add(Row("train", w.name, "vulkan", ms,
                      err=max(abs(a - b) for a, b in zip(ours.losses, ref.losses)), ref_scale=scale,
                      tol=tol, speedup=ref_ms.median / ms.median,
                      cpu_nodes=sum(len(r.cpu_nodes) for r in reports),
                      placement=where["placement"],
                      note=f"losses within {rel:.1e} of eager's (relative, worst step), "
                           f"{rel64:.1e} of float64's (eager fp32: {fp32_floor:.1e}); graphs "
                           f"{'/'.join(r.role or r.kind for r in reports)}; Vulkan memory held "
                           f"{_mib(stats['device_bytes'] - held)}, process peak "
                           f"{_mib(stats['device_bytes_peak'])}; first step "
                           f"{ours.step_s[0]:.1f} s (compiles); GPU to host per step "
                           f"{_per_step(ours, 'gpu_to_host_bytes')}, host to GPU "
                           f"{_per_step(ours, 'host_to_gpu_bytes')}; submits per step "
                           f"{_per_step(ours, 'submits', '')}"))
        bench.extra.setdefault("train_losses", {})[w.name] = {"eager_cpu": ref.losses,
                                                              "vulkan": ours.losses,
                                                              "eager_cpu_float64": exact}
        if bench.opts.cuda:
            torch.cuda.reset_peak_memory_stats()
            gpu = _train_cuda(w, precision)
            gpu_ms = _stat(gpu)
            bench.add(Row("train", w.name, "cuda", gpu_ms,
                          err=max(abs(a - b) for a, b in zip(gpu.losses, ref.losses)),
                          ref_scale=scale, tol=None, speedup=ref_ms.median / gpu_ms.median,
                          note=f"eager torch CUDA, matmul precision {precision!r} as ours; losses within "
                               f"{max_relative_difference(gpu.losses, exact):.1e} of float64's; peak memory "
                               f"{_mib(torch.cuda.max_memory_allocated())}"))
            bench.extra["train_losses"][w.name]["cuda"] = gpu.losses
            del gpu
            torch.cuda.empty_cache()
        if w.name.startswith("gpt") and not bench.quick:
            bench.target(Target(f"train {w.name}: step time vs eager torch CUDA",
                                ("train", w.name, "vulkan"), 1.0, higher_is_better=False,
                                baseline=("train", w.name, "cuda"), metric="ms",
                                note="issue 29: faster than eager CUDA on the same GPU"))
            bench.target(Target(f"train {w.name}: step time vs eager CPU",
                                ("train", w.name, "vulkan"), 0.2, higher_is_better=False,
                                baseline=("train", w.name, "eager_cpu"), metric="ms",
                                note="issue 29: >= 5x eager CPU (ratio <= 0.2)"))
