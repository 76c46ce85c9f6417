"""A flat ATen FX graph as data (JSON), for the disk cache: what a new process needs to
compile a traced graph again without Dynamo and AOT tracing it (precompiled.py).

Nodes are stored in order with their targets by name: ATen and custom operators
(OpOverloads, looked up in torch.ops on load) and a fixed set of Python operators on
sizes. Arguments are nodes, numbers (floats as hex, exact), strings, dtypes, devices,
layouts, memory formats and lists of these. Anything else makes the graph
unstorable (GraphFormatError), never pickled. Placeholders keep their shapes, with a
size symbol's name where a dimension is dynamic.

The partitioner reads every node's value (meta["val"]: dtype, shape, strides). On load
these come from node_values' record of one call's values, stored apart per input sizes,
or from node_value_exprs' record of the traced values with each size as an expression
of the graph's size symbols (the prompt length), which fits every call the graph takes
(set_node_values: meta tensors, no op run, either record); else from running the graph
on fake tensors (propagate_meta), which imports Dynamo (FakeTensorMode's constructor
reads its config) and costs ~1.5 s for a decoder's two graphs on a second process's path.
"""
from __future__ import annotations

import json
import math
import operator

import torch
import torch.fx as fx

FORMAT = 1

# Python callables a traced graph may call on sizes (Dynamo/AOT write these for symbolic
# shapes), by the names stored for them
_PYTHON_OPS = {f"operator.{n}": getattr(operator, n) for n in (
    "getitem", "add", "sub", "mul", "floordiv", "truediv", "mod", "neg", "pow",
    "eq", "ne", "lt", "le", "gt", "ge")}
_PYTHON_OPS.update({"torch.sym_max": torch.sym_max, "torch.sym_min": torch.sym_min,
                    "torch.sym_not": torch.sym_not, "math.ceil": math.ceil, "math.floor": math.floor})
_NAME_OF_PYTHON_OP = {id(f): n for n, f in _PYTHON_OPS.items()}
_DTYPES = {str(d): d for d in vars(torch).values() if isinstance(d, torch.dtype)}
_LAYOUTS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
_FORMATS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.memory_format)}


class GraphFormatError(ValueError):
    """A graph that cannot be stored as data, or stored bytes that are not such a graph."""


def _target_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target._schema.name}.{target._overloadname}"
    name = _NAME_OF_PYTHON_OP.get(id(target))
    if name is None:
        raise GraphFormatError(f"the graph calls {target!r}, which is not an operator overload "
                               "or a known size operation")
    return name


def _target(name: str):
    if name.startswith("op:"):
        qual, _, overload = name[3:].rpartition(".")
        ns, _, op = qual.partition("::")
        try:
            found = getattr(getattr(getattr(torch.ops, ns), op), overload)
        except (AttributeError, RuntimeError) as e:
            raise GraphFormatError(f"operator {name[3:]} is not registered in this process: {e}") from None
        if not isinstance(found, torch._ops.OpOverload):
            raise GraphFormatError(f"{name[3:]} is not an operator overload")
        return found
    if name not in _PYTHON_OPS:
        raise GraphFormatError(f"unknown graph target {name!r}")
    return _PYTHON_OPS[name]


def _encode(a):
    if isinstance(a, fx.Node):
        return {"node": a.name}
    if a is None or isinstance(a, (bool, str)):
        return a
    if isinstance(a, int):
        return a
    if isinstance(a, float):
        return {"float": a.hex()}
    if isinstance(a, (list, tuple)):
        return {"tuple" if isinstance(a, tuple) else "list": [_encode(x) for x in a]}
    if isinstance(a, torch.dtype):
        return {"dtype": str(a)}
    if isinstance(a, torch.device):
        return {"device": str(a)}
    if isinstance(a, torch.layout):
        return {"layout": str(a)}
    if isinstance(a, torch.memory_format):
        return {"memory_format": str(a)}
    raise GraphFormatError(f"an argument of type {type(a).__name__} ({a!r}) cannot be stored")


