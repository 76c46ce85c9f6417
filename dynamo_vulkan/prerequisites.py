"""What the runtime needs beside its Python dependencies, and what to install when
something is missing: the patched kp, glslc, and the Vulkan loader.

Each check returns None when all is well, else one sentence that names the missing
piece and the command that installs it; device.manager() joins them into the one
reason the backend gives when it runs a model on the CPU instead.
"""
from __future__ import annotations

import importlib
import shutil

# kp.dynamo_vulkan_patches of the kp this runtime is written against: the marker the last of
# packaging/kp-dynamo-vulkan/patches/ sets (tests/test_install.py checks that the two, and
# pyproject's kp pin, agree)
KP_PATCHES = 14
# what each patch adds that Python can see (01, 04, 05, 11 and 12 change kp's C++ only), by patch
# file: a kp that lacks one was built without that patch (tests/test_install.py checks
# each name against the patch's added lines)
KP_PATCH_ATTRS = {
    "02-op-memory-barrier": ("OpMemoryBarrier",),
    "03-bare-dispatch-global-barrier": ("OpDispatchBare", "OpGlobalBarrier"),
    "06-fence-reuse-and-spin": ("set_fence_spin_us", "fence_spin_us", "set_fence_reuse", "fence_reuse"),
    "07-integer-dot-product": ("integer_dot_product",),
    "08-algorithms-without-gil": ("Manager.algorithm_nogil",),
    "10-optional-device-features": ("enabled_features",),
    "13-pipeline-cache-data": ("pipelines_built", "Manager.pipeline_cache_header", "Manager.seed_pipeline_cache",
                               "Manager.pipeline_cache_data"),
}
KP_VERSION = f"0.9.0+dynamovulkan.{KP_PATCHES}"
KP_BUILD = ("from a dynamo-vulkan checkout: pip install ./packaging/kp-dynamo-vulkan (it builds "
            "kp 0.9.0 from PyPI's sdist with our patches and needs a C++ compiler and the Vulkan "
            "and fmt headers: apt-get install g++ libvulkan-dev libfmt-dev), or bash scripts/setup.sh")
LOADER = "apt-get install libvulkan1 and a Vulkan driver (mesa-vulkan-drivers has lavapipe for machines without a GPU)"
KP_NO_LOADER = "kp cannot load the Vulkan loader"
GLSLC = ("glslc (GLSL to SPIR-V) is not on PATH: apt-get install glslc, or put the Vulkan SDK's "
         "bin directory on PATH")


def _has(module, dotted: str) -> bool:
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return False
    return True


def missing_patches(kp) -> list[str]:
    """The patches whose Python-visible additions kp lacks, e.g. 'patch 07-integer-dot-product
    (kp.integer_dot_product)'."""
    out = []
    for patch, attrs in KP_PATCH_ATTRS.items():
        lacking = [f"kp.{a}" for a in attrs if not _has(kp, a)]
        if lacking:
            out.append(f"patch {patch} ({', '.join(lacking)})")
    return out


def kp_problem() -> str | None:
    """Whether kp imports and carries exactly the patches this runtime uses."""
    try:
        kp = importlib.import_module("kp")
    except ModuleNotFoundError as e:
        if e.name != "kp":
            raise
        return f"kp (Kompute's Python package) is not installed: {KP_BUILD}"
    except ImportError as e:        # the extension is there but cannot load (libvulkan.so.1)
        if "libvulkan" in str(e):
            return f"{KP_NO_LOADER} ({e}): {LOADER}"
        return f"kp is installed but does not import ({e}): reinstall it, {KP_BUILD}"
    have = getattr(kp, "dynamo_vulkan_patches", None)
    lacking = missing_patches(kp)
    if have is None:
        which = ("plain kp from PyPI?" if len(lacking) == len(KP_PATCH_ATTRS)
                 else "no patch-set marker" + (f"; it lacks {', '.join(lacking)}" if lacking else ""))
        return f"the installed kp lacks dynamo_vulkan's patches ({which}): replace it, {KP_BUILD}"
    if have != KP_PATCHES:
        which = f"; it lacks {', '.join(lacking)}" if lacking else ""
        return (f"the installed kp carries dynamo_vulkan's patch set {have}, this dynamo_vulkan "
                f"needs set {KP_PATCHES}{which}: rebuild it, {KP_BUILD}")
    if lacking:
        return (f"the installed kp says it carries dynamo_vulkan's patch set {KP_PATCHES} but lacks "
                f"{', '.join(lacking)} (patched otherwise): rebuild it, {KP_BUILD}")
    return None


def glslc_problem() -> str | None:
    return None if shutil.which("glslc") else GLSLC


def problems() -> list[str]:
    """Every missing prerequisite, one sentence each (empty when all are there)."""
    return [p for p in (kp_problem(), glslc_problem()) if p]
