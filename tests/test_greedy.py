"""Several greedy decode steps per submit (llm/models/greedy.py, generate's steps_per_call):
the same tokens as one step per call of the eager model, one submit per k tokens (one
compiled step replayed k times on the vulkan backend, runtime/replay.py), KV-cache
updates of every step written in place, stop tokens and the context end honoured."""
from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

import dynamo_vulkan  # noqa: E402
gen_mod = importlib.import_module("dynamo_vulkan.llm.generate")   # the module, not the function
from dynamo_vulkan.llm.generate import generate, step_replay  # noqa: E402
from dynamo_vulkan.llm.tokenizer import GGUFTokenizer  # noqa: E402
from dynamo_vulkan.llm.models import load_model  # noqa: E402
from dynamo_vulkan.llm.models.greedy import GreedySteps  # noqa: E402
from dynamo_vulkan.lowering import decompositions  # noqa: E402
from dynamo_vulkan.lowering import planner  # noqa: E402
from dynamo_vulkan.runtime.plan import barriers  # noqa: E402

from gguf_fixtures import write_tiny_model  # noqa: E402
from vk import require_int_dot  # noqa: E402

PROMPT = "hello the world"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("greedy") / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    want = generate(model, PROMPT, tok, max_new_tokens=30, backend=None, stop_at_eos=False)
    return model, tok, want


def _step_plans(plans) -> list:
    """The plans of decode steps (replayed k steps a call: the ones with step_feed)."""
    return [p for p in plans if any("step_feed" in d.name for d in p.dispatches)]


def _submits(fn):
    before = dynamo_vulkan.runtime_stats()["submits"]
    out = fn()
    return out, dynamo_vulkan.runtime_stats()["submits"] - before


def test_the_replayed_step_plan_and_its_levels_row(tiny, tmp_path):
    """generate() with replayed steps leaves the step's plan where the benchmark harness
    finds it (step_plan), and the harness's levels row sets our decode against that many
    barrier levels at the probe's cost each; a decoder never replayed has no plan (no row)."""
    from types import SimpleNamespace

    from dynamo_vulkan.benchmarks.record import Row
    from dynamo_vulkan.benchmarks.suites import llm as llm_suite
    from dynamo_vulkan.benchmarks.timing import Stat
    from dynamo_vulkan.llm.generate import step_plan
    model, tok, _ = tiny
    generate(model, PROMPT, tok, max_new_tokens=8, backend="vulkan", stop_at_eos=False,
             steps_per_call=3, warmup=False)
    plan = step_plan(model)
    assert plan is not None and plan is step_replay(model, "vulkan").replayer.plan
    levels = 1 + sum(barriers(plan.dispatches))
    assert 1 < levels <= len(plan.dispatches)
    rows = []
    bench = SimpleNamespace(probes={"barrier_level": {"us": 2.0}}, add=rows.append)
    dec = Row("llm", "tiny decode", "vulkan", Stat.of([4.0]), work=1, unit="tok/s")
    llm_suite._level_row(bench, SimpleNamespace(decode="tiny decode"), dec, model)
    assert len(rows) == 1 and rows[0].workload == "tiny decode levels"
    assert rows[0].limit == pytest.approx(1e6 / (levels * 2.0))
    assert rows[0].of_limit == pytest.approx(levels * 2.0 / 4000.0)
    assert rows[0].note.startswith(f"{levels} barrier levels ({len(plan.dispatches)} kernels) a step")
    other = load_model(write_tiny_model(tmp_path / "other.gguf", "llama"), max_ctx=24)
    assert step_plan(other) is None
    llm_suite._level_row(bench, SimpleNamespace(decode="other decode"), dec, other)
    assert len(rows) == 1


