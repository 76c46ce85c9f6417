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


def fused_output(query, key, value, is_causal: bool, attn_mask, scale: float | None):
    """softmax(scale q k^T + mask) v as (B, H, L, Ev) from one dynamo_vulkan.attention (a
    kernel with its softmax online, no (B, H, L, S) matrix), where that op means the same:
    float32 q, k, v, and no mask or a causal one, under which every row attends to a key
    (a bool mask may hide a whole row, whose output SDPA defines as 0, the op's as NaN).
    None elsewhere. Batch and heads fold into the op's heads: query head b * H + h reads
    kv head b * Hkv + h // (H // Hkv), as grouped-query attention pairs them."""
    from dynamo_vulkan.fused import attention

    if attn_mask is not None or {query.dtype, key.dtype, value.dtype} != {torch.float32}:
        return None
    sizes = (*query.shape, *key.shape, *value.shape)
    if not all(isinstance(n, int) for n in sizes):      # symbolic sizes: the math form
        return None
    b, h, t, d = query.shape
    hkv, c, dv = key.shape[1], key.shape[2], value.shape[3]
    if 0 in (b, h, t, d, hkv, c, dv) or h % hkv:
        return None
    mask = torch.ones(t, c, dtype=torch.bool, device=query.device)
    if is_causal:
        mask = mask.tril()
    sc = scale if scale is not None else 1.0 / math.sqrt(d)
    out = attention(query.reshape(b * h, t, d), key.reshape(b * hkv, c, d),
                    value.reshape(b * hkv, c, dv), mask, sc)
    return out.reshape(b, h, t, dv)


def scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p: float = 0.0,
                                               is_causal: bool = False, *, attn_mask=None,
                                               scale: float | None = None):
    """(output, logsumexp), as the op returns them, from one matrix of scores: scale * q
    k^T plus the mask, in float32 for half types (the CPU kernel's accumulation type);
    its row maxima, exponentials and sums give both the probabilities and the logsumexp
    that the backward reads. A row with nothing to attend gets output 0 and logsumexp 0
    (the kernel's convention, which keeps its backward's exp(scores - lse) free of NaN).
    The output comes from the fused attention where it means the same (fused_output);
    then no graph reads the logsumexp (the backward without a mask takes the scores'
    softmax), and the scores here are dead code."""
    torch._check(dropout_p == 0.0,
                 lambda: f"flash attention for CPU: dropout must be zero, got p={dropout_p}")
    torch._check(query.dim() == 4 and key.dim() == 4 and value.dim() == 4,
                 lambda: "flash attention for CPU: q, k, v must be 4-dimensional")
    scores = attention_scores(query, key, attn_mask, is_causal, scale)
    peak = scores.amax(-1, keepdim=True)
    peak = torch.where(peak == float("-inf"), torch.zeros_like(peak), peak)
    weights = (scores - peak).exp()
    total = weights.sum(-1, keepdim=True)
    total = torch.where(total == 0, torch.ones_like(total), total)
    output = fused_output(query, key, value, is_causal, attn_mask, scale)
    if output is None:
        v = value.to(scores.dtype)
        if v.size(-3) != scores.size(-3):             # grouped-query attention
            v = v.repeat_interleave(scores.size(-3) // v.size(-3), dim=-3)
        output = torch.matmul(weights / total, v).to(query.dtype)
    # the flash op's output layout: (B, L, H, E) in memory, seen as (B, H, L, E)
    output = output.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    return output, (peak + total.log()).squeeze(-1)


# op -> decomposition, replacing core ATen's for that op
OVERRIDES = {
    aten._scaled_dot_product_flash_attention_for_cpu.default:
        scaled_dot_product_flash_attention_for_cpu,
}
