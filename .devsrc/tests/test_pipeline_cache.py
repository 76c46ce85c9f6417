"""The device's pipeline cache persists across processes (kp patch 13,
runtime/pipeline_cache.py): a process that built pipelines leaves the driver's cache
data in the disk cache, and a new process seeds its device with it before its first
pipeline; an entry that is not this device's is ignored with a warning; a device that
returns no data leaves nothing behind."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from dynamo_vulkan import cache, device
from dynamo_vulkan.runtime import pipeline_cache

pytestmark = pytest.mark.skipif(not device.is_available(), reason="no Vulkan device")

HEADER = b"H" * 32
IDENTITY = {"name": "fake", "driver_version": 1}


class FakeManager:
    """What pipeline_cache asks of a kp.Manager: its header, seeding and data."""

    def __init__(self, data: bytes = b""):
        self.data, self.seeded = data, []

    def pipeline_cache_header(self) -> bytes:
        return HEADER

    def seed_pipeline_cache(self, data: bytes) -> bool:
        self.seeded.append(data)
        return True

    def pipeline_cache_data(self) -> bytes:
        return self.data


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(d))
    cache.reset_stats()
    saved = dict(pipeline_cache._devices)
    pipeline_cache.forget()
    yield d
    pipeline_cache.forget()
    pipeline_cache._devices.update(saved)


def _builds(monkeypatch, n: int) -> None:
    monkeypatch.setattr(pipeline_cache, "_built", lambda: n)


def test_new_process_is_seeded_with_the_pipelines_an_earlier_one_saved(tmp_path):
    """A process that builds a pipeline saves the device's cache at exit; the next one
    hands those bytes to the driver before its first pipeline (a disk hit) and, having
    built nothing the cache did not hold already, writes nothing."""
    script = textwrap.dedent("""
        import json, numpy as np, kp
        import dynamo_vulkan
        from dynamo_vulkan import device
        from dynamo_vulkan.runtime.shaders import compile_source
        mgr = device.manager()
        t = mgr.tensor_t(np.zeros(1, dtype=np.uint32))
        src = "#version 450\\nlayout(local_size_x = 1) in;\\nlayout(binding = 0) buffer O { uint o[]; };\\n" \\
              "void main() { o[0] = 7; }\\n"
        mgr.algorithm([t], compile_source(src, "pipeline_cache_test"), (1, 1, 1), [], [])
        print(json.dumps({"stats": dynamo_vulkan.cache_stats().get("pipelines", {}),
                          "header": mgr.pipeline_cache_header().hex(), "built": kp.pipelines_built()}))
    """)
    env = dict(os.environ, DYNAMO_VULKAN_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> dict:
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])
    first = run()
    assert first["stats"] == {"misses": 1} and first["built"] >= 1
    entries = list((tmp_path / "cache" / pipeline_cache.LEVEL).glob("*/*.bin"))
    assert len(entries) == 1
    kept = entries[0].read_bytes()[len(cache.MAGIC) + 32:]
    assert kept.startswith(bytes.fromhex(first["header"]))
    mtime = entries[0].stat().st_mtime_ns
    second = run()
    assert second["stats"] == {"disk_hits": 1}
    assert entries[0].stat().st_mtime_ns == mtime       # nothing new to keep: not rewritten


def test_foreign_or_damaged_entries_are_ignored_with_a_warning(cache_dir, caplog):
    """An entry whose bytes do not start with the device's header is never handed to the
    driver: a warning, counted corrupt; a damaged file is a miss; the real driver refuses
    data with another header."""
    mgr = FakeManager()
    key = pipeline_cache.key(mgr, IDENTITY)
    cache.disk_put(pipeline_cache.LEVEL, key, b"G" * 32 + b"pipelines")
    with caplog.at_level(logging.WARNING, logger="dynamo_vulkan.runtime.pipeline_cache"):
        assert pipeline_cache.seed(mgr, 7, IDENTITY) is False
    assert mgr.seeded == []
    assert "not this device's pipeline cache" in caplog.text
    assert cache.cache_stats()["pipelines"] == {"corrupt": 1}
    path = next((cache_dir / pipeline_cache.LEVEL).glob("*/*.bin"))
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")          # the checksum no longer holds
    assert pipeline_cache.seed(FakeManager(), 7, IDENTITY) is False
    assert cache.cache_stats()["pipelines"]["misses"] == 1
    real = device.manager()
    assert real.seed_pipeline_cache(b"\0" * 64) is False


def test_saved_once_when_pipelines_were_built_and_never_without_data(cache_dir, monkeypatch):
    """save() writes a device's data after it built pipelines, once; a device that
    returns no data (or data without its header) leaves no entry."""
    _builds(monkeypatch, 5)
    mgr = FakeManager(HEADER + b"compiled")
    assert pipeline_cache.seed(mgr, 7, IDENTITY) is False          # nothing stored yet
    assert pipeline_cache.save() == 0                              # nothing built since
    _builds(monkeypatch, 6)
    assert pipeline_cache.save() == 1
    assert cache.disk_get(pipeline_cache.LEVEL, pipeline_cache.key(mgr, IDENTITY)) == HEADER + b"compiled"
    _builds(monkeypatch, 7)
    assert pipeline_cache.save() == 0                              # the same bytes again
    fresh = FakeManager()
    assert pipeline_cache.seed(fresh, 7, IDENTITY) is True and fresh.seeded == [HEADER + b"compiled"]

    pipeline_cache.forget()
    other = {"name": "other", "driver_version": 2}
    for data in (b"", b"G" * 40):
        _builds(monkeypatch, 7)
        empty = FakeManager(data)
        pipeline_cache.seed(empty, 3, other)
        _builds(monkeypatch, 8)
        assert pipeline_cache.save() == 0
        assert cache.disk_get(pipeline_cache.LEVEL, pipeline_cache.key(empty, other)) is None
        pipeline_cache.forget()


def test_no_identity_or_no_disk_cache_seeds_nothing(cache_dir, monkeypatch):
    mgr = FakeManager()
    assert pipeline_cache.key(mgr, None) is None
    assert pipeline_cache.seed(mgr, 7, None) is False
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE", "0")
    assert pipeline_cache.seed(mgr, 7, IDENTITY) is False
    assert mgr.seeded == [] and pipeline_cache._devices == {}
