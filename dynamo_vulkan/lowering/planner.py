"""Lower one FX partition, specialised to concrete inputs, into a Plan.

Walks the nodes in order, calling each op's lowering rule (its record,
lowering/registry.py) with a Request and reading back what it did; folds nodes whose
inputs are all constants on the CPU; then assigns temporaries to physical
buffers by liveness so intermediates share memory.

A rule refuses a node by raising LoweringError (the node then runs on the CPU). Any
other exception from a rule is a bug: with Config.strict (DYNAMO_VULKAN_STRICT=1, the
tests) it propagates; otherwise it is logged as a bug and the node falls back
(RuleBugError, a LoweringError), so a user's model still runs.
"""
from __future__ import annotations

import bisect
import logging
import operator

import torch
import torch.fx as fx
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from dynamo_vulkan.runtime.graph_io import GraphFormatError, node_value_exprs, placeholder_spec, set_node_values
from dynamo_vulkan.runtime.plan import InputSpec, OutputSpec, Plan, barriers, words_of
from dynamo_vulkan.shaders.families import ShaderDefineError

from . import LoweringError, RuleBugError, TRef, contiguous_strides, kind_of
from .core import Context, meta_view
from .copy_groups import emit_copies, reads_of, same_view
from .elementwise import ew
from .fusion import Deferred, Lazy, materialize, residual_adds, writes_in_place
from .gguf import packed_input, place_packed
from .registry import Lowered, OpSpec, Request, spec_of
from .schedule import hoist_early, move_copies_ahead
from .views import RESHAPES

log = logging.getLogger(__name__)


def _values_fit(gm: fx.GraphModule, args: list) -> bool:
    """Whether every node's meta['val'] is a concrete value (a meta tensor, a number, as a
    stored graph's are: runtime/graph_io.set_node_values) and the placeholders' are the
    args' dtypes, shapes and strides: the values are then these args', which
    propagating them again would give (and import Dynamo, FakeTensorMode's import)."""
    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        return False

    def concrete(v) -> bool:
        if isinstance(v, (list, tuple)):
            return all(concrete(x) for x in v)
        if isinstance(v, torch.Tensor):
            return v.device.type == "meta" and all(type(d) is int for d in (*v.shape, *v.stride()))
        return v is None or type(v) in (int, float, bool)
    if not all("val" in n.meta and concrete(n.meta["val"]) for n in nodes):
        return False
    for n, a in zip(placeholders, args):
        v = n.meta["val"]
        if isinstance(a, torch.Tensor):
            if not (isinstance(v, torch.Tensor) and v.dtype == a.dtype and tuple(v.shape) == tuple(a.shape)
                    and v.stride() == a.stride()):
                return False
        elif type(v) is not type(a) or v != a:
            return False
    return True


VIEW = torch.ops.aten.view.default


