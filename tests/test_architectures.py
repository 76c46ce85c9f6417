"""Every GGUF architecture the loader supports against llama.cpp's own logits.

Each architecture of gguf_fixtures.ARCH_MODELS is written as a tiny random-weight GGUF
file in two variants: every tensor F32 (llama.cpp then computes in fp32, with an F32 KV
cache, so its logits and ours agree to rounding: the architecture's wiring is checked
tightly) and with mixed quant types (llama.cpp quantizes activations to 8 bits for
quantized weights, so those logits agree to about a percent). llama.cpp's CPU backend
(the peer package in ../shared/peers/llama-cpp, run in a subprocess so its ggml stays out
of this process) evaluates the same token ids; its logits are also kept in
tests/data/arch_logits.json with each file's sha256, so the comparison runs where the
peer is absent, and a fixture that changed is caught. DYNAMO_VULKAN_UPDATE_ARCH_LOGITS=1
(with the peer present) rewrites that file.

Also here: the attention kernel's logit soft-cap against the eager op, and the range
checks of the metadata the loader reads (issue 30).
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gguf")

from dynamo_vulkan import device  # noqa: E402
from dynamo_vulkan.fused import attention  # noqa: E402
from dynamo_vulkan.gguf import GGUFError  # noqa: E402
from dynamo_vulkan.llm.reader import open_gguf  # noqa: E402
from dynamo_vulkan.lowering import attention as att_lowering  # noqa: E402
from dynamo_vulkan.llm.models import load_model  # noqa: E402
from gguf_fixtures import ARCH_MODELS, run_peer, write_arch_model  # noqa: E402
from vk import check  # noqa: E402

STORED = Path(__file__).resolve().parent / "data" / "arch_logits.json"
UPDATE = os.environ.get("DYNAMO_VULKAN_UPDATE_ARCH_LOGITS") == "1"
TOKENS = [5, 60, 7, 80, 9, 100, 11, 40, 200, 3]  # longer than the fixtures' sliding windows
VARIANTS = ("f32", "quant")
# |ours - llama.cpp| <= REL * max|llama.cpp's logits|: fp32 rounding for F32 files (gemma's
# GELU: llama.cpp's CPU backend reads it from an fp16 table), 8-bit activations otherwise
REL = {"f32": 1e-4, "f32-gelu": 1e-3, "quant": 4e-2}
# compiled too: fused q|k|v and gate|up with LongRoPE tables, soft-capped attention, norms
# over whole projections and no pre norms (with sliding windows), granite's multipliers,
# YaRN tables, Llama 4's attention temperature (qwen2's
# biased and qwen3's normed projections are the kernels llama's and gemma3's tests compile)
COMPILED = ("phi3", "gemma2", "olmo3", "granite", "qwen2-yarn", "mistral3-temp")

# run by the peer's Python in a subprocess: jobs [{path, tokens}] on stdin, base64
# float32 logits [T, vocab] of each on stdout; YaRN's betas from the file where the
# architecture reads them, as llama-cli does (llama-cpp-python's defaults would force 32/1)
LLAMACPP_SCRIPT = r"""
import base64, json, sys
import numpy as np
import llama_cpp
out = {}
for job in json.load(sys.stdin):
    llm = llama_cpp.Llama(model_path=job["path"], n_gpu_layers=0, logits_all=True, n_ctx=256, n_batch=256,
                          n_threads=2, type_k=0, type_v=0, yarn_beta_fast=-1.0, yarn_beta_slow=-1.0, verbose=False)
    llm.eval(job["tokens"])
    s = np.ascontiguousarray(np.asarray(llm.scores[:len(job["tokens"])], dtype=np.float32))
    out[job["path"]] = base64.b64encode(s.tobytes()).decode()
    del llm
