"""Inline the nested compile regions of an AOT graph, so partitioning sees one flat graph.

A function marked ``torch.compiler.nested_compile_region`` (the decoder's Block.forward)
is traced once by Dynamo and AOT however many times it is called: the graph then calls
one subgraph through ``invoke_subgraph`` (wrapped in ``auto_functionalized_v2`` where
the region mutates an input, as a layer writes its KV cache). For SmolLM2 that made
Dynamo + AOT 2.7x faster (10.5 -> 3.5 s for the prefill graph, 5.0 -> 2.2 s for a decode
step, on this project's 2-core CI machine). The Vulkan partitions need the ops
themselves, so each call is replaced by a copy of the subgraph's nodes.

Where the region mutates an input, the subgraph is functional but ends in
``copy_(input, new value)``; ``auto_functionalized_v2`` returns the subgraph's outputs,
then each mutated base's new value. A mutated argument that is its whole base (no
``_argN_size``: a cache buffer handed to the layer as it is) is inlined with the base in
its place and the new value taken from that ``copy_``. A call whose mutated argument is
a view of a larger base is left as it is (it then runs on the CPU, with the partition
report's reason), as is any form this module does not know.
"""
from __future__ import annotations

import logging
import operator

import torch
import torch.fx as fx

log = logging.getLogger(__name__)

# the higher-order ops of a region call (None in a torch without them)
_INVOKE = getattr(torch.ops.higher_order, "invoke_subgraph", None)
_AUTO_FUNCTIONALIZED = getattr(torch.ops.higher_order, "auto_functionalized_v2", None)


def _region_call(gm: fx.GraphModule, node: fx.Node):
    """(subgraph, operands in its placeholders' order, base of each mutated placeholder
    index, bases) of a region call that can be inlined, else None."""
    if node.op != "call_function" or _INVOKE is None:
        return None
    if node.target is _INVOKE:
        sub = node.args[0]
        if not (isinstance(sub, fx.Node) and sub.op == "get_attr"):
            return None
        return getattr(gm, sub.target), list(node.args[2:]), {}, []
    if node.target is not _AUTO_FUNCTIONALIZED or not node.args or node.args[0] is not _INVOKE:
        return None
    kw = node.kwargs
    sub = kw.get("subgraph")
    if not (isinstance(sub, fx.Node) and sub.op == "get_attr"):
        return None
    sub = getattr(gm, sub.target)
    n_args = sum(1 for p in sub.graph.nodes if p.op == "placeholder")
    bases = list(kw.get("_all_bases", ()))
    operands, mutated = [], {}
    for i in range(n_args):
        extra = {k for k in kw if k.startswith(f"_arg{i}_")}
        if f"arg{i}" in kw and not extra:
            operands.append(kw[f"arg{i}"])
        elif extra == {f"_arg{i}_base_index"} and isinstance(kw[f"_arg{i}_base_index"], int):
            j = kw[f"_arg{i}_base_index"]     # the whole base, not a view of it
            operands.append(bases[j])
            mutated[i] = j
        else:
            return None
    return sub, operands, mutated, bases


def _inline(gm: fx.GraphModule, node: fx.Node, sub: fx.GraphModule, operands: list,
            mutated: dict[int, int], bases: list) -> None:
    """Copy sub's nodes before node, then give node's getitem users their values."""
    graph = gm.graph
    placeholders = [p for p in sub.graph.nodes if p.op == "placeholder"]
    env: dict[fx.Node, object] = dict(zip(placeholders, operands))
    index_of = {p: i for i, p in enumerate(placeholders)}
    new_base = list(bases)          # each base's value after the region
    outputs = None
    with graph.inserting_before(node):
        for sn in sub.graph.nodes:
            if sn.op == "placeholder":
                continue
            if sn.op == "output":
                outputs = sn.args[0]
                continue
            if (sn.op == "call_function" and sn.target is torch.ops.aten.copy_.default
                    and index_of.get(sn.args[0]) in mutated):
                new_base[mutated[index_of[sn.args[0]]]] = env[sn.args[1]]
                continue
            if sn.op == "get_attr":      # a nested region's subgraph: move it to gm
                name = _fresh_attr(gm, sn.target)
                setattr(gm, name, getattr(sub, sn.target))
                env[sn] = graph.get_attr(name)
                env[sn].meta = dict(sn.meta)
                continue
            env[sn] = graph.node_copy(sn, lambda a: env[a])
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    results = [fx.map_arg(o, lambda a: env[a]) if isinstance(o, fx.Node) else o for o in outs] + new_base
    for user in list(node.users):
        if user.op == "call_function" and user.target is operator.getitem:
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
        else:
            raise RuntimeError(f"dynamo_vulkan.regions: {node.name}'s result is used by "
                               f"{user.format_node()}, not by indexing")
    graph.erase_node(node)


def _fresh_attr(gm: fx.GraphModule, base: str) -> str:
    name, k = base, 0
    while hasattr(gm, name):
        k += 1
        name = f"{base}_inl{k}"
    return name


def inline_regions(gm: fx.GraphModule) -> int:
    """Replace every region call of gm that can be inlined (module docstring) by the
    subgraph's nodes, nested regions too; returns how many calls were inlined."""
    done = 0
    while True:
        found = 0
        for node in list(gm.graph.nodes):
            call = _region_call(gm, node)     # now: inlining replaces earlier calls' results
            if call is not None:
                _inline(gm, node, *call)
                found += 1
        if not found:
            break
        done += found
    if done:
        for n in list(gm.graph.nodes):     # the subgraphs' and tree specs' attributes
            if n.op == "get_attr" and not n.users:
                gm.graph.erase_node(n)
        gm.graph.lint()
        gm.recompile()
        log.debug("inlined %d nested compile region call(s)", done)
    left = [n.name for n in gm.graph.nodes if n.op == "call_function"
            and n.target in (_INVOKE, _AUTO_FUNCTIONALIZED)]
    if left:
        log.info("nested compile region calls left as they are (run on the CPU): %s", left)
    return done


__all__ = ["inline_regions"]