def _decode(a, nodes: dict):
    if a is None or isinstance(a, (bool, int, str)):
        return a
    if not isinstance(a, dict) or len(a) != 1:
        raise GraphFormatError(f"malformed argument {a!r}")
    (kind, v), = a.items()
    try:
        if kind == "node":
            return nodes[v]
        if kind == "float":
            return float.fromhex(v)
        if kind in ("list", "tuple"):
            items = [_decode(x, nodes) for x in v]
            return tuple(items) if kind == "tuple" else items
        if kind == "dtype":
            return _DTYPES[v]
        if kind == "device":
            return torch.device(v)
        if kind == "layout":
            return _LAYOUTS[v]
        if kind == "memory_format":
            return _FORMATS[v]
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise GraphFormatError(f"malformed argument {a!r}: {e}") from None
    raise GraphFormatError(f"unknown argument kind {kind!r}")


def _size(d) -> int | str:
    """A stored dimension: an int, or the name of the size symbol it is."""
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
        return str(d.node.expr)
    raise GraphFormatError(f"dimension {d} is an expression, not one size symbol")


def placeholder_spec(val) -> dict:
    """What a placeholder is: a tensor's dtype and shape (contiguous when a size is a
    symbol), or a size symbol."""
    if isinstance(val, torch.SymInt):
        return {"symint": _size(val)}
    if isinstance(val, int) and not isinstance(val, bool):
        return {"int": val}
    if not isinstance(val, torch.Tensor):
        raise GraphFormatError(f"a placeholder holds {type(val).__name__}, not a tensor or size")
    shape = [_size(d) for d in val.shape]
    if all(isinstance(d, int) for d in shape):
        stride = [int(s) for s in val.stride()]
    elif val.is_contiguous():
        stride = None
    else:
        raise GraphFormatError("a tensor of dynamic shape that is not contiguous")
    return {"dtype": str(val.dtype), "shape": shape, "stride": stride}


def graph_to_bytes(gm: fx.GraphModule) -> bytes:
    """The graph as JSON bytes; GraphFormatError if it holds what cannot be stored
    (attributes, modules, other callables or argument types)."""
    out = []
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            out.append({"op": "placeholder", "name": n.name, "spec": placeholder_spec(n.meta.get("val"))})
        elif n.op == "call_function":
            out.append({"op": "call_function", "name": n.name, "target": _target_name(n.target),
                        "args": _encode(tuple(n.args)), "kwargs": _encode(list(n.kwargs.items()))})
        elif n.op == "output":
            out.append({"op": "output", "name": n.name, "args": _encode(tuple(n.args))})
        else:
            raise GraphFormatError(f"node {n.name} is a {n.op}, which is not stored")
    return json.dumps({"format": FORMAT, "nodes": out}, separators=(",", ":")).encode()


