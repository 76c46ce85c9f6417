"""The run's shared state and the one way every backend is measured on a workload.

``Bench.compare`` runs one workload on eager CPU (the reference), our Vulkan
backend, and whichever baselines apply (inductor CPU, torch CUDA, IREE on
Vulkan), each after warm-up, and adds a Row per backend with its max error
against the eager output of the same run. A backend that fails is recorded
with its error, never left out silently (and the run exits non-zero, unless
--keep-going). A graph our backend placed wholly on the host (as it does with
prompt-sized graphs on a CPU Vulkan device such as lavapipe) is timed and checked
all the same, its row marked "host", with no device time.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import gputime, probes
from .record import Notes, Row
from .timing import Plan, Stat, measure, measure_cuda, once_s

log = logging.getLogger(__name__)


@dataclass
class Target:
    """A goal from issue 6, resolved against the rows when the run ends."""
    name: str
    ours: tuple[str, str, str]                     # (suite, workload, backend)
    goal: float
    higher_is_better: bool = True                  # ratio = ours / baseline, for throughputs
    baseline: tuple[str, str, str] | None = None   # a row ...
    baseline_value: tuple[float, str] | None = None  # ... or a probe's value and its name
    metric: str = "throughput"                     # or "ms" (the median wall time)
    note: str = ""


@dataclass
class Options:
    quick: bool = False
    plan: Plan = field(default_factory=Plan)
    inductor: bool = True
    cuda: bool = False
    iree: Any = None              # peers.iree.IreePeer or None
    llama_cpp: Any = None         # peers.llama_cpp.LlamaCppPeer or None
    skeleton_dir: Any = None
    work_dir: Any = None
    deadline: float | None = None  # time.perf_counter() after which no new workload starts
    llm: Any = None               # suites.llm.Settings (--models, lengths, eager CPU) or None: the defaults


def max_abs(out, ref) -> tuple[float, float]:
    """(max |out - ref|, max |ref|) over a tensor or a tuple of them, compared on the CPU in fp32."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    refs = ref if isinstance(ref, (tuple, list)) else (ref,)
    if len(outs) != len(refs):
        raise ValueError(f"{len(outs)} outputs against {len(refs)} reference outputs")
    err = scale = 0.0
    for o, r in zip(outs, refs):
        o = torch.as_tensor(o).detach().to("cpu", torch.float32)
        r = r.detach().to("cpu", torch.float32)
        if o.shape != r.shape:
            raise ValueError(f"output shape {tuple(o.shape)} != reference {tuple(r.shape)}")
        if r.numel():
            err = max(err, float((o - r).abs().max()))
            scale = max(scale, float(r.abs().max()))
    return err, scale


def placement_of(reports) -> dict:
    """Where a compiled model's graphs ran: "host" when every graph was placed on the host
    (with the backend's reason), "vulkan" when any ran on Vulkan, "" when none was compiled."""
    if not reports:
        return {"placement": ""}
    if all(r.host_reason is not None or not r.vulkan_nodes for r in reports):
        reasons = sorted({r.host_reason for r in reports if r.host_reason})
        return {"placement": "host", "host_reason": "; ".join(reasons) or "no node is supported on Vulkan"}
    return {"placement": "vulkan"}


@contextlib.contextmanager
def _nothing():
    yield None


def _fresh():
    torch._dynamo.reset()
    gc.collect()


