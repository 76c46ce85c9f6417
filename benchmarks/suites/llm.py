"""SmolLM2-135M (Q4_1) and Gemma 3 270M (Q4_K_M): prefill and decode tokens/s.

Ours is dynamo_vulkan.generate.generate with backend="vulkan" (compiled once,
then timed over repetitions; greedy decode runs its default steps_per_call steps per
GPU submit, the argmax on the GPU); eager CPU is the same call uncompiled; the peer
is llama.cpp's Vulkan backend fed the same token ids (the prompt, then the
tokens our run generated, one per step). Prompts are exactly N token ids.
Errors against eager: the prefill's logits (prefill rows), the logits of one
decode step after it (decode rows), and greedy tokens compared step by step.

Models come from dynamo_vulkan.generate.find_model (the `models` extra). Where
one is missing, a skeleton (``--gguf-skeletons DIR``, see synth_model.py) gives
a same-shaped model with random weights; without either the model is skipped
with a note. ``--quick`` runs SmolLM2's first layer only (random weights).
"""
from __future__ import annotations

import gc
import logging
import os
import shutil
from pathlib import Path

import torch

from ..harness import Target, max_abs
from ..peers import PeerUnavailable
from ..record import Row
from ..timing import Stat

log = logging.getLogger(__name__)

DESCRIPTION = "SmolLM2 / Gemma 3 prefill and decode (tok/s)"
# name, label, decode goal, prefill goal (ratios to llama.cpp Vulkan, issue 6)
QUICK_CACHE = Path.home() / ".cache" / "dynamo_vulkan" / "bench-models"   # --quick's 1-layer models
MODELS = (("smollm2", "SmolLM2-135M", 2.0, 1.0), ("gemma3", "Gemma3-270M", 1.5, None))


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
    from dynamo_vulkan.generate import ModelNotInstalledError, find_model

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


def run(bench) -> None:
    models = MODELS[:1] if bench.quick else MODELS
    for name, label, decode_goal, prefill_goal in models:
        if bench.over_budget("llm", label):
            continue
        path, what = resolve(bench, name)
        if path is None:
            bench.note("llm", f"{label}: {what}")
            continue
        bench.note("llm", f"{label}: {what}")
        try:
            one_model(bench, label, path, what)
        except Exception as e:
            log.exception("llm %s failed", label)
            bench.note("llm", f"{label} failed: {type(e).__name__}: {e}")
        gc.collect()
        n_prompt = 8 if bench.quick else 128
        bench.target(Target(f"{label} decode: tok/s vs llama.cpp Vulkan", ("llm", f"{label} decode", "vulkan"),
                            decode_goal, baseline=("llm", f"{label} decode", "llama_cpp_vulkan")))
        if prefill_goal:
            bench.target(Target(f"{label} prefill {n_prompt} tok: tok/s vs llama.cpp Vulkan",
                                ("llm", f"{label} prefill {n_prompt}", "vulkan"), prefill_goal,
                                baseline=("llm", f"{label} prefill {n_prompt}", "llama_cpp_vulkan")))


