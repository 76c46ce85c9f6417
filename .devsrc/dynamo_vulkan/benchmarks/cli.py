"""python -m dynamo_vulkan.benchmarks: measure workloads on our Vulkan backend beside eager CPU,
inductor CPU and the peers that are installed, in one run.

Writes to --out: results.json (the record: machine, device, driver, versions,
git commit, command line, date, probes, every row, the targets), table.md
(what is printed) and PNG plots (speed-up over eager CPU, latency spread,
LLM tokens/s). Every figure is a median after warm-up with its spread, and
every backend's output is checked against eager CPU in the same run.

Peers: IREE on Vulkan (pip install 'dynamo-vulkan[peers]') for the MLP and the
transformer block; llama.cpp's Vulkan backend for the GGUF models, found with
--llama-cpp [DIR] or LLAMA_CPP_DIR (its full-strength build where DIR holds both).
A missing peer is skipped with a note.

Any GGUF model, llama-bench style (prefill 512 / decode 128 and 128 / 64 by default;
see benchmarks/suites/llm.py, which also says how to run the 7B rows on a GPU machine):

    python -m dynamo_vulkan.benchmarks --models MODEL.gguf SKELETON.json.gz --llama-cpp [DIR]

Installed (pip install '.[bench]'), it runs from any directory, also as
`dynamo-vulkan-bench`; --out is relative to the current directory.

Times: "ms" is wall time per call (host clock, the call returned), except torch
CUDA's rows, whose "ms is" column says device (CUDA events); "device ms" is our
kernels' GPU timestamps. A graph our backend placed on the host (prompt-sized graphs
on a CPU Vulkan device such as lavapipe) is timed and checked as usual; its row says
"host" under "ran on" and has no device time.

Exit status: 1 when a row of ours is off eager CPU beyond its tolerance, a backend
failed on a workload, a model or kernel sweep failed, or a suite failed; with
--keep-going only the correctness failures count.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from . import plots, probes, record, suites, table, targets
from .harness import Bench, Options
from .peers import PeerUnavailable
from .timing import Plan

log = logging.getLogger("dynamo_vulkan.benchmarks")
OURS = ("vulkan", "vulkan_kernel")   # rows whose errors decide the exit status (a peer's are reported only)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynamo_vulkan.benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suites", default=None, help="comma-separated (see --list); default: all (with --models: llm)")
    p.add_argument("--list", action="store_true", help="list the suites and exit")
    p.add_argument("--reps", type=int, default=None, help="repetitions per figure after warm-up (default 20, --quick 3)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="time allowed per figure; slow calls get fewer repetitions, at least 3 (default 3, --quick 0.3)")
    p.add_argument("--out", default="bench-out",
                   help="output directory, relative to the current directory (default bench-out)")
    p.add_argument("--keep-going", action="store_true",
                   help="exit 0 although a backend, model or suite failed (the failures stay in the record); "
                        "results off eager CPU still fail the run")
    p.add_argument("--quick", action="store_true", help="small shapes, few repetitions (a smoke test: < 2 min on lavapipe)")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="start no suite after S seconds (the ones left are noted); results are written after each suite")
    p.add_argument("--no-inductor", action="store_true", help="leave out the inductor CPU baseline")
    p.add_argument("--no-peers", action="store_true", help="leave out IREE and llama.cpp")
    p.add_argument("--llama-cpp", default=None, metavar="DIR", nargs="?", const="auto",
                   help=f"llama.cpp with its Vulkan backend (default: ${'{'}LLAMA_CPP_DIR{'}'}): a build, or a folder of "
                        "builds (llama-cpp-full taken before llama-cpp); without DIR: ../shared/peers or "
                        ".device-kit/peers; see benchmarks/peers/llama_cpp.py")
    p.add_argument("--iree-target", default="auto", help="--iree-vulkan-target for IREE (auto: from the device name; "
                                                         "'default': IREE's portable baseline)")
    p.add_argument("--iree-vmfb-dir", default=None, metavar="DIR",
                   help="compiled IREE modules, reused and written here (default ~/.cache/dynamo_vulkan/iree)")
    p.add_argument("--gguf-skeletons", default=None, metavar="DIR",
                   help="NAME.json.gz skeletons (benchmarks/synth_model.py) for models that are not installed")
    llm = p.add_argument_group("llm suite", "any GGUF model, llama-bench style (benchmarks/suites/llm.py)")
    llm.add_argument("--models", nargs="+", action="extend", default=[], metavar="PATH_OR_SKELETON",
                     help="GGUF files, skeletons (NAME.json.gz), header-only chunks or known names (smollm2, gemma3) "
                          "timed instead of the default SmolLM2 and Gemma 3")
    llm.add_argument("--prompt-tokens", default=None, metavar="N,...",
                     help="prompt lengths (default with --models: 512,128; else 128)")
    llm.add_argument("--gen-tokens", default=None, metavar="N,...",
                     help="decode steps, one per prompt length or one for all (default with --models: 128,64; else 64)")
    llm.add_argument("--no-eager", action="store_true", help="leave eager CPU out of the llm suite (no error check)")
    llm.add_argument("--eager-max-gb", type=float, default=1.0, metavar="GB",
                     help="time eager CPU only for files up to GB (larger: one prefill and decode step still "
                          "check our logits; default 1)")
    llm.add_argument("--layers", type=int, default=None, metavar="N",
                     help="keep each model's first N layers (random weights, same shapes)")
    p.add_argument("--replot", default=None, metavar="RESULTS_JSON",
                   help="measure nothing: redraw table.md and the plots of a saved results.json into --out")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def _iree(args, device_name: str, bench_notes) -> object | None:
    from .peers.iree import IreePeer, auto_target

    target = {"auto": auto_target(device_name), "default": None}.get(args.iree_target, args.iree_target)
    vmfb_dir = Path(args.iree_vmfb_dir or Path.home() / ".cache" / "dynamo_vulkan" / "iree")
    try:
        return IreePeer(target, vmfb_dir)
    except PeerUnavailable as e:
        bench_notes.append(f"IREE skipped: {e}")
        return None


def _llama(args, tmp: Path, bench_notes) -> object | None:
    from .peers.llama_cpp import LlamaCppPeer, locate

    try:
        where = locate(args.llama_cpp)
    except PeerUnavailable as e:
        bench_notes.append(f"llama.cpp skipped: {e}")
        return None
    if where is None:
        try:
            import llama_cpp  # noqa: F401  (installed in the environment)
        except ImportError:
            bench_notes.append("llama.cpp skipped: not given (--llama-cpp DIR or LLAMA_CPP_DIR) and not installed")
            return None
    try:
        return LlamaCppPeer(where, tmp)
    except PeerUnavailable as e:
        bench_notes.append(f"llama.cpp skipped: {e}")
        return None


class Interrupted(BaseException):
    """SIGTERM (e.g. from `timeout`): stop measuring, then write what was measured."""


def _lengths(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: {text!r} is not a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{what}: {text!r}: give lengths of at least 1")
    return out


def llm_settings(args):
    """The llm suite's Settings from the command line. The (prompt, decode) pairs zip the
    two lists; a list of one length serves every entry of the other, and a list not given
    is the default's (512,128 / 128,64 with --models, else 128 / 64) where it has as
    many entries as the given one, else the default's first."""
    from .suites.llm import GIVEN_CASES, Settings

    prompts, gens = _lengths(args.prompt_tokens, "--prompt-tokens"), _lengths(args.gen_tokens, "--gen-tokens")
    cases = None
    if prompts or gens:
        default = GIVEN_CASES if args.models else ((128, 64),)
        dp, dg = [n for n, _ in default], [g for _, g in default]
        prompts = prompts or (dp if len(dp) == len(gens) else dp[:1])
        gens = gens or (dg if len(dg) == len(prompts) else dg[:1])
        if len(prompts) == 1:
            prompts = prompts * len(gens)
        if len(gens) == 1:
            gens = gens * len(prompts)
        if len(prompts) != len(gens):
            raise argparse.ArgumentTypeError(f"--prompt-tokens {args.prompt_tokens} and --gen-tokens "
                                             f"{args.gen_tokens}: give as many of each, or one of either")
        cases = list(zip(prompts, gens))
    if args.layers is not None and args.layers < 1:
        raise argparse.ArgumentTypeError(f"--layers {args.layers}: keep at least one layer")
    return Settings(models=list(args.models), cases=cases, eager=not args.no_eager,
                    eager_max_bytes=args.eager_max_gb * 1e9, layers=args.layers, reps=args.reps)