def _data_dependent_errors() -> tuple:
    """What fake-tensor propagation raises for an output whose shape only its values give
    (imported when a propagation fails: not on a cold start's path)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    return DataDependentOutputException, DynamicOutputShapeException, GuardOnDataDependentSymNode


def specialise(gm: fx.GraphModule, args: list) -> None:
    """Refresh node.meta['val'] with concrete shapes from the real args (kept where they
    are those already: _values_fit).

    An arg may come with other strides than the graph was traced with: the backward's
    saved tensors, which the forward's program returns contiguous where AOT traced the
    op's own layout (SDPA's output, (B, L, H, E) in memory). A `view` of such an arg may
    then be impossible; those views become reshapes (a copy only where no view exists),
    as the view rule lowers every reshape anyway (views.view)."""
    if _values_fit(gm, args):
        return
    if _values_from_trace(gm, args):
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    def propagate():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fake)
    try:
        propagate()
    except _data_dependent_errors() as e:
        raise LoweringError(f"a node's output shape depends on the values it reads, which the "
                            f"program must know before it runs ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else ''})") from e
    except (RuntimeError, ValueError):
        views = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is VIEW]
        if not (views and _restrided(gm, args)):
            raise
        for n in views:
            n.target = torch.ops.aten.reshape.default
        gm.recompile()
        propagate()


def _values_from_trace(gm: fx.GraphModule, args: list) -> bool:
    """Set every node's meta['val'] to a meta tensor (or number) of these args' sizes from
    the values AOT traced: a static graph's as they are, a symbolic size as its expression
    of the size symbols evaluated at the args' sizes (as a stored graph's values are set:
    graph_io.node_value_exprs), instead of running the whole partition on fake tensors,
    which costs more than the rest of a decoder's program build. False where those do not
    fit the args (an arg restrided, a size that is no expression of the inputs' sizes):
    specialise then propagates."""
    try:
        # the traced values, kept as they were before a first call's specialising replaced
        # them: a later call's sizes (a new prompt length) are set from them too
        traced = getattr(gm, "_traced_values", None)
        if traced is None:
            specs = [placeholder_spec(n.meta.get("val")) for n in gm.graph.nodes if n.op == "placeholder"]
            traced = gm._traced_values = (specs, node_value_exprs(gm))
        set_node_values(gm, traced[0], list(args), traced[1])
    except (GraphFormatError, ValueError, TypeError, KeyError, AttributeError, RuntimeError) as e:
        log.debug("propagating node values: %s: %s", type(e).__name__, e)   # always exact
        return False
    return True


def _restrided(gm: fx.GraphModule, args: list) -> bool:
    """Whether a tensor arg has other strides than its placeholder was traced with."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return any(isinstance(a, torch.Tensor) and isinstance(n.meta.get("val"), torch.Tensor) and
               n.meta["val"].stride() != a.stride() for n, a in zip(placeholders, args))


