r"""GGUF language models: prefill and decode tokens/s beside eager CPU and llama.cpp.

Ours is dynamo_vulkan.llm.generate.generate with backend="vulkan" (compiled once,
then timed over repetitions; greedy decode runs its default steps_per_call steps per
GPU submit, the argmax on the GPU); eager CPU is the same call uncompiled; the peer
is llama.cpp's Vulkan backend fed the same token ids (the prompt, then the
tokens our run generated, one per step). Prompts are exactly N token ids.
Errors against eager: the prefill's logits (prefill rows), the logits of one
decode step after it (decode rows), and greedy tokens compared step by step.

Default run: SmolLM2-135M (Q4_1) and Gemma 3 270M (Q4_K_M), a 128-token prompt
then 64 decode steps. Models come from dynamo_vulkan.llm.generate.find_model (the
`models` extra). Where one is missing, a skeleton (``--gguf-skeletons DIR``, see
synth_model.py) gives a same-shaped model with random weights; without either
the model is skipped with a note. ``--quick`` runs SmolLM2's first layer only
(random weights).

``--models PATH_OR_SKELETON ...`` times any model instead (llm_models.py: a GGUF
file, a known name, a skeleton, a header-only chunk), llama-bench style: each at
every pair of ``--prompt-tokens`` / ``--gen-tokens`` (default 512/128, llama-bench's
own, and the tiny models' 128/64). Beside the rows above it adds, per pair, the
time to the first token (generate() of one token, its program already built),
the prefill as fp32 FLOP/s and the decode as the weight bytes streamed per second
(llm_work.py), and per model the compile + warm-up time, and its targets: decode
>= 2x llama.cpp, compile + warm-up <= 30 s, memory (GPU <= 1.25x file + KV cache,
host RSS after load <= 1.1x the file above it for files over 1 GB, else 1.5x), and
the prefill: >= 1.5x llama.cpp for files up to 1 GB, >= 0.6 of the device's fp32
FLOP/s (torch CUDA's matmul probe) above. Eager CPU is timed only for files up to
``--eager-max-gb`` (a 7B's eager decode dequantizes 4.7 GB a token); above it one
prefill and one decode step on the CPU still check our logits; ``--no-eager``
leaves the CPU out entirely. ``--layers N`` keeps a model's first N layers.

The 7B rows on the lent GPU machine (scripts/device_kit.sh puts the skeletons
``skel/qwen2-7b.json.gz``, DeepSeek-R1-Distill-Qwen-7B's header, and
``skel/llama-7b.json.gz``, a llama with Qwen2-7B's shapes, and both llama.cpp builds
in .device-kit, which travels beside the tree), one model per command (writing the
4.7 GB file, the eager CPU check and both backends take minutes), from the tree's root::

    REPO=$PWD; SHA=...      # SHA: this checkout's git rev-parse HEAD
    bash scripts/on_device.sh bash -c "cd /tmp && BENCH_GIT_COMMIT=$SHA \
        python3 -m dynamo_vulkan.benchmarks --no-inductor --out $OUT/llama-7b \
        --models $REPO/.device-kit/skel/llama-7b.json.gz --llama-cpp $REPO/.device-kit/peers"

(``qwen2-7b.json.gz`` likewise), and the greedy-token check on their 2-layer variants
(1.05 GB files, so eager CPU is timed only when let: ``--layers 2 --eager-max-gb 2``).
"""
from __future__ import annotations

import gc
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..harness import Target, max_abs
from ..peers import PeerUnavailable
from ..record import Row
from ..timing import Stat

log = logging.getLogger(__name__)

DESCRIPTION = "GGUF LLMs: prefill and decode (tok/s); SmolLM2 / Gemma 3, or --models"
# name, label, decode goal, prefill goal (ratios to llama.cpp Vulkan, issue 6)
QUICK_CACHE = Path.home() / ".cache" / "dynamo_vulkan" / "bench-models"   # --quick's 1-layer models
MODELS = (("smollm2", "SmolLM2-135M", 2.0, 1.0), ("gemma3", "Gemma3-270M", 1.5, None))
GIVEN_CASES = ((512, 128), (128, 64))    # (prompt, decode) tokens for --models: llama-bench's, the tiny models'
QUICK_CASES = ((8, 2),)
BIG_FILE = 1e9               # bytes: above it the host-memory goal is 1.1x the file, and the prefill's is FLOP/s
GIVEN_GOALS = dict(decode=2.0, small_prefill=1.5, flops_fraction=0.6, compile_s=30.0)   # issue 28


