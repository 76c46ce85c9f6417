"""Build a :class:`~dynamo_vulkan.models.decoder.Decoder` from a GGUF file.

Every tensor the architecture needs is checked (present, right shape, a quant type we
decode) before anything is loaded; the model is returned only when complete.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dynamo_vulkan import keep_on_device
from dynamo_vulkan.gguf.errors import GGUFError
from dynamo_vulkan.gguf.op import GGUFEmbedding, GGUFLinear
from ..reader import GGUFFile, open_gguf
from .config import DecoderConfig, config_from_gguf
from .decoder import Attention, Block, Decoder, FeedForward, RMSNorm, Rotary, rope_tables

__all__ = ["load_model", "build_decoder", "DEFAULT_MAX_CTX"]

log = logging.getLogger(__name__)

DEFAULT_MAX_CTX = 2048


def _layer_tensors(cfg: DecoderConfig, i: int) -> dict[str, tuple[int, ...]]:
    p = f"blk.{i}."
    H, hd, vd = cfg.hidden, cfg.head_dim, cfg.v_head_dim
    nq, nk, nv = cfg.n_heads * hd, cfg.n_kv_heads * hd, cfg.n_kv_heads * vd
    t = {p + "attn_norm.weight": (H,)} if cfg.pre_norms else {}
    if cfg.fused_qkv:
        t[p + "attn_qkv.weight"] = (nq + nk + nv, H)
    else:
        t |= {p + "attn_q.weight": (nq, H), p + "attn_k.weight": (nk, H), p + "attn_v.weight": (nv, H)}
    if cfg.qkv_bias:
        t |= {p + "attn_q.bias": (nq,), p + "attn_k.bias": (nk,), p + "attn_v.bias": (nv,)}
    t[p + "attn_output.weight"] = (H, cfg.n_heads * vd)
    if cfg.pre_norms:
        t[p + "ffn_norm.weight"] = (H,)
    if cfg.fused_gate_up:
        t[p + "ffn_up.weight"] = (2 * cfg.ffn_dim, H)
    else:
        t |= {p + "ffn_gate.weight": (cfg.ffn_dim, H), p + "ffn_up.weight": (cfg.ffn_dim, H)}
    t[p + "ffn_down.weight"] = (H, cfg.ffn_dim)
    if cfg.qk_norm:  # per head, or over the whole projection (olmo2)
        t[p + "attn_q_norm.weight"] = (nq,) if cfg.qk_norm_whole else (hd,)
        t[p + "attn_k_norm.weight"] = (nk,) if cfg.qk_norm_whole else (hd,)
    if cfg.post_norms:
        t[p + "post_attention_norm.weight"] = (H,)
        t[p + "post_ffw_norm.weight"] = (H,)
    return t


def _expected_tensors(cfg: DecoderConfig, max_ctx: int) -> dict[str, tuple[int, ...]]:
    t = {"token_embd.weight": (cfg.vocab_size, cfg.hidden), "output_norm.weight": (cfg.hidden,)}
    if not cfg.tied_embeddings:
        t["output.weight"] = (cfg.vocab_size, cfg.hidden)
    factors = cfg.rope_factors_for(max_ctx)
    if factors is not None:
        t[factors] = (cfg.rope_dim // 2,)
    for i in range(cfg.n_layers):
        t.update(_layer_tensors(cfg, i))
    return t


def _finite_vector(f: GGUFFile, name: str, *, positive: bool = False) -> torch.Tensor:
    """A float vector of the file (norm weights, rope factors), checked finite (and > 0)."""
    w = f.float_tensor(name)
    bad = ~torch.isfinite(w) | (w <= 0 if positive else torch.zeros_like(w, dtype=torch.bool))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        allowed = "finite and > 0" if positive else "finite"
        raise GGUFError(f"{f.path}: tensor {name!r} holds {float(w.reshape(-1)[i])} at index {i} "
                        f"(allowed: {allowed})")
    return w


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency, but loading must not need it
        return None
    return tqdm(total=total, desc=desc, unit="tensor", leave=False)


def build_decoder(f: GGUFFile, max_ctx: int | None = None, *, fuse: bool = True, progress: bool = False) -> Decoder:
    """The decoder of an open GGUF file (an architecture of config.SUPPORTED_ARCHITECTURES)."""
    cfg = config_from_gguf(f)
    if max_ctx is None:
        max_ctx = min(cfg.context_length, DEFAULT_MAX_CTX)
    max_ctx = int(max_ctx)
    if max_ctx < 1:
        raise ValueError(f"max_ctx must be >= 1, got {max_ctx}")
    expected = _expected_tensors(cfg, max_ctx)
    f.require(expected)
    for name, shape in expected.items():
        got = f.tensor_info(name).shape
        if tuple(got) != tuple(shape):
            raise GGUFError(f"{f.path}: tensor {name!r} has shape {list(got)}, expected {list(shape)}")

    bar = _progress(len(expected), f"loading {Path(f.path).name}", progress)

    def tick():
        if bar is not None:
            bar.update(1)

    def raw(name):
        info = f.tensor_info(name)
        return info, f.raw(name)

    def linear(names: list[str]) -> GGUFLinear:
        """One GGUFLinear over the rows of one or more same-type weights (and their biases)."""
        infos = [f.tensor_info(n) for n in names]
        blocks = f.raw_concat(names)        # read side by side: no second copy to concatenate
        biases = [n[: -len(".weight")] + ".bias" for n in names]
        bias = None
        if any(f.has_tensor(b) for b in biases):
            bias = torch.cat([
                f.float_tensor(b).reshape(-1) if f.has_tensor(b) else torch.zeros(i.shape[0])
                for b, i in zip(biases, infos)
            ])
        for _ in names:
            tick()
        rows = sum(i.shape[0] for i in infos)
        return GGUFLinear(blocks, infos[0].qtype, rows, infos[0].shape[1], bias=bias, name=names[0])

    def same_type(names):
        return fuse and len({f.tensor_info(n).qtype for n in names}) == 1

    def norm(name, eps=cfg.norm_eps):
        tick()
        return RMSNorm(_finite_vector(f, name), eps)

    try:
        emb_info, emb_blocks = raw("token_embd.weight")
        tick()
        embed = GGUFEmbedding(emb_blocks, emb_info.qtype, emb_info.shape[0], emb_info.shape[1], name="token_embd.weight")

        factors_name = cfg.rope_factors_for(max_ctx)
        freq_factors = _finite_vector(f, factors_name, positive=True) if factors_name else None
        rotary: dict[str, Rotary] = {}
        rope_keys: dict[tuple, str] = {}
        layer_rope = []
        for i in range(cfg.n_layers):
            key = (cfg.rope_base[i], cfg.rope_freq_scale[i], cfg.sliding_window[i] is None)
            use_factors = freq_factors is not None and cfg.sliding_window[i] is None
            key = key + (use_factors,)
            if key not in rope_keys:
                name = f"r{len(rope_keys)}"
                rope_keys[key] = name
                local = cfg.sliding_window[i] is not None
                cos, sin = rope_tables(cfg.rope_base[i], cfg.rope_freq_scale[i], cfg.rope_dim, max_ctx,
                                       freq_factors if use_factors else None,
                                       1.0 if local and cfg.swa_rope_plain else cfg.rope_attn_factor,
                                       None if local else cfg.rope_yarn)
                rotary[name] = Rotary(cos, sin, cfg.rope_neox)
            layer_rope.append(rope_keys[key])

        blocks = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            qkv_names = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
            if cfg.fused_qkv:
                proj = dict(qkv=linear([p + "attn_qkv.weight"]))
            elif same_type(qkv_names):
                proj = dict(qkv=linear(qkv_names))
            elif same_type(qkv_names[:2]):     # e.g. Q4_K_M's Q4_K q and k beside a Q6_K v
                proj = dict(qk=linear(qkv_names[:2]), v=linear(qkv_names[2:]))
            else:
                proj = dict(q=linear(qkv_names[:1]), k=linear(qkv_names[1:2]), v=linear(qkv_names[2:]))
            q_norm = norm(p + "attn_q_norm.weight") if cfg.qk_norm else None
            k_norm = norm(p + "attn_k_norm.weight") if cfg.qk_norm else None
            attn = Attention(cfg, i, max_ctx, o=linear([p + "attn_output.weight"]), q_norm=q_norm, k_norm=k_norm, **proj)
            gu_names = [p + "ffn_gate.weight", p + "ffn_up.weight"]
            if cfg.fused_gate_up:  # gate|up rows of one tensor, gate first
                ffn = FeedForward(cfg.act, linear([p + "ffn_down.weight"]), gate_up=linear([p + "ffn_up.weight"]))
            elif same_type(gu_names):
                ffn = FeedForward(cfg.act, linear([p + "ffn_down.weight"]), gate_up=linear(gu_names))
            else:
                ffn = FeedForward(cfg.act, linear([p + "ffn_down.weight"]),
                                  gate=linear(gu_names[:1]), up=linear(gu_names[1:]))
            blocks.append(Block(
                norm(p + "attn_norm.weight") if cfg.pre_norms else None, attn,
                norm(p + "ffn_norm.weight") if cfg.pre_norms else None, ffn,
                post_attn_norm=norm(p + "post_attention_norm.weight") if cfg.post_norms else None,
                post_ffn_norm=norm(p + "post_ffw_norm.weight") if cfg.post_norms else None,
                rope_key=layer_rope[i], residual_scale=cfg.residual_scale,
            ))

        final_norm = norm("output_norm.weight")
        if cfg.tied_embeddings:
            lm_head = GGUFLinear(embed.blocks, embed.qtype, embed.rows, embed.cols, name="token_embd.weight")
        else:
            lm_head = linear(["output.weight"])
        model = Decoder(cfg, embed, blocks, final_norm, lm_head, rotary, max_ctx)
    finally:
        if bar is not None:
            bar.close()
    model.eval()
    model.requires_grad_(False)
    model.source_path = str(f.path)
    # Compiled for Vulkan, the caches live on the GPU between steps (no copy back per
    # token); read_back(cache) brings them to the host.
    for cache in model.kv_caches():
        keep_on_device(cache)
    return model


def load_model(path, max_ctx: int | None = None, *, fuse: bool = True, progress: bool = False,
               with_tokenizer: bool = False):
    """Load the decoder (and, with ``with_tokenizer``, its tokenizer) of a GGUF file."""
    with open_gguf(path) as f:
        model = build_decoder(f, max_ctx, fuse=fuse, progress=progress)
        if with_tokenizer:
            from ..tokenizer import GGUFTokenizer

            tok = GGUFTokenizer.from_gguf(f)
            return model, tok
    log.info("loaded %s: %s, %d layers, hidden %d, vocab %d, max_ctx %d", path, model.config.arch,
             model.config.n_layers, model.config.hidden, model.config.vocab_size, model.max_ctx)
    return model
