"""A compiled decoder's traced graphs persist across processes (precompiled.py,
runtime/graph_io.py): a new decoder (or a new process) with the same structure loads them
from the disk cache instead of tracing with Dynamo and AOT autograd, and generates the
same tokens as eager; a changed model structure or setting makes a new entry; a damaged
or malformed entry is rejected and traced again."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx as fx

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import dynamo_vulkan  # noqa: E402
from dynamo_vulkan import backend, cache  # noqa: E402
from dynamo_vulkan.llm.generate import compile_decoder, generate, prompt_bucket  # noqa: E402
from dynamo_vulkan.llm.tokenizer import GGUFTokenizer  # noqa: E402
from dynamo_vulkan.llm.models import load_model  # noqa: E402
from dynamo_vulkan.precompiled import Precompiled, fingerprint  # noqa: E402
from dynamo_vulkan.runtime.graph_io import (GraphFormatError, graph_from_bytes,  # noqa: E402
                                            graph_to_bytes, propagate_meta)

from gguf_fixtures import write_tiny_model  # noqa: E402

PROMPT = "hello the world"
CTX = 24
TOKENS = 3


class Traces:
    """A graph sink that counts Dynamo traces (backend._graph_sinks)."""

    def __init__(self):
        self.dynamo = self.aot = 0

    def dynamo_graph(self, gm):
        self.dynamo += 1

    def aot_graph(self, gm, kind, static, bumped):
        self.aot += 1


@pytest.fixture
def traces():
    t = Traces()
    backend._graph_sinks.append(t)
    yield t
    backend._graph_sinks.remove(t)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cold")
    return {"a": write_tiny_model(d / "a.gguf", "llama", n_layers=1, seed=0),
            "b": write_tiny_model(d / "b.gguf", "llama", n_layers=1, seed=1),    # other weights
            "deeper": write_tiny_model(d / "c.gguf", "llama", n_layers=2, seed=0)}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private, empty disk cache for the test, and an empty memory cache."""
    d = tmp_path / "cache"
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE_DIR", str(d))
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")    # the prompt on Vulkan too
    cache.clear_cache(disk=False)
    yield d
    cache.clear_cache(disk=False)


def _run(path, **kw):
    model, tok = load_model(path, max_ctx=CTX), GGUFTokenizer.from_file(path)
    eager = generate(model, PROMPT, tok, max_new_tokens=TOKENS, backend=None, stop_at_eos=False)
    got = generate(model, PROMPT, tok, max_new_tokens=TOKENS, backend="vulkan", stop_at_eos=False,
                   warmup=False, **kw)
    return got.tokens, eager.tokens


def _entries(cache_dir) -> list:
    return sorted((cache_dir / "graph").glob("*/*.bin"))


def _graph_stats():
    return dict(dynamo_vulkan.cache_stats().get("graph", {}))


def _phases(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == "dynamo_vulkan.progress")


def test_new_decoder_loads_graphs_and_a_rewritten_file_is_right(cache_dir, traces, caplog, tmp_path):
    """A second decoder of the same structure reads the traced graphs instead of tracing.
    Weights are graph inputs: here the model file is rewritten with other values, and the
    tokens are its own (eager's), not the first file's."""
    caplog.set_level(logging.INFO, logger="dynamo_vulkan.progress")
    path = write_tiny_model(tmp_path / "m.gguf", "llama", n_layers=1, seed=0)
    a, want_a = _run(path)
    assert a == want_a
    assert traces.dynamo == 2 and traces.aot == 2           # prompt and decode step traced
    assert len(_entries(cache_dir)) == 2
    first = _phases(caplog)
    # the prompt's graph and the decode step's (on a GPU the step is GreedySteps', replayed)
    assert first.count(": tracing with Dynamo") == 2 and "compiling" in first, first
    caplog.clear()
    write_tiny_model(path, "llama", n_layers=1, seed=1)
    before = _graph_stats()
    b, want_b = _run(path)                                   # a new decoder object: new Precompiled
    assert b == want_b and want_a != want_b
    assert traces.dynamo == 2                                # nothing traced again
    assert traces.aot == 4             # the stored graphs went through the backend's compile_graph
    assert _graph_stats().get("disk_hits", 0) - before.get("disk_hits", 0) == 2
    second = _phases(caplog)
    assert second.count(": traced graph read from the cache") == 2 and "tracing" not in second, second


