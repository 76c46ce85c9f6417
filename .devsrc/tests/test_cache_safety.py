"""The disk cache trusts nothing it reads: hostile entries (a pickle that would run code,
a plan whose fields have the wrong types or point outside the plan) are rejected and
rebuilt; directories others can write are refused; failed writes leave no temporary
files; a read-only cache never breaks a compile; clear_cache copes with odd entries."""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from dynamo_vulkan import cache
from dynamo_vulkan.runtime import plan as plan_mod
from dynamo_vulkan.runtime.plan import PlanFormatError, plan_from_bytes, plan_to_bytes


def fn(x):
    return (x * 3).tanh() + 1


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(d))
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE", "1")
    cache.clear_cache(disk=False)
    yield d
    cache.clear_cache(disk=False)


def run_compiled(x):
    """fn compiled afresh (no Dynamo or in-memory cache: the disk cache is what it finds)."""
    torch._dynamo.reset()
    cache.clear_cache(disk=False)
    return torch.compile(fn, backend="vulkan", dynamic=False)(x)


def entry(payload: bytes) -> bytes:
    """A disk entry with a valid checksum: what anyone who can write the directory can make."""
    return cache.MAGIC + hashlib.sha256(payload).digest() + payload


def plan_entries(d: Path) -> list[Path]:
    found = sorted((d / "plan").rglob("*.bin"))
    assert found, "the compile stored no plan"
    return found


def payload_of(path: Path) -> bytes:
    return path.read_bytes()[len(cache.MAGIC) + 32:]


