"""Elementwise fusion: chains of elementwise nodes become one kernel.

The planner lowers a node whose result feeds exactly one elementwise consumer
with `Request(defer=True)`; its rule passes `defer=True` to its ew() call, which
then returns a `Lazy` (the expression and its operands) instead of emitting a
dispatch. The consumer's ew() folds the Lazy into its own expression, so
`x * rsqrt(m + eps) * w` or a RoPE rotation costs one dispatch and no
intermediate buffers. Anything else that meets a Lazy gets it materialised first
(`materialize`).

Every operand keeps its own strides in the fused kernel: a Lazy of shape S
inlined into a consumer of shape S' (S broadcasts to S') reads its leaves
broadcast straight to S', which is what broadcasting S then S' would give.

Which op plays which part (fusible, folds, prologue, takes_deferred, epilogue,
loads_lazy, lazy_view) is in its record (registry.OpSpec), registered with its rule.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from .core import GLSL_TYPE, TRef, broadcast_shapes, f32_bits, i32_bits, kind_of
from .registry import spec_of


class Deferred:
    """A result not computed yet, whose consumer may fold it into its own kernel;
    materialize() computes it standalone (once) for any other consumer."""

    def compute(self, ctx):
        raise NotImplementedError

    def materialize(self, ctx):
        done = self.__dict__.get("_done")
        if done is None:
            done = self.__dict__["_done"] = self.compute(ctx)
        return done

    def fold_rms_norm(self, ctx, weight, eps: float, residual):
        """rms_norm(self, weight, eps) (+ residual) computed by the kernel that computes
        this result, as its epilogue: the norm's TRef, or None when this result's kernel
        cannot (the norm then materializes it and runs as its own kernel)."""
        return None

    def reshape(self, shape: tuple):
        """This result reshaped, still deferred (a consumer of the reshape may fold it), or
        None: the reshape then materializes it."""
        return None


class LazyView(Deferred):
    """A reshape of a Lazy, not computed: a consumer that computes it as it loads reads
    the Lazy in its own shape (element i of the reshape is element i of the Lazy, both
    row-major); any other consumer gets the Lazy computed and viewed."""

    def __init__(self, lazy: "Lazy", shape: tuple):
        self.lazy, self.shape = lazy, tuple(shape)

    def compute(self, ctx):
        from .core import meta_view
        return meta_view(ctx.ref(materialize(ctx, self.lazy)), lambda t: t.reshape(self.shape))


@dataclass(frozen=True)
class Lazy:
    """An elementwise expression not yet computed: ew()'s arguments, kept."""
    expr: str
    operands: tuple
    out_kind: str
    compute: str | None
    result: str | None
    shape: tuple

    @property
    def kind(self) -> str:
        return self.out_kind

    @property
    def ndim(self) -> int:
        return len(self.shape)


def own_kind(o) -> str:
    """The kind ew() loads an operand in when no compute kind is given."""
    if isinstance(o, (TRef, Lazy)):
        return o.kind
    if isinstance(o, torch.Tensor):
        if o.dim():
            return kind_of(o.dtype)
        o = o.item()
    return "b" if isinstance(o, bool) else "i32" if isinstance(o, int) else "f32"


def convert(value: str, src: str, dst: str) -> str:
    """GLSL for a value of kind src as kind dst (as ew() converts its result)."""
    if src == dst:
        return value
    if dst == "b":
        return f"({value} != {GLSL_TYPE[src]}(0))"
    return f"{GLSL_TYPE[dst]}({value})"


def _text(expr: str, operands, compute, result, out_kind, leaves: list) -> str:
    """expr with every $j replaced by its operand's value in the compute kind;
    nested Lazies are expanded, leaves appended to `leaves`."""
    subst = {}
    for j, o in enumerate(operands):
        if isinstance(o, Lazy):
            inner = _text(o.expr, o.operands, o.compute, o.result, o.out_kind, leaves)
            src = o.out_kind
        else:
            leaves.append(o)
            inner, src = f"${len(leaves) - 1}", own_kind(o)
        subst[j] = convert(inner, src, compute or src)
    body = re.sub(r"\$(\d+)", lambda m: subst[int(m.group(1))], expr)
    return convert(f"({body})", result or compute or out_kind, out_kind)


def fold(expr: str, operands, out_kind: str, compute, result, shape):
    """ew() arguments with every Lazy operand inlined: (expr, leaves, compute,
    result, shape); the expression converts each leaf itself."""
    leaves: list = []
    rk = result or compute or out_kind
    text = _text(expr, operands, compute, rk, rk, leaves)
    if shape is None:
        shapes = [tuple(o.shape) for o in operands
                  if isinstance(o, (TRef, Lazy)) or (isinstance(o, torch.Tensor) and o.dim())]
        shape = broadcast_shapes(*shapes) if shapes else ()
    return text, leaves, None, rk, shape


@dataclass
class RowLoader:
    """A Lazy [.., k] seen as m rows of k, computed where a kernel loads it: ``decls``
    declares its buffers (bindings from ``base``) and ``float xlazy(uint m, uint k)``;
    ``buffers`` are bound in that order."""
    decls: str
    buffers: list
    base: int