def test_stored_prompt_graph_fills_a_fresh_kv_cache_kept_on_the_gpu(files, cache_dir, as_gpu):
    """Planned as for a GPU, a decoder's KV cache stays on the device between calls. A new
    decoder, whose cache no eager run has filled, runs the stored prompt graph and then
    the decode steps: they read the prompt's entries from the device, so every token is
    eager's, not only the first."""
    _run(files["a"])                                     # traces and stores
    before = _graph_stats()
    model, tok = load_model(files["a"], max_ctx=CTX), GGUFTokenizer.from_file(files["a"])
    got = generate(model, PROMPT, tok, max_new_tokens=TOKENS + 1, backend="vulkan", stop_at_eos=False,
                   warmup=False)
    assert _graph_stats().get("disk_hits", 0) - before.get("disk_hits", 0) >= 1
    eager = generate(load_model(files["a"], max_ctx=CTX), PROMPT, tok, max_new_tokens=TOKENS + 1,
                     backend=None, stop_at_eos=False)
    assert got.tokens == eager.tokens


def test_changed_structure_or_setting_is_a_new_entry(files, cache_dir, monkeypatch):
    a1, a2 = (load_model(files["a"], max_ctx=CTX) for _ in range(2))
    deeper = load_model(files["deeper"], max_ctx=CTX)
    shorter = load_model(files["a"], max_ctx=CTX - 8)
    assert fingerprint(a1) == fingerprint(a2)
    assert len({fingerprint(a1), fingerprint(deeper), fingerprint(shorter)}) == 3
    sig = ((("torch.int64", (1, 1), False), ("torch.int64", (), False)), False)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "host")
    host = Precompiled(a1, None).key(sig)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    assert host != Precompiled(a1, None).key(sig) == Precompiled(a2, None).key(sig)


def test_damaged_entries_are_rejected_and_traced_again(files, cache_dir, traces):
    """One entry fails its checksum, the other verifies but holds a graph that does not fit
    the call: both are rejected, traced again and stored whole."""
    want = _run(files["a"])[1]
    entries = _entries(cache_dir)
    assert len(entries) == 2
    blob = bytearray(entries[0].read_bytes())
    blob[-2] ^= 0xFF
    entries[0].write_bytes(bytes(blob))
    cache.disk_put("graph", entries[1].stem, json.dumps(
        {"graph": json.dumps({"format": 1, "nodes": [
            {"op": "placeholder", "name": "x", "spec": {"int": 3}},
            {"op": "output", "name": "output", "args": {"tuple": [{"node": "x"}]}}]}),
         "kind": "inference", "inputs": [["arg", 0]], "static": [], "bumped": [], "single": True}).encode())
    before = _graph_stats()
    got, _ = _run(files["a"])
    assert got == want
    assert traces.dynamo == 4                          # both graphs traced again
    after = _graph_stats()
    assert after.get("corrupt", 0) - before.get("corrupt", 0) == 2
    assert after.get("disk_hits", 0) == before.get("disk_hits", 0)
    assert len(_entries(cache_dir)) == 2               # stored again, whole
    got, _ = _run(files["a"])
    assert got == want and traces.dynamo == 4
    with pytest.raises(ValueError):                    # what a non-JSON entry meets
        json.loads(b"{not json")


