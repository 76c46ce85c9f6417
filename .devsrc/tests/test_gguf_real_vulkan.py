"""The real GGUF models (the `models` extra) compiled with backend="vulkan": the same
32 greedy tokens as the same model run eagerly on the CPU, last-position logits
within 1e-3 relative, llama.cpp's top-1 token, everything on the GPU, and one
submit per decode step."""
from __future__ import annotations

import pytest
import torch

import dynamo_vulkan
from gguf_fixtures import REAL_MODELS, package_installed, reference

N_TOKENS = 32
REF = reference()


def _greedy(step, ids: list[int], n: int):
    """Prefill then n-1 decode steps of argmax; returns (prefill logits, tokens,
    submits per decode step)."""
    with torch.no_grad():
        logits = step(torch.tensor([ids]), torch.tensor(0))
        first = logits[0].clone()
        tokens, submits = [], []
        for i in range(n):
            tokens.append(int(logits[0].argmax()))
            if i == n - 1:
                break
            before = dynamo_vulkan.runtime_stats()["submits"]
            logits = step(torch.tensor([[tokens[-1]]]), torch.tensor(len(ids) + i))
            submits.append(dynamo_vulkan.runtime_stats()["submits"] - before)
    return first, tokens, submits


@pytest.fixture(scope="module", params=list(REAL_MODELS))
def run(request):
    key = request.param
    name, package, module = REAL_MODELS[key]
    if not package_installed(module):
        pytest.skip(f"{package} is not installed (the models extra: DYNAMO_VULKAN_EXTRAS=models)")
    from dynamo_vulkan.llm.generate import find_model
    from dynamo_vulkan.llm.models import load_model

    model, tok = load_model(find_model(name), max_ctx=64, with_tokenizer=True)
    ids = tok.encode(REF["models"][key]["prompt"])
    eager = _greedy(model, ids, N_TOKENS)
    model.reset_cache()
    n_reports = len(dynamo_vulkan.reports())
    compiled = torch.compile(model, backend="vulkan", dynamic=False)
    vulkan = _greedy(compiled, ids, N_TOKENS)
    reports = dynamo_vulkan.reports()[n_reports:]
    yield key, eager, vulkan, reports
    del model, compiled
    torch._dynamo.reset()


@pytest.mark.slow
def test_same_greedy_tokens_as_eager(run):
    key, (_, want, _), (_, got, _), _ = run
    assert got == want


@pytest.mark.slow
def test_last_position_logits_within_1e3_relative(run):
    key, (want, _, _), (got, _, _), _ = run
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err < 1e-3, f"{key}: max |vulkan - eager| / max |eager| = {err:.2e}"


@pytest.mark.slow
def test_top1_agrees_with_llamacpp(run):
    key, _, (logits, tokens, _), _ = run
    assert tokens[0] == REF["models"][key]["top10_ids"][0]


@pytest.mark.slow
def test_all_on_gpu_and_one_submit_per_decode_step(run):
    key, _, (_, _, submits), reports = run
    assert len(reports) == 2                       # one prefill graph, one decode graph
    for r in reports:
        assert not r.cpu_nodes, str(r)
        assert r.partitions == 1
    assert submits == [1] * (N_TOKENS - 1)
