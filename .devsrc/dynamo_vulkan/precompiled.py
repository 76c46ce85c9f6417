"""A compiled module whose traced graphs persist across processes.

torch.compile traces a decoder with Dynamo and AOT autograd in every new process
(SmolLM2 on the CI machine: ~9 s of a second run's ~16 s of compile and warm-up, the
plans and SPIR-V being cached already). Precompiled wraps the torch.compile'd module:
the first time a call signature compiles, the flat ATen graph that the backend received
is stored in the disk cache as data (runtime/graph_io.py) with where each of its inputs
comes from (an argument, a size of one, or a module tensor by name), and each node's
value (dtype, shape, strides) for the call's input sizes, and with the graph each node's
value with its sizes as expressions of the graph's size symbols (the prompt length); a
later process with the same key rebuilds that graph, sets those values (for sizes not
stored, from the expressions; where there are none, propagated on fake tensors) and hands
it to the backend's compile_graph directly, without Dynamo or AOT tracing: a process
whose calls all find their graphs and values never imports Dynamo.

The key covers the module's structure (every submodule's class and plain attributes,
every tensor's name, dtype and shape), the call signature, the package's and torch's
versions and sources, the settings and the device, so a changed model file, setting or
version builds and stores a new entry; an entry that does not verify or parse is
rejected and rebuilt. A graph is stored only where calling it directly is what
aot_autograd's wrapper would do: one graph per call, input mutations done in the graph,
no outputs aliasing inputs; else the module keeps running through torch.compile.
"""
from __future__ import annotations

import functools
import json
import logging
import re
import sys
import time
from pathlib import Path

import torch

from . import backend, cache, config, device, progress
from .runtime.graph_io import (GraphFormatError, graph_from_bytes, graph_to_bytes, node_value_exprs,
                                node_values, placeholder_spec, propagate_meta, set_node_values)

log = logging.getLogger(__name__)

_ARG = re.compile(r"L\['args'\]\[(\d+)\]$")
_SIZE = re.compile(r"L\['args'\]\[(\d+)\]\.size\(\)\[(\d+)\]$")
_ATTR = re.compile(r"\._(modules|buffers|parameters)\['([^']+)'\]")
_UNKNOWN = object()
_MISSED = object()      # prepare() found no stored graph: the call traces it


class Capture:
    """backend._graph_sinks entry: the graphs one compiled call traced."""

    def __init__(self):
        self.sources: list[list[str]] = []      # per Dynamo graph, its placeholders' sources
        self.graphs: list[tuple] = []           # (kind, bytes, static, bumped) per AOT graph
        self.values: list[bytes | None] = []     # per AOT graph, its nodes' values (node_values)
        self.value_exprs: list[bytes | None] = []    # per AOT graph, node_value_exprs
        self.why_not: str | None = None

    def dynamo_graph(self, gm) -> None:
        names = []
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                src = getattr(n.meta.get("grapharg"), "source", None)
                name = getattr(src, "name", None)
                names.append(name() if callable(name) else str(name))
        self.sources.append(names)

    def aot_graph(self, gm, kind: str, static: set, bumped: set) -> None:
        meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
        try:
            _check_direct(meta, gm)
            self.graphs.append((kind, graph_to_bytes(gm), sorted(static), sorted(bumped)))
        except GraphFormatError as e:
            self.why_not = str(e)
            self.graphs.append(None)
        try:
            self.values.append(node_values(gm))
        except GraphFormatError as e:       # a later process propagates them (and stores them)
            log.debug("%s: node values not stored (%s)", kind, e)
            self.values.append(None)
        try:
            self.value_exprs.append(node_value_exprs(gm))
        except GraphFormatError as e:       # each new size is propagated
            log.debug("%s: node values not stored as expressions of sizes (%s)", kind, e)
            self.value_exprs.append(None)


def _check_direct(meta, gm) -> None:
    """GraphFormatError unless calling gm is all that aot_autograd's runtime wrapper does
    besides bumping the versions of the inputs the graph mutates."""
    from torch._functorch._aot_autograd.schemas import OutputType

    if meta is None:
        raise GraphFormatError("no aot_autograd metadata")
    outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    checks = {
        "input mutations applied outside the graph": getattr(meta, "num_mutated_inp_runtime_indices", 1),
        "intermediate bases": getattr(meta, "num_intermediate_bases", 1),
        "outputs that alias or are not plain": sum(o.output_type != OutputType.non_alias
                                                   for o in getattr(meta, "output_info", [None])
                                                   if o is not None) + (not hasattr(meta, "output_info")),
        "graph outputs other than the module's": len(outs) != len(getattr(meta, "output_info", ())),
    }
    bad = [what for what, n in checks.items() if n]
    if bad:
        raise GraphFormatError("the graph needs aot_autograd's wrapper: " + ", ".join(bad))


