"""A plan's cache key holds the lowering's constants (lowering/settings.py): a plan built
under one value of a tuning constant is never taken for another, and the hash is the same
in every process, whatever it has imported so far and whatever its hash seed."""
import os
import subprocess
import sys

import torch

from dynamo_vulkan.gguf import GGUFLinear
from dynamo_vulkan.gguf.quants import quant_info
from dynamo_vulkan.lowering import gguf as gguf_lowering
from dynamo_vulkan.lowering import gguf_int_dot
from dynamo_vulkan.lowering.settings import canonical, settings_hash
from dynamo_vulkan.runtime.shaders import head_defines
from gguf_fixtures import blocks_of
from vk import check

HASH = "from dynamo_vulkan.lowering.settings import settings_hash; print(settings_hash())"


def test_a_changed_constant_changes_the_hash(monkeypatch):
    before = settings_hash()
    monkeypatch.setattr(gguf_int_dot, "INT_DOT_SHAPES", {**gguf_int_dot.INT_DOT_SHAPES, (None, "few"): (1, 32)})
    changed = settings_hash()
    monkeypatch.undo()
    assert changed != before and settings_hash() == before


def test_the_hash_is_the_same_in_every_process():
    """Different hash seeds (set and dict orders) and different modules imported first."""
    def run(seed: str, first: str) -> str:
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", f"import {first}; {HASH}"], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1]
    got = {run("1", "dynamo_vulkan.lowering.settings"), run("2", "dynamo_vulkan.backend"),
           run("3", "dynamo_vulkan.lowering.schedule")}
    assert len(got) == 1 and got == {settings_hash()}


def test_canonical_text():
    assert canonical({"b": 1, "a": (2, 3.5)}) == canonical({"a": (2, 3.5), "b": 1})
    assert canonical(frozenset({"x", "y"})) == canonical(frozenset({"y", "x"}))
    assert canonical((1, 2)) != canonical([1, 2])
    assert canonical(torch.float32) is None and canonical((1, object())) is None


def test_a_compile_under_another_setting_lowers_again(plans, as_gpu, monkeypatch):
    """The same graph compiled under two values of a mat-vec constant: two plans, each
    with its own rows a thread group."""
    name = "Q8_0"
    lin = GGUFLinear(blocks_of(name, 67, 256, 3), quant_info(name).ggml_type, 67, 256)
    x = torch.randn(1, 256)
    nrs = []
    for nr in (1, 2):
        monkeypatch.setattr(gguf_lowering, "MV_NR", nr)
        torch._dynamo.reset()       # a new compile of the same graph, not Dynamo's cached one
        with torch.no_grad():
            check(lin, x, rtol=3e-4, atol=3e-4)
        d = plans[-1].dispatches[0]
        nrs.append(head_defines(plans[-1].sources[d.spirv_key]).get("NR"))
    assert len(plans) == 2 and nrs == ["1", "2"], nrs
