"""Elementwise family (shaders/elementwise.comp): one generator for unary,
binary, ternary ops, casts, fills and strided copies, with broadcasting and
views handled by strides. The tables below are the op -> expression entries."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from .fusion import Lazy, fold, foldable, materialize
from .core import (GLSL_TYPE, NO_REQUEST, Context, LoweringError, TRef, broadcast_shapes, contiguous_strides,
                   f32_bits, groups_for, i32_bits, kind_of, lowering)

aten = torch.ops.aten
WG = 256


def _expand(ref: TRef, shape: tuple) -> tuple:
    """Strides of ref broadcast to shape (0 on broadcast dims)."""
    pad = len(shape) - ref.ndim
    strides = [0] * pad + list(ref.strides)
    sizes = [1] * pad + list(ref.shape)
    return tuple(0 if sz == 1 and s != 1 else st for sz, st, s in zip(sizes, strides, shape))


def _coalesce(shape, stride_sets):
    """Merge dims that are contiguous for every operand; drop size-1 dims."""
    dims = [(s, [st[i] for st in stride_sets]) for i, s in enumerate(shape) if s != 1]
    merged = []
    for size, strides in dims:
        if merged:
            psize, pstrides = merged[-1]
            if all(ps == s * size for ps, s in zip(pstrides, strides)):
                merged[-1] = (psize * size, strides)
                continue
        merged.append((size, strides))
    if not merged:
        merged = [(1, [0] * len(stride_sets))]
    return [m[0] for m in merged], [[m[1][k] for m in merged] for k in range(len(stride_sets))]


def row_walk(x, out_strides, dim: int, spec: list, q: str = "q") -> tuple[list, list]:
    """For kernels that take one row along `dim` at a time: the other dims (coalesced)
    as KD/KI/KO spec constants appended to `spec`, and the GLSL that walks row number
    `q` into the row's input and output word offsets ib, ob: (decls, code)."""
    kept = [d for d in range(x.ndim) if d != dim]
    shape, (istr, ostr) = _coalesce([x.shape[d] for d in kept],
                                    [[x.strides[d] for d in kept], [out_strides[d] for d in kept]])
    decls, code = [], []
    for k in reversed(range(len(shape))):
        cid = len(spec)
        decls.append(f"layout(constant_id={cid}) const uint KD{k}=1u;"
                     f"layout(constant_id={cid + 1}) const uint KI{k}=0u;"
                     f"layout(constant_id={cid + 2}) const uint KO{k}=0u;")
        spec += [shape[k], istr[k], ostr[k]]
        code.append(f"{{ uint c = {q} % KD{k}; {q} /= KD{k}; ib += c * KI{k}; ob += c * KO{k}; }}")
    return decls, code


def _folds_badly(bits: int) -> bool:
    """Whether a float constant's exponent is subnormal or above 2^126: a driver that
    folds it into a reciprocal or a flushed operation changes the result."""
    e = (bits >> 23) & 0xFF
    return e == 0 or 253 <= e < 255


def hides(bits: int, is_float: bool) -> bool:
    """Whether a constant's 32-bit word must be hidden from the compiler (unseen): a zero,
    whose folding loses torch's NaN/inf * 0 = NaN (drivers fold x * 0.0 to 0, lavapipe
    does; an int 0 too, once a folded expression converts it to float), or a float that
    folds badly."""
    return bits in (0, 0x80000000) or (is_float and _folds_badly(bits))


def unseen(word: str) -> str:
    """A uint expression equal to `word` that the compiler cannot fold: it is XORed with
    the z group count less one, which every kernel's dispatch gives as 1."""
    return f"({word} ^ (gl_NumWorkGroups.z - 1u))"


def _scalar_spec(value, kind: str) -> int:
    if kind == "f32":
        return f32_bits(float(value))
    return i32_bits(int(value))