@pytest.mark.parametrize("k", [3, 4, 3])       # 3 again: k is guarded, never a stale graph
def test_same_tokens_as_one_step_per_call(tiny, k):
    model, tok, want = tiny
    assert want.stop_reason == "context" and len(want.tokens) == 19   # 6 prompt + 18 steps
    replay = step_replay(model, "vulkan")
    binds = replay.binds
    got, submits = _submits(lambda: generate(model, PROMPT, tok, max_new_tokens=30, backend="vulkan",
                                             stop_at_eos=False, steps_per_call=k, warmup=False))
    assert got.tokens == want.tokens
    assert got.stop_reason == "context" and got.decode_steps == 18
    assert replay.why_not is None and k in replay.replayer.programs
    # prefill, the step that binds the replay's inputs (the first call on this decoder
    # only), k-step replays, the last fewer steps (a prefix of the k-step replay)
    bound = replay.binds - binds
    assert submits == 1 + bound + -(-(18 - bound) // k)
    assert (k, (18 - bound) % k) in replay.replayer.prefixes or (18 - bound) % k == 0
    (prog,) = [p for p in replay.replayer.programs.values() if p.plan.outputs[0].shape == (k,)]
    assert len(prog.plan.dispatches) == k * len(replay.replayer.plan.dispatches) + k + 1


def test_a_replay_binds_replaced_weights_again(tmp_path):
    """The replay first on a fresh decoder (its KV caches hold nothing the steps did not
    write: no eager run before it filled them), checked against a second copy run eagerly;
    then each generate() steps once through torch.compile before replaying, so a decoder
    whose weights were replaced since the last call replays with the new ones."""
    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    kw = dict(max_new_tokens=10, stop_at_eos=False, steps_per_call=3, warmup=False)
    first = generate(model, PROMPT, tok, backend="vulkan", **kw)
    assert first.tokens == generate(load_model(path, max_ctx=24), PROMPT, tok, backend=None, **kw).tokens
    head = model.lm_head
    head.blocks = head.blocks.view(head.rows, -1).flip(0).reshape(head.blocks.shape).contiguous()
    want = generate(model, PROMPT, tok, backend=None, **kw)
    assert want.tokens != first.tokens
    got = generate(model, PROMPT, tok, backend="vulkan", **kw)
    assert got.tokens == want.tokens


def test_a_replay_binds_once_while_the_decoder_keeps_its_tensors(tiny):
    model, tok, want = tiny
    replay = step_replay(model, "vulkan")
    kw = dict(max_new_tokens=9, backend="vulkan", stop_at_eos=False, steps_per_call=4, warmup=False)
    assert generate(model, PROMPT, tok, **kw).tokens == want.tokens[:9]
    binds = replay.binds
    got, submits = _submits(lambda: generate(model, PROMPT, tok, **kw))
    assert got.tokens == want.tokens[:9]
    assert replay.binds == binds and submits == 1 + 2     # prefill, 4 + 4 replayed steps


def test_default_steps_fit_the_burst_time(as_gpu, tmp_path):
    """Greedy on a GPU by default: a replay of up to DEFAULT_STEPS_PER_CALL steps, calls
    of as many (a power of two) as fit BURST_S at the last call's time per step."""
    from dynamo_vulkan.llm.generate import BURST_S, DEFAULT_STEPS_PER_CALL

    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    want = generate(model, PROMPT, tok, max_new_tokens=12, backend=None, stop_at_eos=False)
    got = generate(model, PROMPT, tok, max_new_tokens=12, backend="vulkan", stop_at_eos=False)
    assert got.tokens == want.tokens and got.extra["steps_per_call"] == DEFAULT_STEPS_PER_CALL
    replay = step_replay(model, "vulkan")
    assert replay.step_s is not None and list(replay.replayer.programs) == [DEFAULT_STEPS_PER_CALL]
    replay.step_s = BURST_S / 5.5
    assert replay.steps_within(BURST_S, 64) == 4
    replay.step_s = BURST_S / 1000
    assert replay.steps_within(BURST_S, 64) == 64 and replay.steps_within(BURST_S, 48) == 48
    replay.step_s = BURST_S * 3
    assert replay.steps_within(BURST_S, 64) == 1


def test_other_backends_compile_the_k_step_graph(tiny):
    model, tok, want = tiny
    got = generate(model, PROMPT, tok, max_new_tokens=9, backend="eager", stop_at_eos=False,
                   steps_per_call=4, warmup=False)
    assert got.tokens == want.tokens[:9]
    assert "no Vulkan program" in step_replay(model, "eager").why_not


def test_a_step_plan_that_is_not_one_token_in_one_out_is_not_replayed():
    from dynamo_vulkan.runtime.plan import Buffer, Dispatch, InputSpec, OutputSpec, Plan
    from dynamo_vulkan.runtime.replay import NotReplayable, StepPorts, replay_plan, steps_prefix

    plan = Plan(buffers=[Buffer(1, "input", "i32"), Buffer(1, "input", "i32"), Buffer(1, "output", "i32")],
                inputs=[InputSpec(0, "torch.int64", (1, 1), False), InputSpec(1, "torch.int64", (1,), False)],
                outputs=[OutputSpec(2, "torch.int64", (1,))])
    assert StepPorts.of(plan) == StepPorts(token=0, position=1)
    assert replay_plan(plan, 2).inputs[1].shape == (2,)
    plan.dispatches = [Dispatch("k", "key", [0, 1, 2], [0], [], (1, 1, 1)), Dispatch("k", "key", [2], [0], [], (1, 1, 1))]
    three = replay_plan(plan, 3)      # feed, 2 dispatches, feed, 2, feed, 2, feed
    assert [d.name for d in steps_prefix(three, 2)] == ["step_feed", "k", "k"] * 2 + ["step_feed"]
    assert [d.spec for d in steps_prefix(three, 1) if d.name == "step_feed"] == [[0, 3], [1, 3]]
    with pytest.raises(ValueError, match="no prefix of 3"):
        steps_prefix(three, 3)
    with pytest.raises(ValueError, match="k >= 1"):
        replay_plan(plan, 0)
    two_out = Plan(buffers=plan.buffers, inputs=plan.inputs, outputs=plan.outputs * 2)
    with pytest.raises(NotReplayable, match="one token"):
        StepPorts.of(two_out)
    three_in = Plan(buffers=plan.buffers + [Buffer(4, "input", "f32")],
                    inputs=plan.inputs + [InputSpec(3, "torch.float32", (4,), False)], outputs=plan.outputs)
    with pytest.raises(NotReplayable, match=r"takes \[\(1, 1\), \(1,\), \(4,\)\]"):
        StepPorts.of(three_in)


def test_stop_token_inside_a_chunk(tiny):
    model, tok, want = tiny
    stop = want.tokens[5]
    first = want.tokens.index(stop)
    saved = tok.stop_ids
    tok.stop_ids = set(saved) | {stop}
    try:
        got = generate(model, PROMPT, tok, max_new_tokens=30, backend="vulkan", steps_per_call=4)
    finally:
        tok.stop_ids = saved
    assert got.tokens == want.tokens[:first] and got.stop_reason == "stop_token"


def test_every_steps_cache_update_is_in_place(tiny):
    """k decode steps update each cache k times; each update is a scatter into the
    cache's buffer (planner.in_place_updates), not a copy of the whole cache."""
    from torch._dynamo.backends.common import aot_autograd

    from dynamo_vulkan.regions import inline_regions
    model, _, _ = tiny
    graphs = []
    backend = aot_autograd(fw_compiler=lambda gm, example: graphs.append(gm) or gm,
                           decompositions=decompositions(), keep_inference_input_mutations=True)
    k = 3
    with torch.no_grad():
        torch.compile(GreedySteps(model), backend=backend, dynamic=False)(
            torch.tensor([[5]]), GreedySteps.positions(4, k))
    (gm,) = graphs
    inline_regions(gm)      # the layers are nested compile regions; the backend inlines them
    updates = [n for n in gm.graph.nodes if n.target is torch.ops.aten.index_put.default]
    assert len(updates) == 2 * len(model.layers) * k
    assert planner.in_place_updates(gm) == set(updates)


def test_bad_settings(tiny):
    model, tok, _ = tiny
    with pytest.raises(ValueError, match="greedy"):
        generate(model, PROMPT, tok, max_new_tokens=4, temperature=0.8, steps_per_call=4, backend="vulkan")
    with pytest.raises(ValueError, match=">= 1"):
        generate(model, PROMPT, tok, max_new_tokens=4, steps_per_call=0, backend="vulkan")
    with pytest.raises(ValueError, match=">= 1"):
        GreedySteps.positions(3, 0)


def test_repeated_dispatches_share_one_algorithm(tiny):
    """Dispatches of the same kernel, constants and buffers (every replayed copy of the
    step) record one kp algorithm, whose pipeline and descriptor set cost GPU memory; the
    replay shares its step program's algorithms and buffers instead of holding copies;
    and the tokens stay right."""
    model, tok, want = tiny
    got = generate(model, PROMPT, tok, max_new_tokens=8, backend="vulkan", stop_at_eos=False,
                   steps_per_call=6, warmup=False)
    assert got.tokens == want.tokens[:8]
    replay = step_replay(model, "vulkan")
    multi, step = replay.replayer.programs[6], replay.replayer.step_program
    keys = {(d.spirv_key, tuple(d.spec), tuple(d.bindings), tuple(d.groups)) for d in multi.plan.dispatches}
    assert keys <= set(multi._algorithms) and len(keys) < len(multi.plan.dispatches)
    assert multi._algorithms is step._algorithms
    assert all(multi.tensors[b] is t for b, t in enumerate(step.tensors) if t is not None)
    assert step.sequence is None        # released (its command pool), recorded when next run


def test_a_released_step_program_runs_again_when_binding(tmp_path):
    """A decoder with a tensor more than the replay bound binds again: one step through
    torch.compile, whose program (released once the replay was built) records its
    sequence anew, and the tokens stay eager's."""
    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    kw = dict(max_new_tokens=10, stop_at_eos=False, steps_per_call=3, warmup=False)
    want = generate(load_model(path, max_ctx=24), PROMPT, tok, backend=None, **kw)
    assert generate(model, PROMPT, tok, backend="vulkan", **kw).tokens == want.tokens
    replay = step_replay(model, "vulkan")
    assert replay.replayer.step_program.sequence is None
    model.register_buffer("unused_extra", torch.zeros(1))
    binds = replay.binds
    assert generate(model, PROMPT, tok, backend="vulkan", **kw).tokens == want.tokens
    assert replay.binds == binds + 1 and replay.replayer.step_program.sequence is None


def test_default_steps_per_call(monkeypatch):
    """k steps per submit where a GPU's submit round trip is paid: greedy, Vulkan, a GPU."""
    from dynamo_vulkan import device
    from dynamo_vulkan.llm.generate import DEFAULT_STEPS_PER_CALL, default_steps_per_call

    info = device.device_info()
    monkeypatch.setitem(info, "device_type", "PHYSICAL_DEVICE_TYPE_CPU")
    assert default_steps_per_call("vulkan", 0.0) == 1
    monkeypatch.setitem(info, "device_type", "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU")
    assert default_steps_per_call("vulkan", 0.0) == DEFAULT_STEPS_PER_CALL > 1
    assert default_steps_per_call("vulkan", 0.7) == 1
    assert default_steps_per_call("eager", 0.0) == default_steps_per_call(None, 0.0) == 1


@pytest.mark.parametrize("arch", ["llama", "llama v apart", "gemma3"])
def test_same_tokens_with_the_gpu_decode_fusions(as_gpu, plans, tmp_path, arch):
    """Planned as for a GPU, decode gets the fusions lavapipe does not (q's RoPE and the
    step's K/V cache rows computed in the attention, beside the scatters; Gemma's post
    norms, and its q and k norms over each head, in the mat-vecs): k steps per call still
    give eager's tokens."""
    # Gemma's k of another type than q and v: three mat-vecs, not one of q|k|v
    types = {f"blk.{i}.attn_k.weight": "Q4_0" for i in (0, 1)} if arch == "gemma3" else None
    v_apart = arch == "llama v apart"     # Q4_K_M's way: one q|k product, v of its own
    if v_apart:
        arch, types = "llama", {"blk.0.attn_v.weight": "Q8_0", "blk.1.attn_k.weight": "Q5_1"}
    path = write_tiny_model(tmp_path / "tiny.gguf", arch, types=types)
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    if v_apart:
        assert all(layer.attn.qk is not None and layer.attn.qkv is None for layer in model.layers)
    want = generate(model, PROMPT, tok, max_new_tokens=12, backend=None, stop_at_eos=False)
    got = generate(model, PROMPT, tok, max_new_tokens=12, backend="vulkan", stop_at_eos=False,
                   steps_per_call=4, warmup=False)
    assert got.tokens == want.tokens
    notes = [d.note for p in plans for d in p.dispatches]
    assert any("the step's k/v rows computed here" in n for n in notes)
    if arch == "gemma3":
        assert any("post-norm by the last workgroup" in n for n in notes)
        # the decode steps' q and k norms (head dim 64, two layers): the mat-vecs' grouped
        # post-norms, no rowwise kernel of their own
        steps = _step_plans(plans)
        for p in steps:
            grouped = sum("rms_norm of each 64 " in d.note for d in p.dispatches)
            assert grouped == 2 * sum(d.name == "attention" for d in p.dispatches) > 0   # q's, k's
            assert not any(d.name == "rowwise:rms_norm" for d in p.dispatches)
        assert steps


def test_qwen2_biases_are_added_by_the_decode_matvecs(as_gpu, plans, tmp_path):
    """Qwen2's q, k and v biases: each decode mat-vec adds its bias as it writes (a
    residual of one row), no elementwise kernel of their own; eager's tokens."""
    from gguf_fixtures import write_arch_model
    path = write_arch_model(tmp_path / "tiny-qwen2.gguf", "qwen2")
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    want = generate(model, PROMPT, tok, max_new_tokens=8, backend=None, stop_at_eos=False)
    got = generate(model, PROMPT, tok, max_new_tokens=8, backend="vulkan", stop_at_eos=False,
                   steps_per_call=2, warmup=False)
    assert got.tokens == want.tokens
    steps = _step_plans(plans)
    for p in steps:
        attention = sum(d.name == "attention" for d in p.dispatches)
        biased = [d.note for d in p.dispatches
                  if d.name.startswith("gguf_matvec") and d.note.endswith("+ residual")]
        assert len(biased) >= 3 * attention > 0, biased      # q, k and v of each layer
        assert not any(d.name.startswith("elementwise") and d.note.endswith("<- $0 + $1")
                       for d in p.dispatches), [d.note for d in p.dispatches]
    assert steps


def test_a_second_generate_reuses_the_compiled_graphs(plans, tmp_path):
    """generate() without `compiled` compiles a decoder once per backend: a second call
    (a chat's next turn) lowers no graph again and gives the same tokens."""
    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=24), GGUFTokenizer.from_file(path)
    first = generate(model, PROMPT, tok, max_new_tokens=9, stop_at_eos=False, steps_per_call=4)
    lowered = len(plans)
    assert lowered > 0
    second = generate(model, PROMPT, tok, max_new_tokens=9, stop_at_eos=False, steps_per_call=4)
    assert second.tokens == first.tokens
    assert len(plans) == lowered, "the second call lowered its graphs again"
    assert second.extra["compiled"] is first.extra["compiled"]