def lower(gm: fx.GraphModule, args: list, resident: list[bool], caps: dict, cfg=None) -> Plan:
    """The Plan of `gm` for `args`; `cfg` (default config.load()) reaches the rules as ctx.cfg."""
    ctx = Context(caps, cfg)
    plan = ctx.plan
    values: dict[fx.Node, object] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    index_of = {n: i for i, n in enumerate(placeholders)}
    for i, (node, a) in enumerate(zip(placeholders, args)):
        if isinstance(a, torch.Tensor) and node.users:
            role = "param" if resident[i] else "input"
            chunks = None
            if packed_input(node, a):    # GGUF blocks; split into buffers over the limit
                values[node], chunks = place_packed(ctx, node, a, role)
                buf = chunks[0][0] if chunks else values[node].buf
            else:
                kind = kind_of(a.dtype)
                buf = ctx.buffer(words_of(kind, a.numel()), role, kind)
                values[node] = TRef(buf, tuple(a.shape), contiguous_strides(tuple(a.shape)), 0,
                                    kind)
            plan.inputs.append(InputSpec(buf, str(a.dtype), tuple(a.shape), resident[i], chunks))
        else:
            values[node] = a
            plan.inputs.append(InputSpec(None, str(getattr(a, "dtype", type(a).__name__)),
                                         (), False))

    def val(x):
        return fx.node.map_arg(x, lambda n: values[n])

    ctx.in_place = in_place_updates(gm)
    # graph inputs no node writes: like temporaries, they hold one value all program long
    written = {n.args[0] for n in gm.graph.nodes if n.op == "call_function" and writes_in_place(n)}
    unwritten = {values[p].buf for p in placeholders
                 if p not in written and isinstance(values.get(p), TRef)}
    deferred = deferrable(gm, ctx)
    epilogue = residual_adds(gm)         # producer -> (add, residual)
    added_by = {}                        # add node -> the producer that added its residual

    # copy_ nodes' (src, dst) not emitted yet: a run of them, which nodes without kernels
    # (views, getitem) do not end, goes as a few kernels (copy_groups.py) before the next
    # dispatch of any other node, or before the outputs
    copies: list = []

    def emit_run():                      # as ctx.before_dispatch, which it then clears
        run = copies.copy()
        copies.clear()
        emit_copies(ctx, run)

    for node in gm.graph.nodes:
        ctx.node = node
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            values[node] = getattr(gm, node.target)
        elif node.op == "call_function":
            if is_size_value(node):      # from the specialised shapes
                values[node] = _size_value(node, values)
                continue
            args_, kwargs = val(node.args), val(node.kwargs)
            if node in added_by:              # its producer's kernel already added it
                values[node] = values[added_by[node]]
                continue
            alias = _clone_viewed_in_place(ctx, node, args_, val, unwritten)
            if alias is not None:
                values[node] = alias
                continue
            spec = spec_of(node.target)
            is_copy = node.target is COPY_ and args_[0] is not None
            if (spec is None or not spec.takes_lazy) and not is_copy:   # others need buffers
                args_, kwargs = fx.node.map_aggregate((args_, kwargs),
                                                      lambda v: materialize(ctx, v))
            if node.target is operator.getitem:
                values[node] = args_[0][args_[1]]
                continue
            if not _has_ref((args_, kwargs)) and is_foldable_target(node):
                values[node] = node.target(*args_, **kwargs)
                continue
            if is_copy:
                dst_node = node.args[0]
                if dst_node not in index_of:
                    raise LoweringError("copy_ into a value that is not a graph input")
                dst, src = values[dst_node], args_[1]
                # a kernel writing dst may read only dst's own elements: else src is computed
                # (or, another view of dst's buffer, copied) first, after the earlier copies
                if isinstance(src, (Lazy, Deferred)) and not _computes_into(src, dst):
                    src = materialize(ctx, src)
                if isinstance(src, TRef) and src.buf == dst.buf and src != dst:
                    src = ew(ctx, "$0", [src], src.kind)
                if not (isinstance(src, TRef) and src == dst):    # not already updated in place
                    if ctx.before_dispatch not in (None, emit_run):
                        ctx.run_before_dispatch()     # elementwise siblings, which go first
                    copies.append((src, dst))
                    ctx.before_dispatch = emit_run
                plan.mutations.append((index_of[dst_node], dst.buf))
                values[node] = dst
                continue
            if spec is None:
                raise LoweringError(f"no Vulkan lowering for {node.target}")
            add, res = epilogue.get(node, (None, None))
            request = Request(defer=node in deferred,
                              residual=values.get(res) if isinstance(values.get(res), TRef) else None)
            done = call_rule(ctx, spec, node, args_, kwargs, request)
            values[node] = done.value
            if done.residual_added:
                if add is None:
                    raise RuleBugError(f"the rule of {node.format_node()} says it added a "
                                       "residual it was not given")
                added_by[add] = node
        elif node.op == "output":
            ctx.run_before_dispatch()       # the last run of copies
            outs = node.args[0]
            outs = outs if isinstance(outs, (tuple, list)) else (outs,)
            for o in outs:
                plan.outputs.append(_output(ctx, o, values, index_of))
            ctx.run_before_dispatch()       # outputs computed as siblings (elementwise._join)
        else:
            raise LoweringError(f"unsupported node kind {node.op}")
    moved = hoist_early(plan)
    copies = {moved.get(i, i) for i in ctx.weight_copies}
    assign_buffers(plan, move_copies_ahead(plan, copies))
    return plan


CLONE = torch.ops.aten.clone.default
_STRIDED_READERS = (torch.ops.aten.bmm.default, torch.ops.aten.mm.default)


def _clone_viewed_in_place(ctx: Context, node: fx.Node, args, val, unwritten: set):
    """For clone(x) read only by one view that only matrix products read (AOT's matmul of
    4-d operands: expand, clone to contiguous, view to 3-d, bmm): x itself, where that
    view of it exists without a copy, else None (the clone is computed). x must be a
    temporary, which only its producer writes, or a graph input no node writes
    (`unwritten`: a backward's saved activations), so the products read what the clone
    would have held; they read any strides."""
    if node.target is not CLONE or len(node.users) != 1 or \
            node.kwargs.get("memory_format", torch.contiguous_format) != torch.contiguous_format:
        return None
    x = args[0] if args else None
    (user,) = node.users
    if not isinstance(x, TRef) or x.buf < 0 or \
            (ctx.plan.buffers[x.buf].role != "temp" and x.buf not in unwritten) or \
            x.kind != ctx.out_kind() or user.target not in RESHAPES or user.args[0] is not node or \
            not user.users or not all(u.target in _STRIDED_READERS for u in user.users):
        return None
    shape = val(user.args[1])
    try:
        meta_view(x, lambda t: t.view(*shape) if isinstance(shape, (list, tuple)) else t.view(shape))
    except RuntimeError:
        return None
    return x


