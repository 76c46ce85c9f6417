"""torch.use_deterministic_algorithms(True) on Vulkan: kernels that add floats into one
element from many invocations (scatter_add, index_put with accumulate, a max pool's
backward) do so with atomics in whatever order the GPU runs them, so their last bits vary
from run to run (an embedding's gradient, say). Under torch's deterministic mode such a
node runs on the host, whose kernels add in order, and the report says why; integer and
max/min combines give the same result in any order and stay on Vulkan.

The check reads torch's flag at partition time; Dynamo guards on it, so turning the mode
on or off compiles again."""
from __future__ import annotations

import torch
from torch import fx

ORDERED = {"max", "min", "amax", "amin"}     # combines whose result is the same in any order


def _floating(node: fx.Node) -> bool:
    v = node.meta.get("val")
    v = v[0] if isinstance(v, (tuple, list)) and v else v
    return isinstance(v, torch.Tensor) and v.dtype.is_floating_point


def float_atomics_check(combine) -> "callable":
    """A registry check for a scatter whose combine `combine(node)` names (None: it stores
    without combining): the reason the node leaves Vulkan under torch's deterministic mode,
    or None."""
    def check(node: fx.Node) -> str | None:
        if not torch.are_deterministic_algorithms_enabled() or not _floating(node):
            return None
        op = combine(node)
        if not op or op in ORDERED:
            return None
        return (f"torch.use_deterministic_algorithms(True): {node.target} adds floats into one "
                "element with atomics in any order on the GPU; the host adds them in order")
    return check