def _layer_types(q, k, v, o, gate, up, down, head) -> dict:
    return {f"blk.{i}.{t}.weight": name for i in (0, 1) for t, name in (
        ("attn_q", q), ("attn_k", k), ("attn_v", v), ("attn_output", o), ("ffn_gate", gate),
        ("ffn_up", up), ("ffn_down", down))} | {"output.weight": head}


# the legacy types, and a Q4_K_M file's (Q4_K, with Q6_K for v, down and the head)
INT_DOT_TYPES = [_layer_types("Q4_0", "Q4_0", "Q8_0", "Q4_1", "Q4_1", "Q4_1", "Q8_0", "Q4_1"),
                 _layer_types("Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K")]


def _int_dot_tokens_as_eager(tmp_path, monkeypatch, types, precision: str, max_ctx: int) -> None:
    """A tiny llama of these weight types with DYNAMO_VULKAN_INT_DOT=on under `precision`
    generates eager's tokens, 4 steps a call."""
    require_int_dot()
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "on")
    monkeypatch.setenv("DYNAMO_VULKAN_MATMUL_PRECISION", precision)
    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama", types=types)
    model, tok = load_model(path, max_ctx=max_ctx), GGUFTokenizer.from_file(path)
    want = generate(model, PROMPT, tok, max_new_tokens=12, backend=None, stop_at_eos=False)
    got = generate(model, PROMPT, tok, max_new_tokens=12, backend="vulkan", stop_at_eos=False,
                   steps_per_call=4, warmup=False)
    assert got.tokens == want.tokens