def call_rule(ctx: Context, spec: OpSpec, node: fx.Node, args, kwargs, request: Request) -> Lowered:
    """Run node's rule: its result, as a Lowered. A rule gets the request only when its
    record has a role that reads it (OpSpec.takes_request); a refusal (LoweringError) and
    a misspelled shader define (ShaderDefineError, a bug the tests must see) pass as they
    are; any other exception is a bug in the rule (module docstring)."""
    extra = {"request": request} if spec.takes_request else {}
    try:
        out = spec.rule(ctx, *args, **kwargs, **extra)
    except (LoweringError, ShaderDefineError):
        raise
    except Exception as e:
        if ctx.cfg.strict:
            raise
        rule = f"{spec.rule.__module__}.{spec.rule.__qualname__}"
        log.error("dynamo_vulkan: a bug in the lowering rule %s, lowering %s: %s: %s; the "
                  "node runs on the CPU instead (DYNAMO_VULKAN_STRICT=1 raises it; please "
                  "report it)", rule, node.format_node(), type(e).__name__, e)
        log.debug("the rule's traceback", exc_info=True)
        raise RuleBugError(f"a bug in the lowering rule {rule} ({type(e).__name__}: {e})") from e
    return out if isinstance(out, Lowered) else Lowered(out)


def deferrable(gm: fx.GraphModule, ctx) -> set:
    """Elementwise nodes whose one consumer is elementwise too: they are folded
    into it (lowering/fusion.py) instead of getting a kernel and a buffer; and the
    nodes whose record's prologue (given the compile's Context) lets their consumers
    compute them. The roles are the ops' records (OpSpec)."""
    def spec(n) -> OpSpec | None:
        return spec_of(n.target) if n.op == "call_function" else None

    def loads_lazily(u, n) -> bool:
        s = spec(u)
        return s is not None and s.loads_lazy is not None and s.loads_lazy(u, n)

    def through_view(n):
        """n's one user, a reshape whose one user computes it as it loads (or None)."""
        u = next(iter(n.users))
        s = spec(u)
        if s is None or not s.lazy_view or len(u.users) != 1:
            return None
        return u if loads_lazily(next(iter(u.users)), u) else None

    def fusible(n) -> bool:
        s = spec(n)
        return s is not None and s.fusible

    def folds_into_user(n) -> bool:
        readers = [u for u in n.users if not _reads_shape_only(u, n)]
        if not fusible(n) or len(readers) != 1:
            return False
        u = readers[0]
        s = spec(u)
        return s is not None and (s.fusible or s.folds or loads_lazily(u, n) or
                                  through_view(n) is not None)

    def prologue(n) -> bool:
        s = spec(n)
        return s is not None and s.prologue is not None and s.prologue(n, ctx)

    found = {n for n in gm.graph.nodes
             if n.op == "call_function" and (folds_into_user(n) or prologue(n))}
    # a reshape between a node left to its consumer and that consumer (a mat-vec whose
    # grouped post-norm follows a reshape) passes it on deferred
    found |= {u for n in found if prologue(n) and len(n.users) == 1
              for u in n.users if spec(u) is not None and spec(u).lazy_view and len(u.users) == 1}
    found |= {v for n in found if fusible(n) and len(n.users) == 1
              for v in [through_view(n)] if v is not None}
    return found | _copied_into_inputs(gm, fusible, found)


COPY_ = torch.ops.aten.copy_.default


# factories of a tensor like their first argument (with rules): they read its shape, not
# its values
SHAPE_READERS = frozenset({torch.ops.aten.full_like.default, torch.ops.aten.zeros_like.default,
                           torch.ops.aten.ones_like.default})