def ew(ctx: Context, expr: str, operands: list, out_kind: str, compute: str | None = None,
       out: TRef | None = None, shape: tuple | None = None, result: str | None = None,
       scatter: list[tuple[int, int, int]] = (), accumulate: bool | str = False,
       gather: list[tuple[int, int, int, int]] = (), helpers: tuple = (),
       check: tuple[TRef, int] | None = None, wrap: bool = True, defer: bool = False) -> TRef:
    """out = expr($0, $1, ...) elementwise.

    operands: TRefs, host tensors (0-dim ones become constants) or Python scalars.
    compute: kind every operand is converted to before expr (None: their own).
    result: kind of expr's value (default: compute or out_kind); converted to out_kind.
    out: write into this (possibly strided) TRef instead of a new buffer.
    scatter: (operand j, out stride, dim size) each: the output offset also moves by
      operand j's value (an index, negative ones wrapped) times the stride; elements
      whose index is out of range are not written (index_put).
    accumulate: add into the output (atomically) instead of storing; or "mul", "max",
      "min" to combine with that instead.
    gather: (operand j, operand k, stride, dim size) each: operand k is read at an
      offset also moved by operand j's value (an index, negative ones wrapped) times
      the stride; an out-of-range index makes that element 0 (and sets `check`'s bit).
    check: (check buffer, bit) from checks.check_bit: an out-of-range scatter or gather
      index also sets that bit, and the program raises after the submit.
    wrap: negative scatter/gather indices count from the end (x[idx], index_put, take);
      without it they are out of range (gather, scatter).
    `$i` in expr is the element's flat index (int) in the output shape.
    helpers: the shaders/special.glsl functions expr calls (NEED_<name> defines).
    Lazy operands (fusion.py) are folded into expr; with defer (a fusible rule's
    Request.defer), a plain expression is returned as a Lazy instead of being dispatched."""
    limit = max_buffers(ctx.caps)
    if any(isinstance(o, Lazy) for o in operands):
        folded = fold(expr, operands, out_kind, compute, result, shape)
        if _tensors(folded[1]) < limit:
            expr, operands, compute, result, shape = folded
        else:       # more buffers than a kernel binds: the Lazy operands are computed first
            operands = [materialize(ctx, o) for o in operands]
    # an int64 overflow check (checks.glsl) stays in an elementwise kernel, which flushes it:
    # a kernel that computes a Lazy as it loads (fusion.row_loader) would drop it; a Lazy
    # binds fewer buffers than a kernel may, so any consumer can still fold it
    if defer and foldable(expr, out, scatter, gather, accumulate, helpers) and "_ck(" not in expr \
            and _tensors(operands) < limit:
        if shape is None:
            shape = fold(expr, operands, out_kind, compute, result, None)[4]
        return Lazy(expr, tuple(operands), out_kind, compute, result, tuple(shape))
    ops = _refs(ctx, operands)
    if shape is None:
        shape = out.shape if out is not None else \
            broadcast_shapes(*[t.shape for t in ops if isinstance(t, TRef)])
    shape = tuple(int(s) for s in shape)
    fresh = out is None
    if fresh:
        out = ctx.empty(shape, out_kind)
    if not out.numel:
        return out
    o = Output(expr, ops, out, out_kind, compute, result)
    if fresh and not (scatter or gather or accumulate or helpers or check):
        _join(ctx, o, shape)
    else:
        _emit(ctx, [o], shape, scatter=scatter, accumulate=accumulate, gather=gather,
              helpers=helpers, check=check, wrap=wrap)
    return out


# buffers one multi-output kernel binds at most: the device's per-stage limit on storage
# buffers (lavapipe: 32), less one for a checks word, up to MAX_BUFFERS; a device that
# reports none gets DEFAULT_BUFFERS
MAX_BUFFERS = 64
DEFAULT_BUFFERS = 12


def max_buffers(caps: dict) -> int:
    """How many buffers one multi-output elementwise kernel may bind on this device."""
    limit = caps.get("max_storage_buffers_per_stage")
    return DEFAULT_BUFFERS if limit is None else max(4, min(MAX_BUFFERS, int(limit) - 1))


class KernelGroup:
    """Elementwise outputs that share one kernel (elementwise siblings, copy_groups' copies
    into inputs): their shape, the buffers they write and the buffers they bind."""

    def __init__(self, shape: tuple, limit: int):
        self.shape, self.limit = shape, limit
        self.written, self.bound = set(), set()

    def fits(self, shape: tuple, reads: set, out: int) -> bool:
        """Whether an output into buffer `out` of `shape` reading buffers `reads` may join:
        the same shape, reading nothing a member writes, within the binding limit."""
        return tuple(shape) == self.shape and not (reads & self.written) and \
            len(self.bound | reads | {out}) <= self.limit

    def note(self, reads: set, out: int) -> None:
        self.written.add(out)
        self.bound |= reads | {out}


class _Siblings:
    """Elementwise results into new buffers, none reading another's: those of one shape
    are one kernel (an optimizer step's moments and step counts, one of each a parameter,
    whatever order the parameters' shapes come in). They wait as the Context's
    before_dispatch, so the next dispatch of anything else, or a result that reads one of
    them, emits them first: each is computed before any kernel that reads it."""

    def __init__(self, ctx: Context):
        self.ctx, self.written = ctx, set()
        self.groups: dict[tuple, tuple[KernelGroup, list]] = {}    # shape -> (group, its outputs)

    def join(self, o: Output, shape: tuple, reads: set) -> bool:
        """Add o (of `shape`, reading `reads`) to its shape's kernel; False where it may not
        wait with these (it reads one of them, or its kernel is full). The first output of
        a shape always joins, whatever it binds."""
        if reads & self.written:
            return False
        group, outs = self.groups.get(shape) or (KernelGroup(shape, max_buffers(self.ctx.caps)), [])
        if outs and not group.fits(shape, reads, o.out.buf):
            return False
        group.note(reads, o.out.buf)
        outs.append(o)
        self.groups[shape] = (group, outs)
        self.written.add(o.out.buf)
        return True

    def emit(self) -> None:
        self.ctx.siblings = None
        for shape, (_, outs) in self.groups.items():
            _emit(self.ctx, outs, shape)


def _join(ctx: Context, o: Output, shape: tuple) -> None:
    """o, a new buffer's elementwise result, with the waiting siblings where it may join
    them (nothing else waits after them), else first among new ones."""
    reads = {t.buf for t in o.ops if isinstance(t, TRef)}
    s = ctx.siblings
    if s is None or ctx.before_dispatch != s.emit or not s.join(o, shape, reads):
        ctx.run_before_dispatch()
        s = ctx.siblings = _Siblings(ctx)
        ctx.before_dispatch = s.emit
        s.join(o, shape, reads)