json.dump(out, sys.stdout)
"""


def _variant_rel(name: str, variant: str) -> float:
    if variant == "f32" and ARCH_MODELS[name]["arch"].startswith("gemma"):
        return REL["f32-gelu"]
    return REL[variant]


def _max_ctx(name: str) -> int:
    return ARCH_MODELS[name].get("max_ctx", 32)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _decode(b64: str, dtype: str, shape) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(base64.b64decode(b64), dtype=dtype).astype(np.float32).reshape(shape))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch")
    return {(n, v): write_arch_model(d / f"{n}-{v}.gguf", n, quantized=v == "quant")
            for n in ARCH_MODELS for v in VARIANTS}


@pytest.fixture(scope="module")
def live(files, tmp_path_factory):
    """llama.cpp's logits of every file, or None where the peer is absent."""
    got = run_peer(LLAMACPP_SCRIPT, lambda: [{"path": str(p), "tokens": TOKENS} for p in files.values()],
                   tmp_path_factory.mktemp("llamacpp"), "DYNAMO_VULKAN_UPDATE_ARCH_LOGITS", timeout=300)
    if got is None:
        return None
    return {key: _decode(got[str(p)], "float32", (len(TOKENS), -1)) for key, p in files.items()}


@pytest.fixture(scope="module")
def stored(files, live):
    """tests/data/arch_logits.json (rewritten from the live logits with UPDATE)."""
    if UPDATE:
        models = {}
        for (n, v), p in files.items():
            dtype = "float32" if v == "f32" else "float16"  # the quant tolerance is far above fp16's
            models[f"{n}/{v}"] = {"sha256": _sha256(p), "dtype": dtype, "shape": list(live[n, v].shape),
                                  "logits": base64.b64encode(live[n, v].numpy().astype(dtype).tobytes()).decode()}
        STORED.write_text(json.dumps({"tokens": TOKENS, "models": models}, indent=1) + "\n")
    return json.loads(STORED.read_text())


def _reference(files, live, stored, name, variant) -> torch.Tensor:
    """llama.cpp's logits of the file: live where the peer runs, else the stored ones;
    the stored entry must be of this very file (its sha256) either way."""
    entry = stored["models"].get(f"{name}/{variant}")
    assert entry is not None and stored["tokens"] == TOKENS, \
        f"{STORED.name} has no logits of {name}/{variant}: rerun with DYNAMO_VULKAN_UPDATE_ARCH_LOGITS=1"
    digest = _sha256(files[name, variant])
    assert entry["sha256"] == digest, (
        f"the {name}/{variant} fixture changed (sha256 {digest}, {STORED.name} has {entry['sha256']}): "
        f"rerun with DYNAMO_VULKAN_UPDATE_ARCH_LOGITS=1 and the llama.cpp peer present")
    kept = _decode(entry["logits"], entry["dtype"], entry["shape"])
    if live is None:
        return kept
    ref = live[name, variant]
    # the kept logits are this llama.cpp's (float16-rounded for the quantized files)
    torch.testing.assert_close(kept, ref, rtol=0, atol=2e-3 * float(ref.abs().max()))
    return ref


def _compare(got: torch.Tensor, ref: torch.Tensor, rel: float, what: str) -> None:
    """Values within rel * max|ref|; argmax equal wherever llama.cpp's top two are further
    apart than twice that (every position of the fp32 files, whose fixtures are checked
    to have such gaps; with 8-bit activations some positions are too close to call), and
    ours within the tolerance of llama.cpp's top logit elsewhere."""
    assert got.shape == ref.shape, f"{what}: shape {list(got.shape)}, llama.cpp {list(ref.shape)}"
    atol = rel * float(ref.abs().max())
    err = (got - ref).abs()
    assert float(err.max()) <= atol, \
        f"{what}: max |ours - llama.cpp| = {float(err.max()):.3g} at {divmod(int(err.argmax()), ref.shape[1])}, " \
        f"allowed {atol:.3g}"
    top2 = ref.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > 2 * atol
    if rel < REL["quant"]:
        assert bool(decided.all()), f"{what}: the fixture's top two logits are too close to decide argmax"
    same = got.argmax(-1) == ref.argmax(-1)
    assert bool(same[decided].all()), f"{what}: argmax differs at positions {(~same & decided).nonzero().tolist()}"
    ours_top = ref.gather(1, got.argmax(-1, keepdim=True))[:, 0]
    assert bool((top2[:, 0] - ours_top <= 2 * atol).all()), f"{what}: our argmax is not among llama.cpp's top"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", list(ARCH_MODELS))
