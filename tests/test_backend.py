"""The backend end to end: models, partitioning, cache, env toggles, no device."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dynamo_vulkan
from dynamo_vulkan.examples import MLP, TransformerBlock
from vk import check

ROOT = Path(__file__).resolve().parents[1]


def test_entry_point_finds_backend_without_import():
    code = "import torch; print('vulkan' in torch._dynamo.list_backends())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_device_info():
    info = dynamo_vulkan.device_info()
    assert dynamo_vulkan.is_available()
    assert info["name"] and info["subgroup_size"] in (1, 2, 4, 8, 16, 32, 64, 128)
    assert info["max_storage_buffer_range"] >= 1 << 20


def test_mlp_matches_eager():
    torch.manual_seed(0)
    m = MLP((33, 64, 17, 5)).eval()
    with torch.no_grad():
        check(m, torch.randn(3, 33), atol=1e-4)


def test_transformer_block_matches_eager():
    torch.manual_seed(0)
    m = TransformerBlock(64, heads=4, hidden=96).eval()
    with torch.no_grad():
        check(m, torch.randn(2, 7, 64), atol=1e-4)


def test_large_resident_weights_arrive_intact():
    """Weights of a few MiB, uploaded through two transfers: on a real GPU a
    missing transfer barrier left them half-copied (seen on the H200)."""
    torch.manual_seed(0)
    m = MLP((256, 1024, 1024, 256)).eval()
    with torch.no_grad():
        check(m, torch.randn(8, 256), atol=1e-4)


def test_attention_with_mask_and_causal():
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    check(lambda a, b, c, m: (F.scaled_dot_product_attention(a, b, c, attn_mask=m),
                              F.scaled_dot_product_attention(a, b, c, is_causal=True),
                              F.scaled_dot_product_attention(a, b, c, attn_mask=m.float() * 0.5)),
          q, k, v, mask)


def test_weights_resident_until_their_version_changes():
    torch.manual_seed(0)
    m = nn.Linear(8, 4).eval()
    cm = torch.compile(m, backend="vulkan")
    x = torch.randn(2, 8)
    with torch.no_grad():
        cm(x)
        before = dynamo_vulkan.runtime_stats()["uploads"]
        cm(x)
        assert dynamo_vulkan.runtime_stats()["uploads"] == before      # nothing re-uploaded
        m.weight.mul_(2)                                               # version bump
        torch.testing.assert_close(cm(x), m(x))
        assert dynamo_vulkan.runtime_stats()["uploads"] == before + 1


def test_resident_checks_catch_every_change_between_calls(monkeypatch):
    """The per-call resident check is a few list passes that trust what the last call
    left: a weight written in place, one whose .data is swapped (same tensor object, a
    new pointer, no version bump) and a buffer the graph itself writes each call must
    all still be caught, call after call."""
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)
            self.register_buffer("acc", torch.zeros(4))

        def forward(self, x):
            y = self.lin(x)
            self.acc.add_(y.sum(0))      # mutated by the graph every call
            return y * 2 + self.acc

    m, ref = M().eval(), M().eval()
    ref.load_state_dict(m.state_dict())
    cm = torch.compile(m, backend="vulkan")
    x = torch.randn(3, 8)
    with torch.no_grad():
        for step in range(6):
            if step == 2:
                for mod in (m, ref):
                    mod.lin.weight.mul_(0.5)
            if step == 4:
                w = torch.randn(4, 8)
                m.lin.weight.data = w.clone()
                ref.lin.weight.data = w.clone()
            torch.testing.assert_close(cm(x), ref(x), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(m.acc, ref.acc, rtol=1e-4, atol=1e-4)
        # and with nothing changed from outside, the quick check holds, the graph's own
        # write to `acc` included
        from dynamo_vulkan.runtime.program import Program
        seen, quick = [], Program._residents_current
        monkeypatch.setattr(Program, "_residents_current", lambda self, ts: seen.append(quick(self, ts)) or seen[-1])
        cm(x), cm(x)
    assert seen == [True, True]


def test_runtime_counts_the_gpu_memory_it_holds():
    """runtime_stats' device_bytes: the resident weight and the program's own buffers
    while they live (the memory target counts them), back to the start once freed."""
    import gc
    gc.collect()
    start = dynamo_vulkan.runtime_stats()
    m = nn.Linear(1000, 300, bias=False).eval()
    cm = torch.compile(m, backend="vulkan")
    with torch.no_grad():
        x = torch.randn(2, 1000)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
    held = dynamo_vulkan.runtime_stats()
    weight, io = 4 * 1000 * 300, 4 * (2 * 1000 + 2 * 300)
    assert held["device_bytes"] - start["device_bytes"] >= weight + io
    assert held["staging_bytes"] - start["staging_bytes"] >= io
    assert held["device_bytes_peak"] >= held["device_bytes"]
    del cm, m
    torch._dynamo.reset()
    gc.collect()
    assert dynamo_vulkan.runtime_stats()["device_bytes"] == start["device_bytes"]


def test_one_submit_per_call():
    m = TransformerBlock(32, heads=2, hidden=48).eval()
    cm = torch.compile(m, backend="vulkan")
    x = torch.randn(1, 4, 32)
    with torch.no_grad():
        cm(x)
        before = dynamo_vulkan.runtime_stats()["submits"]
        cm(x)
    assert dynamo_vulkan.runtime_stats()["submits"] == before + 1


@pytest.mark.parametrize("reuse, spin", [(True, 0), (True, 1000), (False, 0), (False, 50)])
def test_repeated_calls_with_each_fence_mode(reuse, spin):
    """kp patch 6: a sequence resets one fence per submit (or makes one, as kp 0.9 did),
    and may poll it before blocking; every mode returns each call's own result."""
    import kp
    m = TransformerBlock(32, heads=2, hidden=48).eval()
    cm = torch.compile(m, backend="vulkan")
    xs = [torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    saved = kp.fence_reuse(), kp.fence_spin_us()
    kp.set_fence_reuse(reuse)
    kp.set_fence_spin_us(spin)
    try:
        with torch.no_grad():
            outs = [cm(x) for x in xs + xs]
    finally:
        kp.set_fence_reuse(saved[0])
        kp.set_fence_spin_us(saved[1])
        torch._dynamo.reset()
    with torch.no_grad():
        want = [m(x) for x in xs + xs]
    for got, ref in zip(outs, want):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_fence_spin_defaults_by_device_type(monkeypatch, as_gpu):
    """Polling the fence is the default on a GPU only (a CPU device's threads need the
    cores); DYNAMO_VULKAN_FENCE_SPIN_US overrides it, and a bad value says what it wants."""
    import kp
    from dynamo_vulkan import config, device
    saved = kp.fence_spin_us()
    try:
        monkeypatch.delenv("DYNAMO_VULKAN_FENCE_SPIN_US", raising=False)
        device.set_fence_spin(config.load().fence_spin_us)
        assert kp.fence_spin_us() == config.DEFAULT_FENCE_SPIN_US
        monkeypatch.setitem(device.device_info(), "device_type", "PHYSICAL_DEVICE_TYPE_CPU")
        device.set_fence_spin(config.load().fence_spin_us)
        assert kp.fence_spin_us() == 0
        monkeypatch.setenv("DYNAMO_VULKAN_FENCE_SPIN_US", "250")
        torch.compile(lambda x: x * 3, backend="vulkan")(torch.randn(5))
        assert kp.fence_spin_us() == 250
        monkeypatch.setenv("DYNAMO_VULKAN_FENCE_SPIN_US", "-1")
        with pytest.raises(Exception, match="DYNAMO_VULKAN_FENCE_SPIN_US='-1' must be a whole number"):
            torch.compile(lambda x: x * 4, backend="vulkan")(torch.randn(5))
    finally:
        kp.set_fence_spin_us(saved)


def test_unsupported_op_in_the_middle_runs_on_cpu():
    def f(x):
        y = torch.relu(x * 2)
        z = torch.linalg.det(y.view(2, 3, 3))      # no Vulkan lowering
        return (z.unsqueeze(-1) + y.sum((1, 2)).unsqueeze(-1)).exp()
    x = torch.randn(2, 9)
    check(f, x.view(2, 3, 3), all_vulkan=False, rtol=1e-4, atol=1e-4)
    rep = dynamo_vulkan.reports()[-1]
    cpu_ops = {n.op for n in rep.cpu_nodes}
    assert any("det" in op for op in cpu_ops), rep
    vk_ops = {n.op for n in rep.vulkan_nodes}
    assert "aten.relu.default" in vk_ops and "aten.exp.default" in vk_ops
    assert rep.partitions >= 2
    assert all(n.reason for n in rep.cpu_nodes)


def test_fallback_error_raises(monkeypatch):
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    with pytest.raises(Exception, match="DYNAMO_VULKAN_FALLBACK=error"):
        torch.compile(lambda x: torch.linalg.det(x) + 1, backend="vulkan")(torch.randn(3, 3))


def test_fallback_warn_warns_once(monkeypatch):
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "warn")
    from dynamo_vulkan import backend
    backend._warned.discard("aten.linalg_lu_factor_ex.default")
    backend._warned.discard("aten._linalg_det.default")
    with pytest.warns(UserWarning, match="runs on the CPU"):
        torch.compile(lambda x: torch.linalg.det(x) * 2, backend="vulkan")(torch.randn(3, 3))


