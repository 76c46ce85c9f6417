"""Decoder hyper-parameters read from a GGUF file's metadata.

The rules follow llama.cpp's loader (the reference implementation of GGUF models):

llama (SmolLM2, Llama 1/2/3, Mistral)
    GQA; RoPE of type NORM (rotation of adjacent pairs; llama.cpp's converter permuted
    the Q/K rows for it); ``rope.freq_base`` (default 10000); rope scaling ``linear``
    (``rope.scaling.factor`` or the older ``rope.scale_linear``) and per-frequency
    factors (the ``rope_freqs.weight`` tensor of Llama 3.1+); SwiGLU FFN; RMSNorm eps
    ``attention.layer_norm_rms_epsilon``; LM head tied to the token embedding when the
    file has no ``output.weight``.
gemma3
    RoPE of type NEOX (rotation of the two halves); sliding-window layers: the file's
    ``attention.sliding_window`` and llama.cpp's pattern of 6 (layer ``il`` is local
    unless ``il % 6 == 5``; an ``attention.sliding_window_pattern`` key overrides it);
    local layers use rope base ``rope.freq_base_swa`` (default 10000) unscaled, global
    ones ``rope.freq_base`` with the file's rope scaling; per-head RMSNorm of q and k;
    RMSNorms before and after attention and FFN; GELU-tanh gated FFN; embeddings scaled
    by sqrt(hidden); queries scaled by 1/sqrt(query_pre_attn_scalar), which the GGUF does
    not store: llama.cpp uses head_dim, or hidden/heads for the 27B (62 layers); optional
    final logit soft-capping. llama.cpp's converter stores Gemma's norm weights as (1 + w),
    so every norm here is a plain ``x / rms(x) * w``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..gguf.errors import GGUFError

__all__ = ["DecoderConfig", "config_from_gguf"]


@dataclass
class DecoderConfig:
    arch: str
    n_layers: int
    hidden: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    ffn_dim: int
    vocab_size: int
    norm_eps: float
    context_length: int
    rope_dim: int  # rotated dims of each head (n_rot)
    rope_neox: bool  # True: halves (NEOX), False: adjacent pairs (NORM)
    rope_base: list[float] = field(default_factory=list)  # per layer
    rope_freq_scale: list[float] = field(default_factory=list)  # per layer: positions are multiplied by it
    rope_freq_factors: bool = False  # divide each frequency by rope_freqs.weight (global layers)
    sliding_window: list[int | None] = field(default_factory=list)  # per layer; None = global attention
    act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float | None = None
    attn_scale: float = 1.0  # multiplies q before q.k
    qk_norm: bool = False
    post_norms: bool = False  # gemma's norms after attention and after the FFN
    final_logit_softcap: float | None = None
    tied_embeddings: bool = True

    @property
    def n_rep(self) -> int:
        return self.n_heads // self.n_kv_heads


def _int(f, key, default=None) -> int:
    v = f.arch_get(key, default) if default is not None else f.arch_get(key)
    if isinstance(v, list):  # per-layer arrays (e.g. head_count_kv): only uniform ones are supported
        if len(set(v)) != 1:
            raise GGUFError(f"{f.path}: per-layer {f.architecture}.{key} = {v} is not supported")
        v = v[0]
    return int(v)


def _rope_scaling(f) -> tuple[float, str]:
    """(freq_scale, type) of the file's rope scaling; freq_scale multiplies positions."""
    stype = f.arch_get("rope.scaling.type", None)
    factor = f.arch_get("rope.scaling.factor", None)
    if factor is None:
        legacy = f.arch_get("rope.scale_linear", None)
        if legacy is not None:
            stype, factor = stype or "linear", legacy
    if stype in (None, "none") or factor in (None, 0, 0.0, 1.0):
        return 1.0, "none"
    if stype == "linear":
        return 1.0 / float(factor), "linear"
    raise GGUFError(f"{f.path}: rope scaling {stype!r} is not supported (only 'linear')")