def _input_ref(source: str) -> list:
    """Where a Dynamo graph input comes from: ["arg", i], ["size", i, dim] or
    ["tensor", dotted name in the module]; GraphFormatError for any other source."""
    if m := _ARG.match(source):
        return ["arg", int(m.group(1))]
    if m := _SIZE.match(source):
        return ["size", int(m.group(1)), int(m.group(2))]
    if source.startswith("L['model']"):
        rest = source[len("L['model']"):]
        parts = _ATTR.findall(rest)
        if parts and "".join(f"._{k}['{v}']" for k, v in parts) == rest and \
                all(k == "modules" for k, _ in parts[:-1]) and parts[-1][0] != "modules":
            return ["tensor", ".".join(v for _, v in parts)]
    raise GraphFormatError(f"an input comes from {source}, which is not an argument or a module tensor")


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """Hash of the package's Python sources, its lowering rules and shaders, and torch's
    version: whatever shapes a traced graph besides the module and its inputs."""
    root = Path(__file__).parent      # lowering/, shaders/ and llm/ included; not the benchmarks
    files = sorted((str(p.relative_to(root)), p.read_bytes()) for p in root.rglob("*")
                   if p.suffix in (".py", ".comp", ".glsl") and p.is_file() and
                   p.relative_to(root).parts[0] != "benchmarks")
    return cache.digest(torch.__version__, *files)


def _plain(v):
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), tuple(v.shape))
    return repr(v)


def fingerprint(module: torch.nn.Module) -> str:
    """What of a module a traced graph depends on: each submodule's class and public
    attributes (sizes, epsilons, quant types, configs), each tensor's name, dtype, shape
    and strides. Weight values are graph inputs, so they are not part of it."""
    parts = []
    for name, m in module.named_modules():
        attrs = sorted((k, _plain(v)) for k, v in vars(m).items() if not k.startswith("_"))
        parts.append((name, type(m).__module__, type(m).__qualname__, attrs))
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        parts.append((name, str(t.dtype), tuple(t.shape), t.stride(), t.requires_grad))
    return cache.digest(*parts)


_MARK = "_dynamo_vulkan_dynamic"     # the dims mark_dynamic recorded on a tensor


def mark_dynamic(t: torch.Tensor, dim: int) -> None:
    """Dynamo's maybe_mark_dynamic(t, dim) for a call of a Precompiled module, without
    importing Dynamo (~1.2 s) where the call's graph comes from the disk cache: the dim is
    recorded on the tensor, part of the call's signature, and Dynamo's mark is applied
    when a call goes through torch.compile (at once if Dynamo is loaded already, as it is
    wherever a torch.compile'd module exists)."""
    setattr(t, _MARK, set(getattr(t, _MARK, ())) | {dim})
    if "torch._dynamo" in sys.modules:
        torch._dynamo.maybe_mark_dynamic(t, dim)


def _apply_marks(args) -> None:
    """Dynamo's marks for the dims mark_dynamic recorded (before a call traces)."""
    for a in args:
        for d in getattr(a, _MARK, ()):
            torch._dynamo.maybe_mark_dynamic(a, d)


def _dynamic_dims(t: torch.Tensor) -> set:
    return (set(getattr(t, "_dynamo_weak_dynamic_indices", ())) | set(getattr(t, "_dynamo_dynamic_indices", ()))
            | set(getattr(t, _MARK, ())))


def signature(args) -> tuple:
    """What a call's graph is specialised on: each argument's dtype and shape (a dimension
    marked dynamic as its 0/1/many class, as Dynamo specialises it), grad mode."""
    sig = []
    for a in args:
        if not isinstance(a, torch.Tensor):
            raise GraphFormatError(f"argument of type {type(a).__name__}")
        dyn = _dynamic_dims(a)
        sig.append((str(a.dtype), tuple(("dyn", min(s, 2)) if d in dyn else s for d, s in enumerate(a.shape)),
                    a.requires_grad))
    return tuple(sig), torch.is_grad_enabled()


