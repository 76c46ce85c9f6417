"""Several greedy decode steps in one call, so one compiled graph (one GPU submit)
produces ``k`` tokens.

A decode call on a GPU costs a fixed submit round trip and host work (torch.compile's
guards, copying inputs in and tokens out: just under 1 ms per call on the H100's host,
measured for Gemma 3) plus the step's kernels. With the argmax computed in the graph and
fed straight to the next step's embedding lookup, and the positions known ahead
(``start_pos + i``), the round trip and the host work around it are paid once per ``k``
tokens. The caller drops tokens after an end-of-sequence token; the cache slots they
wrote are overwritten by the next prompt's prefill or never attended to.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["GreedySteps"]


class GreedySteps(nn.Module):
    """``forward(token [1, 1], positions [k]) -> [k]`` int64: the greedy tokens after
    ``token``, which sits at ``positions[0]``; the decoder's KV cache gains the
    ``positions`` (consecutive: ``start + arange(k)``).

    k is the length of ``positions``, so it is part of the input shapes that a compiled
    graph is specialised and guarded on (module attributes may be unguarded; see
    generate.compile_decoder)."""

    def __init__(self, decoder: nn.Module):
        super().__init__()
        self.decoder = decoder

    @staticmethod
    def positions(start: int, k: int) -> torch.Tensor:
        if k < 1:
            raise ValueError(f"steps per call must be >= 1, got {k}")
        return torch.arange(start, start + k, dtype=torch.int64)

    def forward(self, token: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        tok = token.reshape(1, 1).to(torch.int64)
        out = []
        for i in range(positions.shape[0]):
            logits = self.decoder(tok, positions[i])           # [1, vocab]
            tok = torch.argmax(logits, dim=-1, keepdim=True)  # [1, 1], first index of the max
            out.append(tok.reshape(1))
        return torch.cat(out)