def config_from_gguf(f) -> DecoderConfig:
    """Read the hyper-parameters of a :class:`~dynamo_vulkan.gguf.reader.GGUFFile`."""
    arch = f.architecture
    n_layers = _int(f, "block_count")
    hidden = _int(f, "embedding_length")
    n_heads = _int(f, "attention.head_count")
    n_kv = _int(f, "attention.head_count_kv", n_heads)
    head_dim = _int(f, "attention.key_length", hidden // n_heads)
    v_head_dim = _int(f, "attention.value_length", head_dim)
    ffn = _int(f, "feed_forward_length")
    emb = f.tensor_info("token_embd.weight")
    vocab = int(f.arch_get("vocab_size", emb.shape[0]))
    if emb.shape != (vocab, hidden):
        raise GGUFError(f"{f.path}: token_embd.weight has shape {list(emb.shape)}, expected [{vocab}, {hidden}]")
    if n_heads % n_kv:
        raise GGUFError(f"{f.path}: {n_heads} query heads are not a multiple of {n_kv} kv heads")
    eps = float(f.arch_get("attention.layer_norm_rms_epsilon", 1e-5 if arch == "llama" else 1e-6))
    ctx = int(f.arch_get("context_length", 2048))
    rope_dim = _int(f, "rope.dimension_count", head_dim)
    if rope_dim > head_dim or rope_dim % 2:
        raise GGUFError(f"{f.path}: rope.dimension_count {rope_dim} does not fit head_dim {head_dim}")
    base = float(f.arch_get("rope.freq_base", 10000.0))
    freq_scale, _ = _rope_scaling(f)
    softcap = f.arch_get("final_logit_softcapping", None)
    softcap = float(softcap) if softcap else None
    tied = not f.has_tensor("output.weight")

    common = dict(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, v_head_dim=v_head_dim, ffn_dim=ffn, vocab_size=vocab,
        norm_eps=eps, context_length=ctx, rope_dim=rope_dim, final_logit_softcap=softcap,
        tied_embeddings=tied,
    )
    if arch == "llama":
        return DecoderConfig(
            **common,
            rope_neox=False,
            rope_base=[base] * n_layers,
            rope_freq_scale=[freq_scale] * n_layers,
            rope_freq_factors=f.has_tensor("rope_freqs.weight"),
            sliding_window=[None] * n_layers,
            act="silu",
            attn_scale=1.0 / math.sqrt(head_dim),
        )
    if arch == "gemma3":
        window = f.arch_get("attention.sliding_window", None)
        window = int(window) if window else None
        pattern = f.arch_get("attention.sliding_window_pattern", 6)
        if isinstance(pattern, list):  # per layer: True = sliding window
            if len(pattern) != n_layers:
                raise GGUFError(f"{f.path}: sliding_window_pattern has {len(pattern)} entries for {n_layers} layers")
            is_local = [bool(p) for p in pattern]
        else:
            period = int(pattern)
            is_local = [period > 0 and (il % period) < (period - 1) for il in range(n_layers)]
        if window is None:
            is_local = [False] * n_layers
        base_swa = float(f.arch_get("rope.freq_base_swa", 10000.0))
        qpas = hidden // n_heads if n_layers == 62 else head_dim  # llama.cpp's query_pre_attn_scalar
        return DecoderConfig(
            **common,
            rope_neox=True,
            rope_base=[base_swa if loc else base for loc in is_local],
            rope_freq_scale=[1.0 if loc else freq_scale for loc in is_local],
            rope_freq_factors=False,
            sliding_window=[window if loc else None for loc in is_local],
            act="gelu_tanh",
            embed_scale=math.sqrt(hidden),
            attn_scale=1.0 / math.sqrt(qpas),
            qk_norm=True,
            post_norms=True,
        )
    raise GGUFError(f"{f.path}: unsupported architecture {arch!r}")