@dataclass(frozen=True)
class Output:
    """One output of an elementwise kernel: out = expr($0, $1, ...) over ops (TRefs or
    scalars, in the kinds ew() takes them)."""
    expr: str
    ops: list
    out: TRef
    out_kind: str
    compute: str | None = None
    result: str | None = None


def _tensors(operands) -> int:
    """How many buffers ew()'s operands bind: their distinct tensors (0-dim ones are
    constants)."""
    return len({o.buf if isinstance(o, TRef) else id(o) for o in operands
                if isinstance(o, TRef) or isinstance(o, torch.Tensor) and o.dim()})


def _refs(ctx: Context, operands) -> list:
    """ew()'s operands as the kernel takes them: tensors as TRefs, 0-dim ones as scalars."""
    ops = []
    for o in operands:
        if isinstance(o, torch.Tensor) and o.dim() == 0:
            o = o.item()
        ops.append(ctx.ref(o) if isinstance(o, torch.Tensor) else o)
    return ops


def ew_outputs(ctx: Context, items: list[tuple[object, TRef]]) -> None:
    """Each src (a Lazy or a TRef) into its dst, all of dst's shape, as one kernel: each
    invocation loads every operand's element, then stores every output's, so an operand
    that is an output's own element (same buffer and view) is read before it is written.
    The caller orders them (copy_groups.py): every read sees the values before the kernel."""
    outs = []
    for src, dst in items:
        expr, leaves, compute, result, _ = fold("$0", [src], dst.kind, dst.kind, None, dst.shape)
        outs.append(Output(expr, _refs(ctx, leaves), dst, dst.kind, compute, result))
    shape = tuple(int(s) for s in items[0][1].shape)
    if math.prod(shape):
        _emit(ctx, outs, shape)


