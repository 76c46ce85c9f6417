"""Sampling settings of generate(): repetition, presence and frequency penalties
(dynamo_vulkan.llm.sampling, llama.cpp's definitions), min-p, the first token's time."""

from __future__ import annotations

import pytest
import torch

from dynamo_vulkan.llm.generate import _sample
from dynamo_vulkan.llm.sampling import Penalties

LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, 0.0])


def test_penalties_by_hand():
    p = Penalties(repeat_penalty=2.0, repeat_last_n=-1, presence_penalty=0.5, frequency_penalty=0.25)
    context = [0, 0, 1, 3, 3, 3]
    # token 0 (twice): 2/2 - 2*0.25 - 0.5; 1 (once, negative): -1*2 - 0.25 - 0.5; 3 (3 times): 3/2 - 0.75 - 0.5
    assert p.apply(LOGITS, context).tolist() == [0.0, -2.75, 0.5, 0.25, 0.0]
    last2 = Penalties(2.0, 2, 0.5, 0.25)                       # only [3, 3] counts
    assert last2.apply(LOGITS, context).tolist() == [2.0, -1.0, 0.5, 0.5, 0.0]
    assert Penalties(2.0, 0).apply(LOGITS, context) is LOGITS    # a window of none: off
    assert Penalties().apply(LOGITS, context) is LOGITS          # the defaults: off
    assert LOGITS.tolist() == [2.0, -1.0, 0.5, 3.0, 0.0]         # never changed in place
    assert Penalties(1.5).apply(LOGITS.reshape(1, 5), []).tolist() == LOGITS.tolist()


@pytest.mark.parametrize("kwargs", [dict(repeat_penalty=0.0), dict(repeat_penalty=float("inf")),
                                    dict(repeat_last_n=-2), dict(repeat_last_n=1.5), dict(repeat_last_n=True),
                                    dict(presence_penalty=float("nan")), dict(frequency_penalty=101.0)])
def test_penalties_out_of_range(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Penalties(**kwargs)


def test_min_p():
    logits = torch.tensor([0.0, 5.0, 4.99, -3.0])
    gen = torch.Generator().manual_seed(0)
    drawn = {_sample(logits, 1.0, 0, 1.0, gen, min_p=0.5) for _ in range(300)}
    assert drawn == {1, 2}          # 0 and 3 are under half the likeliest's probability
    assert {_sample(logits, 5.0, 0, 1.0, gen, min_p=1.0) for _ in range(50)} == {1}
    assert len({_sample(logits, 5.0, 0, 1.0, gen) for _ in range(300)}) == 4     # min-p off: all four


def test_generate_with_penalties(tmp_path):
    pytest.importorskip("gguf")
    pytest.importorskip("tokenizers")
    from gguf_fixtures import write_tiny_model

    from dynamo_vulkan.llm.generate import generate, load

    m, tok = load(write_tiny_model(tmp_path / "tiny.gguf", "llama"), max_ctx=48)
    ids = tok.encode("hello the world")
    p = Penalties(repeat_penalty=1.3, repeat_last_n=8, presence_penalty=0.4, frequency_penalty=0.2)
    r = generate(m, "hello the world", tok, max_new_tokens=12, backend=None, stop_at_eos=False,
                 repeat_penalty=1.3, repeat_last_n=8, presence_penalty=0.4, frequency_penalty=0.2)
    want, context = [], list(ids)                # greedy over the penalised logits, step by step
    logits = m(torch.tensor([ids]), 0)
    for i in range(12):
        nxt = int(p.apply(logits, context).argmax())
        want.append(nxt)
        context.append(nxt)
        logits = m(torch.tensor([[nxt]]), len(ids) + i)
    assert r.tokens == want
    plain = generate(m, "hello the world", tok, max_new_tokens=12, backend=None, stop_at_eos=False)
    assert plain.tokens != want                  # the penalties changed the answer
    # a presence penalty that outweighs any logit: no token of the window comes again
    r = generate(m, "hello the world", tok, max_new_tokens=12, backend=None, stop_at_eos=False,
                 presence_penalty=100.0, repeat_last_n=-1)
    assert len(set(r.tokens)) == 12 and not set(r.tokens) & set(ids)
    assert 0 < r.first_token_s and "first token" in r.stats_line()
    with pytest.raises(ValueError, match="min_p"):
        generate(m, "hello", tok, max_new_tokens=2, backend=None, min_p=1.5)
    with pytest.raises(ValueError, match="penalties"):
        generate(m, "hello", tok, max_new_tokens=2, backend="eager", repeat_penalty=1.1, steps_per_call=4)
