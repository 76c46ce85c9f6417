"""Runtime checks in kernels: a kernel that meets an index out of range, or an int64
result that leaves int32 (int64 values travel as int32: shaders/checks.glsl), sets a
bit of the plan's one-word check buffer (atomicOr) instead of reading or writing out of
bounds or wrapping; runtime/program.py reads the word after the submit and raises what
eager raises (IndexError) or OverflowError. A kernel cannot raise itself."""
from __future__ import annotations

from .core import Context, TRef

LAST_BIT = 31      # checks from the 32nd on share the last bit


def op_label(ctx: Context) -> str:
    """The node's op as a user knows it: "index_select" for aten.index_select.default,
    "embedding_bag" for aten._embedding_bag_forward_only.default."""
    target = getattr(ctx.node, "target", None)
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0].lstrip("_").removesuffix("_forward_only")


def check_bit(ctx: Context, message: str, exc: str = "IndexError") -> tuple[TRef, int]:
    """The check buffer (created on first use) and the bit a kernel sets when `message`
    holds: an exception `exc` (IndexError, OverflowError) is raised after the submit."""
    plan = ctx.plan
    if plan.check_buffer is None:
        plan.check_buffer = ctx.buffer(1, "output", "i32")
    text = f"{exc}: {message}"
    if text not in plan.checks:
        plan.checks.append(text)
    return TRef(plan.check_buffer, (1,), (1,), 0, "i32"), min(plan.checks.index(text), LAST_BIT)


def index_check(ctx: Context) -> tuple[TRef, int]:
    """check_bit for the node's index operand being out of range."""
    return check_bit(ctx, f"{op_label(ctx)}: index out of range for the dimension it indexes")