class _Runner:
    """A stored graph compiled by the backend, called with the module's tensors."""

    def __init__(self, module, fn, refs: list, bumped: list[int], single: bool):
        self.fn, self.bumped, self.single = fn, bumped, single
        self.getters = []
        for ref in refs:
            if ref[0] == "arg":
                self.getters.append(lambda args, i=ref[1]: args[i])
            elif ref[0] == "size":
                self.getters.append(lambda args, i=ref[1], d=ref[2]: args[i].shape[d])
            else:
                owner, _, attr = ref[1].rpartition(".")
                sub = module.get_submodule(owner)
                self.getters.append(lambda args, sub=sub, attr=attr: getattr(sub, attr))

    def flat(self, args) -> list:
        return [g(args) for g in self.getters]

    def __call__(self, args):
        flat = self.flat(args)
        # before the call, as aot_autograd's wrapper does: a program that keeps a mutated
        # input on the GPU (a KV cache) takes a version one past the one it left as that
        # wrapper's bump, not as a write on the host; bumped after, the next program
        # uploaded the stale host copy over the GPU's (the prompt's cache entries lost)
        for i in self.bumped:          # one call each: older torch's takes one tensor
            torch.autograd.graph.increment_version(flat[i])
        out = self.fn(flat)
        return out[0] if self.single else tuple(out)