def test_warm_up_compiles_a_stored_prompt_without_running_it(cache_dir, tmp_path, monkeypatch):
    """With nothing stored, Precompiled.prepare says the call must run to compile. With the
    graphs stored, a new decoder's warm-up compiles the prompt's graph from the disk cache
    without running it, so the prompt runs once (not twice), torch.compile is never called
    (no Dynamo), and the tokens are eager's. One decode step per call, as on a CPU device,
    so that each step is a call of the stored graph on a GPU too (not a replay)."""
    from dynamo_vulkan import precompiled

    path = write_tiny_model(tmp_path / "m.gguf", "llama", n_layers=1, seed=0)
    fresh = Precompiled(load_model(path, max_ctx=CTX), make_compiled=lambda: pytest.fail("compiled"))
    with torch.no_grad():
        assert fresh.prepare(torch.tensor([[1, 2, 3]]), torch.tensor(0), torch.tensor(2)) is False
    _run(path, steps_per_call=1)                         # stores both graphs
    runs = []
    call = precompiled._Runner.__call__
    monkeypatch.setattr(precompiled._Runner, "__call__",
                        lambda self, args: runs.append(tuple(args[0].shape)) or call(self, args))
    model, tok = load_model(path, max_ctx=CTX), GGUFTokenizer.from_file(path)
    eager = generate(model, PROMPT, tok, max_new_tokens=TOKENS, backend=None, stop_at_eos=False)
    got = generate(model, PROMPT, tok, max_new_tokens=TOKENS, backend="vulkan", stop_at_eos=False,
                   steps_per_call=1)
    assert got.tokens == eager.tokens
    assert sum(shape[1] > 1 for shape in runs) == 1, runs        # the prompt ran once
    assert sum(shape == (1, 1) for shape in runs) == TOKENS, runs  # a warm-up step, then the steps
    assert got.extra["compiled"]._compiled is None                # torch.compile never made


def test_a_stored_graph_run_on_the_host_imports_no_dynamo(files, cache_dir, monkeypatch):
    """A CPU device's default: the prompt's stored graph runs on the host, its GGUF ops as
    their CPU kernels. A second process imports no Dynamo there either (torch.library's
    custom_op ran its kernels behind torch._disable_dynamo, which imports Dynamo, 1.4 s on
    the CI machine) and gives eager's tokens."""
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "host")
    script = textwrap.dedent(f"""
        import json, sys
        from dynamo_vulkan.llm.generate import generate
        from dynamo_vulkan.llm.tokenizer import GGUFTokenizer
        from dynamo_vulkan.llm.models import load_model
        model, tok = load_model(sys.argv[1], max_ctx={CTX}), GGUFTokenizer.from_file(sys.argv[1])
        res = generate(model, {PROMPT!r}, tok, max_new_tokens={TOKENS}, stop_at_eos=False, warmup=False)
        print(json.dumps({{"tokens": res.tokens, "dynamo": "torch._dynamo" in sys.modules}}))
    """)
    model, tok = load_model(files["a"], max_ctx=CTX), GGUFTokenizer.from_file(files["a"])
    want = generate(model, PROMPT, tok, max_new_tokens=TOKENS, backend=None, stop_at_eos=False).tokens
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", script, str(files["a"])], env=dict(os.environ),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert runs[0]["tokens"] == runs[1]["tokens"] == want
    assert runs[1]["dynamo"] is False