def test_eager_matches_llamacpp(files, live, stored, name, variant):
    ref = _reference(files, live, stored, name, variant)
    m = load_model(files[name, variant], max_ctx=_max_ctx(name))
    got = m(torch.tensor([TOKENS]), 0, all_logits=True)[0]
    _compare(got, ref, _variant_rel(name, variant), f"{name}/{variant} eager")


@pytest.mark.parametrize("name", COMPILED)
def test_compiled_matches_llamacpp(files, live, stored, name, monkeypatch):
    """The quantized file compiled for Vulkan (our kernels, prompts included): equal to
    eager at fp32 tolerance, and to llama.cpp as eager is."""
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    ref = _reference(files, live, stored, name, "quant")
    m = load_model(files[name, "quant"], max_ctx=_max_ctx(name))
    eager = m(torch.tensor([TOKENS]), 0, all_logits=True)[0]
    m.reset_cache()
    got = torch.compile(m, backend="vulkan", dynamic=False)(torch.tensor([TOKENS]), torch.tensor(0),
                                                            all_logits=True)[0]
    torch.testing.assert_close(got, eager, rtol=0, atol=1e-4 * float(eager.abs().max()))
    _compare(got, ref, REL["quant"], f"{name} compiled")


# ---------------------------------------------------------------------- configurations


def test_configs_follow_llamacpp(files):
    cfg = {n: load_model(files[n, "f32"], max_ctx=_max_ctx(n)).config for n in ARCH_MODELS}
    assert not cfg["llama3"].rope_neox and cfg["llama3"].rope_factors == "rope_freqs.weight"
    assert cfg["mistral"].head_dim == 32 and cfg["mistral"].sliding_window == [None, None]
    assert cfg["mistral"].rope_freq_scale == [0.5, 0.5]
    assert cfg["qwen2"].qkv_bias and cfg["qwen2"].rope_neox and cfg["qwen2"].tied_embeddings
    assert cfg["qwen3"].qk_norm and not cfg["qwen3"].qkv_bias and cfg["qwen3"].head_dim == 48
    p = cfg["phi3"]
    assert p.fused_qkv and p.fused_gate_up and p.sliding_window == [None, None]
    assert p.rope_factors_for(32) == "rope_factors_short.weight"
    assert p.rope_attn_factor == pytest.approx(1.19)
    assert cfg["phi3-long"].rope_factors_for(300) == "rope_factors_long.weight"
    assert not cfg["phi3-long"].fused_qkv
    g = cfg["gemma2"]
    assert g.sliding_window == [4, None, 4] and g.attn_softcap == 1.5 and g.final_logit_softcap == 6.0
    assert g.attn_scale == pytest.approx(1 / math.sqrt(32)) and g.post_norms and not g.qk_norm
    o = cfg["olmo2"]
    assert o.rope_neox and o.qk_norm and o.qk_norm_whole and not o.pre_norms and o.post_norms
    assert not o.tied_embeddings and o.rope_yarn is None
    o3 = cfg["olmo3"]
    assert o3.sliding_window == [3, 3, 3, None] and o3.rope_base == [500000.0] * 4
    assert o3.rope_freq_scale == [1.0, 1.0, 1.0, 0.125] and o3.swa_rope_plain and o3.rope_yarn.orig_context == 2048
    gr = cfg["granite"]
    assert not gr.rope_neox and gr.embed_scale == 6.0 and gr.logit_scale == 4.0
    assert gr.residual_scale == pytest.approx(0.3) and gr.attn_scale == pytest.approx(0.09)
    y = cfg["qwen2-yarn"]
    assert y.rope_freq_scale == [0.25, 0.25] and y.rope_yarn.orig_context == 4096
    assert (y.rope_yarn.beta_fast, y.rope_yarn.beta_slow, y.rope_yarn.ext_factor) == (32.0, 1.0, 1.0)
    ly = cfg["llama-yarn"]
    assert ly.rope_yarn.orig_context == 2048 and ly.rope_attn_factor == pytest.approx(0.9) and not ly.rope_neox
    assert cfg["qwen2"].rope_yarn is None and cfg["mistral"].rope_yarn is None
    m3 = cfg["mistral3"]
    assert not m3.rope_neox and m3.head_dim == 32 and m3.attn_temp_scale == 0.0
    assert (m3.rope_yarn.beta_fast, m3.rope_yarn.beta_slow, m3.rope_yarn.log_mul) == (8.0, 4.0, 1.0)
    assert y.rope_yarn.log_mul == 0.0   # read for mistral3 only, as llama.cpp does
    mt = cfg["mistral3-temp"]
    assert mt.attn_temp_scale == 0.5 and mt.attn_temp_length == 3 and mt.rope_yarn is None


