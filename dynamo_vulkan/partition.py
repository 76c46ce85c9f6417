"""Split an ATen graph into Vulkan partitions and CPU nodes, and say why.

A node goes to Vulkan when its op has a lowering rule (or it only combines
constants, which are folded), all its tensors have dtypes the GPU kernels
handle, and the rule's own check passes. Everything else runs eagerly on the
CPU; the PartitionReport records each decision with its reason.
"""
from __future__ import annotations

import operator
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from dynamo_vulkan.lowering import spec_of
from dynamo_vulkan.lowering.core import HostPlacement
from dynamo_vulkan.runtime.plan import KIND_OF_DTYPE
from dynamo_vulkan.lowering.planner import is_foldable_target, is_size_value

PARTITION_PREFIX = "fused_"


class WithGraphOnHost(HostPlacement):
    """The reason of a node Vulkan could run that goes to the host with its graph, which
    a HostPlacement elsewhere in it sent there."""


@dataclass
class NodeDecision:
    name: str
    op: str
    where: str        # "vulkan" | "cpu"
    reason: str = ""


@dataclass
class PartitionReport:
    graph_id: int
    nodes: list[NodeDecision] = field(default_factory=list)
    partitions: int = 0
    host_reason: str | None = None    # why the whole graph was placed on the host, if it was
    kind: str = "graph"     # "forward" | "backward" | "inference" (aot_autograd's graphs)
    role: str | None = None   # what the graph computes, where known: "optimizer step"

    @property
    def vulkan_nodes(self) -> list[NodeDecision]:
        return [n for n in self.nodes if n.where == "vulkan"]

    @property
    def cpu_nodes(self) -> list[NodeDecision]:
        return [n for n in self.nodes if n.where == "cpu"]

    def groups(self) -> dict[tuple[str, str], Counter]:
        """(where, reason) -> how many nodes of each op: one entry per distinct reason,
        most nodes first (the nodes placed on the host with their graph share one)."""
        out: dict[tuple[str, str], Counter] = {}
        for n in self.nodes:
            reason = n.reason
            if isinstance(reason, WithGraphOnHost):
                reason = "placed on the host with the rest of the graph"
            out.setdefault((n.where, reason), Counter())[n.op] += 1
        return dict(sorted(out.items(), key=lambda kv: (kv[0][0] != "vulkan", -sum(kv[1].values()))))

    def summary(self) -> str:
        """Counts per op, grouped by where and why; the per-node list is str(report)."""
        what = f"{self.kind} graph {self.graph_id}" + (f" ({self.role})" if self.role else "")
        lines = [f"{what}: {len(self.vulkan_nodes)} nodes on Vulkan in "
                 f"{self.partitions} partition(s), {len(self.cpu_nodes)} on the CPU"]
        if self.host_reason is not None:
            lines.append(f"  graph placed on the host: {self.host_reason}")
        for (where, reason), ops in self.groups().items():
            counts = ", ".join(f"{op} x{k}" for op, k in ops.most_common())
            label = ("on Vulkan" if where == "vulkan" else
                     "on the CPU (what placed the graph there)" if reason == self.host_reason else
                     f"on the CPU ({reason})")
            lines.append(f"  {sum(ops.values())} {label}: {counts}")
        return "\n".join(lines)

    def __str__(self) -> str:
        lines = [self.summary(), "  nodes:"]
        for n in self.nodes:
            lines.append(f"  {n.where:6s} {n.name:24s} {n.op}" + (f"  ({n.reason})" if n.reason else ""))
        return "\n".join(lines)


def op_name(node: fx.Node) -> str:
    t = node.target
    return str(t) if isinstance(t, torch._ops.OpOverload) else getattr(t, "__name__", str(t))


def _tensor_vals(node: fx.Node):
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    flat = []
    for v in vals:
        if isinstance(v, (list, tuple)):
            flat.extend(v)
        else:
            flat.append(v)
    return [v for v in flat if isinstance(v, torch.Tensor)]


def _is_f64(v) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype == torch.float64


def _float64_at_boundary(node: fx.Node) -> bool:
    """float64 is computed in float32 on the GPU: fine for the intermediates that
    decompositions upcast, not for values the user hands in or gets back."""
    if any(a.op == "placeholder" and _is_f64(a.meta.get("val")) for a in node.all_input_nodes):
        return True
    outs = [node] + [u for u in node.users if u.target is operator.getitem]
    return any(_is_f64(n.meta.get("val")) and any(u.op == "output" for u in n.users)
               for n in outs)


def _unbacked(vals) -> set:
    """The data-dependent sizes (unbacked symbols) in the shapes of vals. Only symbolic
    sizes are looked into, so that a static graph does not load torch's symbolic-shape
    machinery (a few tenths of a second of a cold start's imports)."""
    out = set()
    for v in vals if isinstance(vals, (list, tuple)) else [vals]:
        sizes = v.shape if isinstance(v, torch.Tensor) else [v]
        if any(isinstance(s, torch.SymInt) for s in sizes):
            from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
            out |= free_unbacked_symbols(v)
    return out


def _data_dependent_shape(node: fx.Node) -> bool:
    """Whether the node's output has a size that its inputs' shapes do not give, only its
    values (a boolean mask's index, nonzero): a program is specialised to the shapes of
    its inputs and knows all of its own before it runs."""
    new = _unbacked(node.meta.get("val"))
    if not new:
        return False
    for a in node.all_input_nodes:
        new -= _unbacked(a.meta.get("val"))
    return bool(new)


