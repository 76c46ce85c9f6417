"""Each kernel family's declared defines (shaders/families.py) against its GLSL and its
lowering rules: a misspelled or missing define raises at kernel_source, every name a
family's source switches on is declared, no declared name is absent from its source, and
every define a rule writes literally is declared by the family it dispatches."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dynamo_vulkan.runtime import shaders
from dynamo_vulkan.shaders import families
from dynamo_vulkan.shaders.families import FAMILIES, ShaderDefineError

ROOT = Path(__file__).resolve().parents[1]
NAME = re.compile(r"\b[A-Z][A-Z0-9_]*\b")


def _source(family: str) -> str:
    """The family's GLSL, includes expanded, comments removed."""
    text = shaders.read(f"{family}.comp")
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def _switches(src: str) -> set[str]:
    """Names the preprocessor tests (#if, #ifdef, #ifndef, #elif)."""
    return {n for m in re.finditer(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b(.*)$", src, re.M)
            for n in NAME.findall(m.group(1))} - {"GL_KHR_shader_subgroup_basic"}


DEFAULT_BLOCK = re.compile(r"^\s*#\s*ifndef\s+(\w+)\s*\n\s*#\s*define\s+\1\b.*?^\s*#\s*(?:endif|else)",
                           re.M | re.S)
DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)", re.M)


def _defaults(src: str) -> set[str]:
    """Names a `#ifndef X / #define X ...` block gives a default."""
    return {n for m in DEFAULT_BLOCK.finditer(src) for n in DEFINE.findall(m.group(0))}


def _internal() -> set[str]:
    """Names the shaders define for themselves (outside default blocks): a kernel sets
    GB_INT_DOT before including gguf_blocks.glsl, a block type sets GB_AFFINE."""
    return {n for p in (ROOT / "dynamo_vulkan" / "shaders").iterdir() if p.suffix in (".comp", ".glsl")
            for n in DEFINE.findall(DEFAULT_BLOCK.sub("", p.read_text()))}


def test_every_kernel_has_a_declaration():
    comps = {p.stem for p in (ROOT / "dynamo_vulkan" / "shaders").glob("*.comp")}
    assert comps == set(FAMILIES)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_declarations_match_the_source(family):
    src = _source(family)
    decl = FAMILIES[family]
    undeclared = (_switches(src) | _defaults(src)) - _internal()
    assert undeclared <= decl.accepted, f"{family}: switches on {sorted(undeclared - decl.accepted)}"
    used = set(NAME.findall(src))
    assert not (decl.required | decl.optional) - used - families.GGUF_QTYPES, \
        f"{family} declares names its source never uses"
    assert not decl.labels & used, f"{family}: a label its source reads should be an option"


def test_a_misspelled_define_names_the_family_and_the_accepted_ones():
    with pytest.raises(ShaderDefineError) as e:
        shaders.kernel_source("conv", {"VARIANT": "direct", "HAS_BAIS": 1})
    msg = str(e.value)
    assert "'conv'" in msg and "HAS_BAIS" in msg and "HAS_BIAS" in msg and "TRANSPOSED" in msg


def test_a_missing_required_define_is_named():
    with pytest.raises(ShaderDefineError, match="'search' needs the define.*VAL_T"):
        shaders.kernel_source("search", {"LOAD(w)": "ld_f32(w)"})
    with pytest.raises(ShaderDefineError, match="no kernel family 'serch'"):
        shaders.kernel_source("serch", {})


def test_function_like_defines_are_declared_by_name():
    key, src = shaders.kernel_source("search", {"VARIANT": "f32", "VAL_T": "float", "LOAD(w)": "ld_f32(w)",
                                                "IS_FLOAT": 1})
    assert "#define LOAD(w) ld_f32(w)" in src and key


def test_defines_the_rules_write_are_declared():
    """Every define key a lowering module writes literally (dict keys, item assignments,
    update(NAME=...)) is declared by a family that module dispatches; names built at run
    time are checked by kernel_source in every kernel test."""
    problems = []
    for path in sorted((ROOT / "dynamo_vulkan" / "lowering").glob("*.py")):
        text = path.read_text()
        dispatched = set(re.findall(r'dispatch\(\s*"([a-z_0-9]+)"', text))
        if not dispatched:
            continue
        accepted = set().union(*(FAMILIES[f].accepted for f in dispatched))
        # not module constants' keys (INT_DOT_TYPES), nor spec constants' (rowwise's decls)
        lines = "\n".join(l for l in text.splitlines() if not re.match(r"\s*[A-Z][A-Z0-9_]*\s*=\s*\{", l)
                          and not ("decls" in l and "defines" not in l))
        keys = set(re.findall(r'"([A-Z][A-Z0-9_]*)(?:\([^")]*\))?"\s*:', lines))
        keys |= set(re.findall(r'defines\["([A-Z][A-Z0-9_]*)"\]\s*=', text))
        keys |= {k for args in re.findall(r"defines\.update\(([^)]*)\)", text)
                 for k in re.findall(r"\b([A-Z][A-Z0-9_]*)=", args)}
        for k in sorted(keys - accepted):
            problems.append(f"{path.name}: {k} (dispatches {', '.join(sorted(dispatched))})")
    assert not problems


def test_gguf_block_types_are_the_lowerings():
    from dynamo_vulkan.lowering.gguf import SHADER_TYPES
    assert families.GGUF_QTYPES == {f"QTYPE_{name}" for name in SHADER_TYPES.values()}
