"""The package's layers, read from its imports (ast, no module is imported): each module
imports only from its own layer and the layers listed below it, so a back-edge (the
lowering reaching into execution, the LLM side into the backend's internals) fails here.
docs/design.md draws the same layers."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "dynamo_vulkan"

# layer: (its modules, by dotted prefix; the layers it may import besides its own)
LAYERS = {
    "base": (["config", "progress", "vkinfo", "prerequisites", "shaders"], []),
    # the custom ops that graphs hold and the lowering compiles: GGUF quant formats, fused ops
    "ops": (["gguf", "fused"], ["base"]),
    # what both sides of a Plan share: the device, caches, Plans, shader sources, encoders
    "core": (["cache", "device", "runtime.plan", "runtime.shaders", "runtime.graph_io", "runtime.words",
              "runtime.pipeline_cache"],
             ["ops", "base"]),
    # ATen op -> kernel rules, and the driver that turns a partition into a Plan
    "lowering": (["lowering"], ["core", "ops", "base"]),
    # a Plan made real and run: the rest of runtime/
    "execution": (["runtime"], ["core", "ops", "base"]),
    "compiler": (["backend", "partition", "regions", "debug"], ["lowering", "execution", "core", "ops", "base"]),
    # what the LLM side and users may import: the package's namespace, step replays,
    # compiled modules whose traced graphs persist
    "api": (["", "replay", "precompiled"], ["compiler", "lowering", "execution", "core", "ops", "base"]),
    "tools": (["coverage", "training", "examples"], ["api", "compiler", "lowering", "execution", "core", "ops",
                                                      "base"]),
    # GGUF language models: only the public API, the ops they are built of, the settings
    "llm": (["llm", "models", "generate", "chat", "serve", "sampling", "stop_strings"], ["api", "ops", "base"]),
    "apps": (["demo", "benchmarks"], ["llm", "tools", "api", "compiler", "lowering", "execution", "core", "ops",
                                      "base"]),
}


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in ROOT.rglob("*.py")}


def layer_of(module: str) -> str:
    """The layer of a dynamo_vulkan module: the one naming its longest prefix."""
    rel = module[len("dynamo_vulkan."):] if module != "dynamo_vulkan" else ""
    best, found = -1, None
    for layer, (prefixes, _) in LAYERS.items():
        for p in prefixes:
            if (rel == p or rel.startswith(p + ".") or p == "") and len(p) > best:
                best, found = len(p), layer
    if found is None or (best == 0 and rel):
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py: add it to one")
    return found


def imports(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, dynamo_vulkan module) of every import in the file, function-level ones too;
    `from package import name` counts as the module package.name where that is a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "dynamo_vulkan"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "dynamo_vulkan":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add((node.lineno, sub if sub in MODULES else target))
    return sorted(out)


def back_edges() -> list[str]:
    bad = []
    for module, path in sorted(MODULES.items()):
        mine = layer_of(module)
        allowed = {mine, *LAYERS[mine][1]}
        for line, target in imports(module, path):
            if target not in MODULES:
                bad.append(f"{module}:{line} imports {target}, which is no module")
                continue
            theirs = layer_of(target)
            if theirs not in allowed:
                bad.append(f"{module}:{line} ({mine}) imports {target} ({theirs})")
    return bad


def test_layers_have_no_back_edges():
    bad = back_edges()
    assert not bad, "imports against the layers (docs/design.md):\n" + "\n".join(bad)


def test_every_layer_lists_only_lower_layers():
    order = list(LAYERS)
    for layer, (_, below) in LAYERS.items():
        assert all(order.index(b) < order.index(layer) for b in below), layer


@pytest.mark.parametrize("source, module, want", [
    ("from dynamo_vulkan.runtime.program import Program\n", "dynamo_vulkan.lowering.gguf",
     "(lowering) imports dynamo_vulkan.runtime.program (execution)"),
    ("from ..runtime import program\n", "dynamo_vulkan.lowering.gguf",
     "(lowering) imports dynamo_vulkan.runtime.program (execution)"),
    ("def f():\n    from dynamo_vulkan import backend\n", "dynamo_vulkan.llm.generate",
     "(llm) imports dynamo_vulkan.backend (compiler)"),
])
def test_a_back_edge_is_found(tmp_path, monkeypatch, source, module, want):
    """The check itself: a planted import against the layers, at module or function level,
    absolute or relative, is reported."""
    path = ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")
    planted = tmp_path / path.name
    planted.write_text(source)
    monkeypatch.setitem(MODULES, module, planted)
    assert any(want in b for b in back_edges()), back_edges()
