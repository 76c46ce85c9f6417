"""The op registry (lowering/registry.py): one record per op, registered once; and how
the planner treats what a rule raises: a declared refusal (LoweringError) is a CPU
fallback, anything else a bug that surfaces in strict mode (the tests' setting) and is
logged as a bug otherwise."""
from __future__ import annotations

import dataclasses
import inspect
import logging

import pytest
import torch

from dynamo_vulkan import VulkanFallbackError
from dynamo_vulkan.lowering import (DuplicateLoweringError, LoweringError, OpSpec, lowering,
                                    registry, spec_of, specs)

aten = torch.ops.aten


@pytest.fixture
def private_registry(monkeypatch):
    """The registry's records as a copy the test may change; restored afterwards."""
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))


def test_a_second_registration_of_a_target_raises(private_registry):
    target = object()

    @lowering(target, fusible=True)
    def first(ctx, x, request=registry.NO_REQUEST):
        return x
    assert spec_of(target).rule is first and spec_of(target).fusible

    with pytest.raises(DuplicateLoweringError, match="registered twice.*first.*second"):
        @lowering(target)
        def second(ctx, x):
            return x
    assert spec_of(target).rule is first           # the first record stands


def test_an_existing_ops_target_cannot_be_taken_over(private_registry):
    with pytest.raises(DuplicateLoweringError, match="aten.add.Tensor"):
        lowering(aten.add.Tensor)(lambda ctx, a, b: a)


def test_every_registered_target_has_a_consistent_record():
    every = specs()
    assert len(every) > 200
    for target, spec in every.items():
        assert isinstance(spec, OpSpec) and spec.target is target and callable(spec.rule), target
        assert spec_of(target) is spec
        params = inspect.signature(spec.rule).parameters
        if spec.takes_request:       # the planner passes request=: the rule must take it
            assert "request" in params or any(
                p.kind is p.VAR_KEYWORD for p in params.values()), f"{target}: no request parameter"
        for fn in (spec.check, spec.prologue, spec.loads_lazy):
            assert fn is None or callable(fn), target
        if spec.packed_arg is not None:
            assert spec.packed_arg < len(target._schema.arguments), target
    # the roles the fusions rely on are where they were
    assert spec_of(aten.mul.Tensor).fusible and spec_of(aten.flip.default).fusible
    assert spec_of(aten.cat.default).folds and spec_of(aten.index_put.default).folds
    assert spec_of(aten.view.default).lazy_view and spec_of(aten.view.default).takes_deferred
    assert not spec_of(aten.permute.default).lazy_view
    assert spec_of(aten.take.default).keep_whole
    linear = spec_of(torch.ops.dynamo_vulkan.gguf_linear.default)
    assert linear.epilogue and linear.prologue and linear.loads_lazy and linear.packed_arg == 1
    norm = spec_of(torch.ops.dynamo_vulkan.rms_norm.default)
    assert norm.epilogue and norm.takes_deferred and norm.prologue


def test_keep_whole_ops_are_not_decomposed():
    from dynamo_vulkan.lowering import decompositions
    whole = [t for t, s in specs().items() if s.keep_whole]
    assert whole and not any(t in decompositions() for t in whole)


def _replace_rule(monkeypatch, target, rule):
    table = dict(registry._SPECS)
    table[target] = dataclasses.replace(table[target], rule=rule)
    monkeypatch.setattr(registry, "_SPECS", table)


def _fn(x):
    return torch.sin(x) * 2 + 1


def _buggy(ctx, x, request=None):
    return {}["a key the rule never put there"]


def test_a_rules_bug_surfaces_in_strict_mode(monkeypatch):
    _replace_rule(monkeypatch, aten.sin.default, _buggy)
    x = torch.randn(7, 3)
    with pytest.raises(KeyError, match="a key the rule never put there"):
        torch.compile(_fn, backend="vulkan", options={"strict": True, "fallback": "silent"})(x)


def test_a_rules_bug_outside_strict_mode_falls_back_logged_as_a_bug(monkeypatch, caplog):
    _replace_rule(monkeypatch, aten.sin.default, _buggy)
    x = torch.randn(7, 5)
    with caplog.at_level(logging.ERROR, logger="dynamo_vulkan.lowering.planner"):
        out = torch.compile(_fn, backend="vulkan", options={"strict": False, "fallback": "silent"})(x)
    torch.testing.assert_close(out, _fn(x))
    bugs = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(bugs) == 1 and "a bug in the lowering rule" in bugs[0] and "_buggy" in bugs[0] and \
        "KeyError" in bugs[0]


def test_a_declared_refusal_falls_back_in_strict_mode_too(monkeypatch):
    def refuse(ctx, x, request=None):
        raise LoweringError("this rule declines these inputs")
    _replace_rule(monkeypatch, aten.sin.default, refuse)
    x = torch.randn(7, 6)
    out = torch.compile(_fn, backend="vulkan", options={"strict": True, "fallback": "silent"})(x)
    torch.testing.assert_close(out, _fn(x))
    torch._dynamo.reset()
    with pytest.raises(VulkanFallbackError, match="this rule declines these inputs"):
        torch.compile(_fn, backend="vulkan", options={"strict": True, "fallback": "error"})(torch.randn(7, 6))
