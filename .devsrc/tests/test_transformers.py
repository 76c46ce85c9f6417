"""transformers' own model code (the `hf` extra), as our users run it: a Llama and a
GPT-2 built from small configs (random weights, nothing downloaded), compiled with
backend="vulkan" whole, and generate() with the compiled forward, against eager."""
import pytest
import torch

import dynamo_vulkan

transformers = pytest.importorskip("transformers", reason="the hf extra (DYNAMO_VULKAN_EXTRAS=...,hf)")


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=172,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _new_reports(since: int):
    return dynamo_vulkan.reports()[since:]


@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_forward_is_one_vulkan_partition(make):
    model = make()
    ids = torch.randint(0, 300, (1, 11), generator=torch.Generator().manual_seed(1))
    since = len(dynamo_vulkan.reports())
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        got = torch.compile(model, backend="vulkan")(ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    (report,) = _new_reports(since)
    assert report.partitions == 1 and not report.cpu_nodes, str(report)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_generate_with_a_compiled_forward(cache):
    """The static cache keeps every decode step's shapes; the default (dynamic) cache grows
    by cat, so its step asks for the grown sizes: both stay whole on Vulkan."""
    model = _llama()
    ids = torch.randint(0, 300, (1, 7), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=6, do_sample=False,
              cache_implementation="static" if cache == "static" else None)
    with torch.no_grad():
        want = model.generate(ids, **kw)
        since = len(dynamo_vulkan.reports())
        model.forward = torch.compile(model.forward, backend="vulkan")
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)
    reports = _new_reports(since)
    assert reports and all(r.partitions == 1 and not r.cpu_nodes for r in reports), \
        "\n".join(map(str, reports))
