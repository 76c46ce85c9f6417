"""What the runtime needs beside its Python dependencies, and what to install when
something is missing: the patched kp, glslc, and the Vulkan loader.

Each check returns None when all is well, else one sentence that names the missing
piece and the command that installs it; device.manager() joins them into the one
reason the backend gives when it runs a model on the CPU instead.
"""
from __future__ import annotations

import importlib
import shutil

# kp.dynamo_vulkan_patches of the kp this runtime is written against: scripts/patch_kp.py's
# PATCHES (tests/test_install.py checks that the two, and pyproject's kp pin, agree)
KP_PATCHES = 10
KP_VERSION = f"0.9.0+dynamovulkan.{KP_PATCHES}"
KP_BUILD = ("from a dynamo-vulkan checkout: pip install ./packaging/kp-dynamo-vulkan (it builds "
            "kp 0.9.0 from PyPI's sdist with our patches and needs a C++ compiler and the Vulkan "
            "and fmt headers: apt-get install g++ libvulkan-dev libfmt-dev), or bash scripts/setup.sh")
LOADER = "apt-get install libvulkan1 and a Vulkan driver (mesa-vulkan-drivers has lavapipe for machines without a GPU)"
KP_NO_LOADER = "kp cannot load the Vulkan loader"
GLSLC = ("glslc (GLSL to SPIR-V) is not on PATH: apt-get install glslc, or put the Vulkan SDK's "
         "bin directory on PATH")


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
    if have is None:
        return (f"the installed kp lacks dynamo_vulkan's patches (plain kp from PyPI?): "
                f"replace it, {KP_BUILD}")
    if have != KP_PATCHES:
        return (f"the installed kp carries dynamo_vulkan's patch set {have}, this dynamo_vulkan "
                f"needs set {KP_PATCHES}: rebuild it, {KP_BUILD}")
    return None


def glslc_problem() -> str | None:
    return None if shutil.which("glslc") else GLSLC


def problems() -> list[str]:
    """Every missing prerequisite, one sentence each (empty when all are there)."""
    return [p for p in (kp_problem(), glslc_problem()) if p]
