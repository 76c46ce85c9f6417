"""Decoder hyper-parameters read from a GGUF file's metadata.

The rules follow llama.cpp's loader and graph builders (the reference implementation of
GGUF models). Every field read is range-checked before use (a count, a dimension, an
epsilon, a rope base, a soft-cap); a value out of range is a :class:`GGUFError` naming the
file, the field, its value and the allowed range.

Common to all: GQA (query heads a multiple of kv heads); RMSNorm eps
``attention.layer_norm_rms_epsilon``; rope base ``rope.freq_base`` (default 10000); rope
scaling ``rope.scaling.type`` (default "linear", as in llama.cpp) with
``rope.scaling.factor`` (or the older ``rope.scale_linear``) dividing positions for
"linear", "longrope" and "yarn" ("none" never scales; other names are refused, as
llama.cpp refuses them); ``rope.scaling.attn_factor`` multiplies RoPE's cos and sin (so
q.k by its square); LM head tied to the token embedding when the file has no
``output.weight``; a mixture-of-experts file (``expert_count`` > 0) is refused.

YaRN (``rope.scaling.type`` "yarn", e.g. Qwen2.5's long-context files) follows ggml's
rope kernel with llama.cpp's context defaults for these architectures: extrapolation
factor 1, beta_fast 32 and beta_slow 1 (llama.cpp reads no ``yarn_beta_*`` keys for
them), original context ``rope.scaling.original_context_length`` (default the trained
context). Each rotated pair i mixes the interpolated angle (position / factor) with the
extrapolated one by a ramp that is 1 below the correction dim ``low`` and 0 above
``high``; cos and sin are multiplied by ``0.1 ln(factor) + 1`` (llama.cpp's net
magnitude scale once its context cancels the kernel's own). It is supported on
architectures whose every layer is global (llama, qwen2, qwen3, granite, mistral3) or
whose sliding-window layers llama.cpp rotates unscaled (olmo2).

llama (SmolLM2, Llama 1/2/3, Mistral)
    RoPE of type NORM (rotation of adjacent pairs; llama.cpp's converter permuted the Q/K
    rows for it) over the whole head (``rope.dimension_count`` must equal the head dim);
    per-frequency factors from the ``rope_freqs.weight`` tensor (how Llama 3.1+ files
    carry their "llama3" rope scaling: the converter computes the factors and writes no
    scaling type); SwiGLU FFN. Mistral files are llama files, a head dim other than
    hidden/heads (``attention.key_length``, Mistral Nemo) included; a sliding window in
    their metadata is ignored, as llama.cpp's llama graph ignores it.
qwen2
    As llama with RoPE of type NEOX (rotation of the two halves) over ``rope_dim`` dims and
    biases on q, k and v.
qwen3
    As qwen2 without biases and with a per-head RMSNorm of q and k before RoPE.
phi3
    RoPE NEOX; q|k|v in one ``attn_qkv.weight`` (or three tensors) and gate|up in one
    ``ffn_up.weight`` of 2*ffn rows (gate first); LongRoPE factors
    ``rope_factors_short.weight`` / ``rope_factors_long.weight``: llama.cpp takes the long
    ones when its context exceeds ``rope.scaling.original_context_length`` (default the
    trained context), the short ones otherwise, so the loader picks them by its KV cache
    length; ``attention.sliding_window`` is ignored, as llama.cpp disables Phi-3's SWA.
gemma2
    RoPE NEOX; embeddings scaled by sqrt(hidden); GELU-tanh gated FFN; RMSNorms before and
    after attention and FFN; attention logits soft-capped (``attn_logit_softcapping``,
    default 50) and final logits too (``final_logit_softcapping``, default 30); every
    even layer (il % 2 == 0) attends within ``attention.sliding_window`` (default 4096);
    queries scaled by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 27B (46 layers).
gemma3
    RoPE NEOX; sliding-window layers: the file's ``attention.sliding_window`` and
    llama.cpp's pattern of 6 (layer ``il`` is local unless ``il % 6 == 5``; an
    ``attention.sliding_window_pattern`` key overrides it); local layers use rope base
    ``rope.freq_base_swa`` (default 10000) unscaled, global ones ``rope.freq_base`` with
    the file's rope scaling; per-head RMSNorm of q and k; RMSNorms before and after
    attention and FFN; GELU-tanh gated FFN; embeddings scaled by sqrt(hidden); queries
    scaled by 1/sqrt(query_pre_attn_scalar), which the GGUF does not store: llama.cpp uses
    head_dim, or hidden/heads for the 27B (62 layers); optional final logit soft-capping.

olmo2
    RoPE NEOX; no norms before attention or the FFN: RMSNorms after each (``post_attention_norm``,
    ``post_ffw_norm``) before the residual add; q and k RMS-normed over the whole projection
    (``attn_q_norm`` of hidden, ``attn_k_norm`` of kv_heads * head_dim) before RoPE; head
    dim hidden / heads. OLMo 3's files add a sliding window (``attention.sliding_window``)
    on layers of ``attention.sliding_window_pattern`` (default period 4: every fourth layer
    global), whose RoPE has no scaling, no YaRN and no attn_factor; its base is
    ``rope.freq_base`` (llama.cpp's olmo2 graph reads no ``rope.freq_base_swa``).
granite
    As llama (RoPE NORM, SwiGLU, optional rope_freqs) with four multipliers: the token
    embedding by ``embedding_scale``, each residual branch (attention and FFN output) by
    ``residual_scale``, q.k by ``attention.scale`` in place of 1/sqrt(head_dim), and the
    logits divided by ``logit_scale``; 0 or absent means no scaling (llama.cpp's
    defaults). ``rope.scaling.finetuned`` = false (no RoPE) is refused.
mistral3 (the text decoder of Mistral Small 3.x / Ministral 3 files)
    As llama, with YaRN read further: ``rope.scaling.yarn_beta_fast`` / ``yarn_beta_slow``
    (defaults 32 / 1) and ``yarn_log_multiplier`` m (the magnitude becomes
    mscale(1) / mscale(m), mscale(m) = 1 + 0.1 m ln(factor)); q.k scaled by
    ``attention.scale`` if set; Llama 4's attention temperature when
    ``attention.temperature_scale`` s > 0: q at position p times 1 + s ln(floor(p / L) + 1),
    where llama.cpp takes L from ``rope.scaling.original_context_length`` (default the
    trained context), not from ``attention.temperature_length``.

llama.cpp's converter stores Gemma's norm weights as (1 + w), so every norm here is a
plain ``x / rms(x) * w``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from dynamo_vulkan.gguf.errors import GGUFError
from ..reader import SUPPORTED_ARCHITECTURES

__all__ = ["DecoderConfig", "YarnScaling", "config_from_gguf", "SUPPORTED_ARCHITECTURES", "MAX_LAYERS"]

# Bounds of the metadata we accept: far above any released model, low enough that a
# hostile value fails here, before anything is sized by it.
MAX_LAYERS = 1024
MAX_HIDDEN = 1 << 17
MAX_HEADS = 1 << 12
MAX_HEAD_DIM = 1 << 12
MAX_FFN = 1 << 20
MAX_CONTEXT = 1 << 24
MAX_WINDOW = (1 << 31) - 1

_MISSING = object()
# architectures whose every layer attends globally with the file's rope scaling: YaRN's
# ramp and magnitude apply to all of them alike
_YARN_ARCHS = ("llama", "qwen2", "qwen3", "olmo2", "granite", "mistral3")


@dataclass(frozen=True)
class YarnScaling:
    """YaRN's parameters beside the factor (the table's freq_scale is 1 / factor)."""

    orig_context: int  # the context the model was trained with before scaling
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    ext_factor: float = 1.0
    log_mul: float = 0.0  # rope.scaling.yarn_log_multiplier (mistral3): divides the magnitude by its mscale


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
    # per-frequency factors dividing RoPE's frequencies on global layers: a tensor name,
    # or (short, long) names chosen by the context against rope_orig_context (phi3)
    rope_factors: str | tuple[str, str] | None = None
    rope_orig_context: int = 0
    rope_attn_factor: float = 1.0  # multiplies RoPE's cos and sin (llama.cpp's attn_factor)
    rope_yarn: YarnScaling | None = None  # YaRN's ramp on global layers (rope.scaling.type yarn)
    swa_rope_plain: bool = False  # sliding-window layers rotate without attn_factor (olmo2)
    sliding_window: list[int | None] = field(default_factory=list)  # per layer; None = global attention
    act: str = "silu"  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float | None = None
    attn_scale: float = 1.0  # multiplies q before q.k
    attn_softcap: float = 0.0  # attention logits become tanh(s / c) * c; 0: none
    qk_norm: bool = False
    qk_norm_whole: bool = False  # q/k norms over the whole projection, not per head (olmo2)
    pre_norms: bool = True  # RMSNorms before attention and the FFN (olmo2 has only post norms)
    qkv_bias: bool = False  # q, k and v projections carry biases (qwen2)
    fused_qkv: bool = False  # q|k|v rows in one attn_qkv.weight (phi3)
    fused_gate_up: bool = False  # gate|up rows in one ffn_up.weight (phi3)
    post_norms: bool = False  # gemma's norms after attention and after the FFN
    final_logit_softcap: float | None = None
    residual_scale: float = 1.0  # multiplies each residual branch (granite)
    # Llama 4's attention temperature (mistral3): q at position p is multiplied by
    # 1 + attn_temp_scale * ln(floor(p / attn_temp_length) + 1); 0: none
    attn_temp_scale: float = 0.0
    attn_temp_length: int = 1
    logit_scale: float = 1.0  # logits are divided by it (granite)
    tied_embeddings: bool = True

    @property
    def n_rep(self) -> int:
        return self.n_heads // self.n_kv_heads

    def rope_factors_for(self, max_ctx: int) -> str | None:
        """The factors tensor for a KV cache of ``max_ctx`` positions (llama.cpp's
        get_rope_factors: LongRoPE's long factors past the original context)."""
        if isinstance(self.rope_factors, tuple):
            short, long = self.rope_factors
            return long if max_ctx > self.rope_orig_context else short
        return self.rope_factors


class _Fields:
    """Range-checked reads of one file's ``{arch}.*`` metadata."""

    def __init__(self, f):
        self.f = f
        self.arch = f.architecture

    def error(self, key: str, value, allowed: str) -> GGUFError:
        return GGUFError(f"{self.f.path}: metadata {self.arch}.{key} = {value!r} is out of range "
                         f"(allowed: {allowed})")

    def raw(self, key: str, default=_MISSING):
        return self.f.arch_get(key) if default is _MISSING else self.f.arch_get(key, default)

    def count(self, key: str, lo: int, hi: int, default=_MISSING) -> int:
        """An integer in [lo, hi]; a per-layer array must be uniform."""
        allowed = f"an integer in [{lo}, {hi}]"
        v = self.raw(key, default)
        if isinstance(v, list):
            if not v:
                raise self.error(key, v, allowed)
            if len(set(map(repr, v))) != 1:
                raise GGUFError(f"{self.f.path}: per-layer {self.arch}.{key} = {v[:16]} is not supported "
                                f"(only one value for every layer)")
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not lo <= int(v) <= hi:
            raise self.error(key, v, allowed)
        return int(v)

    def real(self, key: str, default=_MISSING, *, positive: bool = True, hi: float = math.inf) -> float:
        """A finite number, > 0 (``positive``) or >= 0, and at most ``hi``."""
        allowed = ("a finite number " + ("> 0" if positive else ">= 0")
                   + (f" and <= {hi:g}" if hi < math.inf else ""))
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise self.error(key, v, allowed)
        x = float(v)
        if not math.isfinite(x) or x < 0 or (positive and x == 0) or x > hi:
            raise self.error(key, v, allowed)
        return x


def _rope_scaling(m: _Fields, ctx: int) -> tuple[float, YarnScaling | None]:
    """The factor llama.cpp multiplies positions by (cparams.rope_freq_scale), and YaRN's
    parameters where the scaling type is "yarn" and scales."""
    stype = m.raw("rope.scaling.type", "linear")
    if stype not in ("none", "linear", "yarn", "longrope"):
        raise GGUFError(f"{m.f.path}: rope scaling type {stype!r} ({m.arch}.rope.scaling.type) is not one "
                        f"llama.cpp knows (none, linear, yarn, longrope); Llama 3.1 files carry their "
                        f"'llama3' scaling as the rope_freqs.weight tensor")
    key = "rope.scaling.factor" if m.raw("rope.scaling.factor", None) is not None else "rope.scale_linear"
    factor = m.real(key, 0.0, positive=False, hi=1e6)
    if stype == "none" or factor in (0.0, 1.0):
        return 1.0, None
    if stype != "yarn":
        return 1.0 / factor, None
    if m.arch not in _YARN_ARCHS:
        raise GGUFError(f"{m.f.path}: rope scaling 'yarn' ({m.arch}.rope.scaling.type) is supported for "
                        f"{', '.join(_YARN_ARCHS)}, not {m.arch} (whose local layers llama.cpp scales apart)")
    orig = m.count("rope.scaling.original_context_length", 1, MAX_CONTEXT, ctx)
    if m.arch != "mistral3":
        return 1.0 / factor, YarnScaling(orig_context=orig)
    return 1.0 / factor, YarnScaling(orig_context=orig,
                                     beta_fast=m.real("rope.scaling.yarn_beta_fast", 32.0, hi=1e6),
                                     beta_slow=m.real("rope.scaling.yarn_beta_slow", 1.0, hi=1e6),
                                     log_mul=m.real("rope.scaling.yarn_log_multiplier", 0.0, positive=False, hi=1e3))


def _swa_layers(m: _Fields, n_layers: int, default_period: int) -> list[bool]:
    """Which layers attend within the sliding window: ``attention.sliding_window_pattern``
    per layer (True = sliding), or a period (llama.cpp's set_swa_pattern: layer il slides
    unless il % period == period - 1; 0: every layer slides)."""
    pattern = m.raw("attention.sliding_window_pattern", default_period)
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise m.error("attention.sliding_window_pattern", f"{len(pattern)} entries",
                          f"one entry per layer ({n_layers})")
        return [bool(p) for p in pattern]
    period = m.count("attention.sliding_window_pattern", 0, MAX_LAYERS, default_period)
    return [period == 0 or (il % period) < (period - 1) for il in range(n_layers)]


def _disabled_scale(m: _Fields, key: str) -> float:
    """A granite multiplier: 0 or absent is llama.cpp's "off" (1)."""
    return m.real(key, 0.0, positive=False, hi=1e6) or 1.0


def config_from_gguf(f) -> DecoderConfig:
    """Read the hyper-parameters of a :class:`~dynamo_vulkan.gguf.reader.GGUFFile`."""
    arch = f.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"{f.path}: unsupported architecture {arch!r}; supported: "
                        f"{', '.join(SUPPORTED_ARCHITECTURES)}")
    m = _Fields(f)
    n_layers = m.count("block_count", 1, MAX_LAYERS)
    hidden = m.count("embedding_length", 1, MAX_HIDDEN)
    n_heads = m.count("attention.head_count", 1, MAX_HEADS)
    n_kv = m.count("attention.head_count_kv", 1, n_heads, n_heads)
    if n_heads % n_kv:
        raise m.error("attention.head_count_kv", n_kv, f"a divisor of attention.head_count = {n_heads}")
    # head dims default to hidden / heads (llama.cpp), each overridden by its own key
    if None in (m.raw("attention.key_length", None), m.raw("attention.value_length", None)) and hidden % n_heads:
        raise m.error("attention.head_count", n_heads, f"a divisor of embedding_length = {hidden} "
                      f"(the file sets no attention.key_length / value_length)")
    head_dim = m.count("attention.key_length", 1, MAX_HEAD_DIM, hidden // n_heads)
    v_head_dim = m.count("attention.value_length", 1, MAX_HEAD_DIM, hidden // n_heads)
    ffn = m.count("feed_forward_length", 1, MAX_FFN)
    emb = f.tensor_info("token_embd.weight")
    vocab = m.count("vocab_size", 1, 1 << 31, emb.shape[0])
    if tuple(emb.shape) != (vocab, hidden):
        raise GGUFError(f"{f.path}: token_embd.weight has shape {list(emb.shape)}, expected [{vocab}, {hidden}]")
    eps = m.real("attention.layer_norm_rms_epsilon", 1e-5 if arch == "llama" else 1e-6, hi=1.0)
    ctx = m.count("context_length", 1, MAX_CONTEXT, 2048)
    rope_dim = m.count("rope.dimension_count", 2, head_dim, head_dim)
    if rope_dim % 2:
        raise m.error("rope.dimension_count", rope_dim, f"an even number <= the head dim {head_dim}")
    base = m.real("rope.freq_base", 10000.0)
    freq_scale, yarn = _rope_scaling(m, ctx)
    if m.count("expert_count", 0, 1 << 16, 0):
        raise m.error("expert_count", m.raw("expert_count"), "0 (mixture-of-experts models are not supported)")
    attn_factor = m.real("rope.scaling.attn_factor", 1.0, hi=1e3)
    tied = not f.has_tensor("output.weight")

    common = dict(
        arch=arch, n_layers=n_layers, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv,
        head_dim=head_dim, v_head_dim=v_head_dim, ffn_dim=ffn, vocab_size=vocab,
        norm_eps=eps, context_length=ctx, rope_dim=rope_dim, rope_attn_factor=attn_factor,
        rope_yarn=yarn, tied_embeddings=tied,
    )
    plain_layers = dict(rope_base=[base] * n_layers, rope_freq_scale=[freq_scale] * n_layers,
                        sliding_window=[None] * n_layers, act="silu", attn_scale=1.0 / math.sqrt(head_dim))
    if arch == "llama":
        if rope_dim != head_dim:
            raise m.error("rope.dimension_count", rope_dim, f"the head dim {head_dim} (llama rotates whole heads)")
        return DecoderConfig(
            **common, **plain_layers, rope_neox=False,
            rope_factors="rope_freqs.weight" if f.has_tensor("rope_freqs.weight") else None,
        )
    if arch == "granite":
        if rope_dim != head_dim:
            raise m.error("rope.dimension_count", rope_dim, f"the head dim {head_dim} (granite rotates whole heads)")
        if m.raw("rope.scaling.finetuned", True) is not True:
            raise m.error("rope.scaling.finetuned", m.raw("rope.scaling.finetuned"),
                          "true (granite without RoPE is not supported)")
        embed_scale = m.real("embedding_scale", 0.0, positive=False, hi=1e6)
        attn_scale = m.real("attention.scale", 0.0, positive=False, hi=1e6)
        return DecoderConfig(
            **common, **(plain_layers | dict(attn_scale=attn_scale or plain_layers["attn_scale"])),
            rope_neox=False,
            rope_factors="rope_freqs.weight" if f.has_tensor("rope_freqs.weight") else None,
            embed_scale=embed_scale or None,
            residual_scale=_disabled_scale(m, "residual_scale"),
            logit_scale=m.real("logit_scale", hi=1e6),
        )
    if arch == "mistral3":
        if rope_dim != head_dim:
            raise m.error("rope.dimension_count", rope_dim, f"the head dim {head_dim} (mistral3 rotates whole heads)")
        temp = m.real("attention.temperature_scale", 0.0, positive=False, hi=1e3)
        attn_scale = m.real("attention.scale", 0.0, positive=False, hi=1e6)
        return DecoderConfig(
            **common, **(plain_layers | dict(attn_scale=attn_scale or plain_layers["attn_scale"])),
            rope_neox=False,
            rope_factors="rope_freqs.weight" if f.has_tensor("rope_freqs.weight") else None,
            attn_temp_scale=temp,
            # llama.cpp's floor length is the original context (attention.temperature_length unread)
            attn_temp_length=m.count("rope.scaling.original_context_length", 1, MAX_CONTEXT, ctx),
        )
    if arch == "olmo2":
        if n_heads * head_dim != hidden or v_head_dim != head_dim or rope_dim != head_dim:
            raise m.error("attention.head_count", n_heads, f"heads of embedding_length / head_count dims, all "
                          f"rotated (olmo2), got head dim {head_dim}, value dim {v_head_dim}, rope dims {rope_dim}")
        window = m.count("attention.sliding_window", 0, MAX_WINDOW, 0) or None
        is_local = _swa_layers(m, n_layers, 4) if window else [False] * n_layers
        return DecoderConfig(
            **(plain_layers | dict(rope_freq_scale=[1.0 if loc else freq_scale for loc in is_local],
                                   sliding_window=[window if loc else None for loc in is_local])),
            **common, rope_neox=True, qk_norm=True, qk_norm_whole=True, pre_norms=False, post_norms=True,
            swa_rope_plain=True)
    if arch in ("qwen2", "qwen3"):
        return DecoderConfig(**common, **plain_layers, rope_neox=True,
                             qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3")
    if arch == "phi3":
        if n_heads * head_dim != hidden or v_head_dim != head_dim:
            raise m.error("attention.head_count", n_heads, f"heads of embedding_length / head_count dims "
                          f"(phi3 has no attention.key_length), got head dim {head_dim}")
        factors = None
        if f.has_tensor("rope_factors_short.weight") or f.has_tensor("rope_factors_long.weight"):
            factors = ("rope_factors_short.weight", "rope_factors_long.weight")
        return DecoderConfig(
            **common, **plain_layers, rope_neox=True, rope_factors=factors,
            rope_orig_context=m.count("rope.scaling.original_context_length", 1, MAX_CONTEXT, ctx),
            fused_qkv=f.has_tensor("blk.0.attn_qkv.weight"), fused_gate_up=True,
        )
    if arch == "gemma2":
        window = m.count("attention.sliding_window", 1, MAX_WINDOW, 4096)
        is_local = [il % 2 == 0 for il in range(n_layers)]
        base_swa = m.real("rope.freq_base_swa", base)
        qpas = hidden // n_heads if n_layers == 46 else head_dim  # llama.cpp's query_pre_attn_scalar
        final_cap = m.real("final_logit_softcapping", 30.0, positive=False, hi=1e6)
        return DecoderConfig(
            **common,
            rope_neox=True,
            rope_base=[base_swa if loc else base for loc in is_local],
            rope_freq_scale=[freq_scale] * n_layers,
            sliding_window=[window if loc else None for loc in is_local],
            act="gelu_tanh",
            embed_scale=math.sqrt(hidden),
            attn_scale=1.0 / math.sqrt(qpas),
            attn_softcap=m.real("attn_logit_softcapping", 50.0, positive=False, hi=1e6),
            post_norms=True,
            final_logit_softcap=final_cap or None,
        )
    # gemma3
    window = m.count("attention.sliding_window", 0, MAX_WINDOW, 0) or None
    is_local = _swa_layers(m, n_layers, 6) if window else [False] * n_layers
    base_swa = m.real("rope.freq_base_swa", 10000.0)
    qpas = hidden // n_heads if n_layers == 62 else head_dim  # llama.cpp's query_pre_attn_scalar
    final_cap = m.real("final_logit_softcapping", 0.0, positive=False, hi=1e6)
    return DecoderConfig(
        **common,
        rope_neox=True,
        rope_base=[base_swa if loc else base for loc in is_local],
        rope_freq_scale=[1.0 if loc else freq_scale for loc in is_local],
        sliding_window=[window if loc else None for loc in is_local],
        act="gelu_tanh",
        embed_scale=math.sqrt(hidden),
        attn_scale=1.0 / math.sqrt(qpas),
        qk_norm=True,
        post_norms=True,
        final_logit_softcap=final_cap or None,
    )