@dataclass
class Settings:
    """The suite's options from the command line (cli.py)."""
    models: list[str] = field(default_factory=list)     # --models; empty: the default models
    cases: list[tuple[int, int]] | None = None          # (prompt, decode) pairs; None: the run's default
    eager: bool = True                                  # False: no eager CPU at all (--no-eager)
    eager_max_bytes: float = BIG_FILE                   # eager CPU timed only for files up to this size
    layers: int | None = None                           # keep the first N layers (random weights)
    reps: int | None = None                             # timed repetitions (default 3, --quick 1)


@dataclass
class Case:
    """One (prompt, decode) pair of one model: its rows' names and what the peer needs."""
    label: str
    n_prompt: int
    steps: int
    single: bool = False                 # the run's only pair: the default run's row names
    ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    ref: torch.Tensor | None = None      # eager CPU's prefill logits (None: no eager check)
    step_scale: float | None = None
    eager_rows: tuple | None = None      # (prefill, decode) eager CPU rows, the speed-ups' base

    @property
    def prefill(self) -> str:
        return f"{self.label} prefill {self.n_prompt}"

    @property
    def decode(self) -> str:
        return f"{self.label} decode" if self.single else f"{self.label} decode {self.steps} after {self.n_prompt}"

    @property
    def first_token(self) -> str:
        return f"{self.label} first token {self.n_prompt}"


