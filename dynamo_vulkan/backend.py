"""torch.compile(model, backend="vulkan"): the Dynamo backend.

aot_autograd with core ATen decompositions gives a functional ATen graph; it
is partitioned (partition.py); each Vulkan partition becomes a VulkanSubgraph
that specialises to its inputs' shapes on first call, lowers to a Plan,
and replays one recorded kp sequence per call.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import warnings
from collections import OrderedDict

import torch
import torch.fx as fx
# aot_autograd's own module (and torch._dynamo) load in vulkan_backend: a graph read from
# the disk cache (precompiled.py) compiles without them
from torch._functorch._aot_autograd.utils import make_boxed_func

from . import cache, config, device
from .regions import inline_regions
from .partition import PARTITION_PREFIX, HostPlacement, PartitionReport, partition
from .lowering import LoweringError, decompositions as lowering_decompositions
from .lowering import planner
from .lowering.settings import settings_hash
from .runtime import shaders
from .runtime.plan import PlanFormatError, plan_from_bytes, plan_to_bytes
from .runtime.program import (is_kept_on_device, Program, StaleBinding, gradient_may_stay_on_gpu,
                              refresh_host, serialised)

log = logging.getLogger(__name__)
_graph_ids = itertools.count()
_reports: list[PartitionReport] = []
_warned: set[str] = set()


_EAGER = object()   # marks a signature whose partition runs eagerly on the CPU
# Programs a partition keeps, one per input layout (a prompt length): those of its most
# recently used layouts; an older one is built again if it comes back (its plan cached)
PROGRAMS_KEPT = 8
SHAPES_WARNED = 32   # programs built for one partition (input shapes) before a warning
_captures: list[list] = []   # open capture_partitions() lists
_graph_sinks: list = []      # open precompiled.Capture objects: the graphs traced for them


@contextlib.contextmanager
def capture_partitions():
    """Collects (graph module, its VulkanSubgraphs) for each graph compiled while open;
    each of those subgraphs keeps the inputs of its calls until told otherwise
    (remember_args), so a caller can replay its Program (runtime/replay.py)."""
    got: list = []
    _captures.append(got)
    try:
        yield got
    finally:
        _captures.remove(got)


class VulkanFallbackError(RuntimeError):
    """Raised under DYNAMO_VULKAN_FALLBACK=error when a node would run on the CPU."""


def reports() -> list[PartitionReport]:
    """Partition reports of the graphs compiled in this process, oldest first."""
    return list(_reports)


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def _fw_metadata_indices(name: str) -> set[int]:
    """Graph-input indices listed in aot_autograd's metadata under `name`."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx else None
    return set(getattr(meta, name, None) or [])


def _layout(a):
    """What a program is specialised on for one input."""
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.dtype, a.storage_offset())
    return a


_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})
_DTYPE = operator.attrgetter("dtype")


def _layouts(ts: list) -> tuple:
    """The layouts of a call's streamed inputs, as one key: where all are plain tensors
    (a backward streams about 150 saved activations a call), each property is mapped over
    the list in C, without a Python call per tensor; else each input's _layout."""
    if set(map(type, ts)) <= _PLAIN_TENSORS:
        return (tuple(map(torch.Tensor.size, ts)), tuple(map(torch.Tensor.stride, ts)),
                tuple(map(_DTYPE, ts)), tuple(map(torch.Tensor.storage_offset, ts)))
    return tuple(map(_layout, ts))


