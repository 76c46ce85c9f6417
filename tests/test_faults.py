"""Faults and load: a submit that fails in the driver or is interrupted (Ctrl-C), calls that
raise among many threads, a tensor larger than the device allows, two processes filling
one cache directory at once, and a broken Vulkan driver. Each ends in a clear error or
eager's numbers, and the next call works with nothing left locked."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import kp
import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan import device
from dynamo_vulkan.runtime import program
from vk import compiled


def _graph(x):
    return torch.softmax(x * 2, -1).cumsum(-1) + x.mean()


def _gather(x, i):
    return x[i] * 2 + 1


def _lock_is_free() -> bool:
    """Whether another thread can take the runtime's lock at once."""
    taken = []

    def take():
        ok = program.RUN_LOCK.acquire(timeout=5)
        taken.append(ok)
        if ok:
            program.RUN_LOCK.release()
    t = threading.Thread(target=take)
    t.start()
    t.join()
    return taken == [True]


def _all_vulkan(n_reports: int) -> None:
    reports = dynamo_vulkan.reports()[n_reports:]
    assert reports and not [n for r in reports for n in r.cpu_nodes], "a node ran on the CPU"


@pytest.mark.parametrize("fault", ["device_lost", "ctrl_c", "ctrl_c_in_wait"])
def test_failed_or_interrupted_submit_then_the_next_call_works(monkeypatch, fault):
    """The submit fails in the driver, or Ctrl-C comes at the submit or while the call
    waits (its sequence still running): the next calls run and give eager's values."""
    fn = compiled(_graph)
    x = torch.randn(4, 33)
    n = len(dynamo_vulkan.reports())
    torch.testing.assert_close(fn(x), _graph(x))
    _all_vulkan(n)
    calls = []

    def failing(self, *args):
        calls.append(self)
        if fault.startswith("ctrl_c"):
            raise KeyboardInterrupt
        raise RuntimeError("vkQueueSubmit: ErrorDeviceLost (simulated)")
    monkeypatch.setattr(kp.Sequence, "eval_await" if fault == "ctrl_c_in_wait" else "eval_async",
                        failing)
    if fault.startswith("ctrl_c"):
        with pytest.raises(KeyboardInterrupt):
            fn(x)
    else:
        with pytest.raises(program.SubmitError, match="submit of a compiled program .*failed: "
                                                      "vkQueueSubmit: ErrorDeviceLost"):
            fn(x)
    assert calls, "the program's submit was not the one that failed"
    monkeypatch.undo()
    assert _lock_is_free()
    for _ in range(2):
        y = torch.randn(4, 33)
        torch.testing.assert_close(fn(y), _graph(y))


def test_ctrl_c_inside_a_generate_loop_then_generate_again(monkeypatch, tmp_path):
    """KeyboardInterrupt from a decode step's submit mid-generation: the next generate
    gives the tokens of an uninterrupted run."""
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from dynamo_vulkan.llm.generate import generate
    from dynamo_vulkan.llm.tokenizer import GGUFTokenizer
    from dynamo_vulkan.llm.models import load_model
    from gguf_fixtures import write_tiny_model
    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=16), GGUFTokenizer.from_file(path)
    want = generate(model, "hello the world", tok, max_new_tokens=4, backend=None,
                    stop_at_eos=False)
    first = generate(model, "hello the world", tok, max_new_tokens=4, stop_at_eos=False)
    assert first.tokens == want.tokens
    original, evals = kp.Sequence.eval_async, []

    def interrupted(self, *args):
        evals.append(1)
        if len(evals) == 3:
            raise KeyboardInterrupt
        return original(self, *args)
    monkeypatch.setattr(kp.Sequence, "eval_async", interrupted)
    with pytest.raises(KeyboardInterrupt):
        generate(model, "hello the world", tok, max_new_tokens=4, stop_at_eos=False)
    monkeypatch.undo()
    assert _lock_is_free()
    again = generate(model, "hello the world", tok, max_new_tokens=4, stop_at_eos=False)
    assert again.tokens == want.tokens


def test_threads_with_failing_calls_among_them():
    """Calls with an index out of range raise IndexError in their own thread while the
    other calls, on two compiled functions, stay correct."""
    torch.manual_seed(0)
    f, g = compiled(_gather), compiled(_graph)
    x = torch.randn(6, 9)
    n = len(dynamo_vulkan.reports())
    f(x, torch.tensor([0, 5, 2]))
    g(torch.randn(5, 17))
    _all_vulkan(n)
    jobs = []
    for k in range(90):
        if k % 3 == 0:
            jobs.append((f, (x, torch.tensor([0, 6 + k % 4, 2])), None))
        elif k % 3 == 1:
            i = torch.tensor([k % 6, 5 - k % 6, 3])
            jobs.append((f, (x, i), _gather(x, i)))
        else:
            y = torch.randn(5, 17)
            jobs.append((g, (y,), _graph(y)))

    def run(job):
        fn, args, _ = job
        try:
            return fn(*args)
        except IndexError as e:
            return e
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, jobs))
    for k, ((_, _, want), got) in enumerate(zip(jobs, results)):
        if want is None:
            assert isinstance(got, IndexError) and "index" in str(got), (k, got)
        else:
            assert isinstance(got, torch.Tensor), (k, got)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert _lock_is_free()