def rss_bytes() -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gpu_used_bytes() -> int | None:
    """Memory in use on NVIDIA GPU 0 (NVML), or None where NVML is absent."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:
        return None


def prompt_text(tok, n: int) -> str:
    """A text that this tokenizer encodes to exactly n ids (BOS included if it adds one)."""
    for k in range(n, 0, -1):
        text = " the" * k
        if len(tok.encode(text)) == n:
            return text
    raise ValueError(f"no prompt of {n} tokens found")


def resolve(bench, name: str) -> tuple[Path | None, str]:
    """(GGUF path, note) for a model: the real file, else one written from a skeleton."""
    from dynamo_vulkan.llm.generate import ModelNotInstalledError, find_model

    from .. import synth_model

    work = Path(bench.opts.work_dir)
    real = None
    try:
        real = find_model(name)
    except ModelNotInstalledError as e:
        missing = str(e)
    skel_file = Path(bench.opts.skeleton_dir) / f"{name}.json.gz" if bench.opts.skeleton_dir else None
    if bench.quick:
        if real is not None:
            st = real.stat()
            cached = QUICK_CACHE / f"{name}-1layer-{st.st_size}-{int(st.st_mtime)}.gguf"
            if not cached.is_file():      # reading a real file's metadata takes seconds: once
                tmp = synth_model.write_model(synth_model.describe(real), work / cached.name, n_layers=1)
                QUICK_CACHE.mkdir(parents=True, exist_ok=True)
                shutil.move(tmp, cached)
            return cached, f"first layer of {real.name}, random weights (--quick)"
        if skel_file is not None and skel_file.is_file():
            skel = synth_model.load_skeleton(skel_file)
            return (synth_model.write_model(skel, work / f"{name}-1layer.gguf", n_layers=1),
                    f"first layer of {skel['source']}, random weights (--quick)")
        return None, f"not installed ({missing}) and no skeleton"
    if real is not None:
        return real, real.name
    if skel_file is not None and skel_file.is_file():
        skel = synth_model.load_skeleton(skel_file)
        return (synth_model.write_model(skel, work / f"{name}-synth.gguf"),
                f"random weights, same shapes and types as {skel['source']} (model not installed)")
    return None, f"skipped: {missing}; no skeleton given (--gguf-skeletons)"


def settings(bench) -> Settings:
    return getattr(bench.opts, "llm", None) or Settings()


def run(bench) -> None:
    s = settings(bench)
    if s.models:
        run_given(bench, s)
    else:
        run_default(bench, s)


def run_default(bench, s: Settings) -> None:
    models = MODELS[:1] if bench.quick else MODELS
    cases = s.cases or (QUICK_CASES if bench.quick else ((128, 64),))
    for name, label, decode_goal, prefill_goal in models:
        if bench.over_budget("llm", label):
            continue
        path, what = resolve(bench, name)
        if path is None:
            bench.note("llm", f"{label}: {what}")
            continue
        bench.note("llm", f"{label}: {what}")
        done = _cases(label, cases, single=len(cases) == 1)
        try:
            one_model(bench, label, path, what, done, s, eager_timing=s.eager, detailed=False)
        except Exception as e:
            log.exception("llm %s failed", label)
            bench.fail("llm", f"{label} failed: {type(e).__name__}: {e}")
        gc.collect()
        for c in done:
            bench.target(Target(f"{c.decode}: tok/s vs llama.cpp Vulkan", ("llm", c.decode, "vulkan"),
                                decode_goal, baseline=("llm", c.decode, "llama_cpp_vulkan")))
            if prefill_goal:
                bench.target(Target(f"{c.prefill} tok: tok/s vs llama.cpp Vulkan", ("llm", c.prefill, "vulkan"),
                                    prefill_goal, baseline=("llm", c.prefill, "llama_cpp_vulkan")))


def run_given(bench, s: Settings) -> None:
    """--models: each entry at every (prompt, decode) pair, with issue 28's targets."""
    from .. import llm_models, probes

    cases = s.cases or (QUICK_CASES if bench.quick else GIVEN_CASES)
    peak = probes.peak_gflops(bench.probes)
    for entry in s.models:
        if bench.over_budget("llm", entry):
            continue
        try:
            m = llm_models.resolve(entry, bench.opts.skeleton_dir, s.layers)
        except Exception as e:
            log.exception("llm %s: no model", entry)
            bench.fail("llm", f"{entry}: not run: {type(e).__name__}: {e}")
            continue
        bench.note("llm", f"{m.label}: {m.what}")
        big = m.path.stat().st_size > BIG_FILE
        timing = s.eager and m.path.stat().st_size <= s.eager_max_bytes
        if s.eager and not timing:
            bench.note("llm", f"{m.label}: eager CPU not timed (file over --eager-max-gb "
                              f"{s.eager_max_bytes / 1e9:g}); one prefill and one decode step per pair check our logits")
        done = _cases(m.label, cases, single=False)
        try:
            one_model(bench, m.label, m.path, m.what, done, s, eager_timing=timing, detailed=True)
        except Exception as e:
            log.exception("llm %s failed", m.label)
            bench.fail("llm", f"{m.label} failed: {type(e).__name__}: {e}")
        gc.collect()
        g = GIVEN_GOALS
        for c in done:
            bench.target(Target(f"{c.decode}: tok/s vs llama.cpp Vulkan", ("llm", c.decode, "vulkan"),
                                g["decode"], baseline=("llm", c.decode, "llama_cpp_vulkan")))
            if big:
                bench.target(Target(f"{c.prefill}: fraction of the device's fp32 FLOP/s",
                                    ("llm", f"{c.prefill} fp32", "vulkan"), g["flops_fraction"],
                                    baseline_value=(peak, "cuda_fp32_matmul") if peak else None,
                                    note=f"llama.cpp's in the row {c.prefill} fp32 [llama_cpp_vulkan]"))
            else:
                bench.target(Target(f"{c.prefill}: tok/s vs llama.cpp Vulkan", ("llm", c.prefill, "vulkan"),
                                    g["small_prefill"], baseline=("llm", c.prefill, "llama_cpp_vulkan")))
        bench.target(Target(f"{m.label} compile + warm-up <= {g['compile_s']:g} s",
                            ("llm", f"{m.label} compile+warm-up", "vulkan"), 1.0, higher_is_better=False,
                            baseline_value=(g["compile_s"] * 1e3, "goal"), metric="ms"))


def _cases(label: str, cases, single: bool) -> list[Case]:
    return [Case(label, n, g, single) for n, g in cases]