class Precompiled:
    """``compiled`` (torch.compile of ``module``'s call) with its graphs kept on disk; see
    the module docstring. Calls with keyword arguments or under grad mode go to
    ``compiled`` as they are. ``compiled`` may be given as ``make_compiled``, a function
    that returns it, called when a call first needs it: a process whose graphs all come
    from the disk cache then never imports Dynamo (~2 s on the CI machine)."""

    def __init__(self, module: torch.nn.Module, compiled=None, cfg: config.Config | None = None,
                 make_compiled=None):
        self.module, self._compiled, self._make_compiled = module, compiled, make_compiled
        self.cfg = cfg or config.load()
        self.runners: dict = {}     # signature -> _Runner, or None: through compiled
        self._fingerprint = None

    @property
    def compiled(self):
        if self._compiled is None and self._make_compiled is not None:
            self._compiled = self._make_compiled()
        return self._compiled

    def _through_compiled(self, args, kwargs=None):
        """The call through torch.compile, with mark_dynamic's marks as Dynamo's."""
        fn = self.compiled
        _apply_marks(args)
        return fn(*args, **(kwargs or {}))

    def key(self, sig) -> str:
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.module)
        info = device.device_info(self.cfg.device_index)
        return cache.digest("graph", code_hash(), self._fingerprint, sig, self.cfg.key(),
                            info.get("name"), info.get("driver_info"))

    def __call__(self, *args, **kwargs):
        if kwargs or torch.is_grad_enabled() or cache.cache_root(self.cfg) is None:
            return self._through_compiled(args, kwargs)
        try:
            sig = signature(args)
        except GraphFormatError:
            return self._through_compiled(args)
        runner = self.runners.get(sig, _UNKNOWN)
        if runner is _UNKNOWN or runner is _MISSED:
            key = self.key(sig)
            runner = self.runners[sig] = self._load(key, args) if runner is _UNKNOWN else None
            if runner is None:
                return self._trace(key, args)
        return self._through_compiled(args) if runner is None else runner(args)

    def prepare(self, *args) -> bool:
        """Compile the graph of a call with these arguments from the disk cache without
        running it; False where that call must run to compile (nothing stored yet, the
        disk cache off, grad mode): a warm-up then runs it once (generate's prefill, whose
        compile is timed apart from its run without running the prompt twice)."""
        if torch.is_grad_enabled() or cache.cache_root(self.cfg) is None:
            return False
        try:
            sig = signature(args)
        except GraphFormatError:
            return False
        if self.runners.get(sig, _UNKNOWN) is _UNKNOWN:
            # none stored: the call traces it (and stores it)
            self.runners[sig] = self._load(self.key(sig), args) or _MISSED
        return self.runners[sig] not in (None, _MISSED)

    @staticmethod
    def _values_key(key: str, args) -> str:
        """The key of a stored graph's node values for these arguments' sizes."""
        return cache.digest("values", key, [(tuple(a.shape), a.stride()) for a in args])

    def _set_values(self, key: str, gm, specs, flat: list, args, exprs: str | None) -> None:
        """Every node's meta["val"]: from the stored values for these sizes where they verify,
        else from the graph's values as expressions of its sizes (`exprs`, node_value_exprs),
        else propagated on fake tensors (Dynamo's import) and stored for the next process."""
        vkey = self._values_key(key, args)
        if cache.disk_load("values", vkey, lambda blob: set_node_values(gm, specs, flat, blob) or True,
                           (GraphFormatError,), "node values that fit their graph"):
            return
        if exprs is not None:
            try:
                set_node_values(gm, specs, flat, exprs.encode())
            except GraphFormatError as e:
                log.warning("dynamo_vulkan cache entry graph/%s: its node values as expressions of "
                            "sizes do not fit %s (%s); propagating them", key, [tuple(a.shape) for a in args], e)
                cache.count("values", "exprs_refused")
            else:
                cache.count("values", "from_exprs")
                self._put_values(vkey, gm)     # replaces a refused entry; read as before next time
                return
        propagate_meta(gm, specs, flat)
        self._put_values(vkey, gm)

    @staticmethod
    def _put_values(vkey: str, gm) -> None:
        try:
            cache.disk_put("values", vkey, node_values(gm))
        except GraphFormatError as e:
            log.debug("node values not stored (%s)", e)

    def _load(self, key: str, args) -> _Runner | None:
        blob = cache.disk_get("graph", key)
        if blob is None:
            cache.count("graph", "misses")
            return None
        t0 = time.perf_counter()
        try:
            entry = json.loads(blob)
            gm, specs = graph_from_bytes(entry["graph"].encode())
            runner = _Runner(self.module, None, entry["inputs"], entry["bumped"], entry["single"])
            flat = runner.flat(args)
            self._set_values(key, gm, specs, flat, args, entry.get("value_exprs"))
            inputs_meta = (set(entry["static"]), set(entry["bumped"]))
        except (GraphFormatError, ValueError, KeyError, TypeError, AttributeError, RuntimeError) as e:
            log.warning("dynamo_vulkan cache entry graph/%s is not a valid graph for %s (%s); "
                        "tracing it again", key, type(self.module).__name__, e)
            cache.count("graph", "corrupt")
            return None
        cache.count("graph", "disk_hits")
        runner.fn = backend.compile_graph(gm, flat, self.cfg, entry["kind"], inputs_meta)
        progress.phase("%s: traced graph read from the cache (%d nodes, %.1f s)", type(self.module).__name__,
                       len(gm.graph.nodes), time.perf_counter() - t0)
        return runner

    def _trace(self, key: str, args):
        progress.phase("%s: tracing with Dynamo and AOT autograd for inputs %s (once: the graph "
                       "is kept in the disk cache)", type(self.module).__name__, [tuple(a.shape) for a in args])
        cap = Capture()
        backend._graph_sinks.append(cap)
        try:
            out = self._through_compiled(args)
        finally:
            backend._graph_sinks.remove(cap)
        try:
            entry = self._entry(cap, out)
        except GraphFormatError as e:
            log.info("%s: its traced graph is not stored (%s); each process traces it",
                     type(self.module).__name__, e)
            return out
        if entry is not None:
            cache.disk_put("graph", key, json.dumps(entry).encode())
            if cap.values and cap.values[0] is not None:
                cache.disk_put("values", self._values_key(key, args), cap.values[0])
        return out

    def _entry(self, cap: Capture, out) -> dict | None:
        if not cap.graphs and not cap.sources:
            return None              # compiled earlier in this process: nothing traced now
        if cap.why_not:
            raise GraphFormatError(cap.why_not)
        if len(cap.sources) != 1 or len(cap.graphs) != 1:
            raise GraphFormatError(f"the call compiled {len(cap.sources)} Dynamo graph(s) and "
                                   f"{len(cap.graphs)} AOT graph(s), not one of each")
        kind, blob, static, bumped = cap.graphs[0]
        refs = [_input_ref(s) for s in cap.sources[0]]
        gm, specs = graph_from_bytes(blob)
        if len(refs) != len(specs):
            raise GraphFormatError(f"the AOT graph has {len(specs)} inputs, Dynamo's {len(refs)}")
        n_out = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        single = isinstance(out, torch.Tensor)
        if not (single and n_out == 1 or isinstance(out, tuple) and len(out) == n_out and
                all(isinstance(o, torch.Tensor) for o in out)):
            raise GraphFormatError(f"the module returns {type(out).__name__}, the graph {n_out} outputs")
        exprs = cap.value_exprs[0] if cap.value_exprs else None
        return {"graph": blob.decode(), "kind": kind, "inputs": refs, "static": static,
                "bumped": bumped, "single": single, "value_exprs": exprs and exprs.decode()}


__all__ = ["Precompiled", "mark_dynamic", "signature", "fingerprint", "code_hash", "placeholder_spec"]
