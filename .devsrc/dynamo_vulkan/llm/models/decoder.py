"""A plain PyTorch decoder-only transformer over GGUF weights (the architectures of
models/config.py: llama, qwen2, qwen3, phi3, gemma2, gemma3).

Linear layers are :class:`~dynamo_vulkan.gguf.op.GGUFLinear` (weights stay quantized);
the token embedding is a :class:`~dynamo_vulkan.gguf.op.GGUFEmbedding` (only looked-up
rows are dequantized) and, when tied, the LM head reuses its blocks.

KV cache: every attention layer owns two buffers, ``k_cache`` [n_kv_heads, max_ctx,
head_dim] (kept as [.., 2, head_dim/2] or [.., head_dim/2, 2], RoPE's pair layout, when
RoPE rotates every dim) and ``v_cache``, written in place with ``index_copy_`` at the step's positions.
Attention always reads the whole cache under a mask built from tensors (positions
``start_pos + arange(T)`` against ``arange(max_ctx)``), so a decode step (T = 1) has one
shape whatever its position, and ``forward`` has no data-dependent Python control flow
(no ``.item()``): under ``torch.compile`` a decode step is one graph.

Norms and attention call the fused custom ops of :mod:`dynamo_vulkan.fused`, and RoPE is
written as elementwise ops on views (``apply_rope``), so compiled for Vulkan each of them
is one kernel: a decode step's time is mostly the count of dependent kernels.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.torch_version import TorchVersion
from torch import nn

from dynamo_vulkan.fused import attention, rms_norm
from dynamo_vulkan.gguf.op import GGUFEmbedding, GGUFLinear
from .config import DecoderConfig, YarnScaling

__all__ = ["Decoder", "Block", "Attention", "RMSNorm", "ContextOverflowError", "rope_tables", "yarn_ramp",
           "pair_tables", "apply_rope"]


class ContextOverflowError(ValueError):
    """The tokens do not fit the model's KV cache (max_ctx)."""


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.register_buffer("weight", weight.detach().to(torch.float32).contiguous())
        self.eps = float(eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def yarn_ramp(yarn: YarnScaling, base: float, rot: int) -> torch.Tensor:
    """YaRN's extrapolation weight of each rotated pair [rot/2] (ggml's rope_yarn_ramp times
    ext_factor): 1 for the fast pairs below the correction dim of beta_fast, 0 above that of
    beta_slow, linear between. The correction dims are computed in float32 and rounded, as
    ggml_rope_yarn_corr_dims does."""
    def corr_dim(beta: float) -> float:
        f32 = np.float32
        num = f32(rot) * np.log(f32(yarn.orig_context) / (f32(beta) * f32(2 * math.pi)))
        return float(num / (f32(2) * np.log(f32(base))))

    low = max(0.0, math.floor(corr_dim(yarn.beta_fast)))
    high = min(rot - 1.0, math.ceil(corr_dim(yarn.beta_slow)))
    y = (torch.arange(rot // 2, dtype=torch.float64) - low) / max(0.001, high - low)
    return (1 - y.clamp(0, 1)) * yarn.ext_factor


def rope_tables(base: float, freq_scale: float, rot: int, max_ctx: int, freq_factors: torch.Tensor | None = None,
                attn_factor: float = 1.0, yarn: YarnScaling | None = None):
    """cos/sin [max_ctx, rot/2] of RoPE angles ``pos * freq_scale * base^(-2i/rot) / factor_i``,
    both multiplied by ``attn_factor`` (llama.cpp's mscale: it scales the rotated dims of
    q and k, so their product by its square).

    With ``yarn``, pair i's angle mixes the scaled angle with the unscaled one by
    :func:`yarn_ramp`, and the magnitude grows by ``1 + 0.1 ln(1 / freq_scale)`` where that
    is above 1, divided by ``1 + 0.1 m ln(1 / freq_scale)`` with a log multiplier m
    (llama.cpp's mscale for YaRN once its context cancels ggml's own)."""
    inv = base ** (-torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    if freq_factors is not None:
        inv = inv / freq_factors.to(torch.float64).reshape(-1)[: rot // 2]
    t = torch.arange(max_ctx, dtype=torch.float64)
    if yarn is None:
        ang = torch.outer(t * freq_scale, inv)
    else:
        mix = yarn_ramp(yarn, base, rot)
        ang = torch.outer(t, inv * (freq_scale * (1 - mix) + mix))
        if freq_scale < 1:
            mscale = 1 + 0.1 * math.log(1 / freq_scale)
            if yarn.log_mul:
                mscale /= 1 + 0.1 * yarn.log_mul * math.log(1 / freq_scale)
            attn_factor = attn_factor * mscale
    return (torch.cos(ang) * attn_factor).to(torch.float32), (torch.sin(ang) * attn_factor).to(torch.float32)


def attention_temperature(cfg: DecoderConfig, max_ctx: int) -> torch.Tensor:
    """[max_ctx] factors of q by position: ``1 + s * ln(floor(p / length) + 1)`` (llama.cpp's
    llm_graph_input_attn_temp), in float32 as llama.cpp sets them."""
    p = torch.arange(max_ctx, dtype=torch.float64)
    return (torch.log(torch.floor(p / cfg.attn_temp_length) + 1) * cfg.attn_temp_scale + 1).to(torch.float32)


def pair_tables(cos: torch.Tensor, sin: torch.Tensor, neox: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [C, rot/2] laid out as apply_rope reads them: cos with a size-1 pair axis,
    sin with the pair axis holding (-sin, +sin) — [C, 1|2, rot/2] for neox pairs, else
    [C, rot/2, 1|2]."""
    pair = 1 if neox else 2
    return cos.unsqueeze(pair).contiguous(), torch.stack([-sin, sin], dim=pair).contiguous()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: int, neox: bool,
               scale: float = 1.0, flat: bool = True) -> torch.Tensor:
    """Rotate the first ``rot`` dims of x [..., T, d] by the angles of ``pair_tables``
    rows for its T positions, then multiply by ``scale``.

    ``neox``: the pairs are (i, i + rot/2) (llama.cpp ROPE_TYPE_NEOX); otherwise adjacent
    pairs (2i, 2i + 1) (llama.cpp ROPE_TYPE_NORM). Written as ``x*cos + swap(x)*sin``
    over a [.., 2, half] (or [.., half, 2]) view, where swap flips the pair axis and sin
    carries the signs: only elementwise ops on views, so a compiled graph computes the
    rotation (and the scale) in one kernel, with no slices and no cat.

    ``flat=False`` (rot == d only) returns the [..., 2, half] (or [..., half, 2]) pair
    layout unflattened: a consumer that takes it as is (the key cache's scatter) then
    computes the rotation itself, where a flattening view would stop that fusion."""
    d = x.shape[-1]
    xr = x[..., :rot] if rot < d else x
    half = rot // 2
    xp = xr.unflatten(-1, (2, half) if neox else (half, 2))
    out = (xp * cos + xp.flip(-2 if neox else -1) * sin) * scale
    if not flat and rot == d:
        return out
    out = out.flatten(-2)
    if rot < d:
        out = torch.cat([out, x[..., rot:] * scale], dim=-1)
    return out


def lazy_zeros(shape: tuple[int, ...]) -> torch.Tensor:
    """A float32 zero tensor whose memory the OS maps on first write (numpy's zeros is
    calloc; torch.zeros writes every byte): a KV cache kept on the GPU is never written on
    the host, and one on the host grows in RSS as positions fill."""
    return torch.from_numpy(np.zeros(shape, np.float32))


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int, max_ctx: int, *, qkv: GGUFLinear | None = None,
                 qk: GGUFLinear | None = None, q: GGUFLinear | None = None, k: GGUFLinear | None = None,
                 v: GGUFLinear | None = None,
                 o: GGUFLinear, q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None):
        super().__init__()
        self.layer = layer
        self.n_heads = cfg.n_heads
        self.n_kv = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.v_head_dim = cfg.v_head_dim
        self.rot = cfg.rope_dim
        self.neox = cfg.rope_neox
        self.scale = cfg.attn_scale
        self.window = cfg.sliding_window[layer]
        self.softcap = cfg.attn_softcap
        self.qkv = qkv  # fused q|k|v rows when the three share a quant type
        self.qk = qk    # or fused q|k rows, v apart
        self.q, self.k, self.v = q, k, v
        self.o = o
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.qk_norm_whole = cfg.qk_norm_whole  # norms over [T, heads * head_dim] (olmo2)
        self.split = [self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.v_head_dim]
        # keys are cached in RoPE's pair layout (apply_rope flat=False) when every dim
        # rotates: the step's rotation is then computed by the scatter into the cache
        self.k_pairs = None
        if self.rot == self.head_dim:
            half = self.rot // 2
            self.k_pairs = (2, half) if self.neox else (half, 2)
        k_shape = (self.n_kv, max_ctx) + (self.k_pairs or (self.head_dim,))
        self.register_buffer("k_cache", lazy_zeros(k_shape), persistent=False)
        self.register_buffer("v_cache", lazy_zeros((self.n_kv, max_ctx, self.v_head_dim)), persistent=False)
        # Llama 4's attention temperature of each position (mistral3), or None
        self.register_buffer("q_temp", attention_temperature(cfg, max_ctx) if cfg.attn_temp_scale else None,
                             persistent=False)

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        T = x.shape[1]
        if self.qkv is not None:
            q, k, v = self.qkv(x).split(self.split, dim=-1)
        elif self.qk is not None:
            q, k = self.qk(x).split(self.split[:2], dim=-1)
            v = self.v(x)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        if self.q_norm is not None and self.qk_norm_whole:
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = q.reshape(T, self.n_heads, self.head_dim)
        k = k.reshape(T, self.n_kv, self.head_dim)
        if self.q_norm is not None and not self.qk_norm_whole:
            # over each head's dims, before the heads come first: a decode step's norm is
            # then its q or k mat-vec's grouped post-norm (lowering/gguf.py)
            q = self.q_norm(q)
            k = self.k_norm(k)
        q = q.transpose(0, 1)  # [nh, T, hd]
        k = k.transpose(0, 1)  # [nkv, T, hd]
        v = v.reshape(T, self.n_kv, self.v_head_dim).transpose(0, 1)  # [nkv, T, vd]
        q = apply_rope(q, cos, sin, self.rot, self.neox, self.scale)
        if self.q_temp is not None:
            q = q * self.q_temp.index_select(0, pos).unsqueeze(-1)
        k = apply_rope(k, cos, sin, self.rot, self.neox, flat=self.k_pairs is None)
        self.k_cache.index_copy_(1, pos, k)
        self.v_cache.index_copy_(1, pos, v)
        keys = self.k_cache.flatten(2) if self.k_pairs else self.k_cache
        # [nh, T, vd]; q is scaled
        if self.softcap:
            out = attention(q, keys, self.v_cache, mask, 1.0, self.softcap)
        else:
            out = attention(q, keys, self.v_cache, mask, 1.0)
        out = out.transpose(0, 1).reshape(1, T, self.n_heads * self.v_head_dim)
        return self.o(out)

    def extra_repr(self) -> str:
        w = f", sliding_window={self.window}" if self.window else ""
        return f"heads={self.n_heads}, kv_heads={self.n_kv}, head_dim={self.head_dim}{w}"


class FeedForward(nn.Module):
    def __init__(self, act: str, down: GGUFLinear, *, gate_up: GGUFLinear | None = None,
                 gate: GGUFLinear | None = None, up: GGUFLinear | None = None):
        super().__init__()
        self.act = act
        self.gate_up = gate_up  # fused gate|up rows when both share a quant type
        self.gate, self.up = gate, up
        self.down = down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            g, u = self.gate_up(x).chunk(2, dim=-1)
        else:
            g, u = self.gate(x), self.up(x)
        if self.act == "gelu_tanh":
            h = F.gelu(g, approximate="tanh") * u
        else:
            h = F.silu(g) * u
        return self.down(h)


# A block is one nested compile region from torch 2.13 on: under torch.compile, Dynamo
# and AOT trace its forward once for all the layers, and the graph calls it per layer (the
# Vulkan backend inlines those calls again: dynamo_vulkan/regions.py). That traces
# SmolLM2 about 3x faster with torch 2.13; with torch 2.11 regions were no faster, so older
# torch traces every layer as before (docs/journal.md, session 29).
BLOCKS_ARE_REGIONS = (hasattr(torch.compiler, "nested_compile_region")
                      and TorchVersion(torch.__version__) >= "2.13")


def _compile_region(forward):
    return torch.compiler.nested_compile_region(forward) if BLOCKS_ARE_REGIONS else forward


class Block(nn.Module):
    """One layer: ``x + post(attn(pre(x))) * residual_scale``, then the same with the FFN;
    the pre norms (absent in olmo2), post norms (gemma, olmo2) and the scale (granite) are
    optional."""

    def __init__(self, attn_norm: RMSNorm | None, attn: Attention, ffn_norm: RMSNorm | None, ffn: FeedForward,
                 post_attn_norm: RMSNorm | None = None, post_ffn_norm: RMSNorm | None = None, rope_key: str = "r0",
                 residual_scale: float = 1.0):
        super().__init__()
        self.attn_norm = attn_norm
        self.attn = attn
        self.post_attn_norm = post_attn_norm
        self.ffn_norm = ffn_norm
        self.ffn = ffn
        self.post_ffn_norm = post_ffn_norm
        self.rope_key = rope_key
        self.residual_scale = float(residual_scale)

    @_compile_region
    def forward(self, x, pos, cos, sin, mask):
        h = self.attn(x if self.attn_norm is None else self.attn_norm(x), pos, cos, sin, mask)
        if self.post_attn_norm is not None:
            h = self.post_attn_norm(h)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        x = x + h
        h = self.ffn(x if self.ffn_norm is None else self.ffn_norm(x))
        if self.post_ffn_norm is not None:
            h = self.post_ffn_norm(h)
        if self.residual_scale != 1.0:
            h = h * self.residual_scale
        return x + h


class Rotary(nn.Module):
    """One RoPE table set: cos/sin [max_ctx, rot/2] of rope_tables, kept in the layout
    of pair_tables."""

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor, neox: bool):
        super().__init__()
        cos, sin = pair_tables(cos, sin, neox)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)


class Decoder(nn.Module):
    """``forward(tokens [1, T], start_pos) -> logits`` of the last position ([1, vocab]),
    or of every position ([1, T, vocab]) with ``all_logits=True``.

    ``start_pos`` (an int or a 0-dim integer tensor; pass a tensor under torch.compile so
    the value is not baked into the graph) is the position of ``tokens[0, 0]``; the KV
    cache must hold positions ``[0, start_pos)`` from earlier calls.

    ``last`` (an int or a 0-dim integer tensor): the index in ``tokens`` whose logits are
    returned, by default the last. A prompt padded at its end (generate() pads prompts
    to a few lengths, so they share compiled programs) gives the logits of its real last
    token this way: the padding comes after it, so causal attention keeps it out of every
    real position, and its cache slots are rewritten by the decode steps before any query
    can see them."""

    def __init__(self, cfg: DecoderConfig, embed: GGUFEmbedding, blocks: list[Block], norm: RMSNorm,
                 lm_head: GGUFLinear, rotary: dict[str, Rotary], max_ctx: int):
        super().__init__()
        self.config = cfg
        self.max_ctx = int(max_ctx)
        self.embed = embed
        self.layers = nn.ModuleList(blocks)
        self.norm = norm
        self.lm_head = lm_head
        self.rotary = nn.ModuleDict(rotary)
        self.embed_scale = cfg.embed_scale
        self.softcap = cfg.final_logit_softcap
        self.logit_scale = cfg.logit_scale
        self.windows = sorted({w for w in cfg.sliding_window if w})
        self.register_buffer("kv_positions", torch.arange(self.max_ctx, dtype=torch.int64), persistent=False)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def check_fits(self, n_tokens: int, start_pos: int = 0) -> None:
        """Raise :class:`ContextOverflowError` unless positions [start_pos, start_pos + n_tokens) fit."""
        if start_pos < 0:
            raise ContextOverflowError(f"start_pos must be >= 0, got {start_pos}")
        if n_tokens < 1:
            raise ValueError("no tokens to run")
        if start_pos + n_tokens > self.max_ctx:
            raise ContextOverflowError(
                f"{n_tokens} tokens at position {start_pos} need a context of {start_pos + n_tokens}, "
                f"but this model's KV cache holds {self.max_ctx} (load it with a larger max_ctx; "
                f"the file's trained context is {self.config.context_length})"
            )

    def kv_caches(self) -> list[torch.Tensor]:
        """Every layer's K and V cache: the tensors that decode steps write in place (the
        loader marks them keep_on_device, chat reads them back before a host prefill)."""
        return [t for layer in self.layers for t in (layer.attn.k_cache, layer.attn.v_cache)]

    @torch.no_grad()
    def reset_cache(self) -> None:
        for layer in self.layers:
            layer.attn.k_cache.zero_()
            layer.attn.v_cache.zero_()

    def forward(self, tokens: torch.Tensor, start_pos=0, last=None, all_logits: bool = False) -> torch.Tensor:
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.dim() != 2 or tokens.shape[0] != 1:
            raise ValueError(f"tokens must have shape [1, T], got {list(tokens.shape)}")
        T = tokens.shape[1]
        if isinstance(start_pos, torch.Tensor):
            if not torch.compiler.is_compiling():
                self.check_fits(T, int(start_pos))
            start = start_pos.to(torch.int64).reshape(())
        else:
            self.check_fits(T, int(start_pos))
            start = torch.tensor(int(start_pos), dtype=torch.int64)
        pos = start + torch.arange(T, dtype=torch.int64)  # [T]
        # [T, C]: key position <= query position, and within a window w: key position >
        # query position - w. The positions themselves are compared, not their differences:
        # an int64 [T, C] difference is a kernel of its own (its overflow check keeps it
        # out of the comparisons' kernel)
        keys = self.kv_positions.unsqueeze(0)
        causal = pos.unsqueeze(1) >= keys
        masks = {None: causal}
        for w in self.windows:
            masks[w] = causal & (keys > (pos - w).unsqueeze(1))
        ropes = {k: (r.cos.index_select(0, pos), r.sin.index_select(0, pos)) for k, r in self.rotary.items()}

        x = self.embed(tokens)  # [1, T, H]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        for layer in self.layers:
            cos, sin = ropes[layer.rope_key]
            x = layer(x, pos, cos, sin, masks[layer.attn.window])
        if not all_logits:
            if last is None:
                x = x[:, -1:, :]
            else:
                if not isinstance(last, torch.Tensor):
                    if not 0 <= int(last) < T:
                        raise ValueError(f"last must index one of the {T} tokens, got {last}")
                    last = torch.tensor(int(last))
                x = x.index_select(1, last.to(torch.int64).reshape(1))
        x = self.norm(x)
        logits = self.lm_head(x)
        if self.logit_scale != 1.0:
            logits = logits / self.logit_scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits if all_logits else logits[:, -1, :]