def one_model(bench, label: str, path: Path, what: str, cases: list[Case], s: Settings, *,
              eager_timing: bool, detailed: bool) -> None:
    """Rows of one model at each case: eager CPU (eager_timing), ours, llama.cpp; its memory
    figures; and with ``detailed`` (--models) the first-token, FLOP/s, bandwidth and
    compile + warm-up rows."""
    from dynamo_vulkan.llm.models import load_model

    from ..llm_work import model_work

    quick = bench.quick
    reps = s.reps or (1 if quick else 3)
    ctx = max(c.n_prompt + c.steps for c in cases) + 8
    file_bytes = path.stat().st_size
    work = model_work(path) if detailed else None

    # the Vulkan device is made first: its own memory (the driver's context, ~40 MiB
    # on the H100) is the process's, paid once whatever model it runs, not this model's
    before = gpu_used_bytes()
    _make_device()
    rss0, gpu0, held0 = rss_bytes(), gpu_used_bytes(), _runtime_bytes()
    device_bytes = gpu0 - before if gpu0 is not None and before is not None else None
    t0 = time.perf_counter()
    model, tok = load_model(path, max_ctx=ctx, with_tokenizer=True, progress=detailed)
    load_s = time.perf_counter() - t0
    rss_loaded = rss_bytes()
    compiled, warmups = None, []
    for c in cases:
        compiled, warmup_s = _one_case(bench, model, tok, c, compiled, reps, s.eager, eager_timing, quick,
                                       what, work)
        warmups.append(warmup_s)
    gpu1, rss1 = gpu_used_bytes(), rss_bytes()

    kv_bytes = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache")))
    mem = {"file_bytes": file_bytes, "kv_cache_bytes": kv_bytes, "vulkan_device_bytes": device_bytes,
           "host_rss_after_load_bytes": (rss_loaded - rss0) if rss0 and rss_loaded else None,
           "host_rss_after_runs_bytes": (rss1 - rss0) if rss0 and rss1 else None,
           "gpu_used_delta_bytes": (gpu1 - gpu0) if gpu0 is not None and gpu1 is not None else None,
           "runtime_stats": {k: v - held0.get(k, 0) if k != "device_bytes_peak" else v
                             for k, v in _runtime_bytes().items()}}
    if detailed:
        mem["load_s"] = round(load_s, 2)
    bench.extra.setdefault("llm_memory", {})[label] = mem
    _memory_targets(bench, label, mem, host_factor=1.1 if detailed and file_bytes > BIG_FILE else 1.5)
    if detailed:
        later = ", ".join(f"{c.n_prompt}/{c.steps} {w:.1f}s" for c, w in zip(cases[1:], warmups[1:]))
        bench.add(Row("llm", f"{label} compile+warm-up", "vulkan", Stat.of([warmups[0] * 1e3]),
                      note=f"prefill ({cases[0].n_prompt} tok) and decode programs compiled and run once, "
                           f"after load_model ({load_s:.1f}s)" + (f"; later pairs' warm-up: {later}" if later else "")))
    elif not quick:        # after the memory figures: it builds one more program
        _new_prompt_lengths(bench, label, model, tok, compiled, cases[0].n_prompt)
    del model, compiled, tok      # before the peer loads its copy
    torch._dynamo.reset()
    gc.collect()
    _peer(bench, label, path, cases, ctx, reps, work)


