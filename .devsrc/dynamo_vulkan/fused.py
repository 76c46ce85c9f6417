"""Custom ops for model building blocks that a compiled graph runs as one kernel each.

Written with plain ATen ops, an RMSNorm is three kernels (pow, mean, scale) and a
decode step's attention four (scores, mask, softmax, weighted sum), and on a GPU
every dependent kernel costs a few microseconds however small it is. A model that
calls these ops instead (our GGUF decoder does) gets one kernel for each:

``torch.ops.dynamo_vulkan.rms_norm(Tensor x, Tensor weight, float eps) -> Tensor``
    ``x * rsqrt(mean(x**2, -1, keepdim=True) + eps) * weight`` over the last dim.

``torch.ops.dynamo_vulkan.attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale, float softcap=0.0) -> Tensor``
    q [Hq, T, D], k [Hkv, C, D], v [Hkv, C, Dv], mask [T, C] bool (True: attend);
    query head h reads kv head ``h // (Hq // Hkv)`` (grouped-query attention).
    Returns softmax(cap(scale * q k^T) masked) v, [Hq, T, Dv], where ``cap(s)`` is
    ``tanh(s / softcap) * softcap`` for ``softcap > 0`` (Gemma 2's attention logit
    soft-capping) and ``s`` for 0. A row with no True in its mask is NaN, as the
    softmax of nothing but -inf is in eager PyTorch.

The CPU implementations are the reference (eager PyTorch math); the fake ones give
Dynamo shapes; lowering/rowwise.py and lowering/attention.py have the Vulkan kernels.
Registering is idempotent.
"""
from __future__ import annotations

import torch

from .gguf.op import NAMESPACE, define_cpu_op

__all__ = ["rms_norm", "attention"]


def _check_rms_norm(x, weight) -> None:
    torch._check(weight.dim() == 1 and weight.shape[0] == x.shape[-1],
                 lambda: f"rms_norm: weight of shape {list(weight.shape)} for rows of {x.shape[-1]}")


def _rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    _check_rms_norm(x, weight)
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight).contiguous()


def _rms_norm_fake(x, weight, eps):
    _check_rms_norm(x, weight)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _check_attention(q, k, v, mask) -> None:
    torch._check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3,
                 lambda: f"attention: q, k, v must be 3-D [heads, len, dim], got "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    torch._check(k.shape[0] == v.shape[0] and k.shape[1] == v.shape[1],
                 lambda: f"attention: k {list(k.shape)} and v {list(v.shape)} disagree")
    torch._check(q.shape[2] == k.shape[2],
                 lambda: f"attention: q has head dim {q.shape[2]}, k {k.shape[2]}")
    torch._check(k.shape[0] > 0 and q.shape[0] % k.shape[0] == 0,
                 lambda: f"attention: {q.shape[0]} query heads for {k.shape[0]} kv heads")
    torch._check(mask.dtype == torch.bool and tuple(mask.shape) == (q.shape[1], k.shape[1]),
                 lambda: f"attention: mask must be bool [{q.shape[1]}, {k.shape[1]}], got "
                         f"{mask.dtype} {list(mask.shape)}")


def _check_softcap(softcap: float) -> None:
    torch._check(softcap >= 0.0 and softcap != float("inf"),
                 lambda: f"attention: softcap must be finite and >= 0 (0: none), got {softcap}")


def _attention_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float, softcap: float = 0.0) -> torch.Tensor:
    _check_attention(q, k, v, mask)
    _check_softcap(softcap)
    hkv, (hq, t, d), c = k.shape[0], q.shape, k.shape[1]
    g = hq // hkv
    scores = torch.matmul(q.reshape(hkv, g * t, d), k.transpose(1, 2)).reshape(hkv, g, t, c)
    if scale != 1.0:
        scores = scores * scale
    if softcap > 0.0:
        scores = torch.tanh(scores / softcap) * softcap
    scores = torch.where(mask, scores, torch.full_like(scores, float("-inf")))
    probs = torch.softmax(scores, dim=-1).reshape(hkv, g * t, c)
    return torch.matmul(probs, v).reshape(hq, t, v.shape[2])


def _attention_fake(q, k, v, mask, scale, softcap=0.0):
    _check_attention(q, k, v, mask)
    _check_softcap(softcap)
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


define_cpu_op("rms_norm", _rms_norm_cpu, _rms_norm_fake)
define_cpu_op("attention", _attention_cpu, _attention_fake)

rms_norm = getattr(torch.ops, NAMESPACE).rms_norm
attention = getattr(torch.ops, NAMESPACE).attention
