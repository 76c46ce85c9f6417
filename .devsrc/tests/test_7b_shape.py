"""A 7B-class model on lavapipe: one layer with Qwen2-7B's shapes (hidden 3584, FFN 18944,
28 query / 4 KV heads of 128, vocab 152064) in Q4_K_M's types and random weights,
written at test time from its shapes (benchmarks/synth_model.py; ~900 MB in tmp). Its
token embedding (Q4_K, 306 MB) and output head (Q6_K, 447 MB) exceed lavapipe's 128 MiB
buffer limit and are split across buffers. The replayed compiled decode step (its
argmax feeding the next step's embedding lookup on the GPU) gives eager's greedy tokens,
with every GGUF node on Vulkan.

The eager reference costs ~9 s a step on a 2-core machine (dequantizing the 545M-weight
head), so the test compares three steps."""
from __future__ import annotations

import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan.gguf.quants import row_nbytes
from dynamo_vulkan.lowering import gguf as gguf_lowering
from dynamo_vulkan.runtime.program import Resident

pytest.importorskip("gguf")

from dynamo_vulkan.benchmarks import synth_model  # noqa: E402
from test_big_tensors import greedy_tokens  # noqa: E402

STEPS = 3


@pytest.fixture(scope="module")
def model_7b(tmp_path_factory):
    from dynamo_vulkan.llm.models import load_model
    skel = synth_model.llama_skeleton(**synth_model.QWEN2_7B)
    path = synth_model.write_model(skel, tmp_path_factory.mktemp("7b") / "qwen2-7b-shapes-1layer.gguf",
                                   n_layers=1)
    model = load_model(path, max_ctx=16)
    path.unlink()        # the model holds its own copy of the bytes
    return model


def _chunks(module) -> list[int]:
    """Rows in each buffer that the module's blocks were uploaded into."""
    rb = row_nbytes(module.qtype, module.cols)
    return sorted(key[-1][1] // rb for key in Resident._pool
                  if key[0] == id(module.blocks) and isinstance(key[-1], tuple))


def test_greedy_tokens_equal_eager(model_7b, monkeypatch):
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    model = model_7b
    emb, head = model.embed, model.lm_head
    assert (emb.rows, emb.cols, head.rows) == (152064, 3584, 152064)
    assert emb.blocks.numel() > gguf_lowering._limit() and head.blocks.numel() > gguf_lowering._limit()
    n = len(dynamo_vulkan.reports())
    want, got = greedy_tokens(model, 1000, steps=STEPS, k=STEPS - 1)
    assert got == want
    assert len(_chunks(emb)) >= 3 and len(_chunks(head)) >= 4
    nodes = [d for r in dynamo_vulkan.reports()[n:] for d in r.nodes if "gguf" in d.op]
    assert {d.op.split(".")[-2] for d in nodes} >= {"gguf_linear", "gguf_embedding"}, nodes
    assert all(d.where == "vulkan" for d in nodes), [(d.op, d.where, d.reason) for d in nodes]