def _one_case(bench, model, tok, c: Case, compiled, reps: int, eager_check: bool, eager_timing: bool,
              quick: bool, what: str, work):
    """Ours (and eager CPU) at one (prompt, decode) pair; returns (compiled, its warm-up s)."""
    from dynamo_vulkan.llm.generate import generate, prompt_args

    n_prompt, steps = c.n_prompt, c.steps
    eager_steps = min(steps, 2 if quick else 16)
    text = prompt_text(tok, n_prompt)
    c.ids = ids = tok.encode(text)
    ids_t = torch.tensor([ids], dtype=torch.int64)
    pos0 = torch.tensor(0, dtype=torch.int64)
    kw = dict(max_new_tokens=steps + 1, stop_at_eos=False)

    if eager_check:     # the prompt, then one step fed its greedy token, before ours runs
        pos_t = torch.tensor(n_prompt, dtype=torch.int64)
        with torch.no_grad():
            c.ref = model(ids_t, pos0)
            step_t = torch.tensor([[int(c.ref.reshape(-1).argmax())]], dtype=torch.int64)
            ref_step = model(step_t, pos_t)
    import dynamo_vulkan
    before, fresh = len(dynamo_vulkan.reports()), compiled is None
    first = generate(model, text, tok, backend="vulkan", warmup=True, compiled=compiled, **kw)
    reports = dynamo_vulkan.reports()[before:]
    compiled = first.extra["compiled"]
    runs = [generate(model, text, tok, backend="vulkan", warmup=False, compiled=compiled, **kw) for _ in range(reps)]
    c.tokens = tokens = runs[-1].tokens
    errs = ((None, None), (None, None))
    if eager_check:
        with torch.no_grad():   # the same prefill and step compiled, on its own cache state
            ours_pre = compiled(*prompt_args(model, ids, "vulkan"))
            ours_step = compiled(step_t, pos_t)
        errs = (max_abs(ours_pre, c.ref), max_abs(ours_step, ref_step))
        c.step_scale = errs[1][1]
    agreement = "greedy tokens not compared with eager CPU's"
    if eager_timing:
        # eager CPU, fewer steps (it dequantizes every weight on every call)
        eager = generate(model, text, tok, backend=None, warmup=False, max_new_tokens=eager_steps + 1,
                         stop_at_eos=False)
        agree = sum(a == b for a, b in zip(tokens, eager.tokens))
        agreement = f"greedy tokens equal to eager {agree}/{min(len(tokens), len(eager.tokens))}"
        c.eager_rows = _rows(bench, c, "eager_cpu", [eager.prefill_s * 1e3],
                             [eager.decode_s / eager.decode_steps * 1e3],
                             ((0.0, errs[0][1]), (0.0, errs[1][1])), False,
                             f"{eager.decode_steps} decode steps, one run; {what}")
        for r in c.eager_rows:
            r.speedup = 1.0
    ours = _rows(bench, c, "vulkan", [r.prefill_s * 1e3 for r in runs],
                 [r.decode_s / r.decode_steps * 1e3 for r in runs], errs, eager_check,
                 f"{steps} decode steps x {reps} runs, {first.extra['steps_per_call']} per submit; "
                 f"compile+warm-up {first.warmup_s:.1f}s; {agreement}")
    _placements(ours, reports, fresh)
    _speedups(c, ours)
    if work is not None:
        first_token = []
        for _ in range(reps):
            t = time.perf_counter()
            generate(model, text, tok, backend="vulkan", warmup=False, compiled=compiled, max_new_tokens=1,
                     stop_at_eos=False)
            first_token.append((time.perf_counter() - t) * 1e3)
        bench.add(Row("llm", c.first_token, "vulkan", Stat.of(first_token),
                      note="generate() of one token: tokenize, prefill (its program already built), the token"))
        _work_rows(bench, c, "vulkan", ours, work)
        _level_row(bench, c, ours[1], model)
    return compiled, first.warmup_s


# Errors against eager CPU that a row tolerates, (relative to the logits' scale, absolute),
# per float32 matmul precision: exact fp32 kernels ("highest"); tensor cores where the user
# allows them, TF32-class ("high": 2^-11 rounding, ~8,000x fp32's) or bf16-class ("medium",
# 8x TF32's), whose rounding a deep model carries to its logits
LOGITS_TOL = {"highest": (1e-3, 1e-4), "high": (1e-2, 1e-3), "medium": (5e-2, 5e-3)}


def _rows(bench, c: Case, backend: str, prefill_ms, step_ms, errs, tolerate: bool, note: str) -> tuple[Row, Row]:
    """The prefill and decode rows of one backend at one case; errs: ((err, scale), (err, scale))."""
    from dynamo_vulkan import config
    precision = config.load().matmul_precision
    rel, floor = LOGITS_TOL[precision]
    if tolerate and precision != "highest":
        note += f"; error tolerated: {rel:g} x scale + {floor:g} (matmul precision {precision})"

    def tol(scale):
        return rel * scale + floor if tolerate and scale is not None else None
    (e_pre, s_pre), (e_dec, s_dec) = errs
    pre = bench.add(Row("llm", c.prefill, backend, Stat.of(prefill_ms), work=c.n_prompt, unit="tok/s",
                        err=e_pre, ref_scale=s_pre, tol=tol(s_pre), note=note))
    dec = bench.add(Row("llm", c.decode, backend, Stat.of(step_ms), work=1, unit="tok/s",
                        err=e_dec, ref_scale=s_dec, tol=tol(s_dec), note=note))
    return pre, dec