class VulkanSubgraph(torch.nn.Module):
    """One Vulkan partition: specialises per input signature, then replays."""

    def __init__(self, gm: fx.GraphModule, resident: list[bool], cfg: config.Config,
                 dump_dir, name: str, bumped: list[bool] | None = None):
        super().__init__()
        self.gm = gm
        self.resident = resident
        self.streamed = [i for i, r in enumerate(resident) if not r]
        self.bumped = bumped          # inputs whose version the aot wrapper bumps per call
        self.cfg = cfg
        self.dump_dir = dump_dir
        self.name = name
        self.programs: OrderedDict[tuple, Program] = OrderedDict()   # least recently used first
        self.built = 0                # programs built so far (names their debug dumps)
        self.handoff: set[int] = set()   # outputs to hand off: saved activations, gradients
        self.grad_of: dict[int, int] = {}   # a backward's: output -> the graph's output (input)
        self.kind = "graph"              # the graph's: forward, backward, inference
        self.remember_args = False    # keep the last call's inputs in remembered_args
        self.remembered_args: list | None = None
        out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        self.tuple_out = isinstance(out, (tuple, list))
        self.graph_text = gm.code + repr([(n.target, getattr(gm, n.target).shape)
                                          for n in gm.graph.nodes if n.op == "get_attr"])

    @serialised      # its program table and the programs' shared memory: one caller at a time
    def forward(self, *args):
        # Programs are looked up by the layouts of the streamed inputs only: a model's
        # hundreds of resident ones (weights, caches) keep theirs, and the Program
        # checks that each is still the tensor it holds (StaleBinding otherwise).
        key = _layouts([args[i] for i in self.streamed])
        if self.remember_args:
            self.remembered_args = list(args)
        prog = self.programs.get(key)
        if prog is None:
            prog = self.programs[key] = self._build_or_fallback(self._full_key(args), list(args))
            if isinstance(prog, Program):
                self._drop_superseded(key, prog)
            if len(self.programs) > PROGRAMS_KEPT:     # the least recently used goes
                del self.programs[next(iter(self.programs))]
        elif len(self.programs) > 1:
            self.programs.move_to_end(key)
        if prog is _EAGER:
            refresh_host(args)       # keep_on_device tensors a program updated on the GPU
            return self.gm(*args)
        lazy = self._lazy_outputs(prog)
        try:
            out = prog(args, lazy=lazy)
        except StaleBinding:
            full = self._full_key(args)
            if full == prog.key:         # another tensor of the same layout: re-bind
                with config.using(self.cfg):
                    prog = Program(prog.plan, list(args), self.cfg.profile, self.bumped)
                prog.key = full
                prog.hand_off(self.handoff, self.kind == "backward")
            else:                        # a resident input changed shape: build again
                prog = self._build_or_fallback(full, list(args))
            self.programs[key] = prog
            if prog is _EAGER:
                refresh_host(args)
                return self.gm(*args)
            out = prog(args, lazy=self._lazy_outputs(prog))
        return tuple(out) if self.tuple_out else out[0]

    def _lazy_outputs(self, prog: Program) -> dict:
        """The hand-offs whose host copies wait until a host reader needs them: a forward's
        saved activations (unless saved-tensor hooks, which may read them, are on), and a
        backward's gradients that a kept optimizer's parameters accumulate
        (runtime/program.gradient_may_stay_on_gpu), each with that parameter."""
        if not self.handoff:
            return {}
        if self.kind == "forward":
            hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
            return dict.fromkeys(self.handoff) if hooks is None else {}
        node = torch._C._current_autograd_node() if self.kind == "backward" else None
        if node is None:
            return {}
        consumers = node.next_functions
        shapes = {n: o.shape for n, o in enumerate(prog.plan.outputs)}
        return {n: consumers[j][0].variable for n, j in self.grad_of.items()
                if j < len(consumers) and consumers[j][0] is not None and
                gradient_may_stay_on_gpu(consumers[j][0], shapes[n])}

    def _drop_superseded(self, key, new: Program) -> None:
        """Drop the least recently used programs that hold shared temporaries a newer,
        larger program replaced (runtime/program.Scratch), until the replaced ones they
        hold are no larger than the new program's: a chat's prompts grow, and each longer
        one made larger temporaries while every shorter program kept its own, so the
        temporaries held grew to their sum over the PROGRAMS_KEPT programs (for 8 padded
        lengths from 640 to 2048 tokens, about 5x the largest set if they grow with the
        length); now at most twice the largest set.
        A dropped program is built again, from its cached plan, if its length comes back."""
        budget = new.scratch_words()
        while True:
            owners, held = [], {}
            for k, p in self.programs.items():
                old = p.superseded_scratch() if k != key and isinstance(p, Program) else []
                if old:
                    owners.append(k)
                    held.update((id(s), s.words) for s in old)
            if not owners or sum(held.values()) <= budget:
                return
            del self.programs[owners[0]]

    def _full_key(self, args) -> tuple:
        return tuple(_layout(a) for a in args)

    def _build_or_fallback(self, key, args):
        try:
            return self._build(key, args)
        except LoweringError as e:
            if self.cfg.fallback == "error":
                raise VulkanFallbackError(f"{self.name} could not be lowered for inputs {key}: "
                                          f"{e} (DYNAMO_VULKAN_FALLBACK=error)") from e
            if self.cfg.fallback == "warn":
                _warn_once(f"lower:{e}", f"dynamo_vulkan: {self.name} runs on the CPU: {e}")
            return _EAGER

    def _build(self, key, args) -> Program:
        with config.using(self.cfg):       # the cache and the device read this compile's settings
            return self._build_now(key, args)

    def _build_now(self, key, args) -> Program:
        resident = [r or isinstance(a, torch.nn.Parameter) or
                    (isinstance(a, torch.Tensor) and is_kept_on_device(a))
                    for r, a in zip(self.resident, args)]
        info = device.device_info(self.cfg.device_index)
        pkey = cache.digest("plan", self.graph_text, key, resident, shaders.sources_hash(),
                            settings_hash(),
                            info.get("name"), info.get("driver_info"),
                            info.get("integer_dot_product"), self.cfg.key())
        plan = cache.memory_get("plan", pkey)
        if plan is not None:
            cache.count("plan", "memory_hits")
        else:
            plan = cache.disk_load("plan", pkey, plan_from_bytes, (PlanFormatError,), "a valid plan")
            if plan is None:
                planner.specialise(self.gm, args)
                plan = planner.lower(self.gm, args, resident, info, self.cfg)
                cache.disk_put("plan", pkey, plan_to_bytes(plan))
            cache.memory_put("plan", pkey, plan)
        prog = Program(plan, args, self.cfg.profile, self.bumped)
        prog.key = key
        prog.hand_off(self.handoff, self.kind == "backward")
        if self.dump_dir is not None:
            from .debug import dump_program
            dump_program(self.dump_dir, self.name, self.built, plan)
        self.built += 1
        if self.built == SHAPES_WARNED:
            _warn_once(f"shapes:{self.name}", (
                f"dynamo_vulkan: {self.name} has been built for {self.built} input shapes; each new "
                "shape costs a program (lowering, pipelines) before it runs. A size that changes "
                "every call (a KV cache grown by cat, as transformers' DynamicCache does) pays that "
                "every call: keep the shapes fixed (transformers: generate(..., "
                "cache_implementation='static'))"))
        return prog