def _graph_module(graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule of `graph` whose Python code is generated when first needed (torch's
    lazy GraphModule, where this torch has it): the partitioner rewrites a loaded graph
    before it runs, so code generated at once (40 ms for a decoder's prompt graph) would
    be generated again."""
    try:
        from torch.fx._lazy_graph_module import _make_graph_module, _LazyGraphModule
    except ImportError:
        return fx.GraphModule(torch.nn.Module(), graph)
    return _make_graph_module(torch.nn.Module(), graph, graph_module_cls=_LazyGraphModule)


def graph_from_bytes(blob: bytes) -> tuple[fx.GraphModule, list[dict]]:
    """(GraphModule without metadata, its placeholders' specs) of graph_to_bytes' bytes;
    GraphFormatError for anything else."""
    try:
        doc = json.loads(blob)
        if doc.get("format") != FORMAT:
            raise GraphFormatError(f"graph format {doc.get('format')!r}, not {FORMAT}")
        graph, nodes, specs = fx.Graph(), {}, []
        for rec in doc["nodes"]:
            op, name = rec["op"], rec["name"]
            if not isinstance(name, str) or name in nodes:
                raise GraphFormatError(f"bad or repeated node name {name!r}")
            if op == "placeholder":
                node = graph.placeholder(name)
                specs.append(rec["spec"])
            elif op == "call_function":
                kwargs = _decode(rec["kwargs"], nodes)
                node = graph.call_function(_target(rec["target"]), _decode(rec["args"], nodes),
                                           {str(k): v for k, v in kwargs})
            elif op == "output":
                (result,) = _decode(rec["args"], nodes)
                node = graph.output(result)
            else:
                raise GraphFormatError(f"node kind {op!r} is not stored")
            node.name = name
            nodes[name] = node
        ops = [n.op for n in graph.nodes]
        if ops.count("output") != 1 or ops[-1] != "output":
            raise GraphFormatError("a stored graph ends with its one output")
        graph.lint()
        gm = _graph_module(graph)
    except GraphFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RuntimeError, SyntaxError) as e:
        raise GraphFormatError(f"not a stored graph: {type(e).__name__}: {e}") from None
    return gm, specs


def _concrete(x):
    """x with a symbolic number replaced by its value in the traced call (its hint)."""
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        node = x.node
        if not node.has_hint():
            raise GraphFormatError(f"value {x} has no known value (data-dependent)")
        x = node.hint
    return x


# sympy's and torch's integer functions an expression of sizes may hold, by the
# names stored for them (torch.utils._sympy.functions; Python's // and % semantics)
_EXPR_FUNCS = {"Add": "+", "Mul": "*", "Pow": "**", "PowByNatural": "**", "FloorDiv": "//",
               "CleanDiv": "//", "PythonMod": "%", "Max": "max", "Min": "min",
               "ModularIndexing": "modidx", "Identity": "id"}


def _expr_data(e):
    """A sympy integer expression of size symbols as data: an int, a symbol's name, or
    [op, operand...]; GraphFormatError for what _eval_expr cannot compute exactly."""
    if e.is_Integer:
        return int(e)
    if e.is_Symbol:
        return str(e)
    op = _EXPR_FUNCS.get(type(e).__name__)
    if op is None:
        raise GraphFormatError(f"size expression {e} uses {type(e).__name__}")
    if op == "**" and not (e.args[1].is_Integer and int(e.args[1]) >= 0):
        raise GraphFormatError(f"size expression {e} has a power that is not a natural number")
    return [op, *(_expr_data(a) for a in e.args)]


def _eval_expr(x, sizes: dict):
    """The value of _expr_data's data for the size symbols' values in `sizes`."""
    if type(x) is int:
        return x
    if isinstance(x, str):
        if x not in sizes:
            raise GraphFormatError(f"size symbol {x} is no input's size")
        return sizes[x]
    if not isinstance(x, list) or not x or x[0] not in _EXPR_OPS:
        raise GraphFormatError(f"malformed size expression {x!r}")
    args = [_eval_expr(a, sizes) for a in x[1:]]
    try:
        return _EXPR_OPS[x[0]](*args)
    except (TypeError, ZeroDivisionError, ValueError) as e:
        raise GraphFormatError(f"size expression {x!r} at {sizes}: {e}") from None


def _natural_mod(a, b):
    if a < 0 or b <= 0:
        raise ValueError("a modulus of negative numbers")
    return a % b


_EXPR_OPS = {
    "+": lambda *a: sum(a), "*": lambda *a: math.prod(a), "**": lambda a, b: a ** b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b, "max": max, "min": min,
    "modidx": lambda a, b, c: _natural_mod(a // b, c), "id": lambda a: a,
}


def _size_record(d, symbolic: bool):
    """A size in a value record: an int, or with symbolic=True the expression a symbolic
    size is of the graph's size symbols (_expr_data)."""
    if isinstance(d, torch.SymInt) and symbolic:
        return _expr_data(d.node.expr)
    if isinstance(d, (torch.SymFloat, torch.SymBool)) and symbolic and not d.node.expr.is_number:
        raise GraphFormatError(f"value {d} is a symbolic {type(d).__name__}, not a size")
    return _concrete(d)


def _value_record(v, symbolic: bool = False):
    """One node's value as data: a tensor's dtype, shape, strides and offset, a number,
    None, or a list of these; GraphFormatError for anything else."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return {"t": [str(v.dtype), [_size_record(d, symbolic) for d in v.shape],
                      [_size_record(d, symbolic) for d in v.stride()],
                      _size_record(v.storage_offset(), symbolic)]}
    if isinstance(v, (list, tuple)):
        return {"seq": [_value_record(x, symbolic) for x in v]}
    if isinstance(v, torch.SymInt) and symbolic:
        return {"int": _size_record(v, True)}
    v = _size_record(v, symbolic)
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, float):
        return {"float": v.hex()}
    raise GraphFormatError(f"a node's value of type {type(v).__name__} cannot be stored")


def _values_doc(gm: fx.GraphModule, symbolic: bool) -> bytes:
    out = []
    for n in gm.graph.nodes:
        if n.op != "output":
            out.append(_value_record(n.meta.get("val"), symbolic))
    return json.dumps({"format": FORMAT, "symbolic": symbolic, "values": out}, separators=(",", ":")).encode()


def node_values(gm: fx.GraphModule) -> bytes:
    """Every node's meta["val"] but the output's, for the sizes of one call (a symbolic
    size as its value in the traced call; a node without one as null, left without one on
    load, as the partitioner saw it), as JSON bytes for set_node_values; GraphFormatError
    where a value cannot be stored."""
    return _values_doc(gm, False)


def node_value_exprs(gm: fx.GraphModule) -> bytes:
    """node_values of a graph traced with symbolic sizes, each size kept as its expression
    of the size symbols the placeholders name (placeholder_spec), so set_node_values
    gives any call's values from it, as propagating that call's shapes would; the traced
    call's ops decided every branch on sizes, and a call of the graph meets the guards
    that made them. GraphFormatError where a value is no integer expression of those
    symbols that it can compute exactly (then each new size is propagated)."""
    return _values_doc(gm, True)


def _meta_value(rec, sizes: dict | None = None):
    """The value a record stands for; `sizes` (size symbol -> value) evaluates the sizes
    of a symbolic record (node_value_exprs), None takes plain numbers only."""
    if rec is None:
        return None
    if not isinstance(rec, dict) or len(rec) != 1:
        raise GraphFormatError(f"malformed value {rec!r}")
    (kind, v), = rec.items()
    if sizes is not None and kind in ("t", "int"):
        if kind == "int":
            return _eval_expr(v, sizes)
        if not isinstance(v, list) or len(v) != 4 or not isinstance(v[1], list) or not isinstance(v[2], list):
            raise GraphFormatError(f"malformed tensor value {v!r}")
        v = [v[0], [_eval_expr(d, sizes) for d in v[1]], [_eval_expr(d, sizes) for d in v[2]],
             _eval_expr(v[3], sizes)]
    if kind == "t":
        dtype, shape, stride, offset = v
        if dtype not in _DTYPES or len(shape) != len(stride) or \
                not all(type(d) is int and d >= 0 for d in [*shape, offset]) or \
                not all(type(d) is int for d in stride):
            raise GraphFormatError(f"malformed tensor value {v!r}")
        if offset == 0:
            return torch.empty_strided(shape, stride, dtype=_DTYPES[dtype], device="meta")
        extent = offset + sum((d - 1) * abs(s) for d, s in zip(shape, stride) if d > 0) + 1
        base = torch.empty(extent, dtype=_DTYPES[dtype], device="meta")
        return base.as_strided(shape, stride, offset)
    if kind == "seq" and isinstance(v, list):
        return [_meta_value(x, sizes) for x in v]
    if kind == "int" and type(v) is int or kind == "bool" and type(v) is bool:
        return v
    if kind == "float" and isinstance(v, str):
        try:
            return float.fromhex(v)
        except ValueError:
            pass
    raise GraphFormatError(f"malformed value {rec!r}")


def _same_input(val, a) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(val, torch.Tensor) and val.dtype == a.dtype and val.shape == a.shape \
            and val.stride() == a.stride()
    return type(val) is type(a) and val == a


def set_node_values(gm: fx.GraphModule, specs: list[dict], args: list, blob: bytes) -> None:
    """Set every node's meta["val"] from node_values' or node_value_exprs' bytes (meta
    tensors: dtype, shape and strides, no data), after checking `args` against the specs
    as propagate_meta does and each input's recorded value against its argument;
    GraphFormatError where the bytes are malformed or do not fit the graph or the
    arguments."""
    sizes = check_inputs(specs, args)
    try:
        doc = json.loads(blob)
        if doc.get("format") != FORMAT:
            raise GraphFormatError(f"values format {doc.get('format')!r}, not {FORMAT}")
        records = doc["values"]
        nodes = [n for n in gm.graph.nodes if n.op != "output"]
        if not isinstance(records, list) or len(records) != len(nodes):
            raise GraphFormatError(f"{len(records)} values for {len(nodes)} nodes")
        symbolic = doc.get("symbolic", False)
        if not isinstance(symbolic, bool):
            raise GraphFormatError(f"malformed symbolic flag {symbolic!r}")
        vals = [_meta_value(r, sizes if symbolic else None) for r in records]
    except GraphFormatError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:
        raise GraphFormatError(f"not stored node values: {type(e).__name__}: {e}") from None
    inputs = iter(args)
    for n, v in zip(nodes, vals):
        if n.op == "placeholder" and not _same_input(v, next(inputs)):
            raise GraphFormatError(f"the value stored for input {n.name} is not its argument's")
    for n, v in zip(nodes, vals):
        if v is not None:
            n.meta["val"] = v


def check_inputs(specs: list[dict], args: list) -> dict[str, int]:
    """The value of each size symbol in `args`; GraphFormatError unless `args` fit the
    placeholders' specs (dtypes, shapes, strides, one value per size symbol)."""
    if len(specs) != len(args):
        raise GraphFormatError(f"the graph takes {len(specs)} inputs, {len(args)} given")
    sizes: dict[str, int] = {}

    def size_is(name: str, value: int, i: int) -> None:
        if sizes.setdefault(name, value) != value:
            raise GraphFormatError(f"input {i}: size {name} is {value} here, {sizes[name]} elsewhere")
    for i, (spec, a) in enumerate(zip(specs, args)):     # tensors first: they give the sizes
        if "dtype" not in spec:
            continue
        if not isinstance(a, torch.Tensor) or str(a.dtype) != spec["dtype"] or a.dim() != len(spec["shape"]):
            raise GraphFormatError(f"input {i} is not a {spec['dtype']} tensor of {len(spec['shape'])} dims")
        for d, size in zip(spec["shape"], a.shape):
            if isinstance(d, str):
                size_is(d, size, i)
            elif d != size:
                raise GraphFormatError(f"input {i} has shape {tuple(a.shape)}, not {spec['shape']}")
        if spec["stride"] is not None and list(a.stride()) != spec["stride"]:
            raise GraphFormatError(f"input {i} has strides {a.stride()}, not {spec['stride']}")
        if spec["stride"] is None and not a.is_contiguous():
            raise GraphFormatError(f"input {i} is not contiguous")
    for i, (spec, a) in enumerate(zip(specs, args)):
        if "dtype" in spec:
            continue
        if isinstance(a, bool) or not isinstance(a, int):
            raise GraphFormatError(f"input {i} is {type(a).__name__}, not a size")
        if "symint" in spec:
            if spec["symint"] not in sizes:
                raise GraphFormatError(f"input {i}: size {spec['symint']} is no tensor's")
            size_is(spec["symint"], a, i)
        elif "int" not in spec or a != spec["int"]:
            raise GraphFormatError(f"input {i} is {a!r}, not {spec.get('int')!r}")
    return sizes


def propagate_meta(gm: fx.GraphModule, specs: list[dict], args: list) -> list:
    """Set every node's meta["val"] from fake tensors of `args` (the real inputs of the
    graph's first call), which must fit the specs; returns the fake inputs.

    The values are those of this call's shapes, static: the partitioner reads them for
    its choices, as it reads a symbolic graph's size hints (the first call's), and the
    planner specialises each Vulkan partition to every call's shapes itself, so a graph
    traced with a dynamic size still runs for each value of it. Propagating symbolically
    cost more than tracing (sympy on every size: ~5 s for SmolLM2's prompt graph).
    GraphFormatError where `args` do not fit the specs."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    class ValueProp(FakeTensorProp):
        """FakeTensorProp that also records plain numbers: with static shapes a size
        node's value is an int, which torch 2.11's FakeTensorProp leaves out of meta (the
        partitioner then took arithmetic on sizes for host code)."""

        def run_node(self, n):
            result = super().run_node(n)
            if "val" not in n.meta and isinstance(result, (int, float, bool)):
                n.meta["val"] = result
            return result

    check_inputs(specs, args)
    mode = FakeTensorMode()
    fakes = [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]
    with mode:
        ValueProp(gm, mode).propagate_dont_convert_inputs(*fakes)
    for n, f in zip((n for n in gm.graph.nodes if n.op == "placeholder"), fakes):
        n.meta["val"] = f
    return fakes
