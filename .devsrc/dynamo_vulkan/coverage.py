"""ATen coverage measured with PyTorch's own OpInfo suite.

    python -m dynamo_vulkan.coverage [--ops GLOB ...] [--max-samples N]
                                     [--shard I/N] [--json FILE] [--out docs/ops.md]
    python -m dynamo_vulkan.coverage --merge shard0.json shard1.json ... --out docs/ops.md

Every float32 sample of every OpInfo in
`torch.testing._internal.common_methods_invocations.op_db` that supports
float32 on the CPU (less the families listed in EXCLUDED_PREFIXES and the
random or uninitialised-output ops in EXCLUDED_OPS) is compiled with
backend="vulkan" under DYNAMO_VULKAN_FALLBACK=error and fullgraph=True, run,
and compared with eager. Each sample ends as one of

- pass:     compiled, no CPU fallback, matches eager (rtol/atol 1e-4, NaNs equal)
- fallback: some node would run on the CPU (no lowering, unsupported dtype or
            form, or a Dynamo graph break, which leaves the op to eager Python)
- mismatch: ran on Vulkan but the result differs from eager
- error:    anything else that raised (the reason is the exception)

A shard writes JSON; --merge (or a single run with --out) writes the
markdown report with totals, per-op counts and every non-passing sample.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import datetime
import fnmatch
import json
import logging
import os
import re
import signal
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

RTOL = ATOL = 1e-4
SAMPLE_TIMEOUT_S = 300   # the worker is killed past this; the sample itself gives up at 4/5
STATUSES = ("pass", "fallback", "mismatch", "error")

EXCLUDED_PREFIXES = {
    "linalg.": "linear algebra (linalg.*) is out of scope",
    "fft.": "FFTs (fft.*) are out of scope",
    "special.": "special functions (special.*) are out of scope",
    "sparse.": "sparse tensors are out of scope",
}
_RANDOM = "random sampling: eager and compiled draw different numbers"
_UNINIT = "uninitialised output: the values are undefined, nothing to compare"
EXCLUDED_OPS = {
    "bernoulli": _RANDOM, "cauchy": _RANDOM, "exponential": _RANDOM, "geometric": _RANDOM,
    "log_normal": _RANDOM, "normal": _RANDOM, "normal.in_place": _RANDOM,
    "normal.number_mean": _RANDOM, "uniform": _RANDOM, "multinomial": _RANDOM,
    "rand_like": _RANDOM, "randint": _RANDOM, "randint_like": _RANDOM, "randn": _RANDOM,
    "randn_like": _RANDOM, "nn.functional.dropout": _RANDOM, "nn.functional.dropout2d": _RANDOM,
    "nn.functional.dropout3d": _RANDOM, "nn.functional.alpha_dropout": _RANDOM,
    "nn.functional.feature_alpha_dropout.with_train": _RANDOM,
    "nn.functional.feature_alpha_dropout.without_train": _RANDOM,
    "nn.functional.rrelu": _RANDOM, "nn.functional.fractional_max_pool2d": _RANDOM,
    "nn.functional.fractional_max_pool3d": _RANDOM, "svd_lowrank": _RANDOM,
    "pca_lowrank": _RANDOM,
    "to_sparse": "sparse tensors are out of scope",
}
# what OpInfo's has_nondeterministic_output marks (torch 2.11 has no such attribute)
UNINITIALISED = {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                 "new_empty_strided"}


@dataclass
class Outcome:
    status: str
    reason: str = ""
    desc: str = ""
    index: int = -1       # position in the OpInfo's sample_inputs


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def exclusion(op) -> str | None:
    """Why an OpInfo is not counted, or None if it is."""
    name = op_name(op)
    for prefix, why in EXCLUDED_PREFIXES.items():
        if name.startswith(prefix):
            return why
    if name in EXCLUDED_OPS:
        return EXCLUDED_OPS[name]
    if getattr(op, "has_nondeterministic_output", False) or name in UNINITIALISED:
        return _UNINIT
    return None


def select_ops(patterns: list[str] | None):
    """(counted OpInfos, {name: why excluded}) for float32-on-CPU OpInfos."""
    from torch.testing._internal.common_methods_invocations import op_db
    counted, excluded = [], {}
    for op in op_db:
        name = op_name(op)
        if patterns and not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            continue
        if torch.float32 not in op.supported_dtypes("cpu"):
            continue
        why = exclusion(op)
        if why:
            excluded[name] = why
        else:
            counted.append(op)
    return counted, excluded


# --- one sample ---------------------------------------------------------------------------
def describe(sample) -> str:
    def d(x):
        if isinstance(x, torch.Tensor):
            s = "x".join(map(str, x.shape)) or "scalar"
            dt = "" if x.dtype == torch.float32 else f" {str(x.dtype).replace('torch.', '')}"
            nc = "" if x.is_contiguous() else " nc"
            return f"T[{s}{dt}{nc}]"
        if isinstance(x, (list, tuple)):
            return "(" + ", ".join(d(y) for y in x) + ("," if len(x) == 1 else "") + ")"
        return repr(x) if not callable(x) else getattr(x, "__name__", "fn")
    parts = [d(sample.input)] + [d(a) for a in sample.args] + \
        [f"{k}={d(v)}" for k, v in sample.kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= 160 else text[:157] + "..."


def _clone(x):
    from torch.utils import _pytree as pytree
    return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def _compare(got, expected, path="out") -> str | None:
    """None if got matches expected, else what differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path}: expected a tensor, got {type(got).__name__}"
        if got.shape != expected.shape or got.dtype != expected.dtype:
            return (f"{path}: expected {tuple(expected.shape)} {expected.dtype}, "
                    f"got {tuple(got.shape)} {got.dtype}")
        try:
            torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
        except AssertionError as e:
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            detail = "; ".join(ln for ln in lines if ln.startswith(("Mismatched", "Greatest")))
            return f"{path}: {detail or lines[0]}"
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(expected):
            return f"{path}: expected a sequence of {len(expected)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            why = _compare(g, e, f"{path}[{i}]")
            if why:
                return why
        return None
    if isinstance(expected, float) and isinstance(got, float):
        if abs(got - expected) <= ATOL + RTOL * abs(expected) or (got != got and expected != expected):
            return None
    if got != expected:
        return f"{path}: expected {expected!r}, got {got!r}"
    return None