@pytest.mark.parametrize("precision", ["highest", "high"])
@pytest.mark.parametrize("types", INT_DOT_TYPES, ids=["legacy", "k_quants"])
def test_same_tokens_with_integer_dot_products(as_gpu, plans, tmp_path, monkeypatch, types,
                                               precision):
    """DYNAMO_VULKAN_INT_DOT=on, planned as for a GPU: every decode mat-vec of the types it
    decodes reads x's int8 planes (three, or two under matmul precision "high"), made once
    per x with the RMSNorm or silu(gate) * up folded in, across k steps per call and their
    in-place cache writes; eager's tokens."""
    _int_dot_tokens_as_eager(tmp_path, monkeypatch, types, precision, max_ctx=24)
    notes = [d.note for p in plans for d in p.dispatches if d.name.startswith("gguf_xplanes")]
    assert any(n.startswith("rms_norm + ") for n in notes), notes
    assert any(n.startswith("elementwise + ") for n in notes), notes
    assert all(n.endswith(f"as {3 if precision == 'highest' else 2} int8 planes") for n in notes), notes
    idot = [d for p in plans for d in p.dispatches if d.name.startswith("gguf_matvec_idot")]
    assert len(idot) >= 7 * 2 * 4, len(idot)     # 7 weights a layer, 2 layers, 4 steps