def _placements(rows: tuple[Row, Row], reports, fresh: bool) -> None:
    """Mark our prefill and decode rows with where their graphs ran (``reports``: those
    compiled by the case's warm-up; ``fresh``: its decode step's among them). The backend
    places a graph on the host by its matmuls' sizes (prompt-sized ones on a CPU Vulkan
    device), so a graph on the host is the prompt's, and the decode step's too only where
    every graph of a fresh compile was."""
    from ..harness import placement_of

    pre, dec = rows
    hosted = [r for r in reports if placement_of([r])["placement"] == "host"]
    pre.placement = dec.placement = "vulkan"
    if hosted:
        reason = placement_of(hosted)["host_reason"]
        for r in (pre, dec) if fresh and len(hosted) == len(reports) else (pre,):
            r.placement = "host"
            r.note += f"; graph placed on the host: {reason}"


def _speedups(c: Case, rows: tuple[Row, Row]) -> None:
    if c.eager_rows is not None:
        for r, base in zip(rows, c.eager_rows):
            r.speedup = base.ms.median / r.ms.median


def _work_rows(bench, c: Case, backend: str, rows: tuple[Row, Row], work) -> None:
    """The prefill as fp32 FLOP/s and the decode as weight GB/s, against the device's limits."""
    pre, dec = rows
    flops_limit, flops_name = bench.limit_for("GFLOP/s")
    bytes_limit, bytes_name = bench.limit_for("GB/s")
    bench.add(Row("llm", f"{c.prefill} fp32", backend, pre.ms, work=work.prefill_flops(c.n_prompt), unit="GFLOP/s",
                  limit=flops_limit, limit_name=flops_name,
                  note="the prompt's FLOPs (benchmarks/llm_work.py) over its prefill time"))
    bench.add(Row("llm", f"{c.decode} weights", backend, dec.ms, work=work.step_bytes, unit="GB/s",
                  limit=bytes_limit, limit_name=bytes_name,
                  note=f"{work.step_bytes / 2**20:,.0f} MiB of weights a step reads, over the time per token"))


def _level_row(bench, c: Case, dec: Row, model) -> None:
    """Our decode against the least its program's barrier levels cost: a level of kernels
    waits for the one before it, and costs at least what a chain of one-workgroup kernels
    measures a level (probes.barrier_level_us), whatever its kernels do. No row where the
    step is not replayed (a CPU device) or that probe did not run."""
    from dynamo_vulkan.llm.generate import step_plan
    from dynamo_vulkan.runtime.plan import levels

    from .. import probes
    plan, us = step_plan(model), probes.barrier_level(bench.probes)
    if plan is None or not plan.dispatches or not us:
        return
    n = levels(plan.dispatches)
    bench.add(Row("llm", f"{c.decode} levels", "vulkan", dec.ms, work=1, unit="tok/s",
                  limit=1e6 / (n * us), limit_name="barrier_level",
                  note=f"{n} barrier levels ({len(plan.dispatches)} kernels) a step, at least "
                       f"{us:.1f} us each (a chain of one-workgroup kernels): {n * us / 1e3:.2f} ms a token"))


def _peer(bench, label: str, path: Path, cases: list[Case], ctx: int, reps: int, work) -> None:
    """llama.cpp on the same file and ids, each case warmed up once then timed reps times."""
    peer = bench.opts.llama_cpp
    if peer is None:
        bench.note("llm", f"{label}: llama.cpp peer not given (--llama-cpp DIR or LLAMA_CPP_DIR)")
        return
    try:
        t0 = time.perf_counter()
        lm = peer.open(path, ctx)
        open_s = time.perf_counter() - t0
        warm_s = None
        note = f"{peer.note}; same ids; err informational (llama.cpp quantizes activations)"
        try:
            for c in cases:
                warm, *samples = [lm.run(c.ids, c.tokens[:c.steps]) for _ in range(reps + 1)]
                if warm_s is None:
                    warm_s = open_s + warm.prefill_s + (warm.step_s[0] if warm.step_s else 0.0)
                lerr = (None, None)
                if c.ref is not None:
                    lerr = max_abs(torch.from_numpy(samples[-1].logits).reshape(c.ref.shape), c.ref)
                rows = _rows(bench, c, "llama_cpp_vulkan", [x.prefill_s * 1e3 for x in samples],
                             [sum(x.step_s) / len(x.step_s) * 1e3 for x in samples], (lerr, (None, c.step_scale)),
                             False, note)
                _speedups(c, rows)
                if work is not None:
                    bench.add(Row("llm", c.first_token, "llama_cpp_vulkan",
                                  Stat.of([x.first_token_s * 1e3 for x in samples]),
                                  note="llama_eval of the prompt, its logits read, the greedy token"))
                    _work_rows(bench, c, "llama_cpp_vulkan", rows, work)
        finally:
            lm.close()
        if work is not None:
            bench.add(Row("llm", f"{label} compile+warm-up", "llama_cpp_vulkan", Stat.of([warm_s * 1e3]),
                          note=f"Llama() ({open_s:.1f}s: load, upload, pipelines), then the first prompt "
                               f"({cases[0].n_prompt} tok) and decode step"))
    except PeerUnavailable as e:
        bench.note("llm", f"{label}: llama.cpp skipped: {e}")


