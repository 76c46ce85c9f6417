"""Time to the first token of ``python -m dynamo_vulkan.generate`` in new processes.

    python -m dynamo_vulkan.benchmarks.cold_start smollm2 --runs 3

The first run fills a disk cache of its own (a new private directory unless --cache-dir
names one; traced graphs, plans, SPIR-V); each later run is a new process that starts
with that cache, as a user's second command does. Per run it prints the seconds from
launch to the first byte of generated text on stdout (the first token), the whole run's
wall time, and the CPU seconds the process used (user + system: on a shared machine the
wall time also counts others' work).

``--prompts A B ...`` gives the runs their prompts in turn (the filling run the first),
so a later process can meet a prompt length that no earlier run had:

    python -m dynamo_vulkan.benchmarks.cold_start smollm2 --runs 2 --prompts "Hi" "Hi there, how are you"
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

PROMPT = "The capital of France is"


def one_run(model: str, tokens: int, env: dict, extra: list[str],
            prompt: str = PROMPT) -> tuple[float, float, float]:
    """(seconds to the first stdout byte, wall seconds, CPU seconds) of one generate run."""
    cmd = [sys.executable, "-m", "dynamo_vulkan.generate", model, "-p", prompt, "-n", str(tokens), "-q", *extra]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    out = first + proc.stdout.read()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0 or not first:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {os.waitstatus_to_exitcode(status)}): "
                           f"{(out + err).decode(errors='replace')[-2000:]}")
    return t_first, wall, usage.ru_utime + usage.ru_stime


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynamo_vulkan.benchmarks.cold_start", description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default="smollm2", help="a .gguf file or a model name (default smollm2)")
    p.add_argument("--runs", type=int, default=3, help="runs after the one that fills the cache (default 3)")
    p.add_argument("-n", type=int, default=8, help="tokens per run (default 8)")
    p.add_argument("--cache-dir", default=None, help="the disk cache to use (default: a new private one)")
    p.add_argument("--prompts", nargs="+", default=[PROMPT], metavar="PROMPT",
                   help=f"the runs' prompts, taken in turn from the filling run on (default {PROMPT!r})")
    args, extra = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="dvk-cold-") as tmp:
        env = dict(os.environ, DYNAMO_VULKAN_CACHE_DIR=args.cache_dir or os.path.join(tmp, "cache"))
        print(f"cache {env['DYNAMO_VULKAN_CACHE_DIR']}; generate {args.model} -n {args.n} {' '.join(extra)}")
        for i in range(args.runs + 1):
            prompt = args.prompts[i % len(args.prompts)]
            first, wall, cpu = one_run(args.model, args.n, env, extra, prompt)
            label = "fills the cache" if i == 0 else f"run {i}"
            shown = f", prompt {prompt!r}" if len(args.prompts) > 1 else ""
            print(f"{label:>16}: first token {first:6.2f} s, whole run {wall:6.2f} s, CPU {cpu:6.2f} s{shown}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