def test_fallback_silent(monkeypatch, recwarn):
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "silent")
    torch.compile(lambda x: torch.linalg.det(x) - 1, backend="vulkan")(torch.randn(3, 3))
    assert not [w for w in recwarn if "dynamo_vulkan" in str(w.message)]


def test_bad_fallback_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "maybe")
    with pytest.raises(Exception, match="DYNAMO_VULKAN_FALLBACK"):
        torch.compile(lambda x: x + 1, backend="vulkan")(torch.randn(3))


def test_debug_dump(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNAMO_VULKAN_DEBUG_DUMP", str(tmp_path))
    torch.compile(lambda x: torch.softmax(x, -1) * 2, backend="vulkan")(torch.randn(3, 5))
    (graph,) = tmp_path.iterdir()
    names = {p.name for p in graph.iterdir()}
    assert {"fx_graph.py", "partition_report.txt", "shaders"} <= names
    program = [n for n in names if "program" in n]
    assert program and "rowwise" in (graph / program[0]).read_text()
    assert list((graph / "shaders").glob("*.spv")) and list((graph / "shaders").glob("*.comp"))
    assert "vulkan" in (graph / "partition_report.txt").read_text()


def test_profile_prints_kernel_times(monkeypatch, caplog):
    monkeypatch.setenv("DYNAMO_VULKAN_PROFILE", "1")
    with caplog.at_level("INFO", logger="dynamo_vulkan.profile"):
        torch.compile(lambda x: (x * 3).sum(-1), backend="vulkan")(torch.randn(4, 6))
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "dynamo_vulkan.profile")
    assert "elementwise" in text and "reduce" in text and " us " in text