_FALLBACK_RE = re.compile(r"(\S+) \((\S+)\) would run on the CPU: (.*?) \(DYNAMO_VULKAN_FALLBACK")
_LOWER_RE = re.compile(r"could not be lowered for inputs .*?: (.*) \(DYNAMO_VULKAN_FALLBACK", re.S)


def _first_line(text: str, limit: int = 200) -> str:
    """The first informative line (Dynamo's "backend='vulkan' raised:" header skipped)."""
    line = next((ln.strip() for ln in text.splitlines()
                 if ln.strip() and not ln.strip().endswith("raised:")), "")
    return line if len(line) <= limit else line[:limit - 3] + "..."


def classify(exc: BaseException) -> Outcome:
    """Map an exception from compiling or running a sample to fallback/error."""
    from torch._dynamo.exc import Unsupported
    from .backend import VulkanFallbackError
    from .lowering import RuleBugError
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:        # a rule's bug (outside strict mode) is an error, not a fallback
        if isinstance(e, RuleBugError):
            return Outcome("error", _first_line(str(e)))
    for e in chain:
        if isinstance(e, VulkanFallbackError):
            text = str(e)
            m = _FALLBACK_RE.search(text)
            if m:
                return Outcome("fallback", f"{m.group(1)}: {m.group(3)}")
            m = _LOWER_RE.search(text)
            return Outcome("fallback", _first_line(m.group(1) if m else text))
    for e in chain:
        if isinstance(e, Unsupported):
            return Outcome("fallback", "Dynamo graph break: " + _first_line(str(e)))
        if type(e).__name__ == "UserError" and "data-dependent" in str(e):
            # Python control flow on a tensor's value: Dynamo cannot put it in one graph
            return Outcome("fallback", "Dynamo graph break (data-dependent control flow): " +
                           _first_line(str(e)))
    return Outcome("error", f"{type(exc).__name__}: {_first_line(str(exc))}")