def compile_graph(gm: fx.GraphModule, example_inputs, cfg: config.Config | None = None,
                  kind: str = "graph", inputs_meta: tuple[set, set] | None = None):
    """aot_autograd's compiler of each graph (kind: forward, backward or inference):
    partition, wrap each Vulkan partition, keep the rest eager. inputs_meta: (static,
    bumped) input indices where no aot_autograd metadata gives them (a stored graph)."""
    cfg = cfg or config.load()
    with config.using(cfg):
        return _compile_graph(gm, cfg, kind, inputs_meta)


def _compile_graph(gm: fx.GraphModule, cfg: config.Config, kind: str, inputs_meta=None):
    gid = next(_graph_ids)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # the metadata's indices are the forward's inputs: a backward graph's are saved
    # activations and gradients, none of them resident
    static = _fw_metadata_indices("static_input_indices") if kind != "backward" else set()
    bumped = (_fw_metadata_indices("mutated_graph_handled_indices_seen_by_autograd")
              if kind != "backward" else set())
    if inputs_meta is not None:
        static, bumped = inputs_meta
    static_nodes = {n.name for i, n in enumerate(placeholders) if i in static}
    bumped_nodes = {n.name for i, n in enumerate(placeholders) if i in bumped}
    inline_regions(gm)      # nested compile regions: one flat graph for the partitions
    for sink in _graph_sinks:
        sink.aot_graph(gm, kind, static, bumped)
    original = gm.code if cfg.debug_dump is not None else None   # Python codegen: ~30 ms a decoder
    role = _role(gm)
    gm, report = partition(gm, gid, kind)
    report.role = role
    _reports.append(report)
    dump_dir = None
    if cfg.debug_dump is not None:
        from .debug import dump_graph
        dump_dir = dump_graph(cfg.debug_dump, gid, original, report)
    for node in report.cpu_nodes:
        if isinstance(node.reason, HostPlacement):
            continue
        if cfg.fallback == "error":
            raise VulkanFallbackError(f"{node.op} ({node.name}) would run on the CPU: "
                                      f"{node.reason} (DYNAMO_VULKAN_FALLBACK=error)")
        if cfg.fallback == "warn":
            _warn_once(node.op, f"dynamo_vulkan: {node.op} runs on the CPU: {node.reason}")
    handoffs = _saved_only_outputs(gm) if kind == "forward" else \
        _returned_outputs(gm) if kind == "backward" else {}
    subs = []
    for node in list(gm.graph.nodes):
        if _is_partition(node):
            sub = getattr(gm, node.target)
            # by name: fusing partitions rebuilds the graph with new node objects
            resident = [getattr(a, "name", None) in static_nodes for a in node.args]
            subs.append(VulkanSubgraph(sub, resident, cfg, dump_dir, f"graph{gid}_{node.target}",
                                       [getattr(a, "name", None) in bumped_nodes for a in node.args]))
            subs[-1].remember_args = bool(_captures)
            subs[-1].handoff = set(handoffs.get(node.target, ()))
            if kind == "backward":
                subs[-1].grad_of = dict(handoffs.get(node.target, {}))
            subs[-1].kind = kind
            setattr(gm, node.target, subs[-1])
    gm.recompile()
    for got in _captures:
        got.append((gm, subs))
    log.info("%s", report.summary())     # counts per op and reason (generate -v)
    log.debug("%s", report)              # and every node (-vv, TORCH_LOGS="+dynamo_vulkan")
    if kind == "backward":
        return _boxed_taking_args(_reading_host_copies(gm))
    return make_boxed_func(_reading_host_copies(gm, _first_saved() if kind == "forward" else None))


