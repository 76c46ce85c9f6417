"""Two or more versions of the code, timed side by side: the benchmark suites' rows for
each source tree in turn, in one run on one machine (lent machines differ by up to 16% on
a latency-bound decode, so versions are compared only within one run).

    python -m dynamo_vulkan.benchmarks.ab --tree A=/src/before --tree B=/src/after \\
        --models llama-7b.json.gz [--rounds 2] [--match decode] [-- more benchmark arguments]

A tree is a directory holding a `dynamo_vulkan` package (a checkout, `git archive`'s
output, an install's target directory). Each tree runs `python -m dynamo_vulkan.benchmarks`
in a process of its own with that tree first on PYTHONPATH, its own cache directory, and
a working directory outside every tree: `python -m` puts the working directory first on
sys.path, so a run started inside a checkout imports that checkout whatever PYTHONPATH
says. Before anything is timed, each tree's process must import dynamo_vulkan from
inside that tree, or the comparison stops. Rounds alternate the trees (A B A B), and the
summary gives each row's throughput per round and the ratio of each tree's median to the
first tree's.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# what a comparison runs unless told more: ours only, no reference backends
BENCH_ARGS = ("--no-inductor", "--no-eager", "--no-peers", "--keep-going")


class TreeError(RuntimeError):
    """A tree that is not one, or whose process imports dynamo_vulkan from elsewhere."""


def tree_env(tree: Path, cache: Path) -> dict:
    """The environment of a tree's processes: the tree first on PYTHONPATH (before what
    the caller's PYTHONPATH holds), its own cache directory."""
    env = dict(os.environ)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *rest])
    env["DYNAMO_VULKAN_CACHE_DIR"] = str(cache)
    return env


def imported_from(env: dict, cwd: Path) -> Path:
    """Where a process with this environment and working directory imports dynamo_vulkan."""
    code = "import dynamo_vulkan, sys; sys.stdout.write(dynamo_vulkan.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        raise TreeError(f"importing dynamo_vulkan failed:\n{out.stderr.strip()[-2000:]}")
    return Path(out.stdout).resolve().parent


def check_tree(name: str, tree: Path, env: dict, cwd: Path) -> None:
    """Raise TreeError unless the tree holds the package and its process imports it."""
    if not (tree / "dynamo_vulkan" / "__init__.py").is_file():
        raise TreeError(f"tree {name} ({tree}) has no dynamo_vulkan package")
    got = imported_from(env, cwd)
    if got != (tree / "dynamo_vulkan").resolve():
        raise TreeError(f"tree {name}: its process imports dynamo_vulkan from {got}, not from "
                        f"{tree}; run from a directory outside every tree and put nothing "
                        "that holds the package before it on sys.path")


def run_tree(name: str, tree: Path, models: list[str], extra: list[str], work: Path,
             round_: int) -> list[dict]:
    """One benchmark run of a tree: its result rows (results.json), [] if it wrote none."""
    out = work / f"{name}-{round_}"
    env = tree_env(tree, work / f"cache-{name}")
    cmd = [sys.executable, "-m", "dynamo_vulkan.benchmarks", *BENCH_ARGS, "--models", *models,
           "--out", str(out), *extra]
    with open(work / f"{name}-{round_}.log", "w") as log:
        subprocess.run(cmd, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT)
    results = out / "results.json"
    return json.loads(results.read_text())["rows"] if results.is_file() else []


def summary(runs: dict[str, list[list[dict]]], match: str) -> list[str]:
    """Lines of the rows whose workload matches `match`: each tree's throughput a round,
    its median, and that median over the first tree's."""
    pattern = re.compile(match)
    names = list(runs)
    values: dict[str, dict[str, list[float]]] = {}
    units: dict[str, str] = {}
    for name in names:
        for rows in runs[name]:
            for r in rows:
                if r.get("backend") == "vulkan" and r.get("throughput") and pattern.search(r["workload"]):
                    values.setdefault(r["workload"], {}).setdefault(name, []).append(r["throughput"])
                    units[r["workload"]] = r.get("unit", "")
    lines = []
    for workload, by_tree in values.items():
        base = statistics.median(by_tree[names[0]]) if names[0] in by_tree else None
        parts = []
        for name in names:
            got = by_tree.get(name)
            if not got:
                parts.append(f"{name} -")
                continue
            med = statistics.median(got)
            ratio = f" ({med / base:.3f}x)" if base and name != names[0] else ""
            parts.append(f"{name} " + " / ".join(f"{v:,.0f}" for v in got) + ratio)
        lines.append(f"{workload} [{units[workload]}]: " + "; ".join(parts))
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", action="append", required=True, metavar="NAME=DIR",
                   help="a source tree to time (two or more; the first is the baseline)")
    p.add_argument("--models", nargs="+", required=True, help="model names, GGUF files or skeletons")
    p.add_argument("--rounds", type=int, default=2, help="runs of each tree, alternating (default 2)")
    p.add_argument("--match", default="decode|prefill", help="regex of the workloads to summarise")
    p.add_argument("--work", default=None, help="directory for the runs' outputs and logs (default: a new one)")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more arguments for the benchmarks")
    a = p.parse_args(argv)
    trees = {}
    for spec in a.tree:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            p.error(f"--tree takes NAME=DIR, got {spec!r}")
        if name in trees:
            p.error(f"two trees named {name!r}")
        trees[name] = Path(path).resolve()
    if len(trees) < 2:
        p.error("give two or more trees to compare")
    work = Path(a.work or tempfile.mkdtemp(prefix="dvk-ab-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    for name, tree in trees.items():
        if work == tree or tree in work.parents:
            p.error(f"--work {work} is inside tree {name}; its runs would import that tree")
        check_tree(name, tree, tree_env(tree, work / f"cache-{name}"), work)
    extra = [x for x in a.extra if x != "--"]
    models = [str(Path(m).resolve()) if Path(m).exists() else m for m in a.models]
    runs: dict[str, list[list[dict]]] = {name: [] for name in trees}
    for r in range(a.rounds):
        for name, tree in trees.items():
            runs[name].append(run_tree(name, tree, models, extra, work, r + 1))
            print(f"[ab] {name} round {r + 1}: {len(runs[name][-1])} rows "
                  f"(log: {work / f'{name}-{r + 1}.log'})", flush=True)
    for line in summary(runs, a.match):
        print(line)
    print(f"[ab] outputs and logs in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