@pytest.mark.parametrize("types", INT_DOT_TYPES, ids=["legacy", "k_quants"])
def test_same_tokens_with_the_output_projection_reading_attentions_planes(
        as_gpu, plans, tmp_path, monkeypatch, types):
    """A cache long enough for decode attention to split its keys: each head's merge writes
    its output's int8 planes, and the output projection takes integer dots from them with
    no planes kernel of its own; eager's tokens across k steps per call."""
    _int_dot_tokens_as_eager(tmp_path, monkeypatch, types, "high", max_ctx=80)
    merged = [d.note for p in plans for d in p.dispatches
              if d.name.startswith("attention") and "int8 planes" in d.note]
    assert len(merged) >= 2 * 4, [d.note for p in plans for d in p.dispatches if d.name.startswith("attention")]
    steps = _step_plans(plans)
    for p in steps:
        # each step's mask ranges (one kernel for both layers' split attention) join a
        # level before its first attention's, which then waits for its q only
        names, waits = [d.name for d in p.dispatches], barriers(p.dispatches)
        ranges = [i for i, n in enumerate(names) if n == "mask_ranges"]
        assert ranges and names.count("attention") == 2 * len(ranges), names
        for r in ranges:
            at = names.index("attention", r)
            assert not waits[r] and any(waits[r + 1:at]), names
    assert steps


