"""Decompositions that let a compiled `optimizer.step()` run on Vulkan.

The optimizers' foreach implementations call `_foreach_*` ops, one node over a list of
tensors; torch._decomp has no decompositions of them (Inductor lowers them itself). Each
is decomposed here into its per-tensor op, one node per tensor: list arguments are
indexed, the rest passed to every call. `prims.fma`, which torch's `lerp` decomposition
uses, becomes a multiply and an add (two roundings where fma has one: within fp32's
tolerance, as eager's own CPU lerp is not one fma either).
"""
from __future__ import annotations

import torch

aten = torch.ops.aten

# _foreach_ op -> its per-tensor op, where the names differ
_PER_TENSOR = {"_foreach_norm": "linalg_vector_norm"}
# overloads whose per-tensor form is no call of the base op: a tensor of scalars, one a
# tensor (addcmul/addcdiv.Tensor), and out= forms
_LEFT_WHOLE = {"Tensor_out", "out", "Scalar_out", "List_out", "ScalarList_out"}


def _is_list(arg: torch._C.Argument) -> bool:
    return isinstance(arg.type, torch._C.ListType)


def _per_tensor(overload: torch._ops.OpOverload, base):
    """The decomposition of one _foreach_ overload into calls of `base` per tensor."""
    schema = overload._schema
    args = list(schema.arguments)
    # foreach schemas take some arguments by position that the per-tensor op takes by
    # name only (addcmul's value)
    by_name = {a.name for ov in base.overloads() for a in getattr(base, ov)._schema.arguments
               if a.kwarg_only}

    def decomposed(*a, **kw):
        bound = dict(zip((x.name for x in args), a))
        bound.update(kw)
        lists = [x.name for x in args if _is_list(x) and x.name in bound]
        n = len(bound[args[0].name]) if _is_list(args[0]) else len(bound[lists[0]])
        out = []
        for i in range(n):
            pos, named = [], {}
            for x in args:
                if x.name not in bound:
                    continue
                v = bound[x.name][i] if _is_list(x) else bound[x.name]
                if x.kwarg_only or x.name in by_name:
                    named[x.name] = v
                else:
                    pos.append(v)
            out.append(base(*pos, **named))
        return out
    return decomposed


def foreach_decompositions() -> dict:
    """Each functional _foreach_ overload returning a list -> its per-tensor decomposition."""
    table = {}
    names = {s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("aten::_foreach_")}
    for name in sorted(names):
        if name.endswith("_"):
            continue
        base = getattr(aten, _PER_TENSOR.get(name, name[len("_foreach_"):]), None)
        if base is None:
            continue
        packet = getattr(aten, name)
        for ov in packet.overloads():
            if ov in _LEFT_WHOLE:
                continue
            op = getattr(packet, ov)
            schema = op._schema
            rets = schema.returns
            if len(rets) != 1 or not _is_list(rets[0]) or not any(_is_list(a) for a in schema.arguments):
                continue
            # a Tensor argument that holds one scalar per list element (addcmul.Tensor's
            # `scalars`) would reach each call whole
            if any(a.name == "scalars" and not _is_list(a) for a in schema.arguments):
                continue
            table[op] = _per_tensor(op, base)
    return table


def fma(a, b, c):
    """prims.fma(a, b, c) = a * b + c."""
    return a * b + c


def optimizer_decompositions() -> dict:
    import torch._inductor.inductor_prims  # noqa: F401  (registers prims.fma, which optimizers' graphs hold)
    table = foreach_decompositions()
    table[torch.ops.prims.fma.default] = fma
    return table
