"""A GGUF file's chat template (jinja2) rendered in a sandbox with bounded work.

jinja2's ImmutableSandboxedEnvironment keeps a template from reaching Python's
internals (no code injection), but not from working without end: nested loops over
range(99999), strings or lists multiplied, or doubled in a loop. Each render has a
budget: lines of template code run (MAX_STEPS, counted by a trace function on the
template's own frames, so loops that call nothing are counted too), a deadline
(RENDER_TIMEOUT_S), and a size for every string or list an operator, call or filter
makes and for the output (MAX_SIZE). Past any of them the render stops with a
ChatTemplateError that says which.
"""
from __future__ import annotations

import functools
import numbers
import sys
import time

from dynamo_vulkan.gguf.errors import GGUFError

MAX_STEPS = 200_000            # template lines run (a real template, a long chat: a few thousand)
MAX_SIZE = 1 << 20             # characters or items of any value made, and of the output
RENDER_TIMEOUT_S = 10.0
MAX_EXPONENT = 256             # x ** n


class ChatTemplateError(GGUFError):
    """A chat template that fails, or that exceeds the render's budget."""


class _Budget:
    def __init__(self):
        self.steps = 0
        self.deadline = time.monotonic() + RENDER_TIMEOUT_S

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise ChatTemplateError(f"the chat template ran more than {MAX_STEPS} steps; "
                                    "it is refused (a loop without end?)")
        if not self.steps & 1023 and time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the chat template took more than {RENDER_TIMEOUT_S:g} s; "
                                    "it is refused")

    def tracer(self, frame, event, arg):
        """sys.settrace's function: counts the lines of the template's own code."""
        if event == "call":
            return self.tracer if frame.f_code.co_filename == "<template>" else None
        if event == "line":
            self.step()
        return self.tracer


def _sized(v, what: str):
    if isinstance(v, (str, bytes, list, tuple, dict)) and len(v) > MAX_SIZE:
        raise ChatTemplateError(f"the chat template made a {what} of {len(v)} items "
                                f"(at most {MAX_SIZE}); it is refused")
    return v


def _small_ints(args, what: str) -> None:
    """Integer arguments large enough to make huge values ("x".center(10**9))."""
    for a in args:
        if isinstance(a, numbers.Integral) and not isinstance(a, bool) and abs(a) > MAX_SIZE:
            raise ChatTemplateError(f"the chat template passed {a} to {what} (at most {MAX_SIZE})")


def _length(v) -> int | None:
    return len(v) if isinstance(v, (str, bytes, list, tuple)) else None


def _environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, numbers.Number) and abs(right) > MAX_EXPONENT:
                raise ChatTemplateError(f"the chat template raised a number to the power {right} "
                                        f"(at most {MAX_EXPONENT})")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if _length(seq) is not None and isinstance(n, numbers.Integral) and \
                            _length(seq) * n > MAX_SIZE:
                        raise ChatTemplateError(f"the chat template repeated a value {n} times "
                                                f"to over {MAX_SIZE} items")
            if operator == "+" and _length(left) is not None and _length(right) is not None and \
                    _length(left) + _length(right) > MAX_SIZE:
                raise ChatTemplateError(f"the chat template joined values to over {MAX_SIZE} items")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            _small_ints(list(args) + list(kwargs.values()), getattr(__obj, "__name__", "a call"))
            return _sized(super().call(__context, __obj, *args, **kwargs), "value")

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    for name, f in list(env.filters.items()):
        env.filters[name] = _bounded_filter(name, f)
    return env


def _bounded_filter(name, f):
    @functools.wraps(f)              # keeps jinja2's pass_context/pass_environment marks
    def bounded(*args, **kwargs):
        _small_ints(list(args[1:]) + list(kwargs.values()), f"the filter {name}")
        return _sized(f(*args, **kwargs), f"{name} result")
    return bounded


def render(template: str, **context) -> str:
    """The template rendered with `context`, within the budget; ChatTemplateError when it
    is not valid jinja2, raises (raise_exception), or exceeds the budget."""
    import jinja2

    def raise_exception(msg):
        raise ChatTemplateError(f"the chat template raised: {msg}")

    env = _environment()
    env.globals["raise_exception"] = raise_exception
    budget = _Budget()
    try:
        compiled = env.from_string(template)
        out, size = [], 0
        previous = sys.gettrace()
        sys.settrace(budget.tracer)
        try:
            for piece in compiled.generate(**context):
                size += len(piece)
                if size > MAX_SIZE:
                    raise ChatTemplateError(f"the chat template's output passed {MAX_SIZE} characters; "
                                            "it is refused")
                out.append(piece)
        finally:
            sys.settrace(previous)
    except ChatTemplateError:
        raise
    except jinja2.exceptions.TemplateError as e:
        raise ChatTemplateError(f"the chat template cannot be rendered: {type(e).__name__}: {e}") from None
    except Exception as e:          # TypeError, OverflowError, RecursionError, MemoryError, ...
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
    return "".join(out)
