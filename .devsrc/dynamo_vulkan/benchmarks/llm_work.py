"""The work an LLM's prefill and decode step do, from a GGUF file's tensor table: the
FLOPs of a prompt (to state a prefill as a fraction of the device's fp32 FLOP/s) and
the weight bytes a decode step reads (to state decode as a fraction of the copy
bandwidth). Only the header is read, so a file of any size answers at once.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelWork:
    layer_weights: int     # elements of the matrices in the layers (blk.*, 2-D)
    head_weights: int      # elements of the output head (the tied embedding where there is no output.weight)
    attn_width: int        # sum over layers of heads x head_dim of the queries
    step_bytes: int        # bytes of every tensor a decode step reads (the embedding's one row left out)

    def prefill_flops(self, n: int) -> int:
        """A prompt of n tokens: every layer matrix on every token, the output head on the
        last token only (both we and llama.cpp compute one row of logits), and causal
        attention in full: QK^T and PV over n(n+1)/2 query-key pairs (sliding windows,
        which skip some, are counted in full)."""
        pairs = n * (n + 1) // 2
        return 2 * n * self.layer_weights + 2 * self.head_weights + 4 * self.attn_width * pairs


def model_work(path: Path) -> ModelWork:
    from dynamo_vulkan.llm.reader import open_gguf

    with open_gguf(path, check_architecture=False, header_only=True) as f:
        tensors = f.tensors
        layer = sum(t.rows * t.cols for t in tensors.values() if t.name.startswith("blk.") and len(t.shape) == 2)
        head = tensors.get("output.weight") or tensors.get("token_embd.weight")
        embd = tensors.get("token_embd.weight")
        step = sum(t.nbytes for t in tensors.values())
        if embd is not None and "output.weight" in tensors:
            step -= embd.nbytes          # one row of it is gathered per token
        n_layers = int(f.arch_get("block_count"))
        heads = f.arch_get("attention.head_count")
        heads = list(heads) if isinstance(heads, list) else [int(heads)] * n_layers
        hidden = int(f.arch_get("embedding_length"))
        head_dim = int(f.arch_get("attention.key_length", 0)) or hidden // max(heads)
    return ModelWork(layer, head.rows * head.cols if head is not None else 0,
                     sum(int(h) for h in heads) * head_dim, step)