def _boxed_taking_args(fn):
    """fn in the boxed calling convention that empties the list it is given (as Inductor's
    compiled graphs do): aot_autograd's backward keeps that list in a reference cycle, which
    would keep the saved activations alive past the backward until a garbage collection,
    and a pending one (runtime/program.py) read back when the forward runs again."""
    def boxed(args):
        taken = list(args)
        args.clear()
        return fn(*taken)
    boxed._boxed_call = True
    return boxed


def _is_partition(n: fx.Node) -> bool:
    """Whether node n calls a Vulkan partition."""
    return n.op == "call_module" and n.target.startswith(PARTITION_PREFIX)


def _partition_output(a) -> tuple[str, int] | None:
    """(partition, output index) where `a` is one output of a Vulkan partition, else None."""
    if isinstance(a, fx.Node) and a.op == "call_function" and a.target is operator.getitem \
            and _is_partition(a.args[0]):
        return a.args[0].target, a.args[1]
    return None


def _read_on_gpu_only(a: fx.Node) -> bool:
    """Whether only the graph's output and Vulkan partitions read node `a` (no host node,
    which would read its host copy before a pending one is materialised)."""
    return all(u.op == "output" or _is_partition(u) for u in a.users)


def _role(gm: fx.GraphModule) -> str | None:
    """What the graph computes, where its nodes' source says: a torch.optim step."""
    for n in gm.graph.nodes:
        if "torch/optim/" in (n.meta.get("stack_trace") or "").replace("\\", "/"):
            return "optimizer step"
    return None