def test_cpu_device_runs_a_prompt_on_the_host_and_decodes_on_vulkan(tiny, as_cpu, monkeypatch):
    """On a CPU device with DYNAMO_VULKAN_CPU_MATMUL=host (its default) a prompt's products
    and attention run in torch, the decode steps' mat-vecs on Vulkan, and the caches that
    the two graphs share stay consistent: the same tokens as eager."""
    model, tok, _ = tiny
    prompt = "hello the world " * 3
    want = generate(model, prompt, tok, max_new_tokens=6, backend=None, stop_at_eos=False)
    assert len(want.prompt_tokens) >= 9
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "host")
    n = len(dynamo_vulkan.reports())
    got = generate(model, prompt, tok, max_new_tokens=6, stop_at_eos=False, steps_per_call=1)
    assert got.tokens == want.tokens
    reps = dynamo_vulkan.reports()[n:]
    host = {d.op for r in reps for d in r.cpu_nodes}
    assert any("gguf_linear" in op for op in host) and any("attention" in op for op in host), host
    assert any("gguf_linear" in d.op for r in reps for d in r.vulkan_nodes)     # the decode's


def test_prompts_of_many_lengths_share_one_graph(tmp_path, monkeypatch, plans):
    """A chat's turns bring prompts of new lengths: they share one graph of symbolic
    length (Dynamo's recompile limit of 8 otherwise left the ninth length uncompiled),
    entirely on Vulkan, and each gives eager's tokens. Prompts are padded to
    prompt_bucket's lengths, so a program is built per bucket, not per length."""
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")     # prompts on Vulkan here too
    monkeypatch.setattr(gen_mod, "PROMPT_STEP_MIN", 2)    # many buckets in a short context
    path = write_tiny_model(tmp_path / "tiny-llama.gguf", "llama")
    model, tok = load_model(path, max_ctx=48), GGUFTokenizer.from_file(path)
    n = len(dynamo_vulkan.reports())
    lengths = set()
    for words in range(1, 12):
        prompt = "hello " * words
        want = generate(model, prompt, tok, max_new_tokens=3, backend=None, stop_at_eos=False)
        got = generate(model, prompt, tok, max_new_tokens=3, stop_at_eos=False, steps_per_call=1)
        assert got.tokens == want.tokens, prompt
        lengths.add(len(got.prompt_tokens))
    assert len(lengths) >= 10, lengths
    buckets = {gen_mod.prompt_bucket(t, model.max_ctx) for t in lengths}
    assert 4 <= len(buckets) < len(lengths), (buckets, lengths)
    reps = dynamo_vulkan.reports()[n:]
    # the prompt's graph of any length, the decode step's
    assert len(reps) == 2, f"{len(reps)} graphs compiled for {len(lengths)} prompt lengths"
    assert not [d for r in reps for d in r.cpu_nodes], "a node ran on the CPU"
    # one prefill program per bucket (the decode step's programs have 1-token inputs)
    prefill = {i.shape for p in plans for i in p.inputs
               if "int64" in i.dtype and len(i.shape) == 2 and i.shape[0] == 1 and i.shape[1] > 1}
    assert len(prefill) == len(buckets), (prefill, buckets)