def test_new_process_reuses_graphs_plans_and_kernels(files, cache_dir, monkeypatch):
    """This process traces and stores; a new one traces nothing, builds no plan, compiles
    no kernel, runs no subgroup probe, propagates no node values and never imports
    Dynamo, and generates the same tokens. A prompt of a length no process ran takes its
    graph's node values from their expressions of the prompt length and plans with them:
    no Dynamo either, eager's tokens, and the plans the planner makes from propagated
    fake tensors."""
    script = textwrap.dedent(f"""
        import json, sys
        import dynamo_vulkan
        from dynamo_vulkan import backend
        from dynamo_vulkan.llm.generate import generate
        from dynamo_vulkan.llm.tokenizer import GGUFTokenizer
        from dynamo_vulkan.llm.models import load_model
        traced = []
        class Sink:
            def dynamo_graph(self, gm): traced.append(1)
            def aot_graph(self, *a): pass
        backend._graph_sinks.append(Sink())
        path, prompt = sys.argv[1], sys.argv[2]
        model, tok = load_model(path, max_ctx={CTX}), GGUFTokenizer.from_file(path)
        res = generate(model, prompt, tok, max_new_tokens={TOKENS}, stop_at_eos=False, warmup=False)
        print(json.dumps({{"tokens": res.tokens, "traced": len(traced), "dynamo": "torch._dynamo" in sys.modules,
                          "stats": dynamo_vulkan.cache_stats()}}))
    """)
    from dynamo_vulkan import device, precompiled
    precompiled.code_hash.cache_clear()      # hashed now, as the new process will
    device._info.clear()                     # the device asked again: its probe stored in this cache
    first, want = _run(files["a"])                       # this process traces and stores
    stats = dynamo_vulkan.cache_stats()
    assert stats["graph"].get("misses", 0) >= 2 and len(_entries(cache_dir)) == 2

    def new_process(prompt: str) -> dict:
        r = subprocess.run([sys.executable, "-c", script, str(files["a"]), prompt], env=dict(os.environ),
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])
    second = new_process(PROMPT)
    assert second["tokens"] == first == want
    assert second["traced"] == 0 and second["dynamo"] is False
    stats = second["stats"]
    assert stats["graph"] == {"disk_hits": 2}
    assert stats["values"] == {"disk_hits": 2}             # no FakeTensorProp
    assert stats["subgroup"] == {"disk_hits": 1}           # no probe pipeline
    assert stats["plan"].get("misses", 0) == 0 and stats["plan"]["disk_hits"] >= 2
    assert stats["spirv"].get("misses", 0) == 0 and stats["spirv"]["disk_hits"] >= 8

    longer = " ".join([PROMPT] * 2)
    model, tok = load_model(files["a"], max_ctx=CTX), GGUFTokenizer.from_file(files["a"])
    assert prompt_bucket(len(tok.encode(longer))) != prompt_bucket(len(tok.encode(PROMPT)))
    eager = generate(model, longer, tok, max_new_tokens=TOKENS, backend=None, stop_at_eos=False)
    third = new_process(longer)
    assert third["tokens"] == eager.tokens
    assert third["traced"] == 0 and third["dynamo"] is False
    # the prompt graph's values for the new length from its expressions; the step's stored
    assert third["stats"]["values"] == {"misses": 1, "from_exprs": 1, "disk_hits": 1}
    assert third["stats"]["plan"]["misses"] >= 1         # the new length planned, specialise skipped

    # the same plans where the planner propagates fake tensors again (as a traced graph does)
    plans = {p.name: p.read_bytes() for p in (cache_dir / "plan").glob("*/*.bin")}
    for p in (cache_dir / "plan").glob("*/*.bin"):
        p.unlink()
    cache.clear_cache(disk=False)
    from dynamo_vulkan.lowering import planner
    monkeypatch.setattr(planner, "_values_fit", lambda gm, args: False)
    model = load_model(files["a"], max_ctx=CTX)
    assert generate(model, longer, tok, max_new_tokens=TOKENS, stop_at_eos=False, warmup=False).tokens == eager.tokens
    again = {p.name: p.read_bytes() for p in (cache_dir / "plan").glob("*/*.bin")}
    assert len(again.keys() & plans.keys()) >= 2 and all(again[k] == plans[k] for k in again.keys() & plans.keys())


