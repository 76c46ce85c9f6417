"""What one run measured (rows, targets) and where (machine, device, versions, commit, command).

A Row is one workload on one backend: its per-call time (median and spread),
device time where known, throughput, speed-up over eager CPU, the ratio to the
device's known limit, and the max error against eager CPU from the same run.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .timing import Stat

UNIT_SCALE = {"GB/s": 1e9, "GFLOP/s": 1e9, "tok/s": 1.0}


@dataclass
class Row:
    suite: str
    workload: str
    backend: str
    ms: Stat | None                 # time per call (per token for decode, per compile for compile rows): wall
                                    # time, or device time where ms_basis says so (torch CUDA's events)
    gpu_ms: Stat | None = None      # device time: our kp timestamps (kernels only) or CUDA events
    work: float | None = None       # bytes, flops or tokens per call, in `unit`'s base
    unit: str = ""                  # "GB/s", "GFLOP/s" or "tok/s"
    err: float | None = None        # max |out - eager CPU|
    ref_scale: float | None = None  # max |eager CPU out|
    tol: float | None = None        # err must stay <= tol; None: informational (peers that quantize)
    speedup: float | None = None    # eager CPU ms / this ms
    limit: float | None = None      # the device's limit in `unit`
    limit_name: str = ""
    kernels: int | None = None      # Vulkan kernels per call
    cpu_nodes: int | None = None    # nodes that fell back to the CPU
    placement: str = ""             # our rows: "vulkan", or "host" where every graph was placed on the host
    ms_basis: str = "wall"          # what `ms` measures: "wall" (host clock) or "device" (GPU events)
    note: str = ""

    @property
    def throughput(self) -> float | None:
        t = self.gpu_ms or self.ms
        if self.work is None or t is None or t.median <= 0:
            return None
        return self.work / (t.median * 1e-3) / UNIT_SCALE.get(self.unit, 1.0)

    @property
    def basis(self) -> str:
        return "" if self.work is None else ("device" if self.gpu_ms else "wall")

    @property
    def failed(self) -> bool:
        """Meant to be measured and not: the backend raised (``ms`` is None and the note says why)."""
        return self.ms is None and self.note.startswith("failed")

    @property
    def of_limit(self) -> float | None:
        tp = self.throughput
        return tp / self.limit if tp is not None and self.limit else None

    @property
    def ok(self) -> bool | None:
        if self.tol is None or self.err is None:
            return None
        return self.err <= self.tol

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["ms"] = self.ms.as_dict() if self.ms else None
        d["gpu_ms"] = self.gpu_ms.as_dict() if self.gpu_ms else None
        d.update(throughput=self.throughput, basis=self.basis, of_limit=self.of_limit, ok=self.ok)
        return d


@dataclass
class TargetResult:
    name: str
    ours: float | None
    baseline: float | None
    baseline_name: str
    unit: str
    ratio: float | None
    goal: str
    met: bool | None
    err: float | None
    note: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Notes:
    items: list[str] = field(default_factory=list)

    def add(self, suite: str, text: str) -> None:
        self.items.append(f"{suite}: {text}")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(where: Path) -> dict:
    def git(*a):
        r = subprocess.run(["git", "-C", str(where), *a], capture_output=True, text=True, timeout=30)
        return r.stdout.strip() if r.returncode == 0 else None
    if os.environ.get("BENCH_GIT_COMMIT"):
        # said by whoever copied the tree elsewhere (a lent machine's copy may carry a stale .git)
        return {"commit": os.environ["BENCH_GIT_COMMIT"], "dirty": None, "from": "BENCH_GIT_COMMIT"}
    try:
        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {"commit": commit, "dirty": bool(dirty) if dirty is not None else None}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def environment(argv: list[str]) -> dict:
    import torch

    import dynamo_vulkan

    info = dynamo_vulkan.device_info()
    dev = {k: info.get(k) for k in ("name", "driver_name", "driver_info", "api_version", "device_type",
                                    "subgroup_size", "max_storage_buffer_range", "available", "reason")
           if info.get(k) is not None}
    cuda = None
    try:
        if torch.cuda.is_available():
            cuda = {"name": torch.cuda.get_device_name(), "cuda": torch.version.cuda}
    except Exception as e:      # a broken CUDA install: say so, do not stop the run
        cuda = {"error": str(e)}
    src = Path(__file__).resolve().parents[1]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m dynamo_vulkan.benchmarks " + " ".join(shlex.quote(a) for a in argv),
        "machine": {"host": platform.node(), "platform": platform.platform(), "cpu": _cpu_model(),
                    "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()},
        "device": dev,
        "cuda": cuda,
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "kp": _version("kp"),
                     "numpy": _version("numpy"), "dynamo_vulkan": _version("dynamo-vulkan"),
                     "iree_base_runtime": _version("iree-base-runtime"),
                     "iree_base_compiler": _version("iree-base-compiler")},
        "git": git_commit(src),
        "settings": _settings(),
    }


def _settings() -> dict:
    """The settings that change a compiled program (the config's key fields), as this run
    reads them: the tables say which precision and paths their figures were made under."""
    import dataclasses

    from dynamo_vulkan import config
    cfg = config.load()
    return {f.name: str(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.metadata.get("key")}


def write_json(path: Path, env: dict, probes: dict, rows: list[Row], targets: list[TargetResult],
               notes: Notes, extra: dict) -> None:
    doc = {"record": env, "probes": probes, "rows": [r.as_dict() for r in rows],
           "targets": [t.as_dict() for t in targets], "notes": notes.items, **extra}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=_jsonable))
    os.replace(tmp, path)


def _jsonable(o):
    if hasattr(o, "item") and callable(o.item):      # numpy scalars
        return o.item()
    if isinstance(o, Stat):
        return o.as_dict()
    if isinstance(o, Path):
        return str(o)
    return repr(o)


def argv() -> list[str]:
    return sys.argv[1:]


def load_json(path: Path) -> dict:
    """A results.json read back: record, probes, rows (Row), targets (TargetResult), notes, extra."""
    doc = json.loads(Path(path).read_text())
    fields = Row.__dataclass_fields__
    rows = []
    for d in doc["rows"]:
        kw = {k: v for k, v in d.items() if k in fields}
        kw["ms"] = Stat(**d["ms"]) if d.get("ms") else None
        kw["gpu_ms"] = Stat(**d["gpu_ms"]) if d.get("gpu_ms") else None
        rows.append(Row(**kw))
    targets = [TargetResult(**t) for t in doc.get("targets", [])]
    for t in targets:       # files written before numpy scalars were converted hold "np.False_"
        if isinstance(t.met, str):
            t.met = t.met.endswith("True_") or t.met == "True"
    return {"record": doc["record"], "probes": doc.get("probes", {}), "rows": rows, "targets": targets,
            "notes": doc.get("notes", []), "extra": doc.get("extra", {})}