def _saved_only_outputs(gm: fx.GraphModule) -> dict[str, set[int]]:
    """Partition -> indices of its outputs that a forward graph returns only as tensors saved
    for the backward (aot_autograd's outputs from fw_metadata.num_forward on), never to the
    user: those a partition's program hands off to the backward's (runtime/program.py)."""
    first_saved = _first_saved()
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if first_saved is None or not isinstance(out, (tuple, list)):
        return {}
    returned = {a for a in out[:first_saved] if isinstance(a, fx.Node)}
    found: dict[str, set[int]] = {}
    for a in out[first_saved:]:
        where = _partition_output(a)
        if where is not None and a not in returned and _read_on_gpu_only(a):
            found.setdefault(where[0], set()).add(where[1])
    return found


def _returned_outputs(gm: fx.GraphModule) -> dict[str, dict[int, int]]:
    """Partition -> {index of its output: where the graph returns it} for the outputs a
    backward graph returns (gradients; the position is the forward input's, which
    autograd's next_functions follow)."""
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    found: dict[str, dict[int, int]] = {}
    returned = list(out) if isinstance(out, (tuple, list)) else [out]
    for j, a in enumerate(returned):
        where = _partition_output(a)
        if where is not None and _read_on_gpu_only(a) and sum(b is a for b in returned) == 1:
            found.setdefault(where[0], {})[where[1]] = j
    return found


def _first_saved() -> int | None:
    """Where a forward graph's outputs saved for the backward begin (aot_autograd's
    fw_metadata.num_forward), or None."""
    ctx = torch._guards.TracingContext.try_get()
    return getattr(getattr(ctx, "fw_metadata", None), "num_forward", None)


def _reading_host_copies(gm: fx.GraphModule, first_saved: int | None = None):
    """gm.forward, which first reads back the keep_on_device inputs that a program updated
    on the GPU where nodes on the host (or the graph's output) read them: a training step's
    forward placed on the host after an optimizer step on the GPU. An input a forward graph
    returns only as a tensor saved for the backward (outputs from first_saved on) is not read
    back for that: the backward gets the same tensor, and reads it back itself where it
    reads it on the host."""
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    to_user = {a for a in (out if first_saved is None else out[:first_saved])
               if isinstance(a, fx.Node)}

    def host_reader(u: fx.Node, n: fx.Node) -> bool:
        if u.op == "output":
            return n in to_user
        return not _is_partition(u)
    on_host = [i for i, n in enumerate(inputs) if any(host_reader(u, n) for u in n.users)]
    if not on_host:
        return gm.forward

    def forward(*args):
        refresh_host([args[i] for i in on_host])
        return gm.forward(*args)
    return forward


def vulkan_backend(gm: fx.GraphModule, example_inputs, options: dict | None = None, **kwargs):
    """The `vulkan` backend registered through the torch_dynamo_backends entry point;
    torch.compile's `options` override the environment's settings (config.load)."""
    cfg = config.load(options)
    if not device.is_available(cfg.device_index):
        reason = device.device_info(cfg.device_index).get("reason", "no Vulkan device")
        if cfg.fallback == "error":
            raise VulkanFallbackError(f"{reason}; the model would run on the CPU "
                                      "(DYNAMO_VULKAN_FALLBACK=error)")
        _warn_once("no-device", f"dynamo_vulkan: {reason}; running the model on the CPU")
        return gm.forward
    device.set_fence_spin(cfg.fence_spin_us, cfg.device_index)
    for sink in _graph_sinks:
        sink.dynamo_graph(gm)
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return aot_autograd(
        fw_compiler=lambda g, ex: compile_graph(g, ex, cfg, "forward"),
        bw_compiler=lambda g, ex: compile_graph(g, ex, cfg, "backward"),
        inference_compiler=lambda g, ex: compile_graph(g, ex, cfg, "inference"),
        decompositions=lowering_decompositions(),
        keep_inference_input_mutations=True,
        # Inductor's partitioner: the backward recomputes what is cheap to recompute (a
        # fused elementwise kernel) instead of saving it, so a training step's forward
        # writes fewer activations and hands fewer to its backward (docs/journal.md,
        # session 47)
        partition_fn=min_cut_rematerialization_partition,
    )(gm, example_inputs)