class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: int):
    def fire(*_):
        raise SampleTimeout(f"sample took more than {seconds} s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _seeded_outside():
    """OpInfo wraps some ops (attention, dropout) in wrapper_set_seed, which saves and
    restores the RNG state around the call: Python code Dynamo cannot trace, and no
    part of the op. Seed the same way outside the call instead, for eager and
    compiled runs alike."""
    from torch.testing._internal import common_methods_invocations as cmi
    saved = cmi.wrapper_set_seed
    cmi.wrapper_set_seed = lambda fn, *args, **kwargs: fn(*args, **kwargs)
    state = torch.get_rng_state()
    torch.manual_seed(42)
    try:
        yield
    finally:
        cmi.wrapper_set_seed = saved
        torch.set_rng_state(state)


def sample_call(op, sample):
    """(call, tensors): op applied to an OpInfo sample as a function of the sample's
    tensors only (its other arguments held as constants), and those tensors."""
    from torch.utils import _pytree as pytree
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    where = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    consts = [None if isinstance(x, torch.Tensor) else x for x in leaves]

    def call(*tensors):
        full = list(consts)
        for i, t in zip(where, tensors):
            full[i] = t
        inp, args, kwargs = pytree.tree_unflatten(full, spec)
        return op(inp, *args, **kwargs)
    return call, [leaves[i] for i in where]


def run_sample(op, sample) -> Outcome | None:
    """Compile one sample with backend="vulkan" and compare with eager.
    None when eager itself raises (the sample is not counted)."""
    call, tensors = sample_call(op, sample)
    try:
        with warnings.catch_warnings(), _seeded_outside():
            warnings.simplefilter("ignore")
            expected = call(*_clone(tensors))
    except Exception:
        return None
    torch._dynamo.reset()
    try:
        with _time_limit(SAMPLE_TIMEOUT_S * 4 // 5), warnings.catch_warnings(), \
                _seeded_outside():
            warnings.simplefilter("ignore")
            got = torch.compile(call, backend="vulkan", fullgraph=True, dynamic=False)(
                *_clone(tensors))
    except SampleTimeout as e:
        return Outcome("error", str(e))
    except Exception as e:                                    # noqa: BLE001 - classified
        return classify(e)
    why = _compare(got, expected)
    return Outcome("mismatch", why) if why else Outcome("pass")


def run_op(op, max_samples: int | None, start: int = 0, on_sample=None) -> list[Outcome]:
    """Outcomes (with .index, the sample's position) of op's samples from `start`;
    on_sample(k) is called before sample k runs."""
    out = []
    torch.manual_seed(0)
    try:
        samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))
    except Exception as e:                                    # noqa: BLE001
        log.warning("%s: sample_inputs failed: %s", op_name(op), e)
        return out
    for k, sample in enumerate(samples[:max_samples] if max_samples else samples):
        if k < start:
            continue
        if on_sample:
            on_sample(k)
        o = run_sample(op, sample)
        if o is not None:
            o.desc = describe(sample)
            o.index = k
            out.append(o)
    return out


