"""Small reference models used by the demo, the tests and the benchmarks."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, dims=(256, 1024, 1024, 256)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.gelu(x)
        return x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class TransformerBlock(nn.Module):
    """Pre-norm decoder block: RMSNorm, causal multi-head attention, SwiGLU, residuals."""

    def __init__(self, dim: int = 256, heads: int = 4, hidden: int = 688):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class SmallCNN(nn.Module):
    """conv-batchnorm-relu-maxpool blocks, adaptive average pooling, a linear head."""

    def __init__(self, channels=(3, 16, 32, 64), classes: int = 10, pooled: int = 2):
        super().__init__()
        blocks = []
        for cin, cout in zip(channels, channels[1:]):
            blocks += [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                       nn.ReLU(), nn.MaxPool2d(2)]
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(pooled)
        self.head = nn.Linear(channels[-1] * pooled * pooled, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class EmbeddingBagClassifier(nn.Module):
    """Bag-of-tokens text classifier: EmbeddingBag (mean over each text), then an MLP.
    Texts are one flat tensor of token ids plus the offset where each text starts."""

    def __init__(self, vocab: int = 1000, dim: int = 64, hidden: int = 64, classes: int = 4):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, tokens, offsets):
        return self.mlp(self.embed(tokens, offsets))


class GPT2Attention(nn.Module):
    """Causal multi-head self-attention written out: fused qkv projection, a
    causal mask buffer, softmax, attention dropout (off in eval), output projection."""

    def __init__(self, dim: int, heads: int, max_len: int, dropout: float = 0.1):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool))
                             .view(1, 1, max_len, max_len), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // self.heads))
        att = att.masked_fill(~self.causal[:, :, :t, :t], float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.resid_drop(self.c_proj(y))


class GPT2Block(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int, dropout: float = 0.1):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = GPT2Attention(dim, heads, max_len, dropout)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """A GPT-2-style decoder from plain torch modules: token and learned position
    embeddings, pre-LayerNorm blocks, a final LayerNorm and an LM head tied to the
    token embedding. Returns logits (batch, time, vocab)."""

    def __init__(self, vocab: int = 512, dim: int = 64, heads: int = 4, layers: int = 2,
                 max_len: int = 64, dropout: float = 0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_len, dim)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPT2Block(dim, heads, max_len, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight          # tied

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))