def _row_offset_fn(fn: str, offset: int, sizes, strides) -> str:
    """GLSL ``uint fn(uint m)``: the element offset of row m of a leaf, m unravelled over
    its leading dims (sizes, strides). Arithmetic on constants, so the shader's size does
    not grow with the row count (a table of every row's offset did, and a 7B model's q
    rows made a pipeline that NVIDIA's driver refused)."""
    terms = []
    div = 1
    for size, st in zip(reversed(sizes), reversed(strides)):
        if size > 1 and st:
            q = f"(m / {div}u)" if div > 1 else "m"
            terms.append(f"({q} % {size}u) * {st}u")
        div *= size
    return f"uint {fn}(uint m) {{ return {' + '.join([f'{offset}u', *terms])}; }}"


def row_loader(ctx, lazy: Lazy, m: int, k: int, base: int, name: str = "x") -> RowLoader | None:
    """The RowLoader of lazy as [m, k] (None when it is not that shape or reads an
    operand the loader cannot index: those get materialized instead). Each leaf keeps
    its own strides: row offsets are constants (m is a handful), k moves by the leaf's
    stride along the last dim. `name` prefixes its GLSL names (``{name}lazy``), so one
    kernel can hold several loaders."""
    from .elementwise import _expand, hides, unseen
    text, leaves, _, rk, shape = fold(lazy.expr, lazy.operands, lazy.out_kind, lazy.compute,
                                      lazy.result, lazy.shape)
    if not shape or shape[-1] != k or math.prod(shape) != m * k:
        return None
    buffers, subst, decls = [], {}, []
    for j, o in enumerate(leaves):
        if isinstance(o, torch.Tensor) and o.dim() == 0:
            o = o.item()
        if isinstance(o, (bool, int, float)):
            kind = own_kind(o)
            # its 32-bit word, hidden from the compiler as elementwise kernels hide it
            word = f32_bits(o) if kind == "f32" else i32_bits(int(o))
            raw = unseen(f"{word}u") if hides(word, kind == "f32") else f"{word}u"
            subst[j] = f"uintBitsToFloat({raw})" if kind == "f32" else f"{GLSL_TYPE[kind]}({raw})"
            continue
        o = ctx.ref(o)
        if not isinstance(o, TRef):
            return None
        strides = _expand(o, tuple(shape))
        b = next((i for i, t in enumerate(buffers) if t.buf == o.buf), None)
        if b is None:
            buffers.append(o)
            b = len(buffers) - 1
            decls.append(f"layout(set = 0, binding = {base + b}) readonly buffer "
                         f"{name.upper()}L{b} {{ uint {name}l{b}[]; }};")
        decls.append(_row_offset_fn(f"{name}r{j}", o.offset, shape[:-1], strides[:-1]))
        subst[j] = f"ld_{o.kind}({name}l{b}[{name}r{j}(m) + k * {strides[-1]}u])"
    body = re.sub(r"\$(\d+)", lambda mt: subst[int(mt.group(1))], text)
    value = convert(body, rk, "f32")
    # precise, as elementwise.comp's stores: x - x and x * 0 stay NaN for NaN and inf inputs
    decls.append(f"float {name}lazy(uint m, uint k) {{ precise float v_ = {value}; return v_; }}")
    return RowLoader(" ".join(decls), buffers, base)


def residual_adds(gm) -> dict:
    """{producer node: (add node, residual node)} for ``add(a, b)`` where one operand is
    the only use of an epilogue op's result (OpSpec.epilogue) and the other, a graph
    input or computed before it, has the add's shape or is one row of it (a bias: Qwen2's
    q, k and v): the producer may add the residual itself (its rule takes only what its
    kernel can add, a bias row where the output is one row)."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    found = {}
    for add in gm.graph.nodes:
        if add.target is not torch.ops.aten.add.Tensor or add.kwargs.get("alpha", 1) != 1 \
                or len(add.args) != 2 or not all(isinstance(a, torch.fx.Node) for a in add.args):
            continue
        out = add.meta.get("val")
        for p, r in (add.args, add.args[::-1]):
            rv = r.meta.get("val")
            spec = spec_of(p.target)
            if spec is not None and spec.epilogue and len(p.users) == 1 and p not in found and \
                    (r.op == "placeholder" or order[r] < order[p]) and out is not None and rv is not None and \
                    _fits(rv.shape, out.shape) and rv.dtype == out.dtype == torch.float32:
                found[p] = (add, r)
                break
    return found


def _fits(residual: torch.Size, out: torch.Size) -> bool:
    """Whether a residual of this shape may be added by its producer: the output's shape,
    or one row of it (a bias broadcast over the leading dimensions)."""
    return residual == out or (len(out) > 0 and len(residual) <= len(out) and
                               residual[-1:] == out[-1:] and math.prod(residual) == out[-1])


def foldable(expr: str, out, scatter, gather, accumulate, preamble) -> bool:
    """Whether an ew() call may be deferred (a plain expression into a new buffer)."""
    return out is None and not (scatter or gather or accumulate or preamble) and "$i" not in expr


def writes_in_place(n) -> bool:
    """Whether node n writes a buffer in place: a copy_ (into a graph input), an index_put
    (the planner may update it in place) or a mutating op. Fusions that move a read past
    other nodes (a Lazy computed later, a norm folded into its mat-vec) stop at one."""
    t = n.target
    return n.op == "call_function" and (
        t in (torch.ops.aten.copy_.default, torch.ops.aten.index_put.default) or
        (isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable))


def materialize(ctx, value):
    """A TRef for value, computing a Lazy or Deferred (anything else is returned as is)."""
    if isinstance(value, Deferred):
        return value.materialize(ctx)
    if not isinstance(value, Lazy):
        return value
    from .elementwise import ew
    return ew(ctx, value.expr, list(value.operands), value.out_kind, compute=value.compute,
              shape=value.shape, result=value.result)