# --- isolation: samples run in a worker process that a crash or hang cannot take down ----
def worker(job: dict) -> None:
    """Run job["units"] ([op, first sample, end sample or None], ...) from unit job["op"],
    sample job["sample"], printing JSON lines: {"start": [op, k]} before a sample,
    {"outcome": [op, {...}]} after it, {"done": unit index} after a unit."""
    by_name = {op_name(op): op for op in select_ops(sorted({u[0] for u in job["units"]}))[0]}

    def emit(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
    for i, (name, first, end) in enumerate(job["units"]):
        if i < job["op"]:
            continue
        start = job["sample"] if i == job["op"] else first
        for o in run_op(by_name[name], end, start,
                        on_sample=lambda k, name=name: emit({"start": [name, k]})):
            emit({"outcome": [name, o.__dict__]})
        emit({"done": i})


def run_isolated(units: list, max_samples: int | None = None, progress: bool = True,
                 label: str = "opinfo", worker_cmd: list[str] | None = None,
                 on_op_done=None) -> dict:
    """Run units (op names, or [op, first sample, end sample or None]) in a worker
    process; a sample that crashes the process (a driver fault) or runs past
    SAMPLE_TIMEOUT_S is recorded as an error and the worker restarts after it.
    worker_cmd: the worker's command line before its JSON job; on_op_done(results):
    called after each unit (to save partial results)."""
    import queue
    import subprocess
    import threading
    from tqdm import tqdm
    units = [[u, 0, max_samples] if isinstance(u, str) else list(u) for u in units]
    results: dict[str, list] = {u[0]: [] for u in units}
    bar = tqdm(total=len(units), desc=label, unit="op", disable=not progress)
    counts = collections.Counter()
    pos = (0, units[0][1] if units else 0)        # (unit index, sample) to start from
    while pos[0] < len(units):
        job = {"units": units, "op": pos[0], "sample": pos[1]}
        cmd = worker_cmd or [sys.executable, "-m", "dynamo_vulkan.coverage", "--worker"]
        proc = subprocess.Popen(cmd + [json.dumps(job)], stdout=subprocess.PIPE, text=True)
        signal.signal(signal.SIGTERM, lambda *_, p=proc: (p.kill(), sys.exit(143)))
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout] + [lines.put(None)],
                         daemon=True).start()
        current, progressed, unit = None, False, pos[0]
        while True:
            try:
                line = lines.get(timeout=SAMPLE_TIMEOUT_S)
            except queue.Empty:
                proc.kill()
                why = f"timed out (no result in {SAMPLE_TIMEOUT_S} s)"
                break
            if line is None:
                why = f"the process died (exit status {proc.wait()})"
                break
            msg = json.loads(line)
            if "start" in msg:
                current = msg["start"]
                progressed = True
            elif "outcome" in msg:
                name, o = msg["outcome"]
                results[name].append(o)
                counts[o["status"]] += 1
                current = None
            elif "done" in msg:
                bar.update(1)
                bar.set_postfix(dict(counts), refresh=True)
                unit = msg["done"] + 1
                pos = (unit, units[unit][1] if unit < len(units) else 0)
                if on_op_done:
                    on_op_done(results)
        proc.wait()
        if current is None:
            if pos[0] < len(units) and not progressed:
                raise RuntimeError(f"the coverage worker {why} before running a sample")
            continue
        name, k = current
        results[name].append({"status": "error", "reason": why, "desc": "", "index": k})
        counts["error"] += 1
        pos = (unit, k + 1)
    bar.close()
    return results


UNIT_SAMPLES = 200   # a shard's unit of work: at most this many samples of one op


def shard_units(ops, max_samples: int | None, n: int) -> list[list]:
    """The ops' samples cut into units of at most UNIT_SAMPLES and dealt to n shards,
    largest first to the least loaded (an op of 1440 samples does not hold one shard
    up while the others idle). [shard][unit] = [op, first sample, end sample]."""
    loads, shards = [0] * n, [[] for _ in range(n)]
    units = []
    for op in ops:
        torch.manual_seed(0)
        try:
            count = len(list(op.sample_inputs("cpu", torch.float32, requires_grad=False)))
        except Exception:                                     # noqa: BLE001 - run_op logs it
            count = 1
        count = min(count, max_samples) if max_samples else count
        for first in range(0, max(count, 1), UNIT_SAMPLES):
            units.append([op_name(op), first, min(count, first + UNIT_SAMPLES)])
    for u in sorted(units, key=lambda u: u[1] - u[2]):       # largest first
        k = loads.index(min(loads))
        shards[k].append(u)
        loads[k] += u[2] - u[1]
    return shards


def run(ops, max_samples: int | None = None, shard: tuple[int, int] = (0, 1),
        progress: bool = True, on_op_done=None) -> dict:
    """{op name: [Outcome-as-dict, ...]} for this shard's share of the samples."""
    i, n = shard
    units = [[op_name(op), 0, max_samples] for op in ops] if n == 1 else \
        shard_units(ops, max_samples, n)[i]
    return run_isolated(units, None, progress, label=f"opinfo {i}/{n}", on_op_done=on_op_done)