def why_not_vulkan(node: fx.Node) -> str | None:
    """None if the node can run on Vulkan, else the reason it cannot."""
    t = node.target
    if t is operator.getitem:
        src = node.args[0]
        return None if why_not_vulkan(src) is None else "its producer runs on the CPU"
    if is_size_value(node):           # read off the specialised shapes (planner.lower)
        return None
    if not isinstance(t, torch._ops.OpOverload):
        return f"{getattr(t, '__name__', t)} is not an ATen op"
    spec = spec_of(t)
    if t is torch.ops.aten.copy_.default:      # an input mutation: the planner writes it back
        if node.args[0].op != "placeholder":
            return "copy_ into an intermediate"
    elif spec is None:
        # no tensor inputs (a size, SymInt under dynamic shapes, is known when the
        # partition is specialised to its inputs): the planner computes it on the host
        foldable = not any(isinstance(n.meta.get("val"), torch.Tensor) for n in node.all_input_nodes) \
            and is_foldable_target(node)
        if not foldable:
            return f"no Vulkan lowering for {t}"
    for v in _tensor_vals(node):
        if str(v.dtype) not in KIND_OF_DTYPE:
            return f"dtype {v.dtype} is not supported on Vulkan"
        if v.device.type not in ("cpu", "meta"):       # e.g. a *_like(..., device="cuda")
            return f"a tensor on device {v.device} (Vulkan results are CPU tensors)"
    if _data_dependent_shape(node):
        return "its output's size depends on the values it reads (a data-dependent shape)"
    if _float64_at_boundary(node):
        return ("a float64 graph input or output (Vulkan computes float64 in float32, so only "
                "inside a graph, where decompositions upcast)")
    if spec is not None and spec.check is not None:
        return spec.check(node)
    return None


class _Support(OperatorSupportBase):
    def __init__(self):
        self.reasons: dict[fx.Node, str | None] = {}

    def is_node_supported(self, submodules, node: fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if node not in self.reasons:
            self.reasons[node] = why_not_vulkan(node)
        return self.reasons[node] is None


def partition(gm: fx.GraphModule, graph_id: int, kind: str = "graph"):
    """Fuse supported nodes into submodules named fused_N; return (gm, report)."""
    support = _Support()
    report = PartitionReport(graph_id, kind=kind)
    compute = [n for n in gm.graph.nodes if n.op == "call_function"]
    for n in compute:
        support.is_node_supported(None, n)
    placed = next((r for r in support.reasons.values() if isinstance(r, HostPlacement)), None)
    if placed is not None:
        report.host_reason = placed
        # a CPU device's prompt: torch on the host beats lavapipe at the rest of it too
        # (its elementwise, norm and copy kernels), and one host graph has no boundaries
        whole = WithGraphOnHost(f"{placed}; the rest of this graph with it, since torch on the "
                              "host runs every op of it faster than a CPU Vulkan device")
        for n in compute:
            if support.reasons[n] is None:
                support.reasons[n] = whole
    if compute and all(support.reasons[n] is None for n in compute):
        # every node supported: torch's partitioner merges them all into one partition
        # (no unsupported node can sit on a path between two of them), at a cost that grows
        # faster than the graph (0.35 s for SmolLM2's prompt graph on the CI machine)
        parts = [_AllNodes(compute)]
    else:
        partitioner = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True)
        parts = partitioner.propose_partitions()
    in_part = {n for p in parts for n in p.nodes}
    for n in compute:
        reason = support.reasons.get(n)
        if n in in_part:
            report.nodes.append(NodeDecision(n.name, op_name(n), "vulkan"))
        else:
            report.nodes.append(NodeDecision(n.name, op_name(n), "cpu",
                                             reason or "not placed in a partition"))
    report.partitions = len(parts)
    if parts:
        # one partition of every node: the fused module's call sits after its last output,
        # which only the graph's output reads, so the order needs no sort
        whole = len(parts) == 1 and all(n in in_part or n.op in ("placeholder", "output")
                                        for n in gm.graph.nodes)
        gm = _fuse_partitions(gm, parts, sort=not whole)   # submodules named fused_N
    return gm, report


class _AllNodes:
    """The one partition of a graph whose every compute node runs on Vulkan (the part of
    torch's Partition that _fuse_partitions reads)."""

    def __init__(self, nodes: list[fx.Node]):
        self.nodes = dict.fromkeys(nodes)


def _fuse_partitions(gm: fx.GraphModule, parts, sort: bool = True) -> fx.GraphModule:
    """CapabilityBasedPartitioner.fuse_partitions, also for a partition whose results no
    node outside it reads (an optimizer step's in-place updates): torch before 2.13 puts
    each fused module after the partition's last output, and such a partition has none.
    `sort`: put the graph in topological order again afterwards (a third of the time for a
    whole-graph partition of a decoder; not needed when one partition holds every node)."""
    from torch.fx.passes.tools_common import stable_topological_sort
    from torch.fx.passes.utils.fuser_utils import erase_nodes, fuse_as_graphmodule, insert_subgm, topo_sort
    for pid, part in enumerate(parts):
        nodes = topo_sort(list(part.nodes))
        sub_gm, ins, outs = fuse_as_graphmodule(gm, nodes, f"{PARTITION_PREFIX}{pid}",
                                                partition_lookup_table=part.nodes)
        if outs:
            insert_subgm(gm, sub_gm, ins, outs)
        else:
            name = sub_gm.__class__.__name__
            gm.add_submodule(name, sub_gm)
            with gm.graph.inserting_after(nodes[-1]):
                gm.graph.call_module(name, args=ins)
        erase_nodes(gm, nodes)
    if sort:
        stable_topological_sort(gm)
    gm.graph.lint()
    return gm
