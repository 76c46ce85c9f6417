"""Decompositions that replace core ATen's where its forward would change the meaning
of an output that the op's backward reads.

aot_autograd decomposes a forward op below autograd: the op's own derivative formula
still runs in the backward graph, on the outputs the decomposition returned. Core ATen's
decomposition of `_scaled_dot_product_flash_attention_for_cpu` returns the attention
probabilities (B, H, L, S) where the op returns its logsumexp (B, H, L), and
`_scaled_dot_product_flash_attention_for_cpu_backward` reads that slot as the logsumexp:
gradients through `F.scaled_dot_product_attention` came out wrong, silently. (Inductor
drops that decomposition and runs the op whole.)
"""
from __future__ import annotations

import math

import torch

aten = torch.ops.aten


def attention_scores(query, key, attn_mask, is_causal: bool, scale: float | None):
    """scale * q k^T plus the mask (-inf where a bool mask or causality hides a key), in
    float32 for half types (the CPU kernel's accumulation type); grouped-query keys are
    repeated for their query heads."""
    acc = torch.promote_types(query.dtype, torch.float32)
    q, k = query.to(acc), key.to(acc)
    if q.size(-3) != k.size(-3):                      # grouped-query attention
        k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
    sc = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    scores = torch.matmul(q, k.transpose(-2, -1)) * sc
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask.to(acc)
    return scores


def _attention_logsumexp(query, key, attn_mask, is_causal: bool, scale: float | None):
    """log(sum(exp(scores))) over each query row, as the CPU flash-attention kernel saves it
    for its backward: scores = scale * q k^T plus the mask, computed in float32 (the
    kernel's accumulation type for half types); a row with nothing to attend gets 0 (the
    kernel's convention, which keeps its backward's exp(scores - lse) free of NaN)."""
    scores = attention_scores(query, key, attn_mask, is_causal, scale)
    peak = scores.amax(-1, keepdim=True)
    peak = torch.where(peak == float("-inf"), torch.zeros_like(peak), peak)
    total = (scores - peak).exp().sum(-1)
    total = torch.where(total == 0, torch.ones_like(total), total)
    return peak.squeeze(-1) + total.log()


def scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p: float = 0.0,
                                               is_causal: bool = False, *, attn_mask=None,
                                               scale: float | None = None):
    """(output, logsumexp), as the op returns them. The output is the math attention that
    core ATen's decomposition computes (so the forward graph, and its kernels, are the
    same); the logsumexp is computed beside it for the backward, and an inference graph,
    which does not use it, drops it as dead code."""
    torch._check(dropout_p == 0.0,
                 lambda: f"flash attention for CPU: dropout must be zero, got p={dropout_p}")
    torch._check(query.dim() == 4 and key.dim() == 4 and value.dim() == 4,
                 lambda: "flash attention for CPU: q, k, v must be 4-dimensional")
    output, _ = aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask=attn_mask, dropout_p=0.0, is_causal=is_causal,
        dropout_mask=None, scale=scale, enable_gqa=query.size(1) != key.size(1))
    # the flash op's output layout: (B, L, H, E) in memory, seen as (B, H, L, E)
    output = output.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    return output, _attention_logsumexp(query, key, attn_mask, is_causal, scale)


# op -> decomposition, replacing core ATen's for that op
OVERRIDES = {
    aten._scaled_dot_product_flash_attention_for_cpu.default:
        scaled_dot_product_flash_attention_for_cpu,
}
