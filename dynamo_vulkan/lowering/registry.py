"""One record per lowered op: its rule, its check, and what the partitioner, the
planner and the fusions may do with it (`OpSpec`). A family module registers each op
with `@lowering(targets..., role=...)` next to its rule; registering a target twice is an
error. Everything that asks about an op reads its record through `spec_of`.

The planner and a rule talk through values: the planner calls a rule that has a fusion
role needing it with `request=` (a `Request`: whether its result may be left uncomputed
for its consumer, and a residual its kernel may add), and the rule says what it did by
returning a `Lowered` (or just its value)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping


class DuplicateLoweringError(ValueError):
    """A target registered by two rules (one would silently replace the other)."""


@dataclass(frozen=True)
class OpSpec:
    """Everything the compiler knows of one ATen (or dynamo_vulkan) op.

    rule(ctx, *args, **kwargs [, request]): lowers a node into the Context; raises
      LoweringError (with the reason) for what it cannot do, and the node runs on the CPU.
    check(node): None if the node can run on Vulkan, else the reason (a str, or a
      HostPlacement when the host is a choice); the partitioner asks it before lowering.
    fusible: the lowering is exactly one ew() of its inputs: its result may be left as a
      Lazy (fusion.py) to an elementwise consumer, and it folds Lazy inputs.
    folds: not elementwise, but copies its inputs with ew() (cat), so a Lazy input
      folds into that copy.
    takes_deferred: accepts Deferred and Lazy arguments and materializes what it cannot fold.
    epilogue: may add a residual (Request.residual) into its output.
    prologue(node, ctx) -> bool: whether the node's result may be left to its consumers
      to compute as they load it (the rule then returns a Deferred); ctx is the compile's
      Context (its caps and cfg).
    loads_lazy(consumer, producer) -> bool: whether an elementwise producer may be left
      as a Lazy for this consumer, whose kernel computes it as it loads (row_loader).
    lazy_view: a reshape a Lazy may pass through, as a LazyView, to a loads_lazy consumer.
    keep_whole: not decomposed before lowering (its core decomposition guards on data,
      which breaks tracing); the rule lowers it whole.
    packed_arg: the argument that holds GGUF blocks: a uint8 graph input read only
      there is placed on the GPU as packed bytes (gguf.packed_input), not as integers.
    """
    target: object
    rule: Callable
    check: Callable | None = None
    fusible: bool = False
    folds: bool = False
    takes_deferred: bool = False
    epilogue: bool = False
    prologue: Callable | None = None
    loads_lazy: Callable | None = None
    lazy_view: bool = False
    keep_whole: bool = False
    packed_arg: int | None = None

    @property
    def takes_lazy(self) -> bool:
        """Whether its arguments reach the rule as they are (Lazy, Deferred): the planner
        materializes every other rule's arguments first."""
        return self.fusible or self.folds or self.takes_deferred

    @property
    def takes_request(self) -> bool:
        """Whether the planner passes the rule a `request=` (roles that may defer or add)."""
        return self.fusible or self.lazy_view or self.epilogue or self.prologue is not None


@dataclass(frozen=True)
class Request:
    """What the planner asks of one node's rule beyond computing it.

    defer: the node's result may be returned not computed (a Lazy, LazyView or Deferred)
      for its consumer to fold (fusion.py); never set for a rule without such a role.
    residual: a TRef the rule's kernel may add to its output (epilogue ops); if it does,
      it returns Lowered(value, residual_added=True) and the planner skips that add."""
    defer: bool = False
    residual: object = None


NO_REQUEST = Request()


@dataclass(frozen=True)
class Lowered:
    """A rule's result with what it did beyond computing it."""
    value: object
    residual_added: bool = False


_SPECS: dict[object, OpSpec] = {}


def lowering(*targets, check=None, fusible=False, folds=False, takes_deferred=False,
             epilogue=False, prologue=None, loads_lazy=None, lazy_view=False, keep_whole=False,
             packed_arg=None):
    """Register `fn(ctx, *args, **kwargs)` as the lowering of `targets`, each with an
    OpSpec of these roles (see OpSpec). A target registered before is an error."""
    def deco(fn):
        for t in targets:
            if t in _SPECS:
                old = _SPECS[t].rule
                raise DuplicateLoweringError(
                    f"{t} is registered twice: by {old.__module__}.{old.__qualname__} and by "
                    f"{fn.__module__}.{fn.__qualname__}; keep one rule per op")
            _SPECS[t] = OpSpec(t, fn, check, fusible, folds, takes_deferred, epilogue,
                               prologue, loads_lazy, lazy_view, keep_whole, packed_arg)
        return fn
    return deco


def spec_of(target) -> OpSpec | None:
    """The record of `target`, or None when no rule lowers it."""
    return _SPECS.get(target)


def specs() -> Mapping[object, OpSpec]:
    """Every registered record, by target (read-only view)."""
    from types import MappingProxyType
    return MappingProxyType(_SPECS)


def node_arg(node, index: int, name: str, default=None):
    """Argument `index` of an fx node, or its keyword `name` (for checks, which see nodes)."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)
