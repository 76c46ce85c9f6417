"""Where a decode step's GPU time goes: per-kernel GPU timestamps of greedy decode steps,
grouped by kernel, beside the bytes each group reads; with --prompt, where the prompt's
prefill (of --context tokens) goes instead.

    python -m dynamo_vulkan.benchmarks.decode_profile --models smollm2 llama-7b.json.gz --steps 16
    python -m dynamo_vulkan.benchmarks.decode_profile --models llama-7b.json.gz --context 512 --prompt

Runs generate() with DYNAMO_VULKAN_PROFILE=1 (timestamps around every dispatch; each
costs about a microsecond that an unprofiled step does not pay), collects the
"dynamo_vulkan.profile" tables of the k-step replays, and prints, per kernel name, the
dispatches and microseconds per step. The sum is the GPU-busy time of a step; the gap to
the wall time per token is launch, barrier and host time.
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from collections import defaultdict

ROW = re.compile(r"^\s*([0-9.]+) us\s+(\S+)(?:\s+(.*))?$")


class _Tables(logging.Handler):
    """Keeps the text of every profile table logged."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.tables: list[str] = []

    def emit(self, record):
        self.tables.append(record.getMessage())


def parse(table: str) -> list[tuple[str, str, float]]:
    """(kernel name, note, us) of each row of one profile table."""
    out = []
    for line in table.splitlines()[1:]:
        m = ROW.match(line)
        if m and m.group(2) != "total":
            out.append((m.group(2), m.group(3) or "", float(m.group(1))))
    return out


def summarise(rows: list[tuple[str, str, float]], steps: int) -> list[tuple[str, float, float]]:
    """(name, dispatches per step, us per step), largest time first."""
    count, total = defaultdict(int), defaultdict(float)
    for name, _note, us in rows:
        count[name] += 1
        total[name] += us
    return sorted(((n, count[n] / steps, total[n] / steps) for n in count), key=lambda r: -r[2])


def profile_model(entry: str, steps: int, skeleton_dir: str | None, layers: int | None = None,
                  dump: bool = False, context: int | None = None, prompt: bool = False) -> None:
    from .llm_models import resolve
    from .llm_work import model_work
    from dynamo_vulkan.llm.generate import generate, load, step_plan
    from dynamo_vulkan.runtime.plan import levels

    bench = resolve(entry, skeleton_dir, layers)
    model, tok = load(bench.path)
    work = model_work(bench.path)
    handler = _Tables()
    plog = logging.getLogger("dynamo_vulkan.profile")
    plog.setLevel(logging.INFO)
    plog.addHandler(handler)
    plog.propagate = False
    # a prompt of `context` token ids (the decode steps then attend over that many keys),
    # or a short sentence
    text = ([100 + i % 1000 for i in range(context)] if context
            else "The quick brown fox jumps over the lazy dog. " * 4)
    try:
        generate(model, text, tok, max_new_tokens=steps + 1, steps_per_call=steps, warmup=True,
                 stop_at_eos=False)
        handler.tables.clear()
        res = generate(model, text, tok, max_new_tokens=steps + 1, steps_per_call=steps, warmup=False,
                       stop_at_eos=False)
    finally:
        plog.removeHandler(handler)
    if prompt:
        _print_prompt(bench, res, handler.tables, dump)
        return
    tables = [t for t in handler.tables if len(parse(t)) > 50]
    if not tables:
        raise SystemExit(f"{bench.label}: no decode profile was logged (does decode replay on this device?)")
    rows = parse(tables[-1])
    summary = summarise(rows, steps)
    busy = sum(us for _n, _c, us in summary)
    print(f"\n{bench.label}: {bench.what}")
    print(f"decode {res.decode_tok_s:.1f} tok/s unprofiled-ish ({res.decode_steps} steps); "
          f"GPU busy {busy:.1f} us/step over {sum(c for _n, c, _u in summary):.0f} dispatches; "
          f"weights {work.step_bytes / 1e9:.3f} GB/step -> {work.step_bytes / busy / 1e3:.0f} GB/s while busy")
    plan = step_plan(model)
    if plan is not None and plan.dispatches:
        print(f"{levels(plan.dispatches)} barrier levels a step "
              f"({len(plan.dispatches)} kernels; kernels of a level run side by side)")
    print(f"{'kernel':40s} {'per step':>9s} {'us/step':>10s} {'share':>6s}")
    for name, c, us in summary:
        print(f"{name[:40]:40s} {c:9.1f} {us:10.1f} {us / busy:6.1%}")
    first = rows[: len(rows) // steps]
    print("dispatches of the first step:" if dump else "largest dispatches of the first step:")
    for name, note, us in (first if dump else sorted(first, key=lambda r: -r[2])[:25]):
        print(f"  {us:8.1f} us  {name} {note[:90]}")


def _print_prompt(bench, res, tables: list[str], dump: bool) -> None:
    """The prefill's table: of those the timed generate() logged, the one of most GPU time
    (a prompt placed on the host, as on a CPU device, logs none)."""
    if not tables:
        raise SystemExit(f"{bench.label}: no prefill profile was logged")
    rows = max((parse(t) for t in tables), key=lambda r: sum(us for _n, _c, us in r))
    summary = summarise(rows, 1)
    busy = sum(us for _n, _c, us in summary)
    print(f"\n{bench.label}: {bench.what}")
    from dynamo_vulkan import config
    print(f"prefill of {res.prefilled} tokens {res.prefill_s * 1e3:.2f} ms (profiled); GPU busy "
          f"{busy / 1e3:.2f} ms over {len(rows)} dispatches; matmul precision "
          f"{config.load().matmul_precision!r} (torch.set_float32_matmul_precision or "
          "DYNAMO_VULKAN_MATMUL_PRECISION)")
    print(f"{'kernel':40s} {'count':>6s} {'ms':>9s} {'share':>6s}")
    for name, c, us in summary:
        print(f"{name[:40]:40s} {c:6.0f} {us / 1e3:9.3f} {us / busy:6.1%}")
    print("dispatches in order:" if dump else "largest dispatches:")
    for name, note, us in (rows if dump else sorted(rows, key=lambda r: -r[2])[:25]):
        print(f"  {us:8.1f} us  {name} {note[:110]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["smollm2"], help="model names, GGUF files or skeletons")
    p.add_argument("--steps", type=int, default=16, help="decode steps per replay (default 16)")
    p.add_argument("--skeleton-dir", default=None)
    p.add_argument("--layers", type=int, default=None, help="keep only the first N layers")
    p.add_argument("--dump", action="store_true", help="list every dispatch of the first step in order")
    p.add_argument("--context", type=int, default=None, metavar="N",
                   help="a prompt of N token ids before the decode steps (default: a short sentence)")
    p.add_argument("--prompt", action="store_true",
                   help="profile the prompt's prefill (give --context) instead of the decode steps")
    args = p.parse_args(argv)
    if args.prompt and not args.context:
        p.error("--prompt needs --context N (the prompt's length)")
    os.environ["DYNAMO_VULKAN_PROFILE"] = "1"
    for m in args.models:
        profile_model(m, args.steps, args.skeleton_dir, args.layers, args.dump, args.context, args.prompt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