def test_gradients_still_correct():
    torch.manual_seed(0)
    m = MLP((6, 8, 3))
    x = torch.randn(4, 6, requires_grad=True)
    ref = m(x).square().sum()
    ref.backward()
    grads = [p.grad.clone() for p in m.parameters()] + [x.grad.clone()]
    m.zero_grad()
    x.grad = None
    out = torch.compile(m, backend="vulkan")(x).square().sum()
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    for g, p in zip(grads, list(m.parameters()) + [x]):
        torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-4)


def _run(code: str, **env) -> dict:
    full = dict(os.environ, **env)
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=full, cwd=tempfile.gettempdir())
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


CACHE_PROG = """
import json, warnings, torch, dynamo_vulkan
from dynamo_vulkan.examples import MLP
torch.manual_seed(0)
m = MLP((16, 32, 8)).eval()
x = torch.randn(2, 16)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with torch.no_grad():
        y = torch.compile(m, backend="vulkan")(x)
        ok = torch.allclose(y, m(x), rtol=1e-4, atol=1e-4)
print(json.dumps({"stats": dynamo_vulkan.cache_stats(), "ok": bool(ok),
                  "warnings": [str(x.message) for x in w if "dynamo_vulkan" in str(x.message)]}))
"""


def test_second_process_hits_disk_cache_and_corruption_is_rebuilt(tmp_path):
    env = {"DYNAMO_VULKAN_CACHE_DIR": str(tmp_path)}
    first = _run(CACHE_PROG, **env)
    assert first["ok"] and first["stats"]["plan"]["misses"] >= 1
    assert first["stats"]["spirv"]["misses"] >= 1
    second = _run(CACHE_PROG, **env)
    assert second["ok"]
    assert second["stats"]["plan"].get("disk_hits", 0) >= 1
    assert "misses" not in second["stats"]["plan"] and "misses" not in second["stats"]["spirv"]
    for p in tmp_path.rglob("*.bin"):            # damage every entry
        p.write_bytes(p.read_bytes()[:-7] + b"garbage")
    third = _run(CACHE_PROG, **env)
    assert third["ok"]
    assert third["stats"]["plan"]["corrupt"] >= 1 and third["stats"]["plan"]["misses"] >= 1
    fourth = _run(CACHE_PROG, **env)               # rebuilt entries are good again
    assert fourth["ok"] and fourth["stats"]["plan"].get("disk_hits", 0) >= 1


