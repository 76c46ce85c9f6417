"""transformers' generate() with a compiled forward: decode tokens/s of a Llama
(SmolLM2-135M's shape, random fp32 weights, nothing downloaded) with a static cache,
compiled with backend="vulkan", against eager on the CPU and, where present, on CUDA,
in one run; the greedy tokens checked equal to the CPU's.

    python -m dynamo_vulkan.benchmarks.hf_generate [--layers 30] [--prompt 32] [--new-tokens 64]

Each backend runs generate() once to warm up (compiling, for Vulkan), then once for
one new token (the prompt's prefill and one step) and once for N, all with one static
cache of a fixed length (reset between calls): decode tokens/s are (N - 1) over the
difference of those two wall times. transformers' own compilation of
static-cache generation is switched off (disable_compile), so eager is eager.
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch


def llama(layers: int):
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                   num_hidden_layers=layers, num_attention_heads=9,
                                   num_key_value_heads=3, max_position_embeddings=2048,
                                   tie_word_embeddings=True, rope_theta=100000.0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def timed(model, ids, new_tokens: int) -> tuple[dict, torch.Tensor]:
    """One static cache of a fixed length for every call (generate() would otherwise size
    each call's cache to its own max_length: a new shape, so a new compile, per call)."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + new_tokens + 8)
    kw = dict(do_sample=False, past_key_values=cache, disable_compile=True)

    def run(n):
        cache.reset()
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        return time.perf_counter() - t, out

    with torch.no_grad(), warnings.catch_warnings():
        # transformers 5 renames generate()'s past_key_values to cache; 4.x knows the first
        warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
        for _ in range(2):       # warm-up: compiles (the first prefill also fills the cache's
            run(4)               # tensors in, a path of its own), and every later shape
        one, _ = run(1)
        many, out = run(new_tokens)
    return {"prefill_and_one_ms": one * 1e3, "decode_tok_s": (new_tokens - 1) / (many - one)}, out.cpu()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=64)
    a = p.parse_args(argv)
    import dynamo_vulkan
    model = llama(a.layers)
    ids = torch.randint(0, model.config.vocab_size, (1, a.prompt), generator=torch.Generator().manual_seed(1))
    rows = {}
    rows["eager CPU"], ref = timed(model, ids, a.new_tokens)
    if torch.cuda.is_available():
        cuda = llama(a.layers).cuda()
        rows["eager CUDA"], got = timed(cuda, ids.cuda(), a.new_tokens)
        rows["eager CUDA"]["tokens_equal_cpu"] = torch.equal(got, ref)
    model.forward = torch.compile(model.forward, backend="vulkan")
    rows["vulkan"], got = timed(model, ids, a.new_tokens)
    rows["vulkan"]["tokens_equal_cpu"] = torch.equal(got, ref)
    print(f"transformers Llama, {a.layers} layers of width 576, prompt {a.prompt}, "
          f"{a.new_tokens} new tokens, static cache; {dynamo_vulkan.device_info().get('name')}")
    for name, r in rows.items():
        extra = "" if "tokens_equal_cpu" not in r else f", tokens equal the CPU's: {r['tokens_equal_cpu']}"
        print(f"  {name:11s} decode {r['decode_tok_s']:7.1f} tok/s, prefill + 1 token "
              f"{r['prefill_and_one_ms']:6.1f} ms{extra}")
    for r in dynamo_vulkan.reports():
        print(" ", str(r).splitlines()[0])


if __name__ == "__main__":
    main()
