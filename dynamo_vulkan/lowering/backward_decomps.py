"""Decompositions of backward ops into ops that have lowerings, so a training step's
backward graph runs on Vulkan without kernels of its own.

torch._decomp has none for `convolution_backward`, adaptive average pooling's backward
or the CPU flash attention's backward; each is written here from its definition: the
input's gradient of a convolution is a transposed convolution and the weight's a matrix
product of the output's gradient with the input's windows, pooling's are two matrix
products with the windows' weights, and attention's are the math form's matrix products,
recomputing the probabilities from the logsumexp that the forward saved.
"""
from __future__ import annotations

import itertools
import math

import torch

from .decomp_overrides import attention_scores

aten = torch.ops.aten


# The stacked windows of one weight-gradient product at most (they hold the input once per
# kernel offset): a larger batch is summed in chunks of images, each its own product.
WINDOWS_MAX_BYTES = 32 << 20


def _weight_grad(x, gy, w_shape, stride, padding, dilation, groups):
    """d loss / d weight of a direct convolution y = conv(x, w): for each kernel offset, the
    sum over the batch and the output positions of gy times the input that offset met.
    Those inputs are a strided window of the zero-padded x; the windows of every offset,
    stacked as (cin, offsets, n, *out), make the gradient one matrix product per group,
    gy (cout, n * out) by the windows' (n * out, cin * offsets), whose long K the matmul
    kernels split; input positions past the last window (the stride's leftovers) are
    never read. Batches whose windows exceed WINDOWS_MAX_BYTES are summed in chunks."""
    n, cin = int(x.shape[0]), int(x.shape[1])
    cout = int(gy.shape[1])
    ks = [int(k) for k in w_shape[2:]]
    out = [int(s) for s in gy.shape[2:]]
    cg, cog = cin // groups, cout // groups
    xt = x.transpose(0, 1)                                   # (cin, n, *spatial)
    if any(padding):
        xt = aten.constant_pad_nd.default(xt, [q for p in reversed(padding) for q in (p, p)], 0.0)
    offsets, positions = math.prod(ks), math.prod(out)
    chunk = max(1, WINDOWS_MAX_BYTES // (cin * offsets * positions * x.element_size()))
    gw = None
    for first in range(0, n, chunk):
        images = min(chunk, n - first)
        xc = aten.slice.Tensor(xt, 1, first, first + images)
        windows = []
        for offs in itertools.product(*(range(k) for k in ks)):
            v = xc
            for d, (o, s, dl, size) in enumerate(zip(offs, stride, dilation, out)):
                v = aten.slice.Tensor(v, 2 + d, o * dl, o * dl + (size - 1) * s + 1, s)
            windows.append(v)
        depth = images * positions                          # the product's K
        cols = torch.stack(windows, 1).reshape(groups, cg * offsets, depth)
        gyt = aten.slice.Tensor(gy, 0, first, first + images).transpose(0, 1).reshape(groups, cog, depth)
        part = torch.matmul(gyt, cols.transpose(1, 2))
        gw = part if gw is None else gw + part
    return gw.reshape(cout, cg, *ks)


def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    """(grad_input, grad_weight, grad_bias) of aten.convolution, each None where
    output_mask leaves it out."""
    nd = weight.dim() - 2
    stride, padding, dilation = (list(v) * (nd if len(v) == 1 else 1)
                                 for v in (stride, padding, dilation))
    gx = gw = gb = None
    if output_mask[0]:
        if transposed:       # the input's gradient of a transposed conv is a direct conv
            gx = aten.convolution.default(grad_output, weight, None, stride, padding, dilation,
                                          False, [0] * nd, groups)
        else:                # and of a direct conv, a transposed one of the input's size
            extra = [int(input.shape[2 + d]) - ((int(grad_output.shape[2 + d]) - 1) * stride[d]
                     - 2 * padding[d] + dilation[d] * (int(weight.shape[2 + d]) - 1) + 1)
                     for d in range(nd)]
            gx = aten.convolution.default(grad_output, weight, None, stride, padding, dilation,
                                          True, extra, groups)
    if output_mask[1]:
        if transposed:       # y = conv_transpose(x, w) pairs x with gy as a direct conv pairs gy with x
            gw = _weight_grad(grad_output, input, weight.shape, stride, padding, dilation, groups)
        else:
            gw = _weight_grad(input, grad_output, weight.shape, stride, padding, dilation, groups)
    if output_mask[2]:
        gb = grad_output.sum([0] + list(range(2, grad_output.dim())))
    return gx, gw, gb


def flash_attention_for_cpu_backward(grad_out, query, key, value, out, logsumexp,
                                     dropout_p: float, is_causal: bool, *, attn_mask=None,
                                     scale: float | None = None):
    """Gradients of softmax(scale q k^T + mask) v, with the probabilities recomputed: from
    the saved logsumexp under a mask (a row with nothing to attend has logsumexp 0 and
    scores of -inf: probabilities 0, as the CPU kernel's backward has them), else as the
    scores' softmax."""
    torch._check(dropout_p == 0.0,
                 lambda: f"flash attention backward: dropout must be zero, got {dropout_p}")
    acc = torch.promote_types(query.dtype, torch.float32)
    q, k, v = query.to(acc), key.to(acc), value.to(acc)
    go, o = grad_out.to(acc), out.to(acc)
    rep = q.size(-3) // k.size(-3)
    if rep != 1:                                              # grouped-query attention
        k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
    sc = scale if scale is not None else 1.0 / math.sqrt(query.size(-1))
    scores = attention_scores(query, key, attn_mask, is_causal, scale)
    if attn_mask is None:
        # no row is wholly masked (no mask, or a causal one): the probabilities are the
        # scores' softmax, and the forward's logsumexp goes unread (dead code there where
        # the fused kernel gave the output: decomp_overrides.fused_output)
        probs = torch.softmax(scores, -1)
    else:
        probs = (scores - logsumexp.to(acc).unsqueeze(-1)).exp()
    gv = torch.matmul(probs.transpose(-2, -1), go)
    gp = torch.matmul(go, v.transpose(-2, -1))
    gs = probs * (gp - (go * o).sum(-1, keepdim=True))
    gq = torch.matmul(gs, k) * sc
    gk = torch.matmul(gs.transpose(-2, -1), q) * sc
    if rep != 1:
        shape = (gk.size(0), gk.size(1) // rep, rep) + tuple(gk.shape[2:])
        gk, gv = gk.reshape(shape).sum(2), gv.reshape(shape).sum(2)
    return gq.to(query.dtype), gk.to(key.dtype), gv.to(value.dtype)


def _pool_weights(size: int, out: int, like: torch.Tensor) -> torch.Tensor:
    """(size, out): 1/len(window j) where input position i lies in adaptive pooling window j
    (windows [floor(j size / out), ceil((j + 1) size / out)), as torch's kernels take them)."""
    j = torch.arange(out, device=like.device)
    start = (j * size) // out
    end = ((j + 1) * size + out - 1) // out
    i = torch.arange(size, device=like.device).unsqueeze(1)
    inside = (i >= start) & (i < end)
    return inside.to(like.dtype) / (end - start).to(like.dtype)


def adaptive_avg_pool2d_backward(grad_output, input):
    """The input's gradient of adaptive average pooling: each output's gradient spread
    evenly over its window. The window weights separate into rows and columns, so it is
    two matrix products: rows (H, oh) @ grad (.., oh, ow) @ columns (W, ow)^T."""
    rows = _pool_weights(int(input.shape[-2]), int(grad_output.shape[-2]), grad_output)
    cols = _pool_weights(int(input.shape[-1]), int(grad_output.shape[-1]), grad_output)
    return torch.matmul(torch.matmul(rows, grad_output), cols.transpose(0, 1))


# backward op -> its decomposition into lowered ops
BACKWARD_DECOMPOSITIONS = {
    aten._adaptive_avg_pool2d_backward.default: adaptive_avg_pool2d_backward,
    aten.convolution_backward.default: convolution_backward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
        flash_attention_for_cpu_backward,
}