def _new_prompt_lengths(bench, label: str, model, tok, compiled, n_prompt: int) -> None:
    """A chat's next prompts, as a note: the time to the first token of a prompt whose
    padded length (generate.prompt_bucket) is new, so a program is built for it, then
    of another prompt of that padded length."""
    import time

    from dynamo_vulkan.llm.generate import generate, prompt_bucket
    n = n_prompt + 40
    m = next((k for k in range(n + 1, model.max_ctx + 1) if prompt_bucket(k, model.max_ctx) ==
              prompt_bucket(n, model.max_ctx)), None)
    if m is None or prompt_bucket(n, model.max_ctx) == prompt_bucket(n_prompt, model.max_ctx):
        return
    took = []
    for k in (n, m):
        t = time.perf_counter()
        generate(model, prompt_text(tok, k), tok, backend="vulkan", compiled=compiled, warmup=False,
                 max_new_tokens=1, stop_at_eos=False)
        took.append(time.perf_counter() - t)
    bench.note("llm", f"{label}: first token of a {n}-token prompt, a new padded length "
                      f"({prompt_bucket(n, model.max_ctx)}): {took[0]:.2f} s (a program built for it); "
                      f"of a {m}-token prompt of that padded length: {took[1]:.2f} s")


def _make_device() -> None:
    """The Vulkan device made now, where there is one (without one, the runs that need it
    say why)."""
    from dynamo_vulkan import device
    try:
        device.manager()
    except device.VulkanUnavailable:
        pass


def _runtime_bytes() -> dict:
    import dynamo_vulkan
    return {k: v for k, v in dynamo_vulkan.runtime_stats().items() if "bytes" in k}


def _memory_targets(bench, label: str, mem: dict, host_factor: float = 1.5) -> None:
    """Issue 6's memory goals (issue 28's host goal for big files) as rows of the targets table (ratios <= 1)."""
    fb, kv = mem["file_bytes"], mem["kv_cache_bytes"]
    counted = mem["runtime_stats"]["device_bytes"]   # the runtime's own count's growth
    # the device's own figure (NVML) where there is one: it also sees what the driver
    # spends on our behalf (allocation granularity, pipelines, command buffers)
    gpu, gpu_how = mem["gpu_used_delta_bytes"], "NVML used-memory delta over load+compile+runs"
    if gpu is None:
        gpu, gpu_how = counted, "runtime_stats()['device_bytes'] (kp tensors the runtime holds)"
    else:
        gpu_how += f"; the runtime counts {counted / 2**20:.0f} MiB of kp tensors"
        if mem.get("vulkan_device_bytes"):
            gpu_how += (f"; the Vulkan device, made before this model, took "
                        f"{mem['vulkan_device_bytes'] / 2**20:.0f} MiB more")
    bench.extra.setdefault("memory_targets", []).append({
        "name": f"{label} GPU memory <= 1.25 x file + KV cache", "ours": gpu, "limit": 1.25 * fb + kv,
        "how": gpu_how})
    host = mem["host_rss_after_load_bytes"]
    bench.extra["memory_targets"].append({
        "name": f"{label} host memory after load <= {host_factor:g} x file", "ours": host, "limit": host_factor * fb,
        "how": "RSS growth over load_model"})