def _interrupt(signum, frame):
    raise Interrupted()


def _write(out: Path, env: dict, probe_results: dict, bench: Bench, args, names, plan) -> str:
    """results.json and table.md from the rows so far; returns the table text."""
    results = targets.resolve(bench.targets, bench.rows, bench.extra.get("memory_targets", []))
    extra = {k: v for k, v in bench.extra.items() if k != "memory_targets"}
    record.write_json(out / "results.json", env, probe_results, bench.rows, results, bench.notes,
                      {"extra": extra, "options": {"quick": args.quick, "suites": names, "reps": plan.reps,
                                                   "max_seconds": plan.max_s, "budget_s": args.budget}})
    text = tables_text(env, probe_results, bench.rows, results, bench.notes.items)
    (out / "table.md").write_text(text + "\n")
    return text


def tables_text(env: dict, probe_results: dict, rows, results, notes: list[str]) -> str:
    return "\n\n".join([table.header(env, probe_results), table.rows_table(rows), "Targets (issue 6):",
                        table.targets_table(results), "Notes:\n" + "\n".join(f"- {n}" for n in notes)])


def _plots(rows, out: Path, title: str) -> list[Path]:
    """The PNG plots, or none (with a warning) where matplotlib is missing: the record and
    the table are already written."""
    try:
        return plots.draw_all(rows, out, title)
    except ImportError as e:
        log.warning("plots not drawn: %s (pip install 'dynamo-vulkan[bench]')", e)
        return []