def test_prompt_bucket_lengths():
    """Padded lengths: never shorter, within the context, multiples of 8 up to 64, then
    4 an octave (under 25% padding), and few of them."""
    b = gen_mod.prompt_bucket
    assert [b(n) for n in (1, 8, 9, 64, 65, 80, 81, 128, 129, 1000)] == \
        [8, 8, 16, 64, 80, 80, 96, 128, 160, 1024]
    for n in range(1, 5000):
        assert n <= b(n) and (b(n) - n < 8 or (b(n) - n) / n < 0.25), n
        assert b(n, 100) == max(n, min(b(n), 100))
    assert len({b(n) for n in range(1, 4097)}) == 8 + 4 * 6


def test_padded_prompt_gives_the_unpadded_logits_and_steps(tiny):
    """Decoder.forward with `last`: a prompt padded at its end gives its last real token's
    logits, and the decode steps after it those after the unpadded prompt (the padding's
    cache slots are rewritten before any query sees them)."""
    model, tok, _ = tiny
    ids = tok.encode("hello the world hello")
    pad = torch.tensor([ids + [ids[-1]] * 5])
    with torch.no_grad():
        want = model(torch.tensor([ids]), 0)
        want_step = model(torch.tensor([[7]]), torch.tensor(len(ids)))
        got = model(pad, 0, last=len(ids) - 1)
        got_step = model(torch.tensor([[7]]), torch.tensor(len(ids)))
        got_t = model(pad, torch.tensor(0), last=torch.tensor(len(ids) - 1))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_t, want)
    torch.testing.assert_close(got_step, want_step)
    with pytest.raises(ValueError, match=f"last must index one of the {len(ids) + 5} tokens"):
        model(pad, 0, last=len(ids) + 5)


def test_warm_up_records_the_sequences_the_calls_take(tiny):
    """With the warm-up, the replay's sequences of the calls' step counts (k, and the last
    call's remainder) are recorded before the timed steps, which then record none."""
    from dynamo_vulkan.replay import StepReplayer

    model, tok, want = tiny
    recorded = []
    prepare, prefix = StepReplayer.prepare, StepReplayer._prefix

    def timed_prefix(self, k, n):
        if (k, n) not in self.prefixes and n not in (0, k):
            recorded.append((k, n))
        return prefix(self, k, n)
    StepReplayer._prefix = timed_prefix
    StepReplayer.prepare = lambda self, k, n: prefix(self, k, n)   # the warm-up's, not counted
    try:
        got = generate(model, PROMPT, tok, max_new_tokens=12, backend="vulkan", stop_at_eos=False,
                       steps_per_call=4)
    finally:
        StepReplayer._prefix, StepReplayer.prepare = prefix, prepare
    assert got.tokens == want.tokens[:12]
    assert (4, 3) in step_replay(model, "vulkan").replayer.prefixes      # 11 steps: 4 + 4 + 3
    assert recorded == [], f"timed calls recorded {recorded}"