def test_cache_disabled_writes_nothing(tmp_path):
    out = _run(CACHE_PROG, DYNAMO_VULKAN_CACHE_DIR=str(tmp_path), DYNAMO_VULKAN_CACHE="0")
    assert out["ok"] and not list(tmp_path.rglob("*.bin"))
    assert "disk_hits" not in out["stats"].get("plan", {})


def test_clear_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(tmp_path))
    torch.compile(lambda x: x * 5 + 2, backend="vulkan")(torch.randn(3))
    assert list(tmp_path.rglob("*.bin"))
    dynamo_vulkan.clear_cache()
    assert not list(tmp_path.rglob("*.bin"))


def test_kernels_compile_together_once_each(tmp_path, monkeypatch):
    """shaders.compile_many: the uncached sources of a program compiled at once, each
    once (a repeat is one compile), then found in memory; a bad one fails with glslc's
    message and its numbered source."""
    from dynamo_vulkan import cache
    from dynamo_vulkan.runtime import shaders
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(tmp_path))
    body = "layout(local_size_x = 1) in;\nlayout(binding = 0) buffer B { uint b[]; };\n"
    srcs = [(f"#version 450\n{body}void main() {{ b[0] = {i}u + {id(tmp_path) % 997}u; }}\n",
             f"k{i}") for i in range(5)]
    before = cache.cache_stats().get("spirv", {})
    shaders.compile_many(srcs + srcs[:2])
    after = cache.cache_stats()["spirv"]
    assert after.get("misses", 0) - before.get("misses", 0) == 5
    spv = [shaders.compile_source(src, name) for src, name in srcs]
    assert cache.cache_stats()["spirv"]["memory_hits"] - after.get("memory_hits", 0) == 5
    assert all(s[:4] == b"\x03\x02\x23\x07" for s in spv)     # SPIR-V's magic number
    bad = ("#version 450\nlayout(local_size_x = 1) in;\nvoid main() { nope(); }\n", "bad")
    with pytest.raises(shaders.ShaderCompileError, match=r"glslc failed for bad(.|\n)*3 void main"):
        shaders.compile_many([bad, srcs[0], (bad[0] + "// 2\n", "bad")])