def test_yarn_tables_follow_ggml():
    """The ramp and magnitude of YaRN tables, computed by hand for one case: rot 16, base
    10000, original context 4096, factor 4 (ggml's corr dims: floor(2.62) = 2 and
    ceil(5.63) = 6)."""
    from dynamo_vulkan.llm.models.config import YarnScaling
    from dynamo_vulkan.llm.models.decoder import rope_tables, yarn_ramp

    yarn = YarnScaling(orig_context=4096)
    ramp = yarn_ramp(yarn, 10000.0, 16)
    torch.testing.assert_close(ramp, torch.tensor([1, 1, 1, .75, .5, .25, 0, 0], dtype=torch.float64))
    cos, sin = rope_tables(10000.0, 0.25, 16, 5, yarn=yarn)
    inv = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    ang = torch.arange(5, dtype=torch.float64)[:, None] * inv * (0.25 * (1 - ramp) + ramp)
    mscale = 1 + 0.1 * math.log(4)
    torch.testing.assert_close(cos, (torch.cos(ang) * mscale).float())
    torch.testing.assert_close(sin, (torch.sin(ang) * mscale).float())


def test_phi3_picks_long_factors_past_the_original_context(files):
    """llama.cpp's choice is by context size: the same file with a KV cache within the
    original context (128) takes the short factors, and gives other logits."""
    short = load_model(files["phi3-long", "f32"], max_ctx=64)
    long = load_model(files["phi3-long", "f32"], max_ctx=300)
    assert not torch.equal(short.rotary["r0"].cos, long.rotary["r0"].cos[:64])


# ---------------------------------------------------------------------- the soft-cap kernel


def _capped_reference(q, k, v, mask, scale, cap):
    """Written independently of the op, in float64."""
    g = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(g, 0).double(), v.repeat_interleave(g, 0).double()
    s = (q.double() @ k.transpose(1, 2)) * scale
    s = torch.tanh(s / cap) * cap
    return (torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v).float()


# (query heads, kv heads, query rows, keys, head dim, value dim): a prompt, decode rows
# over several chunks of keys (split across workgroups when planned as a GPU), odd dims
SOFTCAP_CASES = [(8, 2, 5, 40, 32, 32), (9, 3, 1, 700, 64, 64), (2, 1, 1, 1, 3, 5),
                 (4, 4, 3, 37, 7, 9), (6, 2, 1, 300, 16, 16)]