class Bench:
    def __init__(self, opts: Options, probe_results: dict):
        self.opts = opts
        self.probes = probe_results
        self.rows: list[Row] = []
        self.targets: list[Target] = []
        self.notes = Notes()
        self.extra: dict = {}
        self.failures: list[str] = []   # what failed outside a row (a model, a kernel sweep)

    # ------------------------------------------------------------------ bookkeeping
    @property
    def quick(self) -> bool:
        return self.opts.quick

    @property
    def plan(self) -> Plan:
        return self.opts.plan

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def note(self, suite: str, text: str) -> None:
        self.notes.add(suite, text)
        log.info("%s: %s", suite, text)

    def fail(self, suite: str, text: str) -> None:
        """A note that also fails the run (cli's exit status): something meant to be measured
        was not."""
        self.note(suite, text)
        self.failures.append(f"{suite}: {text}")

    def over_budget(self, suite: str, what: str) -> bool:
        """True (and noted) when the run's --budget is spent: ``what`` is not started."""
        import time
        if self.opts.deadline is not None and time.perf_counter() > self.opts.deadline:
            self.note(suite, f"{what}: not run, the --budget was spent")
            return True
        return False

    def target(self, t: Target) -> None:
        self.targets.append(t)

    def limit_for(self, unit: str) -> tuple[float | None, str]:
        if unit == "GB/s":
            return probes.copy_limit(self.probes)
        if unit == "GFLOP/s":
            p = probes.peak_gflops(self.probes)
            return (p, "cuda_fp32_matmul") if p else (None, "")
        return None, ""

    # ------------------------------------------------------------------ backends
    def eager(self, model, inputs) -> tuple[Stat, Any]:
        with torch.no_grad():
            ref = model(*inputs)
            return measure(lambda: model(*inputs), self.plan), ref

    def vulkan(self, model, inputs, profile: bool = True) -> dict:
        """Compile with backend="vulkan"; wall time per call, and (``profile``) the
        kernels' GPU time from a second, timestamped compile of the same model
        (--quick: one timestamped compile serves both, to save time). A model whose
        graphs were all placed on the host has no kernels to time: its result says
        ``placement`` "host" and why, and carries no device time."""
        import dynamo_vulkan

        _fresh()
        before = len(dynamo_vulkan.reports())
        both = profile and self.quick
        with torch.no_grad(), (gputime.profiled() if both else _nothing()) as cap:
            cm = torch.compile(model, backend="vulkan", dynamic=False)
            out, compile_s = once_s(lambda: cm(*inputs))
            reports = dynamo_vulkan.reports()[before:]
            ms = measure(lambda: cm(*inputs), self.plan)
            res = {"ms": ms, "out": out, "compile_s": compile_s,
                   "cpu_nodes": sum(len(r.cpu_nodes) for r in reports),
                   "vulkan_nodes": sum(len(r.vulkan_nodes) for r in reports),
                   "partitions": sum(r.partitions for r in reports)}
            res.update(placement_of(reports))
            on_device = res["placement"] != "host"
            if both and on_device:
                samples, res["kernels"] = gputime.kernel_ms_per_call(cap, lambda: cm(*inputs), ms.n)
                res["gpu_ms"] = Stat.of(samples)
            del cm
        if profile and not both and on_device:
            _fresh()
            with torch.no_grad(), gputime.profiled() as cap:
                cp = torch.compile(model, backend="vulkan", dynamic=False)
                for _ in range(max(1, self.plan.warmup)):
                    cp(*inputs)
                samples, res["kernels"] = gputime.kernel_ms_per_call(
                    cap, lambda: cp(*inputs), self.plan.count(ms.median / 1e3))
                del cp
            res["gpu_ms"] = Stat.of(samples)
        _fresh()
        return res

    def inductor(self, model, inputs) -> dict:
        _fresh()
        with torch.no_grad():
            cm = torch.compile(model, backend="inductor", dynamic=False)
            out, compile_s = once_s(lambda: cm(*inputs))
            ms = measure(lambda: cm(*inputs), self.plan)
        del cm
        _fresh()
        return {"ms": ms, "out": out, "compile_s": compile_s}

    def cuda(self, model, inputs) -> dict:
        """Device time (CUDA events) of the same workload on torch CUDA, inputs already on the GPU."""
        m = copy.deepcopy(model).to("cuda") if isinstance(model, torch.nn.Module) else model
        xs = tuple(x.to("cuda") for x in inputs)
        with torch.no_grad():
            out = m(*xs)
            gpu = measure_cuda(lambda: m(*xs), self.plan)
            out = out.cpu() if isinstance(out, torch.Tensor) else tuple(o.cpu() for o in out)
        del m, xs
        torch.cuda.empty_cache()
        return {"ms": gpu, "gpu_ms": gpu, "out": out, "ms_basis": "device"}

    # ------------------------------------------------------------------ one workload, every backend
    def compare(self, suite: str, workload: str, model, inputs: tuple, *, work: float | None = None,
                unit: str = "", rtol: float = 1e-4, atol: float = 1e-5, inductor: bool = True,
                cuda: bool = False, cuda_model=None, iree: bool = False, profile: bool = True,
                note: str = "") -> dict[str, Row]:
        """Rows for ``workload`` on every applicable backend; returns them by backend."""
        if isinstance(model, torch.nn.Module):
            model.eval()
        rows: dict[str, Row] = {}
        limit, limit_name = self.limit_for(unit)
        eager_ms, ref = self.eager(model, inputs)
        rows["eager_cpu"] = self.add(Row(suite, workload, "eager_cpu", eager_ms, work=work, unit=unit,
                                         err=0.0, ref_scale=max_abs(ref, ref)[1], tol=None, speedup=1.0,
                                         note=note))

        def tol(scale):
            return atol + rtol * scale

        def add(backend: str, fn: Callable[[], dict], gpu_limit: bool, tolerance=True, extra_note=""):
            try:
                r = fn()
            except Exception as e:
                log.warning("%s %s on %s failed: %s", suite, workload, backend, e)
                rows[backend] = self.add(Row(suite, workload, backend, None, unit=unit,
                                             note=f"failed: {type(e).__name__}: {str(e)[:300]}"))
                return
            err, scale = max_abs(r["out"], ref)
            n = [extra_note] if extra_note else []
            if r.get("placement") == "host":
                n.append(f"graph placed on the host: {r['host_reason']}")
            elif r.get("cpu_nodes"):
                n.append(f"{r['cpu_nodes']} node(s) on CPU")
            if r.get("compile_s") is not None:
                n.append(f"compile {r['compile_s']:.1f}s")
            rows[backend] = self.add(Row(
                suite, workload, backend, r["ms"], gpu_ms=r.get("gpu_ms"), work=work, unit=unit,
                err=err, ref_scale=scale, tol=tol(scale) if tolerance else None,
                speedup=eager_ms.median / r["ms"].median if r["ms"].median > 0 else None,
                limit=limit if gpu_limit and r.get("placement") != "host" else None,
                limit_name=limit_name if gpu_limit else "", kernels=r.get("kernels"), cpu_nodes=r.get("cpu_nodes"),
                placement=r.get("placement", ""), ms_basis=r.get("ms_basis", "wall"), note="; ".join(n)))

        add("vulkan", lambda: self.vulkan(model, inputs, profile=profile), True)
        if inductor and self.opts.inductor:
            add("inductor_cpu", lambda: self.inductor(model, inputs), False)
        if cuda and self.opts.cuda:
            add("torch_cuda", lambda: self.cuda(cuda_model or model, inputs), True)
        if iree and self.opts.iree is not None:
            add("iree_vulkan", lambda: self.opts.iree.run(workload, model, inputs, self.plan), True,
                extra_note=self.opts.iree.note)
        return rows