def test_algorithms_are_built_on_several_threads(monkeypatch):
    """A program's kp algorithms (pipelines) are built from a thread pool through kp's
    algorithm_nogil (patch 8), and the program still computes eager's result."""
    from dynamo_vulkan.runtime import program
    import kp
    assert hasattr(kp.Manager, "algorithm_nogil"), "kp lacks patch 8: run scripts/setup.sh"
    pools = []

    class Spy(program.ThreadPoolExecutor):
        def __init__(self, max_workers=None):
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)
    monkeypatch.setattr(program, "ThreadPoolExecutor", Spy)
    monkeypatch.setattr(program.os, "cpu_count", lambda: 4)

    def f(x, y):
        return (torch.sigmoid(x) @ y).softmax(-1).cumsum(0) + torch.tanh(y).sum()
    x, y = torch.randn(37, 19), torch.randn(19, 23)
    check(f, x, y)
    assert pools and max(pools) == 4, pools


def test_no_driver_falls_back_to_cpu_with_a_warning(tmp_path):
    env = {"VK_ICD_FILENAMES": str(tmp_path / "none.json"), "VK_DRIVER_FILES": str(tmp_path / "none.json"),
           "DYNAMO_VULKAN_CACHE_DIR": str(tmp_path)}
    out = _run(CACHE_PROG, **env)
    assert out["ok"]
    assert len(out["warnings"]) == 1 and "CPU" in out["warnings"][0]


def test_device_index_out_of_range_falls_back(tmp_path):
    out = _run(CACHE_PROG, DYNAMO_VULKAN_DEVICE="7", DYNAMO_VULKAN_CACHE_DIR=str(tmp_path))
    assert out["ok"] and "DYNAMO_VULKAN_DEVICE=7" in out["warnings"][0]


def test_a_node_on_another_device_runs_eagerly():
    """ones_like(x, device="cuda") (an OpInfo sample where CUDA exists): the result must be
    a tensor on that device, which a Vulkan program does not give, so the node stays on
    the CPU partition (eager), with the reason."""
    import torch.fx as fx
    from torch._subclasses.fake_tensor import FakeTensorMode

    from dynamo_vulkan.partition import why_not_vulkan
    with FakeTensorMode():
        on_cuda = torch.empty(5, device="cuda")
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(5, device="meta")
    node = g.call_function(torch.ops.aten.ones_like.default, (x,), {"device": torch.device("cuda")})
    node.meta["val"] = on_cuda
    assert "device cuda" in why_not_vulkan(node)
    node.meta["val"] = torch.empty(5, device="meta")
    assert why_not_vulkan(node) is None


def test_streamed_layouts_key_every_property_of_every_input():
    """A program is looked up by its streamed inputs' layouts (backend._layouts): inputs
    that differ in shape, strides, dtype or storage offset get different keys, equal
    layouts the same key, and a non-tensor input falls back to each input's own layout."""
    from dynamo_vulkan.backend import _layout, _layouts
    base = torch.zeros(4, 6)
    same = [torch.ones(4, 6), torch.ones(3)]
    key = _layouts([base, torch.zeros(3)])
    assert _layouts(same) == key
    for other in (torch.zeros(6, 4), base.t().contiguous().t(), base.double(),
                  torch.zeros(25)[1:].view(4, 6), nn.Parameter(torch.zeros(4, 6)).t()):
        assert _layouts([other, torch.zeros(3)]) != key, other.shape
    assert _layouts([nn.Parameter(torch.zeros(4, 6)), torch.zeros(3)]) == key
    assert _layouts([base, 7]) == (_layout(base), 7) != _layouts([base, 8])


def test_a_transposed_input_after_a_contiguous_one_gets_its_own_program():
    """The same shape with other strides between calls: each call's result is eager's."""
    fn = torch.compile(lambda a, b: a @ b + 1, backend="vulkan", dynamic=False)
    a, b = torch.randn(5, 5), torch.randn(5, 3)
    for x in (a, a.t(), a, a.t().contiguous().t()):
        torch.testing.assert_close(fn(x, b), x @ b + 1)