class _Touch:
    """Unpickling this creates a file: the stand-in for a shell command."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_hostile_pickle_entry_runs_nothing_and_is_rebuilt(cache_dir, tmp_path):
    x = torch.randn(5, 7)
    torch.testing.assert_close(run_compiled(x), fn(x))
    hostile = pickle.dumps(_Touch(tmp_path / "ran"))
    pickle.loads(pickle.dumps(_Touch(tmp_path / "proof")))      # the payload is live
    assert (tmp_path / "proof").exists()
    for p in plan_entries(cache_dir):
        p.write_bytes(entry(hostile))
    cache.reset_stats()
    torch.testing.assert_close(run_compiled(x), fn(x))
    assert not (tmp_path / "ran").exists()
    stats = cache.cache_stats()["plan"]
    assert stats["corrupt"] >= 1 and stats["misses"] >= 1 and "disk_hits" not in stats


def _header(payload: bytes) -> tuple[dict, bytes]:
    head = len(plan_mod.PLAN_MAGIC) + 8
    (size,) = struct.unpack_from("<Q", payload, len(plan_mod.PLAN_MAGIC))
    return json.loads(payload[head:head + size]), payload[head + size:]


def _with_header(header: dict, arrays: bytes) -> bytes:
    text = json.dumps(header).encode()
    return plan_mod.PLAN_MAGIC + struct.pack("<Q", len(text)) + text + arrays


def test_a_plan_entry_with_wrong_field_types_is_rejected_and_rebuilt(cache_dir):
    x = torch.randn(4, 6)
    run_compiled(x)
    for p in plan_entries(cache_dir):
        header, arrays = _header(payload_of(p))
        header["plan"]["buffers"][0]["words"] = "12"
        header["plan"]["dispatches"][0]["bindings"] = [0.5]
        p.write_bytes(entry(_with_header(header, arrays)))
    cache.reset_stats()
    torch.testing.assert_close(run_compiled(x), fn(x))
    stats = cache.cache_stats()["plan"]
    assert stats["corrupt"] >= 1 and stats["misses"] >= 1 and "disk_hits" not in stats
    cache.reset_stats()
    torch.testing.assert_close(run_compiled(x), fn(x))      # the rebuilt entry is good
    assert cache.cache_stats()["plan"].get("disk_hits", 0) >= 1


@pytest.fixture(scope="module")
def good_payload():
    from vk import lowered_plan
    from dynamo_vulkan.runtime.plan import Buffer
    p = lowered_plan(lambda a, b: (a @ b).softmax(-1) + torch.arange(3.0), [torch.randn(2, 5),
                                                                       torch.randn(5, 3)],
                     [False, True])
    assert any(isinstance(b.const, np.ndarray) for b in p.buffers), "the plan holds no constant"
    assert isinstance(p.buffers[0], Buffer)
    return plan_to_bytes(p)


def test_a_plan_round_trips(good_payload):
    back = plan_from_bytes(good_payload)
    assert plan_to_bytes(back) == good_payload
    assert all(isinstance(d.groups, tuple) for d in back.dispatches)
    assert all(isinstance(s.shape, tuple) for s in back.inputs)


def _mutated(payload, change) -> bytes:
    header, arrays = _header(payload)
    change(header)
    return _with_header(header, arrays)


def _set(path, value):
    def change(h):
        node = h["plan"]
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return change


def _first_source(h, f):
    key = next(iter(h["plan"]["sources"]))
    h["plan"]["sources"][key] = f(h["plan"]["sources"][key])


@pytest.mark.parametrize("change, message", [
    (_set(["buffers", 0, "words"], "12"), "buffers[0].words: expected int"),
    (_set(["buffers", 0, "words"], True), "buffers[0].words: expected int"),
    (_set(["buffers", 0, "words"], 1 << 40), "words"),
    (_set(["buffers", 0, "role"], "code"), "role"),
    (_set(["buffers", 0, "kind"], "u8/../../x"), "kind"),
    (_set(["buffers", 0, "extra"], 1), "expected the fields"),
    (_set(["dispatches", 0, "bindings"], [999]), "bindings[0]"),
    (_set(["dispatches", 0, "groups"], [1, 1]), "expected 3 items"),
    (_set(["dispatches", 0, "spec"], [-1]), "uint32"),
    (_set(["dispatches", 0, "name"], "../../evil"), "not one of the package's shaders"),
    (_set(["dispatches", 0, "spirv_key"], "nope"), "names no source"),
    (_set(["inputs", 0, "resident"], 1), "resident: expected bool"),
    (_set(["outputs", 0, "dtype"], "torch.load"), "not a torch dtype"),
    (_set(["mutations"], [[0, 999]]), "mutations[0] buffer"),
    (lambda h: _first_source(h, lambda s: s + "\nvoid evil() {}"), "key is not its digest"),
    (lambda h: _first_source(h, lambda s: s.replace("#version 450\n", "#version 450\n#include \"x\"\n")),
     "key is not its digest"),
    (lambda h: h["arrays"][0].update(dtype="|O"), "arrays[0]"),
    (lambda h: h["arrays"][0].update(shape=[1 << 20]), "run past"),
    (lambda h: h.update(code="x"), "header must be"),
])
def test_a_malformed_plan_is_a_plan_format_error(good_payload, change, message):
    with pytest.raises(PlanFormatError, match=None) as e:
        plan_from_bytes(_mutated(good_payload, change))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_source_that_is_not_a_shipped_shader_is_rejected_even_with_its_own_digest(good_payload):
    def change(h):
        src = h["plan"]["sources"]
        key = next(iter(src))
        evil = src.pop(key).replace("void main()", "void main2()")
        new = cache.digest(evil)
        src[new] = evil
        for d in h["plan"]["dispatches"]:
            if d["spirv_key"] == key:
                d["spirv_key"] = new
    with pytest.raises(PlanFormatError, match="is not shaders/"):
        plan_from_bytes(_mutated(good_payload, change))


@pytest.mark.parametrize("blob", [b"", b"DVKPLAN1\n", b"DVKPLAN1\n" + struct.pack("<Q", 1 << 60),
                                  b"DVKPLAN1\n" + struct.pack("<Q", 3) + b"{{{",
                                  b"DVKPLAN1\n" + struct.pack("<Q", 4000) + b"[" * 4000])
def test_truncated_or_garbage_plans_are_plan_format_errors(blob):
    with pytest.raises(PlanFormatError):
        plan_from_bytes(blob)


# --- the directory -------------------------------------------------------------------

def test_the_cache_directory_is_created_private(cache_dir):
    assert cache.cache_root() == cache_dir.resolve()
    assert cache_dir.stat().st_mode & 0o777 == 0o700


def _refused(caplog, d: Path, reason: str):
    with caplog.at_level(logging.WARNING, logger="dynamo_vulkan.cache"):
        assert cache.cache_root() is None
    msgs = [r.getMessage() for r in caplog.records if "not using the disk cache" in r.getMessage()]
    assert len(msgs) == 1 and str(d) in msgs[0] and reason in msgs[0], msgs


def test_a_world_writable_parent_is_refused_and_compiles_in_memory(tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    d = shared / "cache"
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(d))
    cache.clear_cache(disk=False)
    _refused(caplog, d, "not sticky")
    x = torch.randn(3, 4)
    torch.testing.assert_close(run_compiled(x), fn(x))
    assert not list(d.rglob("*.bin"))


def test_a_group_writable_cache_directory_is_refused(tmp_path, monkeypatch, caplog):
    d = tmp_path / "cache"
    d.mkdir()
    d.chmod(0o770)
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(d))
    cache.clear_cache(disk=False)
    _refused(caplog, d, "mode 0770")


def test_a_sticky_world_writable_parent_is_accepted(tmp_path, monkeypatch):
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(shared / "cache"))
    cache.clear_cache(disk=False)
    assert cache.cache_root() == (shared / "cache").resolve()


def test_a_directory_of_another_user_is_refused(tmp_path, monkeypatch, caplog):
    if os.geteuid() == 0:
        d = tmp_path / "theirs"
        d.mkdir(mode=0o700)
        os.chown(d, 65534, 65534)
    else:
        d = Path("/")             # root's, not this user's
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(d))
    cache.clear_cache(disk=False)
    _refused(caplog, d, "owned by uid")


def test_a_symlinked_directory_is_used_at_its_target(tmp_path, monkeypatch):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(tmp_path / "link"))
    cache.clear_cache(disk=False)
    assert cache.cache_root() == real.resolve()
    cache.disk_put("spirv", "ab" * 16, b"payload")
    (tmp_path / "link").unlink()                 # swapped away: entries still go to the target
    (tmp_path / "link").symlink_to(tmp_path)
    assert cache.disk_get("spirv", "ab" * 16) == b"payload"


# --- around the edges ------------------------------------------------------------------

def _deny_writes_under(monkeypatch, d: Path):
    """A read-only directory, also for root (whom mode bits do not stop)."""
    d.chmod(0o500)
    real_unlink, real_mkstemp = Path.unlink, cache.tempfile.mkstemp
    inside = str(d.resolve())

    def unlink(self, *a, **k):
        if str(self.resolve()).startswith(inside):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_unlink(self, *a, **k)

    def mkstemp(*a, dir=None, **k):
        if dir is not None and str(Path(dir).resolve()).startswith(inside):
            raise PermissionError(errno.EACCES, "Permission denied", str(dir))
        return real_mkstemp(*a, dir=dir, **k)
    monkeypatch.setattr(Path, "unlink", unlink)
    monkeypatch.setattr(cache.tempfile, "mkstemp", mkstemp)


def test_a_damaged_entry_in_a_read_only_cache_does_not_break_the_compile(cache_dir, monkeypatch):
    x = torch.randn(6)
    run_compiled(x)
    damaged = plan_entries(cache_dir)
    for p in damaged:
        p.write_bytes(p.read_bytes()[:-5] + b"xxxxx")
    for sub in [cache_dir, *[p for p in cache_dir.rglob("*") if p.is_dir()]]:
        _deny_writes_under(monkeypatch, sub)
    try:
        cache.reset_stats()
        torch.testing.assert_close(run_compiled(x), fn(x))
        assert cache.cache_stats()["plan"]["corrupt"] >= 1
        assert all(p.exists() for p in damaged)
    finally:
        for sub in [cache_dir, *[p for p in cache_dir.rglob("*") if p.is_dir()]]:
            sub.chmod(0o700)
    assert not list(cache_dir.rglob(".tmp-*"))


def _temps(d: Path) -> list[Path]:
    return list(d.rglob(cache.TMP_PREFIX + "*"))


@pytest.mark.parametrize("fault", [OSError(errno.ENOSPC, "No space left on device"),
                                   KeyboardInterrupt()])
def test_a_failed_or_interrupted_write_leaves_no_temporary_file(cache_dir, monkeypatch, fault):
    def boom(*a, **k):
        raise fault
    monkeypatch.setattr(cache.os, "replace", boom)
    if isinstance(fault, KeyboardInterrupt):
        with pytest.raises(KeyboardInterrupt):
            cache.disk_put("spirv", "cd" * 16, b"x" * 1000)
    else:
        cache.disk_put("spirv", "cd" * 16, b"x" * 1000)   # a warning, not an error
    monkeypatch.undo()
    assert cache_dir.is_dir() and not _temps(cache_dir)
    assert cache.disk_get("spirv", "cd" * 16) is None


def test_a_write_that_fails_midway_leaves_no_temporary_file(cache_dir, monkeypatch):
    real_fdopen = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[:10])
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(cache.os, "fdopen", lambda fd, mode: Full(real_fdopen(fd, mode)))
    cache.disk_put("spirv", "ef" * 16, b"y" * 100)
    monkeypatch.undo()
    assert not _temps(cache_dir) and cache.disk_get("spirv", "ef" * 16) is None


def test_clear_cache_removes_temporary_files_and_directories_in_an_entry_place(cache_dir):
    key = "ab" * 16
    cache.disk_put("spirv", key, b"ok")
    slot = cache_dir / "spirv" / key[:2]
    crashed = slot / ".tmp-left-by-a-crash"
    crashed.write_bytes(b"partial")
    blocked = slot / ("cd" * 16 + ".bin")
    blocked.mkdir()
    (blocked / "inner").write_bytes(b"z")
    assert cache.disk_get("spirv", "cd" * 16) is None          # a directory: no entry
    cache.disk_put("spirv", "cd" * 16, b"new")                # cannot replace it: a warning
    assert _temps(cache_dir) == [crashed]
    cache.clear_cache()
    assert not list(cache_dir.rglob("*.bin")) and not _temps(cache_dir)
    cache.disk_put("spirv", "cd" * 16, b"new")
    assert cache.disk_get("spirv", "cd" * 16) == b"new"


def test_the_plans_of_a_decoder_are_valid_entries(plans, tmp_path):
    """Every plan the planner makes for a decoder's prompt and decode step passes the
    load-time checks (a check stricter than the planner made every such entry a rebuild)."""
    from gguf_fixtures import write_tiny_model
    from dynamo_vulkan.llm.models import load_model
    model = load_model(write_tiny_model(tmp_path / "m.gguf", n_layers=1, hidden=256, ffn=256), max_ctx=32)
    step = torch.compile(model, backend="vulkan")
    with torch.no_grad():
        step(torch.tensor([[1, 2, 3, 4, 5]]), torch.tensor(0))
        step(torch.tensor([[6]]), torch.tensor(5))
    assert len(plans) >= 2
    for p in plans:
        blob = plan_to_bytes(p)
        assert plan_to_bytes(plan_from_bytes(blob)) == blob