@pytest.mark.parametrize("plan_as", ["device", "as_gpu"])
@pytest.mark.parametrize("hq,hkv,t,c,d,dv", SOFTCAP_CASES, ids=str)
def test_attention_softcap_kernel(request, plans, plan_as, hq, hkv, t, c, d, dv):
    if plan_as != "device":
        request.getfixturevalue(plan_as)
    g = torch.Generator().manual_seed(hq * 1000 + c)
    q, k, v = (torch.randn(s, generator=g) * 3 for s in ((hq, t, d), (hkv, c, d), (hkv, c, dv)))
    mask = (c - t + torch.arange(t))[:, None] >= torch.arange(c)[None, :]
    mask[:, 0] = c == 1 or t == 1                      # a hole (not at a decode row's only key)
    scale, cap = 1 / math.sqrt(d), 2.5
    ref = _capped_reference(q, k, v, mask, scale, cap)
    torch.testing.assert_close(attention(q, k, v, mask, scale, cap), ref, rtol=1e-5, atol=1e-5)
    if c > 1:
        assert float((attention(q, k, v, mask, scale) - ref).abs().max()) > 1e-2  # the cap matters here
    check(lambda q, k, v, m: attention(q, k, v, m, scale, cap), q, k, v, mask, rtol=1e-5, atol=1e-5)
    notes = [x.note for p in plans for x in p.dispatches if x.name.startswith("attention")]
    assert notes and all("softcap 2.5" in n for n in notes if "splits of" not in n), notes
    info = device.device_info()
    tpk = att_lowering.split_invocations_per_key(d // (4 if d % 4 == 0 and dv % 4 == 0 else 1))
    split = att_lowering.splits_keys(info, hq * t, c, att_lowering.workgroup_size(info), tpk)
    assert any("splits merged" in n for n in notes) == split


def test_attention_softcap_of_large_scores_and_argument_checks():
    """Scores far past the cap (tanh saturates: no NaN); a bad cap is refused."""
    q, k, v = torch.randn(2, 1, 8) * 100, torch.randn(1, 70, 8) * 100, torch.randn(1, 70, 8)
    mask = torch.ones(1, 70, dtype=torch.bool)
    got = check(lambda q, k, v, m: attention(q, k, v, m, 1.0, 0.5), q, k, v, mask, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(RuntimeError, match="softcap"):
            attention(q, k, v, mask, 1.0, bad)


# ---------------------------------------------------------------------- metadata range checks


BAD_METADATA = [
    ("qwen2", {"block_count": 2**31}, r"block_count = 2147483648 .*\[1, 1024\]"),
    ("qwen2", {"block_count": 0}, r"block_count = 0 .*\[1, 1024\]"),
    ("qwen2", {"attention.head_count": 0}, r"attention\.head_count = 0 "),
    ("qwen2", {"attention.head_count_kv": 0}, r"attention\.head_count_kv = 0 "),
    ("qwen2", {"attention.head_count_kv": 3}, r"head_count_kv = 3 .*divisor of attention\.head_count = 4"),
    ("qwen2", {"attention.head_count": 6}, r"head_count = 6 .*divisor of embedding_length = 64"),
    ("qwen2", {"embedding_length": 0}, r"embedding_length = 0 "),
    ("qwen2", {"feed_forward_length": -5}, r"feed_forward_length = -5 "),
    ("qwen2", {"context_length": 0}, r"context_length = 0 "),
    ("qwen2", {"attention.layer_norm_rms_epsilon": float("nan")}, r"epsilon = nan .*finite number > 0"),
    ("qwen2", {"attention.layer_norm_rms_epsilon": -0.5}, r"epsilon = -0\.5 "),
    ("qwen2", {"attention.layer_norm_rms_epsilon": 0.0}, r"epsilon = 0\.0 "),
    ("qwen2", {"rope.freq_base": 0.0}, r"rope\.freq_base = 0\.0 .*finite number > 0"),
    ("qwen2", {"rope.freq_base": float("inf")}, r"rope\.freq_base = inf "),
    ("qwen2", {"rope.dimension_count": 7}, r"rope\.dimension_count = 7 "),
    ("qwen2", {"rope.dimension_count": 64}, r"rope\.dimension_count = 64 .*\[2, 16\]"),
    ("qwen2", {"rope.scaling.type": "llama3"}, r"'llama3'.*rope_freqs\.weight"),
    ("gemma2", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}, r"'yarn' .*not gemma2"),
    ("phi3", {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}, r"'yarn' .*not phi3"),
    ("qwen2-yarn", {"rope.scaling.original_context_length": 0}, r"original_context_length = 0 "),
    ("qwen2", {"expert_count": 8}, r"expert_count = 8 .*mixture-of-experts"),
    ("olmo3", {"attention.sliding_window_pattern": [True, False]}, r"'2 entries' .*one entry per layer \(4\)"),
    ("olmo2", {"attention.key_length": 32, "attention.value_length": 32}, r"head_count = 6 .*olmo2"),
    ("granite", {"logit_scale": None}, r"logit_scale"),
    ("granite", {"logit_scale": 0.0}, r"logit_scale = 0\.0 .*> 0"),
    ("granite", {"residual_scale": float("nan")}, r"residual_scale = nan "),
    ("granite", {"embedding_scale": -2.0}, r"embedding_scale = -2\.0 "),
    ("granite", {"attention.scale": float("inf")}, r"attention\.scale = inf "),
    ("mistral3", {"rope.scaling.yarn_beta_fast": -1.0}, r"yarn_beta_fast = -1\.0 "),
    ("mistral3", {"rope.scaling.yarn_log_multiplier": float("nan")}, r"yarn_log_multiplier = nan "),
    ("mistral3-temp", {"attention.temperature_scale": -0.5}, r"temperature_scale = -0\.5 "),
    ("mistral3", {"rope.dimension_count": 16}, r"rope\.dimension_count = 16 .*mistral3"),
    ("granite", {"rope.scaling.finetuned": False}, r"rope\.scaling\.finetuned = False .*without RoPE"),
    ("qwen2", {"rope.scaling.factor": float("nan")}, r"rope\.scaling\.factor = nan "),
    ("qwen2", {"attention.head_count_kv": [2, 1]}, r"per-layer .*head_count_kv"),
    ("llama3", {"rope.dimension_count": 8}, r"rope\.dimension_count = 8 .*head dim 16"),
    ("gemma2", {"attn_logit_softcapping": -1.0}, r"attn_logit_softcapping = -1\.0 .*>= 0"),
    ("gemma2", {"attn_logit_softcapping": float("nan")}, r"attn_logit_softcapping = nan "),
    ("gemma2", {"final_logit_softcapping": float("inf")}, r"final_logit_softcapping = inf "),
    ("gemma2", {"attention.sliding_window": 0}, r"sliding_window = 0 "),
    ("gemma2", {"attention.key_length": "32"}, r"key_length = '32' "),
]


@pytest.mark.parametrize("name,overrides,match", BAD_METADATA, ids=lambda x: str(x)[:60])
def test_metadata_out_of_range_is_a_clear_error(tmp_path, name, overrides, match):
    path = write_arch_model(tmp_path / f"{name}.gguf", name, quantized=False, overrides=overrides)
    with pytest.raises(GGUFError, match=match) as e:
        load_model(path, max_ctx=16)
    assert str(path) in str(e.value)


def test_unsupported_architecture_names_the_supported(tmp_path):
    from gguf_fixtures import write_tiny_model
    p = write_tiny_model(tmp_path / "m.gguf", "llama", arch_name="olmo", with_tokenizer=False)
    with pytest.raises(GGUFError, match="qwen2, qwen3, phi3, gemma2"):
        load_model(p)


@pytest.mark.parametrize("tensor,value", [("blk.1.ffn_norm.weight", float("nan")),
                                          ("output_norm.weight", float("inf")),
                                          ("rope_factors_short.weight", 0.0)])
def test_nonfinite_norm_weights_and_rope_factors_are_refused(tmp_path, tensor, value):
    path = write_arch_model(tmp_path / "phi3.gguf", "phi3", quantized=False)
    with open_gguf(path) as f:
        info = f.tensor_info(tensor)
        at = info.offset + 4 * 3  # the file offset of element 3
    data = bytearray(path.read_bytes())
    data[at:at + 4] = np.float32(value).tobytes()
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=rf"{tensor}.* holds {value} at index 3"):
        load_model(path, max_ctx=16)
