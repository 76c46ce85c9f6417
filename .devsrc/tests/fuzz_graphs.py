"""Random small graphs for the differential fuzzer (test_fuzz.py): a seed gives inputs
(odd and size-1 shapes; fp32, fp16, int32, int64 up to int32's edge, bool; contiguous,
transposed, permuted, strided, expanded and offset layouts; NaN, +-inf and +-0 in float
inputs)
and a chain of steps (elementwise, broadcasting, reductions, softmax, matmul/bmm,
views, cat/stack, where, index ops, flip, casts), built by running each step eagerly
so every step fits the values it is given.

Ops that jump (floor, comparisons, argmax, remainder, casts to int) take only values
that are exact: inputs and results of steps that round the same on every device
(views, +, -, *, max, where ...). A value after exp or a sum may differ from eager in
its last bits, and a jump would turn that into a different answer."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

SIZES = [1, 1, 2, 3, 4, 5, 7, 8, 13]
SPECIALS = [math.nan, math.inf, -math.inf, 0.0, -0.0]
FLOAT = (torch.float32, torch.float16)
INTS = (torch.int32, torch.int64)


@dataclass
class Value:
    t: torch.Tensor          # its eager value while the graph is built
    exact: bool              # rounds the same on every device
    special: bool            # may hold NaN or inf


@dataclass
class Step:
    text: str                # what it does, for the failure message
    fn: object               # fn(*values) -> tensor
    args: tuple              # slots of the graph it reads


@dataclass
class Graph:
    """Values in creation order (`slots`): an int is that input, a Step computes from
    earlier slots. Inputs are made between steps (a matmul's second operand), so the
    graph takes them all first and walks the slots."""
    seed: int
    inputs: list = field(default_factory=list)
    slots: list = field(default_factory=list)
    outputs: list = field(default_factory=list)

    @property
    def steps(self) -> list:
        return [s for s in self.slots if isinstance(s, Step)]

    def __call__(self, *xs):
        vals = []
        for s in self.slots:
            vals.append(xs[s] if isinstance(s, int) else s.fn(*[vals[i] for i in s.args]))
        return tuple(vals[i] for i in self.outputs)

    def describe(self) -> str:
        lines = []
        for i, s in enumerate(self.slots):
            if isinstance(s, int):
                x = self.inputs[s]
                lines.append(f"v{i} = input {tuple(x.shape)} {x.dtype} strides {x.stride()} "
                             f"offset {x.storage_offset()}")
            else:
                lines.append(f"v{i} = " + s.text.format(*[f"v{a}" for a in s.args]))
        lines.append("outputs " + ", ".join(f"v{i}" for i in self.outputs))
        return "\n".join(lines)


def _values(rng: random.Random, shape, dtype, special: bool) -> torch.Tensor:
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype in INTS:      # small, or near int32's edge (int64 results must stay inside it)
        high = 7 if rng.random() < 0.7 else 2**30
        return torch.randint(-high + 1, high, shape, generator=g, dtype=dtype)
    t = torch.randn(shape, generator=g) * 2
    if special and t.numel():
        flat = t.view(-1)
        for _ in range(rng.randint(1, 3)):
            flat[rng.randrange(flat.numel())] = rng.choice(SPECIALS)
    return t.to(dtype)


def _layout(rng: random.Random, shape, dtype, special: bool) -> torch.Tensor:
    """A tensor of `shape` in a random layout: contiguous, transposed, permuted,
    strided, expanded or at an offset in a larger buffer."""
    kind = rng.choice(["contig", "contig", "transposed", "permuted", "strided", "expanded",
                       "offset"])
    nd = len(shape)
    if kind == "transposed" and nd >= 2:
        return _values(rng, shape[:-2] + (shape[-1], shape[-2]), dtype, special).transpose(-1, -2)
    if kind == "permuted" and nd >= 2:
        perm = list(range(nd))
        rng.shuffle(perm)
        inv = [perm.index(d) for d in range(nd)]
        return _values(rng, tuple(shape[p] for p in inv), dtype, special).permute(*perm)
    if kind == "strided" and nd >= 1:
        return _values(rng, shape[:-1] + (shape[-1] * 2,), dtype, special)[..., ::2]
    if kind == "expanded" and nd >= 1:
        d = rng.randrange(nd)
        small = shape[:d] + (1,) + shape[d + 1:]
        return _values(rng, small, dtype, special).expand(shape)
    if kind == "offset" and nd >= 1:
        return _values(rng, (shape[0] + 2,) + shape[1:], dtype, special)[1:-1]
    return _values(rng, shape, dtype, special)


def _shape(rng: random.Random, nd: int | None = None) -> tuple:
    nd = rng.choice([0, 1, 2, 2, 3, 3, 4]) if nd is None else nd
    return tuple(rng.choice(SIZES) for _ in range(nd))


def _bcast_shape(rng: random.Random, shape: tuple) -> tuple:
    """A shape that broadcasts with `shape`: fewer leading dims, some dims 1."""
    keep = rng.randint(0, len(shape))
    return tuple(1 if rng.random() < 0.4 else s for s in shape[len(shape) - keep:])


class Builder:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.graph = Graph(seed)
        self.vals: list[Value] = []

    # -- values ----------------------------------------------------------------
    def new_input(self, shape, dtype, special=None) -> int:
        if special is None:
            special = dtype in FLOAT and self.rng.random() < 0.35
        return self.const_input(_layout(self.rng, tuple(shape), dtype, special), special)

    def const_input(self, t: torch.Tensor, special: bool = False) -> int:
        self.graph.slots.append(len(self.graph.inputs))
        self.graph.inputs.append(t)
        self.vals.append(Value(t, True, special))
        return len(self.vals) - 1

    def add(self, text, fn, args, exact=False, special=None) -> int | None:
        """Run fn eagerly on the values `args`; keep it as a step if torch accepts it."""
        ts = [self.vals[a].t for a in args]
        try:
            out = fn(*ts)
        except (RuntimeError, IndexError, ValueError, TypeError):
            return None
        if not isinstance(out, torch.Tensor) or out.numel() > 4096:
            return None
        if out.dtype == torch.int64 and out.numel() and \
                (out.min().item() < -2**31 or out.max().item() >= 2**31):
            return None    # the GPU raises OverflowError there (tests/test_bounds.py)
        if special is None:
            special = any(self.vals[a].special for a in args)
        self.graph.slots.append(Step(text, fn, tuple(args)))
        exact = exact and all(self.vals[a].exact for a in args)
        self.vals.append(Value(out, exact, special or (out.is_floating_point() and
                                                       not torch.isfinite(out).all().item())))
        return len(self.vals) - 1

    def pick(self, pred=lambda v: True) -> int | None:
        ids = [i for i, v in enumerate(self.vals) if pred(v)]
        return self.rng.choice(ids) if ids else None

    def partner(self, i: int, dtypes) -> int:
        """A second operand for a binary op with value i: a value of the same shape, a new
        broadcastable input, or a 0-dim tensor."""
        v = self.vals[i].t
        same = [j for j, w in enumerate(self.vals) if w.t.shape == v.shape and w.t.dtype in dtypes]
        r = self.rng.random()
        if same and r < 0.4:
            return self.rng.choice(same)
        shape = () if r > 0.9 else _bcast_shape(self.rng, tuple(v.shape))
        return self.new_input(shape, self.rng.choice(dtypes))

    # -- steps -----------------------------------------------------------------
    def step(self) -> None:
        kind = self.rng.choices(list(STEPS), weights=[w for w, _ in STEPS.values()])[0]
        STEPS[kind][1](self)


def _dim(b: Builder, t: torch.Tensor) -> int | None:
    return b.rng.randrange(t.dim()) if t.dim() else None


def unary(b: Builder):
    i = b.pick(lambda v: v.t.dtype in FLOAT)
    if i is None:
        return
    exact = b.vals[i].exact
    fp16 = b.vals[i].t.dtype == torch.float16
    smooth = {"neg": (torch.neg, True), "abs": (torch.abs, True), "relu": (torch.relu, True),
              "tanh": (torch.tanh, False), "sigmoid": (torch.sigmoid, False),
              "clamp": (lambda x: x.clamp(-0.5, 0.7), True), "hardtanh": (F.hardtanh, True),
              "leaky_relu": (F.leaky_relu, True), "square": (lambda x: x * x, True)}
    t = b.vals[i].t
    finite = t[t.isfinite()].float()
    if not fp16 and (not finite.numel() or finite.abs().max().item() < 1e4):
        # lavapipe's sin loses its accuracy beyond (sin(1e9) is off by 1.1)
        smooth["sin"] = (torch.sin, False)
    if not fp16:
        smooth |= {"exp": (torch.exp, False),
                   "sqrt_abs": (lambda x: torch.sqrt(x.abs()), False),
                   "log1p_abs": (lambda x: torch.log1p(x.abs()), False), "silu": (F.silu, False),
                   "gelu": (lambda x: F.gelu(x.clamp(max=1e30)), False),
                   "atan": (torch.atan, False), "erf": (torch.erf, False),
                   "x*0+1": (lambda x: x * 0 + 1, True), "x-x": (lambda x: x - x, True)}
    if exact:
        smooth |= {"floor": (torch.floor, True), "sign": (torch.sign, True),
                   "round": (torch.round, True), "isnan": (torch.isnan, True),
                   "gt0": (lambda x: x > 0, True), "fmod": (lambda x: torch.fmod(x, 1.5), True),
                   "remainder": (lambda x: torch.remainder(x, -1.25), True)}
    name = b.rng.choice(sorted(smooth))
    fn, ex = smooth[name]
    # float16 arithmetic rounds each result in eager, not in a kernel
    ex = ex and not (fp16 and name in ("square", "leaky_relu"))
    b.add(f"{name}({{0}})", fn, (i,), exact=ex)


def _copysign(x, y):
    """copysign with y's NaNs taken as +1: the sign of a NaN that an operation makes
    (sin(inf), 0 * inf) is unspecified (IEEE 754, 6.3): x86 CPUs make it negative, GPUs
    and ARM positive, so eager's copysign(1, sin(inf)) is -1 on one and 1 on the other."""
    return torch.copysign(x, torch.where(torch.isnan(y), 1.0, y))


BINARY = {"add": (torch.add, True), "sub": (torch.sub, True), "mul": (torch.mul, True),
          "maximum": (torch.maximum, True), "minimum": (torch.minimum, True),
          "div": (torch.div, False), "atan2": (torch.atan2, False),
          "fmax": (torch.fmax, True), "hypot": (torch.hypot, False),
          "copysign": (_copysign, True)}


def binary(b: Builder):
    i = b.pick(lambda v: v.t.dtype != torch.bool)
    if i is None:
        return
    dt = b.vals[i].t.dtype
    if dt in INTS:
        name = b.rng.choice(["add", "sub", "maximum", "minimum", "mul_small"])
        if name == "mul_small":
            b.add("{0} * 3", lambda x: x * 3, (i,), exact=True)
            return
        j = b.partner(i, INTS)
        b.add(f"{name}({{0}}, {{1}})", BINARY[name][0], (i, j), exact=True)
        return
    names = ["add", "sub", "mul", "maximum", "minimum"] if dt == torch.float16 else sorted(BINARY)
    name = b.rng.choice(names)
    j = b.partner(i, (dt,) if dt == torch.float16 else (torch.float32, torch.float32, torch.int32))
    if name == "div" and not b.vals[j].exact:
        # a divisor near 0 turns eager's own last-bit errors into large ones (its float32
        # gelu is 2e-3 off at -4 where the kernel's is 1e-6)
        name = "mul"
    fn, ex = BINARY[name]
    ex = ex and (dt != torch.float16 or name in ("maximum", "minimum"))
    b.add(f"{name}({{0}}, {{1}})", fn, (i, j), exact=ex)


def where(b: Builder):
    c = b.pick(lambda v: v.exact and v.t.dtype != torch.float16)
    if c is None:
        return
    ct = b.vals[c].t
    cond = (lambda t: t) if ct.dtype == torch.bool else (lambda t: t > 0)
    i = b.pick(lambda v: v.t.dtype == torch.float32)
    if i is None:
        return
    scalar = b.rng.random() < 0.3
    if scalar:
        val = b.rng.choice([0.0, -1.5, math.nan, math.inf])
        b.add(f"where({{0}}, {{1}}, {val})", lambda x, y: torch.where(cond(x), y, val), (c, i),
              exact=True)
    else:
        j = b.partner(i, (torch.float32,))
        b.add("where({0}, {1}, {2})", lambda x, y, z: torch.where(cond(x), y, z), (c, i, j),
              exact=True)


def reduction(b: Builder):
    i = b.pick(lambda v: v.t.dtype != torch.float16 or v.t.numel() <= 16)
    if i is None:
        return
    t = b.vals[i].t
    d = _dim(b, t)
    keep = b.rng.random() < 0.3
    kw = {} if d is None or b.rng.random() < 0.2 else {"dim": d, "keepdim": keep}
    if t.dtype == torch.bool:
        names = ["any", "all", "sum"]
    elif t.dtype in INTS:
        names = ["sum", "amax", "amin"]
    else:
        names = ["sum", "mean", "amax", "amin"]
    if b.vals[i].exact and t.dtype != torch.bool and t.numel():
        names += ["argmax", "argmin"]
    name = b.rng.choice(names)
    if name in ("argmax", "argmin") and "keepdim" in kw and not t.dim():
        kw = {}
    if name in ("any", "all") and "dim" not in kw:
        fn = getattr(torch, name)
    else:
        fn = (lambda x, name=name, kw=kw: getattr(torch, name)(x, **kw))
    exact = name in ("amax", "amin", "argmax", "argmin", "any", "all") or t.dtype in INTS
    shown = str(kw).replace("{", "{{").replace("}", "}}")
    b.add(f"{name}({{0}}, {shown})", fn, (i,), exact=exact)


def softmax(b: Builder):
    i = b.pick(lambda v: v.t.dtype == torch.float32 and v.t.dim() > 0)
    if i is None:
        return
    d = _dim(b, b.vals[i].t)
    name = b.rng.choice(["softmax", "log_softmax", "cumsum", "logsumexp"])
    b.add(f"{name}({{0}}, {d})", lambda x: getattr(torch, name)(x, d), (i,))


def matmul(b: Builder):
    i = b.pick(lambda v: v.t.dtype == torch.float32 and not v.special and 2 <= v.t.dim() <= 3)
    if i is None:
        return
    t = b.vals[i].t
    n = b.rng.choice(SIZES)
    if t.dim() == 3 and b.rng.random() < 0.5:
        j = b.new_input((t.shape[0], t.shape[2], n), torch.float32, special=False)
        b.add("bmm({0}, {1})", torch.bmm, (i, j))
    else:
        j = b.new_input((t.shape[-1], n), torch.float32, special=False)
        b.add("matmul({0}, {1})", torch.matmul, (i, j))


def view(b: Builder):
    i = b.pick(lambda v: v.t.dim() > 0)
    if i is None:
        return
    t = b.vals[i].t
    nd = t.dim()
    d, e = b.rng.randrange(nd), b.rng.randrange(nd)
    perm = list(range(nd))
    b.rng.shuffle(perm)
    ops = {
        "transpose": (f"{{0}}.transpose({d}, {e})", lambda x: x.transpose(d, e)),
        "permute": (f"{{0}}.permute({perm})", lambda x: x.permute(*perm)),
        "flatten": ("{0}.reshape(-1)", lambda x: x.reshape(-1)),
        "unsqueeze": (f"{{0}}.unsqueeze({d})", lambda x: x.unsqueeze(d)),
        "slice": (f"{{0}}[{':, ' * d}::2]", lambda x: x[(slice(None),) * d + (slice(None, None, 2),)]),
        "flip": (f"{{0}}.flip({d})", lambda x: x.flip(d)),
        "expand": ("{0}.unsqueeze(0).expand(3, ...)", lambda x: x.unsqueeze(0).expand(3, *x.shape)),
        "contiguous_t": (f"{{0}}.transpose({d}, {e}).contiguous()",
                         lambda x: x.transpose(d, e).contiguous()),
    }
    name = b.rng.choice(sorted(ops))
    text, fn = ops[name]
    # a view is returned as is; a following op makes the graph compute with it
    j = b.add(text, fn, (i,), exact=True)
    if j is not None and b.rng.random() < 0.5 and b.vals[j].t.dtype in FLOAT:
        b.add("{0} * 2", lambda x: x * 2, (j,), exact=True)


def cat(b: Builder):
    i = b.pick(lambda v: v.t.dim() > 0)
    if i is None:
        return
    t = b.vals[i].t
    d = _dim(b, t)
    same = [j for j, w in enumerate(b.vals) if w.t.shape == t.shape and w.t.dtype == t.dtype]
    j = b.rng.choice(same)
    if b.rng.random() < 0.5:
        b.add(f"cat([{{0}}, {{1}}], {d})", lambda x, y: torch.cat([x, y], d), (i, j), exact=True)
    else:
        b.add(f"stack([{{0}}, {{1}}], {d})", lambda x, y: torch.stack([x, y], d), (i, j), exact=True)


def index(b: Builder):
    i = b.pick(lambda v: v.t.dim() > 0 and v.t.numel() > 0)
    if i is None:
        return
    t = b.vals[i].t
    d = _dim(b, t)
    size = t.shape[d]
    name = b.rng.choice(["index_select", "gather", "getitem", "embedding"])
    k = b.rng.choice([1, 2, 3, 5])
    g = torch.Generator().manual_seed(b.rng.randrange(2**31))
    if name == "index_select":
        idx = torch.randint(0, size, (k,), generator=g)
        j = b.const_input(idx)
        b.add(f"index_select({{0}}, {d}, {{1}})", lambda x, ix: torch.index_select(x, d, ix),
              (i, j), exact=True)
    elif name == "gather":
        shape = list(t.shape)
        shape[d] = k
        idx = torch.randint(0, size, tuple(shape), generator=g)
        j = b.const_input(idx)
        b.add(f"gather({{0}}, {d}, {{1}})", lambda x, ix: torch.gather(x, d, ix), (i, j), exact=True)
    elif name == "getitem":
        idx = torch.randint(-t.shape[0], t.shape[0], (k,), generator=g)
        j = b.const_input(idx)
        b.add("{0}[{1}]", lambda x, ix: x[ix], (i, j), exact=True)
    elif t.dim() == 2 and t.dtype == torch.float32:
        idx = torch.randint(0, t.shape[0], (k, 2), generator=g)
        j = b.const_input(idx)
        b.add("embedding({1}, {0})", lambda w, ix: F.embedding(ix, w), (i, j), exact=True)


def cast(b: Builder):
    i = b.pick()
    if i is None:
        return
    v = b.vals[i]
    floating = v.t.is_floating_point()
    targets = [torch.float32, torch.bool]
    # float -> int truncates: only exact values (fp16 ones too: kernels keep float16
    # intermediates in float32, as Inductor does, so tanh(x).long() may round elsewhere)
    if not floating or (v.exact and not v.special and (v.t.abs() < 1e4).all().item()):
        targets += [torch.int32, torch.int64]
    if not floating or (v.t.abs() < 1e3).all().item() or v.special:
        targets.append(torch.float16)
    if floating and not v.exact:
        targets.remove(torch.bool)       # x != 0 on a value that may round to 0 elsewhere
    if v.t.dtype == torch.float16 and not v.exact:
        # a chain of float16 ops rounds once in a kernel, at each op in eager: only a
        # float16 result's own tolerance holds
        targets = [torch.float16]
    dt = b.rng.choice(targets)
    b.add(f"{{0}}.to({dt})", lambda x: x.to(dt), (i,), exact=dt != torch.float16 or v.exact)


STEPS = {"unary": (5, unary), "binary": (5, binary), "where": (1, where),
         "reduction": (2, reduction), "softmax": (1, softmax), "matmul": (1, matmul),
         "view": (2, view), "cat": (1, cat), "index": (1, index), "cast": (1, cast)}


def make_graph(seed: int) -> Graph:
    """The graph of one seed: 1-2 inputs, 2-7 steps, 1-2 outputs (the last value and
    perhaps one other computed value)."""
    b = Builder(seed)
    rng = b.rng
    for _ in range(rng.randint(1, 2)):
        dtype = rng.choices([torch.float32, torch.float16, torch.int32, torch.int64, torch.bool],
                            weights=[8, 1, 1, 1, 1])[0]
        b.new_input(_shape(rng), dtype)
    for _ in range(rng.randint(2, 7)):
        b.step()
    computed = [i for i, s in enumerate(b.graph.slots) if isinstance(s, Step)]
    if not computed:
        computed = [b.add("{0}.reshape(-1)[:7] * 2", lambda x: x.reshape(-1)[:7] * 2, (0,),
                          exact=True)]
    outs = [computed[-1]]
    if len(computed) > 1 and rng.random() < 0.5:
        outs.append(rng.choice(computed[:-1]))
    b.graph.outputs = outs
    return b.graph