def _tiny_graph():
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.placeholder("n")
    y = g.call_function(torch.ops.aten.mul.Tensor, (x, 0.1))
    z = g.call_function(torch.ops.aten.view.default, (y, [n, -1]))
    s = g.call_function(torch.ops.aten.sum.dim_IntList, (z, [1]), {"keepdim": True, "dtype": torch.float32})
    g.output((s, z))
    return fx.GraphModule(torch.nn.Module(), g)


def test_graph_round_trip_with_a_dynamic_size():
    """A graph traced with symbolic sizes is stored with its size symbols and runs, once
    read back, for other sizes too; a static graph's bytes are the same after a round trip."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        return (x * 0.1).view(x.shape[0], -1).sum(1, keepdim=True), x.flip(0)
    traced = make_fx(f, tracing_mode="symbolic")(torch.randn(5, 4, 3))
    blob = graph_to_bytes(traced)
    back, specs = graph_from_bytes(blob)
    assert [isinstance(d, str) for d in specs[0]["shape"]] == [True, True, True]
    assert any(n.target is torch.ops.aten.sym_size.int for n in back.graph.nodes)
    for shape in ((5, 4, 3), (7, 2, 6)):
        x = torch.randn(shape)
        gm, specs = graph_from_bytes(blob)
        propagate_meta(gm, specs, [x])
        assert all("val" in n.meta for n in gm.graph.nodes if n.op != "output")
        for want, got in zip(f(x), gm(x)):
            assert torch.equal(want, got)
    static = _tiny_graph_with_meta()
    again, specs = graph_from_bytes(graph_to_bytes(static))
    propagate_meta(again, specs, [torch.zeros(3, 2), 3])
    assert graph_to_bytes(again) == graph_to_bytes(static)


def test_graph_io_refuses_what_is_not_data():
    gm = _tiny_graph()
    propagate_meta(gm, [{"dtype": "torch.float32", "shape": [3, 2], "stride": [2, 1]}, {"int": 3}],
                   [torch.zeros(3, 2), 3])
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.target = print
    with pytest.raises(GraphFormatError, match="print"):
        graph_to_bytes(gm)
    node.target = torch.ops.aten.mul.Tensor
    node.args = (node.args[0], object())
    with pytest.raises(GraphFormatError, match="cannot be stored"):
        graph_to_bytes(gm)
    good = json.loads(graph_to_bytes(_tiny_graph_with_meta()))
    for bad_target in ("op:aten::no_such_op.default", "builtins.eval", "op:aten::mul"):
        doc = json.loads(json.dumps(good))
        doc["nodes"][2]["target"] = bad_target
        with pytest.raises(GraphFormatError):
            graph_from_bytes(json.dumps(doc).encode())
    with pytest.raises(GraphFormatError):
        graph_from_bytes(b"\x00garbage")
    with pytest.raises(GraphFormatError, match="shape"):
        gm2, specs = graph_from_bytes(json.dumps(good).encode())
        propagate_meta(gm2, specs, [torch.zeros(4, 2), 4])


def _tiny_graph_with_meta():
    gm = _tiny_graph()
    propagate_meta(gm, [{"dtype": "torch.float32", "shape": [3, 2], "stride": [2, 1]}, {"int": 3}],
                   [torch.zeros(3, 2), 3])
    return gm


def test_compile_decoder_is_precompiled_only_for_vulkan():
    model = torch.nn.Linear(2, 2)
    assert isinstance(compile_decoder(model, "vulkan"), Precompiled)
    assert not isinstance(compile_decoder(model, "eager"), Precompiled)



def test_quiet_turns_the_progress_lines_off():
    from dynamo_vulkan.llm.generate import _parser, run_cli
    progress = logging.getLogger("dynamo_vulkan.progress")
    level = progress.level
    try:
        assert _parser().parse_args(["m", "-p", "x", "-q"]).quiet
        assert not _parser().parse_args(["m", "-p", "x"]).quiet
        assert run_cli(0, lambda: 0, quiet=True) == 0 and not progress.isEnabledFor(logging.INFO)
        assert run_cli(0, lambda: 0) == 0 and progress.isEnabledFor(logging.INFO)
    finally:
        progress.setLevel(level)


def test_cold_start_benchmark_times_new_processes(tmp_path, capsys):
    """benchmarks/cold_start.py runs generate in new processes, the first filling the cache,
    and prints each run's times; a run that fails is an error with its output."""
    from dynamo_vulkan.benchmarks import cold_start

    path = write_tiny_model(tmp_path / "m.gguf", "llama", n_layers=1, seed=0)
    assert cold_start.main([str(path), "--runs", "1", "-n", "2", "--cache-dir", str(tmp_path / "c")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0].strip() for ln in lines[1:]] == ["fills the cache", "run 1"], lines
    assert all("first token" in ln and "CPU" in ln for ln in lines[1:])
    with pytest.raises(RuntimeError, match=r"exit 2\).*no-such"):
        cold_start.one_run(str(tmp_path / "no-such.gguf"), 1, dict(os.environ), [])


