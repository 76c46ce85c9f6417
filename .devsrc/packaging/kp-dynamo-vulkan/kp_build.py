"""PEP 517 build backend: kp 0.9.0 from PyPI's sdist, with dynamo_vulkan's patches.

kp 0.9.0 is published as source only, its default build clones its dependencies from
the network, and dynamo_vulkan's runtime needs bindings it lacks (patches/*.patch).
Building this directory's wheel fetches that sdist with pip (sha256 pinned), patches
it (kp_patches.py), and builds it with kp's own setup.py against the system's Vulkan and
fmt headers and pip's pybind11. The wheel is the distribution `kp`, version
0.9.0+dynamovulkan.N, N being the patch marker that the last patch compiles into the module.

KP_DYNAMO_VULKAN_SDIST=PATH builds from a kp-0.9.0.tar.gz already at hand (offline).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:       # pip's backend-path puts it there; a direct import may not
    sys.path.insert(0, str(HERE))
import kp_patches  # noqa: E402

KP_VERSION = kp_patches.KP_VERSION
KP_SDIST_SHA256 = kp_patches.SDIST_SHA256
SDIST_ENV = "KP_DYNAMO_VULKAN_SDIST"
# what kp's CMake reads from the environment: system headers, no network
CMAKE_ENV = {
    "KOMPUTE_OPT_USE_BUILT_IN_VULKAN_HEADER": "OFF",
    "KOMPUTE_OPT_USE_BUILT_IN_FMT": "OFF",
    "KOMPUTE_OPT_USE_BUILT_IN_PYBIND11": "OFF",
    "KOMPUTE_OPT_DISABLE_VULKAN_VERSION_CHECK": "ON",
    "KOMPUTE_OPT_INSTALL": "OFF",
}
SYSTEM_PACKAGES = "a C++ compiler and the Vulkan and fmt headers (Debian/Ubuntu: " \
                  "apt-get install g++ libvulkan-dev libfmt-dev)"


class BuildError(RuntimeError):
    """What the build lacked, and what to install."""


def version() -> str:
    return f"{KP_VERSION}+dynamovulkan.{kp_patches.patch_set()}"


def fetch_sdist(dest: Path) -> Path:
    """kp's sdist: the file KP_DYNAMO_VULKAN_SDIST names, or PyPI's through pip."""
    given = os.environ.get(SDIST_ENV)
    if given:
        path = Path(given)
        if not path.is_file():
            raise BuildError(f"{SDIST_ENV}={given} is not a file")
    else:
        req = dest / "kp-requirement.txt"
        req.write_text(f"kp=={KP_VERSION} --hash=sha256:{KP_SDIST_SHA256}\n")
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                            "--no-binary=:all:", "--require-hashes", "-r", str(req),
                            "-d", str(dest)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"pip could not download kp {KP_VERSION}'s sdist:\n{r.stdout}\n"
                             f"{r.stderr}\n(offline: set {SDIST_ENV} to a kp-{KP_VERSION}.tar.gz)")
        path = dest / f"kp-{KP_VERSION}.tar.gz"
    try:
        kp_patches.check_sdist(path)
    except kp_patches.PatchError as e:
        raise BuildError(str(e)) from None
    return path


def _has_header(name: str) -> bool:
    roots = [os.environ.get("VULKAN_SDK", "")] + \
        os.environ.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) + ["/usr", "/usr/local"]
    dirs = [Path(r) / "include" for r in roots if r] + \
        [Path(d) for d in os.environ.get("CPATH", "").split(os.pathsep) if d]
    return any((d / name).is_file() for d in dirs)


def check_toolchain() -> None:
    """One message naming everything the C++ build lacks, before CMake's long output."""
    missing = []
    if not (os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
            or shutil.which("clang++")):
        missing.append("a C++ compiler")
    for header, what in (("vulkan/vulkan.hpp", "the Vulkan headers"), ("fmt/format.h", "fmt's headers")):
        if not _has_header(header):
            missing.append(f"{what} ({header})")
    if missing:
        raise BuildError(f"building kp needs {', '.join(missing)}; install {SYSTEM_PACKAGES} "
                         "(headers elsewhere: set CPATH or CMAKE_PREFIX_PATH)")


def prepare_source(sdist: Path, work: Path) -> Path:
    """The unpacked sdist, patched, its metadata naming our version and numpy unpinned."""
    try:
        src = kp_patches.unpack(sdist, work)
        kp_patches.apply(src)
    except kp_patches.PatchError as e:
        raise BuildError(f"patching kp failed: {e}") from None
    setup = src / "setup.py"
    text = setup.read_text()
    # kp's metadata pins numpy<2; built against pybind11 >= 2.12 it works with numpy 2
    for old, new in ((f"version='{KP_VERSION}'", f"version='{version()}'"),
                     ('"numpy<2.0.0"', '"numpy"')):
        if old not in text:
            raise BuildError(f"kp's setup.py lacks {old!r} (not kp {KP_VERSION}'s sdist?)")
        text = text.replace(old, new, 1)
    setup.write_text(text)
    return src


@contextlib.contextmanager
def _build_env(src: Path):
    import pybind11
    saved, cwd = dict(os.environ), os.getcwd()
    os.environ.update(CMAKE_ENV)
    prefix = [pybind11.get_cmake_dir()] + [p for p in saved.get("CMAKE_PREFIX_PATH", "").split(os.pathsep) if p]
    os.environ["CMAKE_PREFIX_PATH"] = os.pathsep.join(prefix)
    os.environ.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
    # kp's setup.py runs `make -j` with no bound unless this is set; it appends the value's
    # characters one by one to the make arguments, so it must be one digit
    os.environ.setdefault("KOMPUTE_PYTHON_NUM_PARALLEL_THREADS", str(min(os.cpu_count() or 1, 9)))
    os.chdir(src)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


# --- PEP 517 hooks -----------------------------------------------------------------


def get_requires_for_build_wheel(config_settings=None):
    cmake = shutil.which("cmake")
    if cmake:
        out = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
        m = re.search(r"version\s+(\d+)\.(\d+)", out)
        if m and (int(m.group(1)), int(m.group(2))) >= (3, 15):
            return []
    return ["cmake>=3.15"]


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    check_toolchain()
    from setuptools import build_meta
    with tempfile.TemporaryDirectory(prefix="kp-dynamo-vulkan-") as tmp:
        work = Path(tmp)
        src = prepare_source(fetch_sdist(work), work)
        with _build_env(src):
            return build_meta.build_wheel(os.path.abspath(wheel_directory), config_settings)


def build_sdist(sdist_directory, config_settings=None):
    """This directory (backend, applier, patches): building it builds kp as above."""
    name = f"kp-{version()}"
    pkg_info = (f"Metadata-Version: 2.1\nName: kp\nVersion: {version()}\n"
                "Summary: Kompute's Python package 0.9.0 with dynamo_vulkan's patches\n"
                "Requires-Python: >=3.10\nRequires-Dist: numpy\n").encode()
    out = Path(sdist_directory) / f"{name}.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for f in [HERE / "pyproject.toml", HERE / "kp_build.py", HERE / "kp_patches.py",
                  *sorted(kp_patches.PATCH_DIR.glob("*.patch"))]:
            tar.add(f, arcname=f"{name}/{f.relative_to(HERE)}")
        info = tarfile.TarInfo(f"{name}/PKG-INFO")
        info.size = len(pkg_info)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(pkg_info))
    return out.name