def _reads_shape_only(user: fx.Node, n: fx.Node) -> bool:
    """Whether `user` reads only n's shape (full_like(n, v), as torch's lerp decomposes its
    weight): a node whose values one consumer reads still folds into that consumer (these
    rules take their argument as it is, Lazy included)."""
    return user.op == "call_function" and user.target in SHAPE_READERS and \
        user.args[0] is n and n not in user.args[1:] and n not in user.kwargs.values() and \
        spec_of(user.target) is not None and spec_of(user.target).takes_lazy


def _copied_into_inputs(gm: fx.GraphModule, fusible, deferred: set) -> set:
    """Fusible nodes copied by a copy_ into a graph input (an optimizer step's new
    parameters and moments) and otherwise read only by elementwise consumers: the copy_
    computes the expression straight into the input's buffer (one kernel, no temporary)
    and the other consumers compute it again inside their own kernels. Taken where every
    such computation still reads the inputs the node would have read: nothing between
    the node and its copy_ writes an input the expression reads (such as the copies of
    earlier parameters), and every other consumer is computed before the copy_ (so not
    a step counter whose copy_ comes before its readers). `deferred`: the nodes that
    their consumers compute (the other roles)."""
    nodes = list(gm.graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    inputs_of: dict = {}

    def inputs(n) -> frozenset:        # the graph inputs n is computed from
        if n not in inputs_of:
            inputs_of[n] = frozenset([n]) if n.op == "placeholder" else \
                frozenset().union(*(inputs(a) for a in n.all_input_nodes))
        return inputs_of[n]

    copy_of: dict = {}                 # a taken node -> its copy_
    last_of: dict = {}

    def last_computed(n) -> int:
        """The latest graph position at which n's value is computed (a deferred node is
        computed by each of its consumers, a taken one also by its copy_)."""
        if n not in last_of:
            if n in copy_of:
                last_of[n] = max([order[copy_of[n]]] + [last_computed(u) for u in n.users
                                                        if u is not copy_of[n]])
            elif n in deferred:
                last_of[n] = max(last_computed(u) for u in n.users)
            else:
                last_of[n] = order[n]
        return last_of[n]

    writes = [n for n in nodes if writes_in_place(n)]
    write_at = [order[n] for n in writes]
    candidates = []
    for c in writes:
        src = c.args[1] if c.target is COPY_ and len(c.args) > 1 else None
        if c.args[0].op != "placeholder" or not isinstance(src, fx.Node) or src in deferred or \
                src.op != "call_function" or not fusible(src) or \
                not all(u is c or u.op == "call_function" and u.target is not COPY_ and fusible(u)
                        for u in src.users):
            continue
        candidates.append((src, c))
    # the latest first: a node's consumers are decided before it
    for src, c in sorted(candidates, key=lambda sc: -order[sc[0]]):
        read = inputs(src)
        between = writes[bisect.bisect_right(write_at, order[src]):bisect.bisect_left(write_at, order[c])]
        if all(m.target is COPY_ and m.args[0].op == "placeholder" and m.args[0] not in read
               for m in between) and \
                all(last_computed(u) < order[c] for u in src.users if u is not c):
            copy_of[src] = c
    return set(copy_of)


def _computes_into(src, dst: TRef) -> bool:
    """Whether src, a Lazy, may be computed by a kernel writing straight into dst: every
    tensor its expression loads from dst's buffer is dst itself (element i of the output
    reads only element i of dst, before writing it)."""
    return isinstance(src, Lazy) and tuple(src.shape) == tuple(dst.shape) and all(
        t.buf != dst.buf or same_view(t, dst) for t in reads_of(src, dst))


def in_place_updates(gm: fx.GraphModule) -> set:
    """index_put nodes that may write straight into their input's buffer: a chain
    index_put(index_put(P, ...), ...) whose last result goes back into the same graph
    input P by copy_ (how KV-cache updates read after functionalization, one per decode
    step of a multi-step graph), each link taken while every other reader of its input
    comes earlier. The update then costs a scatter, not a copy."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    found = set()
    for node in gm.graph.nodes:
        if node.target is not COPY_:
            continue
        dst, src = node.args[0], node.args[1]
        # readers of src after the copy_ see dst's buffer, which then holds src, unless
        # dst is written again (torch versions differ in where the copy_ goes)
        if dst.op != "placeholder" or not _is_index_put(src) or \
                any(u is not node and u.target is COPY_ and
                    u.args[0] in (dst, node) and order[u] > order[node]
                    for u in (*dst.users, *node.users)):
            continue
        chain = [src]
        while _is_index_put(chain[-1].args[0]):
            chain.append(chain[-1].args[0])
        if chain[-1].args[0] is not dst:
            continue
        for link in reversed(chain):         # from the first update on
            others = [u for u in link.args[0].users if u is not link and u is not node]
            if not all(order[u] < order[link] for u in others):
                break
            found.add(link)
    return found


def _is_index_put(n) -> bool:
    return isinstance(n, fx.Node) and n.target is torch.ops.aten.index_put.default


# Sizes of tensors (SymInts under dynamic shapes): known once the partition is
# specialised to its inputs, so the planner reads them off the concrete shapes, never
# from a buffer, and a graph that asks for them stays one partition. Each query -> its
# value from the tensor's specialised meta value.
SHAPE_QUERIES = {torch.ops.aten.sym_size.int: lambda t, d: t.shape[d],
                 torch.ops.aten.sym_stride.int: lambda t, d: t.stride()[d],
                 torch.ops.aten.sym_numel.default: lambda t: t.numel(),
                 torch.ops.aten.sym_storage_offset.default: lambda t: t.storage_offset()}
_SYM_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_size_value(node: fx.Node) -> bool:
    """A size or arithmetic on sizes (aten.sym_size, operator.mul of SymInts, torch.sym_sum,
    ...): its value is fixed by the input shapes a program is built for. Not item() and
    the like (ATen ops of data-dependent, unbacked values)."""
    if node.target in SHAPE_QUERIES:
        return True
    return node.op == "call_function" and node.target is not operator.getitem and \
        not isinstance(node.target, torch._ops.OpOverload) and \
        isinstance(node.meta.get("val"), (*_SYM_SCALARS, int, float, bool))   # specialised


def is_foldable_target(node: fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and \
        torch.Tag.nondeterministic_seeded not in t.tags


def _has_ref(tree) -> bool:
    found = []
    fx.node.map_aggregate(tree, lambda x: found.append(1) if isinstance(x, (TRef, Lazy, Deferred)) else x)
    return bool(found)


def _size_value(node: fx.Node, values: dict):
    """A size query off its tensor's specialised meta value; arithmetic on sizes computed
    from its arguments' values (torch 2.11's FakeTensorProp leaves such nodes' meta
    symbolic)."""
    if node.target in SHAPE_QUERIES:
        t = node.args[0].meta["val"]
        return _concrete(SHAPE_QUERIES[node.target](t, *node.args[1:]), node)
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
    return _concrete(node.target(*args, **kwargs), node)


def _concrete(v, node: fx.Node):
    if isinstance(v, _SYM_SCALARS) and v.node.is_constant():
        v = v.node.constant
    if not isinstance(v, (int, float, bool)):
        raise LoweringError(f"{node.format_node()} has no concrete value for these inputs ({v})")
    return v


def _output(ctx: Context, o, values, index_of) -> OutputSpec:
    if o is None:
        return OutputSpec(None, "None", (), alias=None)
    if isinstance(o, fx.Node) and isinstance(values[o], (int, float, bool)):   # a size
        return OutputSpec(None, type(values[o]).__name__, (), const=values[o])
    v = materialize(ctx, values[o])
    meta = o.meta.get("val")
    if o in index_of and isinstance(v, TRef):
        return OutputSpec(None, str(meta.dtype), tuple(v.shape), alias=index_of[o])
    if isinstance(v, torch.Tensor):           # a folded constant
        v = ctx.ref(v)
    if not isinstance(v, TRef):
        raise LoweringError(f"output {o} is not a tensor")
    buf = ctx.plan.buffers[v.buf]
    if not (v.is_contiguous() and v.offset == 0 and buf.role == "temp" and buf.words == v.numel
            and not any(x.buf == v.buf for x in ctx.outputs)):
        v = ew(ctx, "$0", [v], v.kind)
    ctx.plan.buffers[v.buf].role = "output"
    ctx.outputs.append(v)
    return OutputSpec(v.buf, str(meta.dtype), tuple(v.shape))


def _fit(starts: list, ends: list, start: int, end: int, level: list) -> tuple | None:
    """Where the life start..end (dispatches) goes among a buffer's sorted lives, and
    whether it lies in other barrier levels than theirs too; None where it meets one."""
    at = bisect.bisect_left(starts, start)   # the lives before and after this one
    if (at and ends[at - 1] >= start) or (at < len(starts) and starts[at] <= end):
        return None
    return at, (not at or level[ends[at - 1]] < level[start]) and \
        (at == len(starts) or level[starts[at]] > level[end])


# temporaries smaller than this take a buffer of their own rather than one that a
# dispatch of their barrier level also binds (assign_buffers)
SAME_LEVEL_BYTES = 1 << 20


def assign_buffers(plan: Plan, live_from: dict[int, int] | None = None) -> None:
    """Give temporaries physical buffers by liveness (first .. last dispatch binding them;
    live_from: an earlier start for some, schedule.move_copies_ahead's).

    Largest first: each temporary goes into the first physical buffer whose temporaries
    all live apart from it, else into a new buffer of its size (greedy by size, as
    TFLite's arena planner orders its tensors), so a buffer is as large as its first,
    largest, occupant. Taking them in order of first use and reusing only a free buffer
    already large enough held 9.8 MiB of temporaries in SmolLM2's 128-token prefill (its
    split-K partial sums are 0.5-4.7 MB each), this 7.2 (at most 6.4 live at once).
    A buffer whose temporaries also live in other barrier levels than this one's (levels
    as the plan has them with every temporary in a buffer of its own) goes first: one
    freed by a dispatch and taken by a later one of the same level would make the later
    wait behind a barrier (a write after a read) that the plan did not need. Where only
    such a buffer is free, a temporary under SAME_LEVEL_BYTES takes a new one instead
    (two reductions' split partials side by side), a larger one shares it."""
    level, n = [], 0
    for wait in barriers(plan.dispatches):
        n += wait
        level.append(n)
    first, last = {}, {}
    for i, d in enumerate(plan.dispatches):
        for b in d.bindings:
            first.setdefault(b, i)
            last[b] = i
    for b, i in (live_from or {}).items():
        first[b] = min(first[b], i)
    temps = sorted((b for b, buf in enumerate(plan.buffers) if buf.role == "temp" and b in first),
                   key=lambda b: (-plan.buffers[b].words, first[b]))
    remap: dict[int, int] = {}
    phys: list[tuple[int, list[int], list[int]]] = []   # (buffer, its lives' starts, ends), sorted
    for b in temps:
        start, end = first[b], last[b]
        shares_a_level = plan.buffers[b].words * 4 >= SAME_LEVEL_BYTES
        home = None
        for p, starts, ends in phys:
            fit = _fit(starts, ends, start, end, level)
            if fit is not None and fit[1]:
                home = (p, starts, ends, fit[0])
                break
            if fit is not None and shares_a_level and home is None:
                home = (p, starts, ends, fit[0])
        if home is None:
            phys.append((b, [start], [end]))
            remap[b] = b
            continue
        p, starts, ends, at = home
        starts.insert(at, start)
        ends.insert(at, end)
        remap[b] = p
    for d in plan.dispatches:
        d.bindings = [remap.get(b, b) for b in d.bindings]
    for b in set(remap) - set(remap.values()):
        plan.buffers[b].words = 0     # merged into another buffer; never allocated
        plan.buffers[b].role = "unused"