def test_tensor_over_the_device_limit_then_smaller_ones_work(monkeypatch):
    """An input larger than maxStorageBufferRange: eager's numbers (its graph on the
    CPU, with a warning naming the limit); the same function on a smaller input then
    runs on Vulkan."""
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "warn")
    info = device.device_info()
    monkeypatch.setitem(info, "max_storage_buffer_range", 16384)
    monkeypatch.setitem(info, "name", f"{info['name']} (test limit 16384)")
    fn = compiled(_graph)
    big = torch.randn(64, 100)                       # 25,600 bytes
    with pytest.warns(UserWarning, match="maxStorageBufferRange"):
        torch.testing.assert_close(fn(big), _graph(big))
    small = torch.randn(4, 33)
    n = len(dynamo_vulkan.reports())
    torch.testing.assert_close(fn(small), _graph(small))
    _all_vulkan(n)
    assert _lock_is_free()


CACHE_PROG = """
import json, sys, torch, dynamo_vulkan
torch.manual_seed(0)
xs = [torch.randn(8, 37), torch.randn(3, 5)]
f = torch.compile(lambda x: torch.softmax(x * 2, -1).cumsum(-1) + x.mean(), backend="vulkan",
                  dynamic=False)
err = max(float((f(x) - (torch.softmax(x * 2, -1).cumsum(-1) + x.mean())).abs().max())
          for x in xs)
cpu = [n for r in dynamo_vulkan.reports() for n in r.cpu_nodes]
print(json.dumps({"err": err, "cpu": len(cpu), "stats": dynamo_vulkan.cache_stats()}))
"""


def _start(code: str, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, **env), cwd=tempfile.gettempdir())


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_fill_one_cache_directory_at_once(tmp_path):
    """Both compile the same graphs into one empty cache at the same time: both correct,
    and a third process then loads every entry from the disk (none damaged)."""
    env = {"DYNAMO_VULKAN_CACHE_DIR": str(tmp_path / "cache")}
    both = [_result(p) for p in [_start(CACHE_PROG, **env), _start(CACHE_PROG, **env)]]
    for r in both:
        assert r["err"] < 1e-5 and r["cpu"] == 0, r
    third = _result(_start(CACHE_PROG, **env))
    assert third["err"] < 1e-5 and third["cpu"] == 0, third
    assert third["stats"]["plan"].get("disk_hits", 0) >= 2, third["stats"]
    assert "misses" not in third["stats"]["plan"] and "misses" not in third["stats"]["spirv"], \
        third["stats"]
    assert not list((tmp_path / "cache").rglob("*.tmp*")), "temporary files were left"


NO_DRIVER_PROG = """
import json, warnings, torch, dynamo_vulkan
torch.manual_seed(0)
x, w = torch.randn(3, 16), torch.randn(16, 8)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    f = torch.compile(lambda x, w: torch.tanh(x @ w).sum(-1), backend="vulkan")
    g = torch.compile(lambda x: x.cumsum(0) * 2, backend="vulkan")
    ok = all(torch.allclose(f(x, w), torch.tanh(x @ w).sum(-1), atol=1e-5) and
             torch.allclose(g(x), x.cumsum(0) * 2) for _ in range(2))
print(json.dumps({"ok": bool(ok), "warnings": [str(m.message) for m in caught
                                               if "dynamo_vulkan" in str(m.message)]}))
"""


def test_broken_vulkan_driver_runs_on_the_cpu_with_one_warning(tmp_path):
    """A driver manifest that is not a manifest (a missing one: test_backend): eager's
    numbers for every call of two functions, and one warning that says so."""
    icd = tmp_path / "icd.json"
    icd.write_text("{not json")
    out = _result(_start(NO_DRIVER_PROG, VK_ICD_FILENAMES=str(icd), VK_DRIVER_FILES=str(icd),
                         DYNAMO_VULKAN_CACHE_DIR=str(tmp_path / "cache")))
    assert out["ok"]
    assert len(out["warnings"]) == 1 and "CPU" in out["warnings"][0], out["warnings"]
