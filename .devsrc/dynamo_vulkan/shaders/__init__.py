"""The GLSL compute kernels (package data), and which glslc compiles each.

Kernels that use GLSL extensions newer than Debian 12's glslc knows (tensor cores:
GL_KHR_cooperative_matrix; GL_EXT_bfloat16) are compiled by a second glslc, Debian sid's,
which scripts/glslc_coopmat.sh installs in the venv (scripts/setup.sh runs it); every
other kernel keeps the system's glslc and its SPIR-V.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

COOPMAT_GLSLC_ENV = "DYNAMO_VULKAN_GLSLC_COOPMAT"
# the extensions whose kernels need the second glslc
NEW_GLSL_EXTENSIONS = ("GL_KHR_cooperative_matrix", "GL_EXT_bfloat16")


class CoopmatGlslcMissing(RuntimeError):
    """No glslc that compiles cooperative-matrix kernels was found."""


def default_coopmat_glslc() -> Path:
    """Where scripts/setup.sh puts the wrapper: inside the venv (sys.prefix)."""
    return Path(sys.prefix) / "opt" / "glslc-coopmat" / "glslc-coopmat"


def coopmat_glslc() -> str | None:
    """The glslc for NEW_GLSL_EXTENSIONS kernels: the config's glslc_coopmat
    (DYNAMO_VULKAN_GLSLC_COOPMAT; an error if it names no executable), else the set-up location, else `glslc-coopmat` on PATH, else
    None (the tensor-core kernels are then not chosen)."""
    from dynamo_vulkan import config
    path = config.current().glslc_coopmat
    if path is not None:
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise CoopmatGlslcMissing(f"{COOPMAT_GLSLC_ENV}={str(path)!r} is not an executable file "
                                      "(scripts/glslc_coopmat.sh install DIR makes DIR/glslc-coopmat)")
        return str(path)
    default = default_coopmat_glslc()
    if default.is_file() and os.access(default, os.X_OK):
        return str(default)
    return shutil.which("glslc-coopmat")


def needs_coopmat_glslc(source: str) -> bool:
    """Whether a kernel's GLSL enables an extension only the second glslc knows."""
    return any(f"#extension {ext}" in source for ext in NEW_GLSL_EXTENSIONS)