def merge_results(into: dict, more: dict) -> dict:
    """Add one result set's samples to another: an op's samples from several shards
    are joined, and a sample run again replaces the earlier run of it."""
    for name, outs in more.items():
        by_index = {o["index"]: o for o in into.get(name, [])}
        by_index.update({o["index"]: o for o in outs})
        into[name] = [by_index[k] for k in sorted(by_index)]
    return into


# --- report ---------------------------------------------------------------------------------
def totals(results: dict) -> collections.Counter:
    c = collections.Counter()
    for outs in results.values():
        c.update(o["status"] for o in outs)
    return c


def _reason_key(reason: str) -> str:
    """A reason with sample-specific details (shapes, numbers) blurred, for ranking."""
    return re.sub(r"\d+", "N", reason)[:120]


def markdown(results: dict, excluded: dict, meta: dict) -> str:
    c = totals(results)
    counted = sum(c.values())
    pct = 100.0 * c["pass"] / counted if counted else 0.0
    lines = [
        "# ATen coverage: PyTorch OpInfo samples through backend=\"vulkan\"",
        "",
        "Generated by `python -m dynamo_vulkan.coverage` (see its docstring for the method): every "
        "float32 sample of every counted OpInfo in `op_db`, compiled with `fullgraph=True` under "
        "`DYNAMO_VULKAN_FALLBACK=error` and compared with eager (rtol = atol = 1e-4).",
        "",
        f"- device: {meta.get('device', '?')}; torch {meta.get('torch', '?')}; "
        f"commit {meta.get('commit', '?')}; generated {meta.get('date', '?')}",
        f"- OpInfos counted: {len(results)}; excluded: {len(excluded)} (listed at the end)",
        "",
        "## Totals",
        "",
        "| samples | pass | fallback | mismatch | error | pass % |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
        f"| {counted} | {c['pass']} | {c['fallback']} | {c['mismatch']} | {c['error']} | "
        f"{pct:.1f} |",
        "",
        "## Most common reasons a sample does not pass",
        "",
        "| samples | ops | status: reason |",
        "| ---: | ---: | --- |",
    ]
    reasons = collections.Counter()
    reason_ops = collections.defaultdict(set)
    for name, outs in results.items():
        for o in outs:
            if o["status"] != "pass":
                k = f"{o['status']}: {_reason_key(o['reason'])}"
                reasons[k] += 1
                reason_ops[k].add(name)
    for k, n in reasons.most_common(40):
        lines.append(f"| {n} | {len(reason_ops[k])} | {_md(k)} |")
    lines += ["", "## Per op", "", "| op | samples | pass | fallback | mismatch | error |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in sorted(results):
        oc = collections.Counter(o["status"] for o in results[name])
        lines.append(f"| {name} | {len(results[name])} | {oc['pass']} | {oc['fallback']} | "
                     f"{oc['mismatch']} | {oc['error']} |")
    lines += ["", "## Samples that do not pass", "",
              "Sample numbers are positions in the OpInfo's `sample_inputs(\"cpu\", float32)`; "
              "`T[2x3 int64 nc]` is a tensor of that shape (dtype if not float32, `nc` if "
              "non-contiguous).", ""]
    for name in sorted(results):
        bad = [(o.get("index", k), o) for k, o in enumerate(results[name])
               if o["status"] != "pass"]
        if not bad:
            continue
        lines.append(f"### {name}")
        lines.append("")
        for k, o in bad:
            desc = f" — `{o['desc']}`" if o["desc"] else ""
            lines.append(f"- #{k} {o['status']}: {_md(o['reason'])}{desc}")
        lines.append("")
    lines += ["## Excluded OpInfos", "", "| op | why |", "| --- | --- |"]
    for name in sorted(excluded):
        lines.append(f"| {name} | {excluded[name]} |")
    return "\n".join(lines) + "\n"


def compare(a: dict, b: dict) -> tuple[int, list]:
    """Samples present in both result sets (same op, position and description) and
    the ones whose status differs: (count, [(op, index, status a, status b, reasons)])."""
    both, differ = 0, []
    for name, outs in a.items():
        other = {(o["index"], o["desc"]): o for o in b.get(name, [])}
        for o in outs:
            p = other.get((o["index"], o["desc"]))
            if p is None:
                continue
            both += 1
            if p["status"] != o["status"]:
                differ.append((name, o["index"], o["status"], p["status"],
                               o["reason"][:120], p["reason"][:120]))
    return both, differ


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _meta() -> dict:
    from . import device
    info = device.device_info() if device.is_available() else {"name": "no Vulkan device"}
    return {"device": info.get("name", "?"), "torch": torch.__version__,
            "date": datetime.date.today().isoformat(), "commit": _commit()}


def _commit() -> str:
    """The source checkout's commit, if this runs from one."""
    import subprocess
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).resolve().parent, timeout=10)
        return out.stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", nargs="*", help="OpInfo names or globs (default: all counted)")
    p.add_argument("--max-samples", type=int, default=None, help="samples per op (default: all)")
    p.add_argument("--shard", default="0/1",
                   help="I/N: run the I-th of N shares of the samples (balanced by sample count)")
    p.add_argument("--json", type=Path, default=None, help="write this shard's raw results here")
    p.add_argument("--out", type=Path, default=None,
                   help="markdown report (default docs/ops.md for a full single run)")
    p.add_argument("--merge", nargs="*", type=Path, default=None,
                   help="merge shard JSON files into the markdown report instead of running")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"),
                   help="compare two result sets (JSON shard files, or directories of them)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--worker", help=argparse.SUPPRESS)      # internal: a JSON job
    a = p.parse_args(argv)
    os.environ["DYNAMO_VULKAN_FALLBACK"] = "error"
    # a private on-disk cache unless one is named: measure this code, not old plans
    os.environ.setdefault("DYNAMO_VULKAN_CACHE_DIR", tempfile.mkdtemp(prefix="dvk-coverage-"))
    logging.basicConfig(level=logging.WARNING)
    if a.worker:
        warnings.simplefilter("ignore")
        worker(json.loads(a.worker))
        return 0
    if a.compare:
        sets = []
        for path in a.compare:
            files = sorted(path.glob("*.json")) if path.is_dir() else [path]
            merged = {}
            for f in files:
                merge_results(merged, json.loads(f.read_text())["results"])
            sets.append(merged)
        both, differ = compare(*sets)
        print(f"{both} samples in both; {both - len(differ)} agree, {len(differ)} differ")
        for row in differ:
            print("  " + " | ".join(str(x) for x in row))
        return 0
    if a.merge is not None:
        results, excluded, meta = {}, {}, {}
        for f in a.merge:
            data = json.loads(f.read_text())
            merge_results(results, data["results"])   # a sample run again: the later file's
            excluded.update(data["excluded"])
            if not data["meta"].get("partial"):
                commits = {meta.get("commit"), data["meta"].get("commit")} - {None}
                meta = {**data["meta"], "commit": "+".join(sorted(commits))}
        out = a.out or Path("docs/ops.md")
    else:
        i, n = (int(x) for x in a.shard.split("/"))
        if not 0 <= i < n:
            p.error(f"--shard {a.shard}: need 0 <= I < N")
        ops, excluded = select_ops(a.ops)
        if not ops:
            p.error(f"no counted OpInfo matches {a.ops}")
        t0 = time.time()

        def save(results, meta=None):
            if a.json:
                a.json.parent.mkdir(parents=True, exist_ok=True)
                tmp = a.json.with_suffix(".part")
                tmp.write_text(json.dumps({"results": results, "excluded": excluded,
                                           "meta": meta or {"partial": True}}, indent=0))
                tmp.replace(a.json)
        results = run(ops, a.max_samples, (i, n), progress=not a.no_progress, on_op_done=save)
        meta = _meta() | {"seconds": round(time.time() - t0, 1)}
        save(results, meta)
        full = not a.ops and not a.max_samples and n == 1
        out = a.out or (Path("docs/ops.md") if full else None)
    c = totals(results)
    counted = sum(c.values())
    print(f"{counted} samples: " + ", ".join(f"{s} {c[s]}" for s in STATUSES) +
          (f" ({100.0 * c['pass'] / counted:.1f}% pass)" if counted else ""))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown(results, excluded, meta))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