def replot(results_json: Path, out: Path) -> int:
    """The table and plots of a saved run, drawn again (the numbers are the run's, untouched)."""
    doc = record.load_json(results_json)
    out.mkdir(parents=True, exist_ok=True)
    text = tables_text(doc["record"], doc["probes"], doc["rows"], doc["targets"], doc["notes"])
    (out / "table.md").write_text(text + "\n")
    made = _plots(doc["rows"], out, f"{doc['record']['device'].get('name')} - {doc['record']['date']}")
    sys.stdout.write(text + "\n\nwrote " + ", ".join(str(p) for p in [out / "table.md", *made]) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if args.list:
        for name in suites.NAMES:
            print(f"{name:14s} {suites.load(name).DESCRIPTION}")
        return 0
    if args.replot:
        return replot(Path(args.replot), Path(args.out))
    chosen = args.suites or ("llm" if args.models else ",".join(suites.NAMES))
    names = [s.strip() for s in chosen.split(",") if s.strip()]
    unknown = [n for n in names if n not in suites.NAMES]
    if unknown:
        parser().error(f"unknown suite(s) {unknown}; choose from {', '.join(suites.NAMES)}")
    try:
        llm = llm_settings(args)
    except argparse.ArgumentTypeError as e:
        parser().error(str(e))
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("DYNAMO_VULKAN_FALLBACK", "silent")   # the rows count CPU nodes instead

    import torch

    import dynamo_vulkan

    torch.manual_seed(0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="dvk-bench-"))
    plan = Plan(reps=args.reps or (3 if args.quick else 20), warmup=1 if args.quick else 3,
                max_s=args.max_seconds or (0.3 if args.quick else 3.0))
    early_notes: list[str] = []
    if not dynamo_vulkan.is_available():
        early_notes.append("no Vulkan device: " + str(dynamo_vulkan.device_info().get("reason")))
    env = record.environment(argv)
    try:
        probe_results = probes.run_all(args.quick, plan)
        if args.quick and not args.no_inductor:
            early_notes.append("inductor CPU left out in --quick (its cold C++ compiles alone would take most of "
                               "the two minutes on a small machine)")
        opts = Options(quick=args.quick, plan=plan, inductor=not (args.no_inductor or args.quick),
                       cuda=probes.cuda_available(),
                       skeleton_dir=args.gguf_skeletons, work_dir=tmp, llm=llm)
        if not args.no_peers and {"mlp", "block"} & set(names):
            opts.iree = _iree(args, env["device"].get("name", ""), early_notes)
        if not args.no_peers and "llm" in names:
            opts.llama_cpp = _llama(args, tmp, early_notes)
        if args.no_peers:
            early_notes.append("peers left out (--no-peers)")
        bench = Bench(opts, probe_results)
        for n in early_notes:
            bench.note("run", n)
        failed_suites = []
        bar = tqdm(names, desc="suites", unit="suite", file=sys.stderr, dynamic_ncols=True)
        seconds = bench.extra.setdefault("suite_seconds", {})
        cpu_seconds = bench.extra.setdefault("suite_cpu_seconds", {})   # this process's CPU time (all threads)
        started = time.perf_counter()
        opts.deadline = started + args.budget if args.budget else None
        signal.signal(signal.SIGTERM, _interrupt)
        for name in bar:
            bar.set_postfix_str(name)
            if args.budget and time.perf_counter() - started > args.budget:
                bench.note(name, f"not run: the --budget of {args.budget:g} s was spent")
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                suites.load(name).run(bench)
            except Interrupted:
                bench.note(name, "interrupted (SIGTERM): the rows so far are kept, later suites not run")
                break
            except Exception as e:
                log.exception("suite %s failed", name)
                bench.note(name, f"suite failed: {type(e).__name__}: {e}")
                failed_suites.append(name)
            finally:
                seconds[name] = round(time.perf_counter() - t0, 1)
                cpu_seconds[name] = round(time.process_time() - c0, 1)
            _write(out, env, probe_results, bench, args, names, plan)   # a run cut short keeps what it has
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        text = _write(out, env, probe_results, bench, args, names, plan)
        title = f"{env['device'].get('name')} - {env['date']}"
        made = _plots(bench.rows, out, title)
        sys.stdout.write(text + "\n\nwrote " + ", ".join(str(p) for p in [out / "results.json", out / "table.md", *made]) + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return exit_status(bench, failed_suites, args.keep_going)


def exit_status(bench: Bench, failed_suites: list[str], keep_going: bool = False) -> int:
    """1 (the reasons on stderr) when a row of ours is off eager CPU beyond its tolerance,
    or, unless ``keep_going``, a row failed (its backend raised), a model or kernel sweep
    failed, or a suite failed; else 0."""
    bad = [f"{r.workload} [{r.backend}] err {r.err:.2e} > tol {r.tol:.2e}" for r in bench.rows
           if r.ok is False and r.backend in OURS]
    failed = ([f"{r.suite} {r.workload} [{r.backend}] {r.note}" for r in bench.rows if r.failed]
              + bench.failures + [f"suite {s}" for s in failed_suites])
    if failed and keep_going:
        sys.stderr.write(f"{len(failed)} failure(s) kept going past (--keep-going):\n" + "\n".join(failed) + "\n")
        failed = []
    if bad or failed:
        sys.stderr.write("correctness or run failures:\n" + "\n".join(bad + failed) + "\n")
        return 1
    return 0