def one_model(bench, label: str, path: Path, what: str) -> None:
    from dynamo_vulkan.generate import generate, prompt_args
    from dynamo_vulkan.models import load_model

    quick = bench.quick
    n_prompt, steps = (8, 2) if quick else (128, 64)
    eager_steps = 2 if quick else 16
    reps = 1 if quick else 3
    ctx = n_prompt + steps + 8
    file_bytes = path.stat().st_size

    rss0, gpu0, held0 = rss_bytes(), gpu_used_bytes(), _runtime_bytes()
    model, tok = load_model(path, max_ctx=ctx, with_tokenizer=True)
    rss_loaded = rss_bytes()
    text = prompt_text(tok, n_prompt)
    ids = tok.encode(text)
    ids_t = torch.tensor([ids], dtype=torch.int64)
    pos0 = torch.tensor(0, dtype=torch.int64)
    kw = dict(max_new_tokens=steps + 1, stop_at_eos=False)

    with torch.no_grad():
        ref = model(ids_t, pos0)
    # ours
    first = generate(model, text, tok, backend="vulkan", warmup=True, **kw)
    compiled = first.extra["compiled"]
    runs = [generate(model, text, tok, backend="vulkan", warmup=False, compiled=compiled, **kw) for _ in range(reps)]
    tokens = runs[-1].tokens
    step_t, pos_t = torch.tensor([[tokens[0]]], dtype=torch.int64), torch.tensor(n_prompt, dtype=torch.int64)
    with torch.no_grad():   # one prefill then one decode step, each backend on its own cache state
        ours_pre = compiled(*prompt_args(model, ids, "vulkan"))
        ours_step = compiled(step_t, pos_t)
        model(ids_t, pos0)
        ref_step = model(step_t, pos_t)
    gpu1, rss1 = gpu_used_bytes(), rss_bytes()
    err, scale = max_abs(ours_pre, ref)
    step_err, step_scale = max_abs(ours_step, ref_step)
    # eager CPU, fewer steps (it dequantizes every weight on every call)
    eager = generate(model, text, tok, backend=None, warmup=False, max_new_tokens=eager_steps + 1, stop_at_eos=False)
    agree = sum(a == b for a, b in zip(tokens, eager.tokens))

    def rows_for(backend, prefill_ms, step_ms, errs, tolerate, note):
        (e_pre, s_pre), (e_dec, s_dec) = errs
        pre = bench.add(Row("llm", f"{label} prefill {n_prompt}", backend, Stat.of(prefill_ms), work=n_prompt,
                            unit="tok/s", err=e_pre, ref_scale=s_pre, tol=1e-3 * s_pre + 1e-4 if tolerate else None,
                            note=note))
        dec = bench.add(Row("llm", f"{label} decode", backend, Stat.of(step_ms), work=1, unit="tok/s",
                            err=e_dec, ref_scale=s_dec, tol=1e-3 * s_dec + 1e-4 if tolerate else None, note=note))
        return pre, dec

    e_pre, e_dec = rows_for("eager_cpu", [eager.prefill_s * 1e3], [eager.decode_s / eager.decode_steps * 1e3],
                            ((0.0, scale), (0.0, step_scale)), False, f"{eager.decode_steps} decode steps, one run; {what}")
    e_pre.speedup = e_dec.speedup = 1.0
    v_pre, v_dec = rows_for("vulkan", [r.prefill_s * 1e3 for r in runs],
                            [r.decode_s / r.decode_steps * 1e3 for r in runs], ((err, scale), (step_err, step_scale)), True,
                            f"{steps} decode steps x {reps} runs, {first.extra['steps_per_call']} per submit; "
                            f"compile+warm-up {first.warmup_s:.1f}s; "
                            f"greedy tokens equal to eager {agree}/{min(len(tokens), len(eager.tokens))}")
    for r in (v_pre, v_dec):
        r.speedup = (e_pre if r is v_pre else e_dec).ms.median / r.ms.median

    kv_bytes = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith(("k_cache", "v_cache")))
    mem = {"file_bytes": file_bytes, "kv_cache_bytes": kv_bytes,
           "host_rss_after_load_bytes": (rss_loaded - rss0) if rss0 and rss_loaded else None,
           "host_rss_after_runs_bytes": (rss1 - rss0) if rss0 and rss1 else None,
           "gpu_used_delta_bytes": (gpu1 - gpu0) if gpu0 is not None and gpu1 is not None else None,
           "runtime_stats": {k: v - held0.get(k, 0) if k != "device_bytes_peak" else v
                             for k, v in _runtime_bytes().items()}}
    bench.extra.setdefault("llm_memory", {})[label] = mem
    _memory_targets(bench, label, mem)
    if not quick:        # after the memory figures: it builds one more program
        _new_prompt_lengths(bench, label, model, tok, compiled, n_prompt)

    peer = bench.opts.llama_cpp
    if peer is None:
        bench.note("llm", f"{label}: llama.cpp peer not given (--llama-cpp DIR or LLAMA_CPP_DIR)")
    else:
        try:
            lm = peer.open(path, ctx)
            try:
                samples = [lm.run(ids, tokens[:steps]) for _ in range(reps + 1)][1:]   # first warms up
            finally:
                lm.close()
            lerr = max_abs(torch.from_numpy(samples[-1][2]).reshape(ref.shape), ref)
            rows_for("llama_cpp_vulkan", [s[0] * 1e3 for s in samples],
                     [sum(s[1]) / len(s[1]) * 1e3 for s in samples], (lerr, (None, step_scale)), False,
                     f"{peer.note}; same ids; err informational (llama.cpp quantizes activations)")
            for r in bench.rows[-2:]:
                base = e_pre if "prefill" in r.workload else e_dec
                r.speedup = base.ms.median / r.ms.median
        except PeerUnavailable as e:
            bench.note("llm", f"{label}: llama.cpp skipped: {e}")
    del model, compiled
    torch._dynamo.reset()


def _new_prompt_lengths(bench, label: str, model, tok, compiled, n_prompt: int) -> None:
    """A chat's next prompts, as a note: the time to the first token of a prompt whose
    padded length (generate.prompt_bucket) is new, so a program is built for it, then
    of another prompt of that padded length."""
    import time

    from dynamo_vulkan.generate import generate, prompt_bucket
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


def _runtime_bytes() -> dict:
    import dynamo_vulkan
    return {k: v for k, v in dynamo_vulkan.runtime_stats().items() if "bytes" in k}


def _memory_targets(bench, label: str, mem: dict) -> None:
    """Issue 6's memory goals as rows of the targets table (ratios <= 1)."""
    fb, kv = mem["file_bytes"], mem["kv_cache_bytes"]
    counted = mem["runtime_stats"]["device_bytes"]   # the runtime's own count's growth
    # the device's own figure (NVML) where there is one: it also sees what the driver
    # spends on our behalf (allocation granularity, pipelines, command buffers)
    gpu, gpu_how = mem["gpu_used_delta_bytes"], "NVML used-memory delta over load+compile+runs"
    if gpu is None:
        gpu, gpu_how = counted, "runtime_stats()['device_bytes'] (kp tensors the runtime holds)"
    else:
        gpu_how += f"; the runtime counts {counted / 2**20:.0f} MiB of kp tensors"
    bench.extra.setdefault("memory_targets", []).append({
        "name": f"{label} GPU memory <= 1.25 x file + KV cache", "ours": gpu, "limit": 1.25 * fb + kv,
        "how": gpu_how})
    host = mem["host_rss_after_load_bytes"]
    bench.extra["memory_targets"].append({
        "name": f"{label} host memory after load <= 1.5 x file", "ours": host, "limit": 1.5 * fb,
        "how": "RSS growth over load_model"})