def _emit(ctx: Context, outs: list[Output], shape: tuple, scatter=(), accumulate=False,
          gather=(), helpers=(), check=None, wrap=True) -> None:
    """The kernel computing outs over shape (scatter, gather, accumulate and check: one
    output only, as ew() describes them)."""
    if len(outs) > 1 and (scatter or gather or accumulate or check):
        raise ValueError("scatter, gather, accumulate and check take one output")
    numel = math.prod(shape)
    # operands of every output in one list: output k's $j is operand first[k] + j
    first, ops, exprs = [], [], []
    for o in outs:
        first.append(len(ops))
        exprs.append(re.sub(r"\$(\d+)", lambda m, b=len(ops): f"${b + int(m.group(1))}", o.expr))
        ops += o.ops
    computes = [c for o in outs for c in [o.compute] * len(o.ops)]
    tensors = [o for o in ops if isinstance(o, TRef)]
    strides = [_expand(t, shape) for t in tensors] + [_expand(o.out, shape) for o in outs]
    dims, strides = _coalesce(shape, strides)
    nd = len(dims)
    n_in = len(tensors)
    # vec4: a flat kernel over contiguous (or broadcast scalar) operands moves 4
    # elements per invocation with 16-byte loads and stores
    vec = nd == 1 and numel % 4 == 0 and not (scatter or gather or accumulate) and \
        not any("$i" in e for e in exprs) and \
        all(st[0] == 1 and o.out.offset % 4 == 0 for st, o in zip(strides[n_in:], outs)) and \
        all(st[0] == 0 or (st[0] == 1 and t.offset % 4 == 0)
            for st, t in zip(strides, tensors))
    unit = [st[0] == 1 for st in strides[:n_in]] if vec else []

    spec = [WG, numel // 4 if vec else numel]
    # Sizes, strides, offsets and scalars are specialisation constants whose defaults in
    # the source are placeholders (the spec list gives every value): one source, one
    # glslc compile, for every shape of the same expression. With the values as defaults
    # each new shape compiled its kernels again (a transformers DynamicCache decode step:
    # 9 new sources a token, most of the step's build on lavapipe).
    decls, loads, names = [], [], []
    cid = 2
    for d in dims:
        decls.append(f"layout(constant_id={cid}) const uint D{cid - 2}=1u;")
        spec.append(d)
        cid += 1

    def operand_decl(tag: str, ref_strides, offset):
        nonlocal cid
        decls.append(f"layout(constant_id={cid}) const uint O{tag}=0u;")
        spec.append(offset)
        cid += 1
        for k, st in enumerate(ref_strides):
            decls.append(f"layout(constant_id={cid}) const uint S{tag}_{k}=0u;")
            spec.append(st)
            cid += 1

    # the outputs' buffers first (bindings 0..); output k's offset, strides and word
    # variable are tagged "o" + k ("o" alone for the first)
    buffers = []
    otags = ["o" + (str(k) if k else "") for k in range(len(outs))]
    out_bindings = [_bind(buffers, o.out) for o in outs]
    index = ["uint r = i;"]
    ti = 0
    binding = {}
    vec_loads, vec_bufs = [], set(out_bindings)
    for j, o in enumerate(ops):
        ck = computes[j] or (o.kind if isinstance(o, TRef) else None)
        if isinstance(o, TRef):
            operand_decl(str(j), strides[ti], o.offset)
            # one binding per buffer: fused kernels read many views of few buffers
            # (descriptor limits: 32 on lavapipe)
            b = binding[j] = _bind(buffers, o)
            raw = f"ld_{o.kind}(b{b}[o{j}])"
            if vec and unit[ti]:
                vec_loads.append(f"uvec4 w{j} = b{b}v[(O{j} >> 2u) + i];")
                vec_bufs.add(b)
                raw = f"ld_{o.kind}(w{j}[e_])"
            elif vec:
                raw = f"ld_{o.kind}(b{b}[O{j}])"
            ti += 1
            ck = ck or o.kind
            loads.append(f"{GLSL_TYPE[ck]} v{j} = {GLSL_TYPE[ck]}({raw});")
        else:
            if ck is None:
                ck = "b" if isinstance(o, bool) else "i32" if isinstance(o, int) else "f32"
            if ck == "b":
                o = int(bool(o))
                ctype = "int"
            else:
                ctype = GLSL_TYPE[ck]
            val = _scalar_spec(o, "f32" if ctype == "float" else "i32")
            base = "float" if ctype == "float" else "int"
            decls.append(f"layout(constant_id={cid}) const uint C{j}=0u;")
            spec.append(val)
            cid += 1
            conv = "uintBitsToFloat" if base == "float" else "int"
            raw = unseen(f"C{j}") if hides(val, base == "float") else f"C{j}"
            loads.append(f"{GLSL_TYPE[ck]} v{j} = {GLSL_TYPE[ck]}({conv}({raw}));")
        names.append(f"v{j}")
    for tag, st, o in zip(otags, strides[n_in:], outs):
        operand_decl(tag, st, o.out.offset)

    # index code: unravel i over dims (last fastest), accumulate each operand offset
    offs = [f"o{j}" for j, o in enumerate(ops) if isinstance(o, TRef)] + ["o" + t for t in otags]
    tags = [str(j) for j, o in enumerate(ops) if isinstance(o, TRef)] + otags
    index += [f"uint {v} = O{t};" for v, t in zip(offs, tags)]
    for k in reversed(range(nd)):
        index.append(f"{{ uint c = r % D{k}; r /= D{k};" +
                     "".join(f" {v} += c * S{t}_{k};" for v, t in zip(offs, tags)) + " }")
    flag = ""
    if check is not None:          # the bit this kernel sets for an index out of range
        flag = f"atomicOr(b{_bind(buffers, check[0])}[0], {1 << check[1]}u); "
    for j, stride, size in scatter:
        decls.append(f"layout(constant_id={cid}) const uint XS{j}=0u;"
                     f"layout(constant_id={cid + 1}) const int XN{j}=1;")
        spec += [stride, size]
        cid += 2
        loads.append(f"{{ int x_ = int(v{j}); {f'if (x_ < 0) x_ += XN{j}; ' if wrap else ''}"
                     f"if (x_ < 0 || x_ >= XN{j}) {{ {flag}return; }} oo += uint(x_) * XS{j}; }}")
    for j, k, stride, size in gather:
        decls.append(f"layout(constant_id={cid}) const uint GS{j}=0u;"
                     f"layout(constant_id={cid + 1}) const int GN{j}=1;")
        spec += [stride, size]
        cid += 2
        index.append(f"{{ int x_ = ld_i32(b{binding[j]}[o{j}]); "
                     f"{f'if (x_ < 0) x_ += GN{j}; ' if wrap else ''}"
                     f"if (x_ < 0 || x_ >= GN{j}) {{ {flag}b0[oo] = 0u; return; }} "
                     f"o{k} += uint(x_) * GS{j}; }}")
    stores, vec_stores, bodies = [], [], []
    for k, (o, expr, tag, b) in enumerate(zip(outs, exprs, otags, out_bindings)):
        body = expr.replace("$i", "int(i)")
        for j in reversed(range(len(names))):
            body = body.replace(f"${j}", names[j])
        bodies.append(body)
        rk = o.result or o.compute or o.out_kind
        value = "res" if k == 0 else f"res{k}"
        stored = value + "_"
        if rk != o.out_kind:
            stored = {"b": f"nonzero_f({stored})" if rk == "f32" else f"({stored} != {GLSL_TYPE[rk]}(0))"}.get(
                o.out_kind, f"{GLSL_TYPE[o.out_kind]}({stored})")
        # vec4: one component of the 4-word result per pass of the loop INDEX_CODE opened
        r4 = "r4_" if k == 0 else f"r4{k}_"
        store = f"{f'{r4}[e_]' if vec else f'b{b}[o{tag}]'} = st_{o.out_kind}({stored});"
        if accumulate:
            store = _atomic_store(o.out_kind, "add" if accumulate is True else accumulate, stored)
        # precise: the driver may not fold x - x, x * 0 or x * 0 + 1 to constants (NaN and
        # inf inputs give NaN there) nor contract into fma (results then match torch's bit
        # for bit); on bool and int results too, for the float arithmetic under
        # isnan(x - x) or x > y
        stores.append(f"precise {GLSL_TYPE[rk]} {value}_ = {GLSL_TYPE[rk]}({body}); {store}")
        vec_stores.append((r4, f"b{b}v[(O{tag} >> 2u) + i] = {r4};"))
    checked = ""
    if any("_ck(" in body for body in bodies):   # int64 arithmetic whose overflow flags (checks.glsl)
        ck = TRef(ctx.plan.check_buffer, (1,), (1,), 0, "i32")
        checked = f" if (ck_ != 0u) atomicOr(b{_bind(buffers, ck)}[0], ck_);"

    many = f"_{len(outs)}out" if len(outs) > 1 else ""
    defines = {
        "VARIANT": f"{n_in}in{nd}d" + ("v4" if vec else "") + many,
        "SPEC_DECLS": " ".join(decls),
        **{f"NEED_{h}": 1 for h in helpers},
        "BUFFER_DECLS": " ".join(f"BUFFER({k}, b{k})" for k in range(len(buffers))),
        "INDEX_CODE": " ".join(index + loads),
        "OUT_STORE": " ".join(stores),
    }
    if vec:     # the same expression per component of 16-byte words
        defines["BUFFER_DECLS"] += " " + " ".join(
            f"layout(set = 0, binding = {k}) buffer Buf{k}v {{ uvec4 b{k}v[]; }};"
            for k in sorted(vec_bufs))
        defines["INDEX_CODE"] = " ".join(vec_loads + [f"uvec4 {r4};" for r4, _ in vec_stores] +
                                         ["for (uint e_ = 0u; e_ < 4u; ++e_) {"] + loads)
        defines["OUT_STORE"] += " } " + " ".join(st for _, st in vec_stores)
    defines["OUT_STORE"] += checked
    ctx.dispatch("elementwise", defines, buffers, sorted(set(out_bindings)), spec,
                 groups_for(numel // 4 if vec else numel, WG), note=f"{shape} <- {' ; '.join(o.expr for o in outs)}")


def _bind(buffers: list, ref: TRef) -> int:
    """The binding of ref's buffer among `buffers`, appended if it has none."""
    for k, b in enumerate(buffers):
        if b.buf == ref.buf:
            return k
    buffers.append(ref)
    return len(buffers) - 1


# combine(old, new) of the accumulating stores; f32 and products go through a CAS loop
_COMBINE = {"add": "({a} + {b})", "mul": "({a} * {b})",
            "max": "((isnan({a}) || {a} > {b}) ? {a} : {b})",
            "min": "((isnan({a}) || {a} < {b}) ? {a} : {b})"}
_INT_ATOMIC = {"add": "atomicAdd", "max": "atomicMax", "min": "atomicMin"}


def _atomic_store(kind: str, op: str, value: str) -> str:
    if kind == "b":
        return f"atomic{'Or' if op in ('add', 'max') else 'And'}(b0[oo], st_b({value}));"
    if kind == "i32" and op in _INT_ATOMIC:       # int atomics on the uint words, as int
        return (f"{{ uint seen_ = b0[oo], was_; do {{ was_ = seen_; seen_ = atomicCompSwap("
                f"b0[oo], was_, st_i32({op}(ld_i32(was_), int({value})))); }} "
                f"while (seen_ != was_); }}" if op != "add" else
                f"atomicAdd(b0[oo], st_i32({value}));")
    combine = _COMBINE[op].format(a=f"ld_{kind}(was_)", b=f"{GLSL_TYPE[kind]}({value})")
    if kind == "i32":
        combine = combine.replace("isnan", "false && bool")
    return (f"{{ uint seen_ = b0[oo], was_; do {{ was_ = seen_; seen_ = atomicCompSwap("
            f"b0[oo], was_, st_{kind}({combine})); }} while (seen_ != was_); }}")


def add_slices(ctx: Context, part: TRef, out: TRef) -> TRef:
    """out = part.sum(0) for a contiguous part of [splits, *out.shape]: the partial
    products of a matmul whose K was split, added in one kernel."""
    splits, size = part.shape[0], math.prod(part.shape[1:])
    slices = [part.with_layout(out.shape, contiguous_strides(out.shape), part.offset + z * size)
              for z in range(splits)]
    return ew(ctx, " + ".join(f"${z}" for z in range(splits)), slices, "f32", out=out)


def copy_to(ctx: Context, src, out: TRef) -> TRef:
    """Strided copy (with conversion) of src into out's view."""
    return ew(ctx, "$0", [src], out.kind, compute=out.kind, out=out)


def contiguous(ctx: Context, ref: TRef) -> TRef:
    return ref if ref.is_contiguous() else ew(ctx, "$0", [ref], ref.kind)


# --- tables ----------------------------------------------------------------
FLOAT_UNARY = {
    aten.exp.default: "exp($0)", aten.log.default: "log_f($0)", aten.sqrt.default: "sqrt($0)",
    aten.rsqrt.default: "inversesqrt($0)", aten.tanh.default: "tanh_f($0)",
    aten.sigmoid.default: "sigmoid_f($0)", aten.sin.default: "sin($0)",
    aten.cos.default: "cos($0)", aten.tan.default: "tan_f($0)", aten.exp2.default: "exp2($0)",
    aten.log2.default: "log2($0)", aten.log10.default: "log($0) * 0.43429448190325176",
    # Kahan's forms: accurate near 0, where log(1 + x) and exp(x) - 1 cancel
    aten.log1p.default: "log1p_f($0)", aten.expm1.default: "expm1_f($0)",
    aten.reciprocal.default: "div_f(1.0, $0)", aten.erf.default: "erf_f($0)",
    aten.asin.default: "(abs($0) <= 1.0 ? atan2_f($0, sqrt((1.0 - $0) * (1.0 + $0))) : "
                       "uintBitsToFloat(0x7fc00000u))",   # lavapipe asin is 4e-4 off
    aten.acos.default: "(abs($0) <= 1.0 ? atan2_f(sqrt((1.0 - $0) * (1.0 + $0)), $0) : "
                       "uintBitsToFloat(0x7fc00000u))", aten.atan.default: "atan_f($0)",
    aten.sinh.default: "sinh_f($0)", aten.cosh.default: "cosh($0)",
    aten.asinh.default: "asinh_f($0)", aten.acosh.default: "acosh($0)",
    aten.atanh.default: "atanh($0)",
    aten.silu.default: "$0 * sigmoid_f($0)",
    aten.isnan.default: "isnan($0)", aten.isinf.default: "isinf($0)",
}
SAME_KIND_UNARY = {
    aten.neg.default: "-$0", aten.abs.default: "abs($0)",
    aten.sign.default: "sign($0)", aten.floor.default: "floor($0)", aten.ceil.default: "ceil($0)",
    aten.trunc.default: "trunc($0)", aten.round.default: "roundEven($0)",
    aten.lift_fresh_copy.default: "$0",
    aten.logical_not.default: "!$0", aten.bitwise_not.default: "~$0",
}
ARITH = {  # computed in the output's kind
    aten.mul.Tensor: "$0 * $1", aten.div.Tensor: "div_f($0, $1)",
    aten.maximum.default: "max_f($0, $1)", aten.minimum.default: "min_f($0, $1)",
    aten.pow.Tensor_Tensor: "pow_f($0, $1)",
    aten.pow.Scalar: "pow_f($0, $1)", aten.atan2.default: "atan2_f($0, $1)",
    aten.fmod.Tensor: "fmod_f($0, $1)", aten.fmod.Scalar: "fmod_f($0, $1)",
    aten.remainder.Tensor: "remainder_f($0, $1)", aten.remainder.Scalar: "remainder_f($0, $1)",
    aten.bitwise_and.Tensor: "$0 & $1", aten.bitwise_or.Tensor: "$0 | $1",
    aten.bitwise_xor.Tensor: "$0 ^ $1",
}
COMPARE = {  # computed in the promoted input kind, result bool
    aten.eq.Tensor: "$0 == $1", aten.eq.Scalar: "$0 == $1", aten.ne.Tensor: "$0 != $1",
    aten.ne.Scalar: "$0 != $1", aten.lt.Tensor: "$0 < $1", aten.lt.Scalar: "$0 < $1",
    aten.le.Tensor: "$0 <= $1", aten.le.Scalar: "$0 <= $1", aten.gt.Tensor: "$0 > $1",
    aten.gt.Scalar: "$0 > $1", aten.ge.Tensor: "$0 >= $1", aten.ge.Scalar: "$0 >= $1",
}
LOGICAL = {aten.logical_and.default: "$0 && $1", aten.logical_or.default: "$0 || $1",
           aten.logical_xor.default: "$0 != $1"}


def _input_kind(ctx: Context) -> str:
    """The promoted kind of the node's tensor/scalar inputs (torch's type promotion)."""
    vals = [a.meta["val"] if hasattr(a, "meta") else a for a in ctx.node.args[:2]]
    return kind_of(torch.result_type(*vals)) if len(vals) == 2 else kind_of(vals[0].dtype)


_ROUNDING = ("floor($0)", "ceil($0)", "trunc($0)", "roundEven($0)")
BOOL_FORMS = {"$0 & $1": "$0 && $1", "$0 | $1": "$0 || $1", "$0 ^ $1": "$0 != $1", "~$0": "!$0",
              "$0 * $1": "$0 && $1", "$0 + $1": "$0 || $1", "max_f($0, $1)": "$0 || $1",
              "min_f($0, $1)": "$0 && $1", "abs($0)": "$0", "sign($0)": "$0",
              **{e: "$0" for e in _ROUNDING}}
INT_FORMS = {"remainder_f($0, $1)": "imod_($0, $1)", "fmod_f($0, $1)": "irem_($0, $1)",
             "pow_f($0, $1)": "ipow_($0, $1)", "max_f($0, $1)": "max($0, $1)",
             "min_f($0, $1)": "min($0, $1)", **{e: "$0" for e in _ROUNDING}}


def _for_kind(expr: str, kind: str, ctx: Context | None = None) -> str:
    """The form of expr in kind: bool tensors use GLSL's logical ops, integers
    their own division, modulo, power and (identity) rounding; with ctx, an int64
    result that may leave int32 is computed with an overflow check."""
    expr = {"b": BOOL_FORMS, "i32": INT_FORMS}.get(kind, {}).get(expr, expr)
    return int64_checked(ctx, expr) if ctx is not None and kind == "i32" else expr


# int64 results travel as int32: these forms flag a result that leaves it (checks.glsl)
CHECKED_INT64 = {"$0 + $1": "iadd_ck($0, $1, {m}u)", "$0 - $1": "isub_ck($0, $1, {m}u)",
                 "$0 * $1": "imul_ck($0, $1, {m}u)", "-$0": "ineg_ck($0, {m}u)",
                 "abs($0)": "iabs_ck($0, {m}u)", "$0 << $1": "ishl_ck($0, $1, {m}u)",
                 "ipow_($0, $1)": "ipow_ck($0, $1, {m}u)"}


def int64_overflow_mask(ctx: Context) -> int:
    """The check bit (as a mask) for the node's int64 result leaving int32."""
    from .checks import check_bit, op_label
    _, bit = check_bit(ctx, f"{op_label(ctx)}: an int64 result does not fit in int32 (int64 "
                            "values travel as int32 on the GPU)", "OverflowError")
    return 1 << bit


def int64_checked(ctx: Context, expr: str) -> str:
    """expr with an overflow check where the node's result is int64 and expr can leave
    int32 (sums, differences, products, powers, negation, left shifts)."""
    val = ctx.node.meta.get("val") if ctx.node is not None else None
    if expr not in CHECKED_INT64 or not isinstance(val, torch.Tensor) or val.dtype != torch.int64:
        return expr
    return CHECKED_INT64[expr].format(m=int64_overflow_mask(ctx))


def _register_tables():
    """The table ops: each one ew() of its inputs (fusible)."""
    for op, e in FLOAT_UNARY.items():
        lowering(op, fusible=True)(lambda ctx, x, e=e, request=NO_REQUEST: ew(
            ctx, e, [x], ctx.out_kind(), compute="f32",
            result="b" if "isnan" in e or "isinf" in e else "f32", defer=request.defer))
    for op, e in SAME_KIND_UNARY.items():
        lowering(op, fusible=True)(lambda ctx, x, e=e, request=NO_REQUEST, **kw: ew(
            ctx, _for_kind(e, ctx.out_kind(), ctx), [x], ctx.out_kind(), compute=ctx.out_kind(),
            defer=request.defer))
    for op, e in ARITH.items():
        lowering(op, fusible=True)(lambda ctx, a, b, e=e, request=NO_REQUEST: ew(
            ctx, _for_kind(e, ctx.out_kind(), ctx), [a, b], ctx.out_kind(), compute=ctx.out_kind(),
            defer=request.defer))
    for op, e in COMPARE.items():
        lowering(op, fusible=True)(lambda ctx, a, b, e=e, request=NO_REQUEST: ew(
            ctx, e, [a, b], "b", compute=_input_kind(ctx), result="b", defer=request.defer))
    for op, e in LOGICAL.items():
        lowering(op, fusible=True)(lambda ctx, a, b, e=e, request=NO_REQUEST: ew(
            ctx, e, [a, b], "b", compute="b", defer=request.defer))


_register_tables()


@lowering(aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, fusible=True)
def add(ctx, a, b, alpha=1, request=NO_REQUEST):
    sign = "-" if ctx.node.target in (aten.sub.Tensor, aten.sub.Scalar) else "+"
    k = ctx.out_kind()
    if alpha == 1:
        return ew(ctx, _for_kind(f"$0 {sign} $1", k, ctx), [a, b], k, compute=k, defer=request.defer)
    return ew(ctx, f"$0 {sign} $2 * $1", [a, b, alpha], k, compute=k, defer=request.defer)


# torch's float pow with these scalar exponents is these forms (sqrt(-inf) is NaN where
# pow(-inf, 0.5) is inf; x * x keeps the last bit pow's exp2(log2) loses)
POW_FORMS = {2: "$0 * $0", 3: "$0 * $0 * $0", -2: "div_f(1.0, $0 * $0)", 0.5: "sqrt($0)",
             -0.5: "inversesqrt($0)", -1: "div_f(1.0, $0)"}


@lowering(aten.pow.Tensor_Scalar, fusible=True)
def pow_scalar(ctx, a, b, request=NO_REQUEST):
    k = ctx.out_kind()
    if k == "f32" and not isinstance(b, bool) and b in POW_FORMS:
        return ew(ctx, POW_FORMS[b], [a], k, compute=k, defer=request.defer)
    return ew(ctx, _for_kind("pow_f($0, $1)", k, ctx), [a, b], k, compute=k, defer=request.defer)


@lowering(aten.mul.Scalar, aten.div.Scalar, fusible=True)
def scalar_arith(ctx, a, b, request=NO_REQUEST):
    k = ctx.out_kind()
    e = "$0 * $1" if ctx.node.target == aten.mul.Scalar else \
        "div_f($0, $1)" if k == "f32" else "$0 / $1"
    return ew(ctx, _for_kind(e, k, ctx), [a, b], k, compute=k, defer=request.defer)


@lowering(aten.div.Tensor_mode)
def div_mode(ctx, a, b, rounding_mode=None):
    k = ctx.out_kind()
    fn = {"trunc": "trunc", "floor": "floor", None: ""}[rounding_mode]
    if k == "i32" and rounding_mode in ("trunc", "floor"):
        e = "$0 / $1" if rounding_mode == "trunc" else "ifloordiv_($0, $1)"
        return ew(ctx, e, [a, b], k, compute="i32")
    if rounding_mode == "floor":    # torch's rule, from the exact remainder
        return ew(ctx, "floordiv_f($0, $1)", [a, b], k, compute="f32", result="f32")
    return ew(ctx, f"{fn}(div_f($0, $1))", [a, b], k, compute="f32", result="f32")


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, fusible=True)
def where(ctx, cond, a, b, request=NO_REQUEST):
    k = ctx.out_kind()
    t = GLSL_TYPE[k]
    return ew(ctx, f"bool($0) ? {t}($1) : {t}($2)", [cond, a, b], k, result=k, defer=request.defer)


@lowering(aten.relu.default, fusible=True)
def relu(ctx, x, request=NO_REQUEST):
    k = ctx.out_kind()
    e = "relu_f($0)" if k == "f32" else "max($0, 0)"
    return ew(ctx, e, [x], k, compute=k, defer=request.defer)


@lowering(aten.clamp.default, aten.clamp.Tensor, fusible=True)
def clamp(ctx, x, lo=None, hi=None, request=NO_REQUEST):
    """min(max(x, lo), hi); for floats a NaN in x or a bound gives NaN, as torch's."""
    k = ctx.out_kind()
    mx, mn = ("max_f", "min_f") if k == "f32" else ("max", "min")
    expr, ops = "$0", [x]
    if lo is not None:
        ops.append(lo)
        expr = f"{mx}({expr}, ${len(ops) - 1})"
    if hi is not None:
        ops.append(hi)
        expr = f"{mn}({expr}, ${len(ops) - 1})"
    return ew(ctx, expr, ops, k, compute=k, defer=request.defer)


@lowering(aten.clamp_min.default, aten.clamp_max.default, fusible=True)
def clamp_one(ctx, x, bound, request=NO_REQUEST):
    lo = ctx.node.target == aten.clamp_min.default
    return clamp(ctx, x, bound if lo else None, None if lo else bound, request=request)


@lowering(aten.gelu.default, fusible=True)
def gelu(ctx, x, approximate="none", request=NO_REQUEST):
    if approximate == "tanh":
        e = "0.5 * $0 * (1.0 + tanh_f(0.7978845608028654 * ($0 + 0.044715 * $0 * $0 * $0)))"
    else:
        e = "0.5 * $0 * erfc_f(-$0 * M_SQRT1_2)"   # erfc: no cancellation for x < 0
    return ew(ctx, e, [x], "f32", compute="f32", defer=request.defer)


@lowering(aten.leaky_relu.default, fusible=True)
def leaky_relu(ctx, x, slope=0.01, request=NO_REQUEST):
    return ew(ctx, "$0 > 0.0 ? $0 : $0 * $1", [x, slope], "f32", compute="f32", defer=request.defer)


@lowering(aten.hardtanh.default, fusible=True)
def hardtanh(ctx, x, lo=-1.0, hi=1.0, request=NO_REQUEST):
    return ew(ctx, "min_f(max_f($0, $1), $2)", [x, lo, hi], "f32", compute="f32",
              defer=request.defer)


@lowering(aten._to_copy.default, aten.clone.default, aten.copy.default,
          torch.ops.prims.convert_element_type.default)   # (a size ** 0.5 under dynamic shapes)
def to_copy(ctx, x, *rest, **kwargs):
    if ctx.node.target == aten.copy.default:   # copy(dst, src): src broadcast to dst's shape
        x = rest[0]
    k = ctx.out_kind()
    dtype = ctx.meta().dtype
    e = _cast_expr(x, k, dtype)
    if e == "ftoi32_($0)" and dtype == torch.int64:     # NaN and beyond int32: an error
        e = f"ftoi_ck($0, {int64_overflow_mask(ctx)}u)"
    src = getattr(getattr(ctx.node.args[0] if ctx.node.target != aten.copy.default
                          else ctx.node.args[1], "meta", {}).get("val"), "dtype", None)
    if src in (torch.float16, torch.bfloat16) and src != dtype:
        # a float16 value is kept in float32 (unrounded where it was computed): rounded
        # first, as torch holds it, so that .float() and .long() see eager's value
        e = e.replace("$0", NARROW[src].format("$0"))
    return ew(ctx, e, [x], k, shape=ctx.out_shape(), result=k)


# Narrow dtypes live in wider GPU kinds; a cast into one rounds or wraps as torch does.
NARROW = {
    torch.float16: "round_f16({})",
    torch.bfloat16: "round_bf16({})",
    torch.uint8: "(({}) & 255)", torch.int8: "(((({}) & 255) ^ 128) - 128)",
    torch.int16: "(((({}) & 65535) ^ 32768) - 32768)",
}


def _cast_expr(x, k: str, dtype: torch.dtype | None = None) -> str:
    src = x.kind if isinstance(x, TRef) else "f32"
    if k == "b":
        return "nonzero_f($0)" if src == "f32" else "$0 != " + {"i32": "0", "b": "false"}[src]
    expr = "ftoi32_($0)" if src == "f32" and k == "i32" else f"{GLSL_TYPE[k]}($0)"
    return NARROW[dtype].format(expr) if dtype in NARROW else expr


@lowering(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, fusible=True)
def full_like(ctx, x, value=None, request=NO_REQUEST, **kwargs):
    value = {aten.zeros_like.default: 0, aten.ones_like.default: 1}.get(ctx.node.target, value)
    k = ctx.out_kind()
    return ew(ctx, "$0", [value], k, compute=k, shape=ctx.out_shape(), defer=request.defer)


@lowering(aten.fill.Scalar, fusible=True)
def fill(ctx, x, value, request=NO_REQUEST):
    k = ctx.out_kind()
    return ew(ctx, "$0", [value], k, compute=k, shape=ctx.out_shape(), defer=request.defer)