def test_subgroup_probe_is_stored_and_a_bad_entry_is_measured_again(cache_dir):
    """The subgroup size is probed once per device and driver; a stored answer is used by
    a later process, and one that verifies but is no power of two, or is another device's,
    is measured again and replaced."""
    from dynamo_vulkan import device

    index = device.resolve_index()
    key = device.subgroup_key(index)
    assert key is not None
    device._info.clear()
    cache.reset_stats()
    probed = device.device_info(index)["subgroup_size"]
    assert cache.cache_stats()["subgroup"] == {"misses": 1}
    device._info.clear()
    assert device.device_info(index)["subgroup_size"] == probed
    assert cache.cache_stats()["subgroup"] == {"misses": 1, "disk_hits": 1}
    ident = json.loads(cache.disk_get("subgroup", key))["device"]
    for bad in ({"subgroup_size": 48, "device": ident}, {"subgroup_size": probed, "device": {"name": "other"}},
                {"size": probed}):
        cache.disk_put("subgroup", key, json.dumps(bad).encode())
        device._info.clear()
        assert device.device_info(index)["subgroup_size"] == probed
    assert cache.cache_stats()["subgroup"]["corrupt"] == 3
    assert json.loads(cache.disk_get("subgroup", key))["subgroup_size"] == probed   # replaced


def _flat_values(v) -> list:
    """A node's value as (dtype, shape, strides, offset) per tensor, flattened."""
    if isinstance(v, (list, tuple)):
        return [w for u in v for w in _flat_values(u)]
    if isinstance(v, torch.Tensor):
        return [(v.dtype, tuple(v.shape), v.stride(), v.storage_offset())]
    return [v]


