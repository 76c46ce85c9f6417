"""GLSL -> SPIR-V through glslc, cached in memory and on disk by source hash."""
from __future__ import annotations

import functools
import importlib.resources
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import cache

_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)


class ShaderCompileError(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def shader_dir() -> Path:
    return Path(str(importlib.resources.files("dynamo_vulkan.shaders")))


@functools.lru_cache(maxsize=None)
def read(name: str) -> str:
    """A shader file with its includes expanded (so the hash covers them)."""
    text = (shader_dir() / name).read_text()
    return _INCLUDE.sub(lambda m: read(m.group(1)), text)


@functools.lru_cache(maxsize=1)
def sources_hash() -> str:
    """Hash of the shaders, of the lowering rules and the planner that write plans with
    them, of the plan format, and of the GPU words of constants (words.py) and of GGUF
    rows (constants in a plan are stored so), so a cached plan is never reused after any
    changes."""
    lowering_dir = Path(str(importlib.resources.files("dynamo_vulkan.lowering")))
    here = Path(__file__).parent
    files = [p for p in shader_dir().iterdir() if p.suffix in (".comp", ".glsl")] + \
        [p for p in lowering_dir.iterdir() if p.suffix == ".py"] + \
        [here / "plan.py", here / "words.py", here.parent / "gguf" / "gpu_layout.py"]
    return cache.digest(*sorted((p.name, p.read_bytes()) for p in files))


def kernel_source(family: str, defines: dict) -> tuple[str, str]:
    """(key, GLSL) of shaders/<family>.comp specialised by `defines` (#defines at its head,
    which head_defines reads back); the key names it in a Plan's sources. The defines must
    be ones the family declares (shaders/families.py: ShaderDefineError otherwise)."""
    from ..shaders import families
    families.check(family, defines)
    head = ["#version 450"] + [f"#define {k} {v}" for k, v in defines.items()]
    source = "\n".join(head) + "\n" + read(f"{family}.comp")
    return cache.digest(source), source


def head_defines(source: str) -> dict[str, str]:
    """The #defines at the head of a dispatch's source: the lowering's choices, not the
    defaults the body gives itself further down."""
    defs = {}
    for line in source.splitlines():
        if not line.startswith(("#version", "#define", "#extension")):
            break
        if line.startswith("#define "):
            name, _, value = line[len("#define "):].partition(" ")
            defs[name] = value
    return defs


def glslc() -> str:
    exe = shutil.which("glslc")
    if exe is None:
        raise ShaderCompileError("glslc was not found on PATH: apt-get install glslc "
                                 "(scripts/setup.sh does this)")
    return exe


def glslc_for(source: str) -> str:
    """The system's glslc, or for a kernel with newer GLSL extensions (tensor cores) the
    second one (dynamo_vulkan.shaders.coopmat_glslc)."""
    from .. import shaders as kernels
    if not kernels.needs_coopmat_glslc(source):
        return glslc()
    exe = kernels.coopmat_glslc()
    if exe is None:
        raise ShaderCompileError("this kernel needs a glslc that knows GL_KHR_cooperative_matrix: "
                                 "scripts/glslc_coopmat.sh install .venv/opt/glslc-coopmat "
                                 f"(or set {kernels.COOPMAT_GLSLC_ENV})")
    return exe


def compile_source(source: str, name: str = "kernel") -> bytes:
    """SPIR-V for a complete GLSL compute source."""
    key = cache.digest("spirv", source)
    hit = cache.memory_get("spirv", key)
    if hit is not None:
        cache.count("spirv", "memory_hits")
        return hit
    spv = cache.disk_get("spirv", key)
    if spv is not None:
        cache.count("spirv", "disk_hits")
    else:
        cache.count("spirv", "misses")
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / f"{name}.comp"
            out = Path(d) / f"{name}.spv"
            src.write_text(source)
            r = subprocess.run([glslc_for(source), "--target-env=vulkan1.1", "-O", str(src), "-o", str(out)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                numbered = "\n".join(f"{i + 1:4d} {l}" for i, l in enumerate(source.splitlines()))
                raise ShaderCompileError(f"glslc failed for {name}:\n{r.stderr}\n{numbered}")
            spv = out.read_bytes()
        cache.disk_put("spirv", key, spv)
    cache.memory_put("spirv", key, spv)
    return spv


def compile_many(sources) -> None:
    """Compile the (GLSL, name) pairs not yet cached, at once on the machine's cores
    (glslc runs as a process, so threads suffice); compile_source then finds them
    cached. A new prompt length alone can need a dozen new kernels (docs/journal.md,
    session 29)."""
    todo = {}
    for source, name in sources:
        key = cache.digest("spirv", source)
        if key not in todo and cache.memory_get("spirv", key) is None:
            todo[key] = (source, name)
    todo = {key: sn for key, sn in todo.items() if not _read_cached(key)}
    if len(todo) < 2:
        return
    from .. import progress
    progress.phase("compiling %d kernels (glslc)", len(todo))
    shown = progress.bar(len(todo), "compiling kernels", "kernel")

    def compile_shown(sn):
        compile_source(*sn)
        shown.update()
    try:
        with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            list(pool.map(compile_shown, todo.values()))
    finally:
        shown.close()


def _read_cached(key: str) -> bool:
    """Whether the disk cache holds the SPIR-V of `key` (then it is in memory too)."""
    spv = cache.disk_get("spirv", key)
    if spv is None:
        return False
    cache.count("spirv", "disk_hits")
    cache.memory_put("spirv", key, spv)
    return True


def clear_memory() -> None:
    read.cache_clear()
    sources_hash.cache_clear()