def test_node_values_round_trip_and_refuse_what_does_not_fit():
    """A traced graph's node values (a symbolic size at its traced value) set on the graph
    read back give what propagating fake tensors gives; values that do not fit the graph
    or its arguments are refused."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from dynamo_vulkan.runtime.graph_io import node_values, set_node_values

    def f(x, y):
        a = (x * 0.5).view(x.shape[0], -1)
        m, i = a.max(1)
        return a.t()[1:], m + y, i
    x, y = torch.randn(5, 4, 3), torch.randn(5)
    traced = make_fx(f, tracing_mode="symbolic")(x, y)
    blob = node_values(traced)
    gm, specs = graph_from_bytes(graph_to_bytes(traced))
    set_node_values(gm, specs, [x, y], blob)
    ref, _ = graph_from_bytes(graph_to_bytes(traced))
    propagate_meta(ref, specs, [x, y])

    got = [_flat_values(n.meta.get("val")) for n in gm.graph.nodes if n.op != "output"]
    want = [_flat_values(n.meta.get("val")) for n in ref.graph.nodes if n.op != "output"]
    assert got == want and any(len(v) == 2 for v in got)        # max's pair included
    assert node_values(gm) == blob                               # stored again, the same
    doc = json.loads(blob)
    for broken in (doc["values"][:-1], [{"t": ["torch.float32", [5, 4, 3], [12, 3], 0]}] + doc["values"][1:],
                   [{"t": ["torch.float99", [5, 4, 3], [12, 3, 1], 0]}] + doc["values"][1:],
                   [{"code": "x"}] + doc["values"][1:]):
        with pytest.raises(GraphFormatError):
            set_node_values(gm, specs, [x, y], json.dumps({"format": 1, "values": broken}).encode())
    with pytest.raises(GraphFormatError):           # recorded for 5 rows, called with 6
        set_node_values(gm, specs, [torch.randn(6, 4, 3), torch.randn(6)], blob)
    with pytest.raises(GraphFormatError):
        set_node_values(gm, specs, [x, y], b"\x00not json")


def test_node_value_exprs_give_the_values_propagation_gives_at_every_size():
    """A graph traced with symbolic sizes keeps its node values as expressions of its size
    symbols: evaluated for sizes other than the traced ones they are exactly what
    propagating those sizes' fake tensors gives (views, slices by a floor division, a
    product of two symbolic sizes, a pair of outputs); expressions that name no input's
    size or hold an unknown operation are refused."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from dynamo_vulkan.runtime.graph_io import node_value_exprs, set_node_values

    def f(x, y):
        a = (x * 0.5).view(x.shape[0], -1)
        s = a @ a.t()                                   # (n, n): strides of n
        half = s[: x.shape[0] // 2, 1:]
        m, i = a.max(1)
        return half.t().contiguous(), torch.cat([a, y], 1)[::2], m + 1, i
    traced = make_fx(f, tracing_mode="symbolic")(torch.randn(5, 4, 3), torch.randn(5, 2))
    blob = node_value_exprs(traced)
    sizes = [d for r in json.loads(blob)["values"] if r and "t" in r for d in r["t"][1] + r["t"][2]]
    assert any(isinstance(d, list) for d in sizes) and any(isinstance(d, str) for d in sizes)

    for n in (2, 3, 5, 9, 16):
        args = [torch.randn(n, 4, 3), torch.randn(n, 2)]
        gm, specs = graph_from_bytes(graph_to_bytes(traced))
        set_node_values(gm, specs, args, blob)
        ref, _ = graph_from_bytes(graph_to_bytes(traced))
        propagate_meta(ref, specs, args)
        got = [_flat_values(x.meta.get("val")) for x in gm.graph.nodes if x.op != "output"]
        want = [_flat_values(x.meta.get("val")) for x in ref.graph.nodes if x.op != "output"]
        assert got == want, n
    doc = json.loads(blob)
    sym = next(d for r in doc["values"] if r and "t" in r for d in r["t"][1] if isinstance(d, str))
    for bad in ("s_unknown", ["sqrt", sym], ["//", sym, 0], {"x": 1}):
        broken = json.loads(blob)
        rec = next(r for r in broken["values"] if r and "t" in r and sym in r["t"][1])
        rec["t"][1][rec["t"][1].index(sym)] = bad
        gm, specs = graph_from_bytes(graph_to_bytes(traced))
        with pytest.raises(GraphFormatError):
            set_node_values(gm, specs, [torch.randn(5, 4, 3), torch.randn(5, 2)], json.dumps(broken).encode())


def test_damaged_node_values_are_propagated_again(files, cache_dir):
    """A values entry that verifies but does not fit its graph is refused: the values come
    from the graph's expressions of its sizes, the tokens are eager's, and the entry is
    stored again."""
    want = _run(files["a"])[1]
    entries = sorted((cache_dir / "values").glob("*/*.bin"))
    assert len(entries) == 2
    for e in entries:
        cache.disk_put("values", e.stem, json.dumps({"format": 1, "values": [None]}).encode())
    cache.clear_cache(disk=False)
    before = dict(dynamo_vulkan.cache_stats().get("values", {}))
    got, _ = _run(files["a"])
    assert got == want
    after = dynamo_vulkan.cache_stats()["values"]
    assert after.get("corrupt", 0) - before.get("corrupt", 0) == 2
    assert after.get("from_exprs", 0) - before.get("from_exprs", 0) == 2
    for e in entries:
        assert len(json.loads(cache.disk_get("values", e.stem))["values"]) > 1


def test_a_wholly_supported_graph_is_the_partition_torch_proposes():
    """partition() makes one partition of a graph whose every node Vulkan runs without
    torch's partitioner; that is the partitioner's own proposal there (disconnected parts
    and a tuple-returning op included)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
    from dynamo_vulkan.partition import _Support, partition

    def f(x, y):
        a = torch.ops.aten.mul.Tensor(x, 2.0)
        v, m = torch.ops.aten.var_mean.correction(a, [1], correction=0, keepdim=True)
        return a + v - m, y * 3.0
    gm = make_fx(f)(torch.randn(3, 4), torch.randn(5))
    support = _Support()
    compute = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert all(support.is_node_supported(None, n) for n in compute)
    proposed = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True).propose_partitions()
    assert [sorted(n.name for n in p.nodes) for p in proposed] == [sorted(n.name for n in compute)]
    names = sorted(n.name for n in compute)
    fused, report = partition(gm, 0)
    assert report.partitions == 1 and not report.cpu_nodes
    sub = fused.get_submodule("fused_0")
    assert sorted(n.name for n in sub.graph.nodes if n.op == "call_function") == names
    x, y = torch.randn(3, 4), torch.randn(5)
    for want, got in zip(f(x, y), fused(x, y)):
        assert torch.equal(want, got)


def test_prompt_length_mark_reaches_dynamo_without_the_disk_cache(tmp_path, traces, monkeypatch):
    """generate records the prompt's dynamic length without importing Dynamo
    (precompiled.mark_dynamic); where the call goes through torch.compile (here the disk
    cache is off) Dynamo gets the mark, so a second prompt length is not traced again."""
    from dynamo_vulkan.precompiled import mark_dynamic, signature

    monkeypatch.setenv("DYNAMO_VULKAN_CACHE", "0")
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    t = torch.zeros(1, 5, dtype=torch.int64)
    mark_dynamic(t, 1)
    assert signature([t])[0][0][1] == (1, ("dyn", 2))
    path = write_tiny_model(tmp_path / "m.gguf", "llama", n_layers=1, seed=0)
    model, tok = load_model(path, max_ctx=64), GGUFTokenizer.from_file(path)
    for prompt in (PROMPT, " ".join([PROMPT] * 4)):
        want = generate(model, prompt, tok, max_new_tokens=2, backend=None, stop_at_eos=False)
        got = generate(model, prompt, tok, max_new_tokens=2, stop_at_eos=False, warmup=False)
        assert got.tokens == want.tokens
    assert traces.dynamo == 2          # the prompt's graph (both lengths) and the decode step's


def test_broadcast_shapes_is_torchs_without_its_imports():
    """lowering.core.broadcast_shapes (planning a new size imports no sympy through it)
    gives torch.broadcast_shapes' answer, and raises where it does."""
    import itertools
    from dynamo_vulkan.lowering.core import broadcast_shapes

    dims = [(), (1,), (3,), (0,), (2, 1), (1, 3), (2, 3), (3, 2), (4, 1, 3), (0, 1)]
    for shapes in itertools.chain(itertools.product(dims, repeat=2), itertools.product(dims[:6], repeat=3)):
        try:
            want = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError:
            with pytest.raises(RuntimeError):
                broadcast_shapes(*shapes)
        else:
            assert broadcast_shapes(*shapes) == want, shapes
    assert broadcast_shapes(3, (2, 1)) == (2, 3)
