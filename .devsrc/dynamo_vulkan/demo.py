"""The README's main job: what backend="vulkan" does on this machine, checked against
eager CPU, with where each op ran and both timings.

1. A transformer block on a prompt (seq tokens) and on one token (a decode step). On a
   CPU Vulkan device (lavapipe) a prompt's matrix products run on the host through
   torch, which is faster there, and the report says so; the one-token step runs on
   Vulkan everywhere.
2. GGUF decoding of SmolLM2-135M (when the `models` extra is installed): greedy tokens
   through Vulkan against eager CPU, tokens/s of each.

    python -m dynamo_vulkan.demo [--seq 64] [--dim 256] [--reps 20] [--tokens 32]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import dynamo_vulkan
from dynamo_vulkan.examples import TransformerBlock


def _median_ms(fn, x, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _block(model, x, reps: int, label: str, out) -> bool:
    """One shape of the block: compiled, checked, timed; its partition summary printed."""
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, backend="vulkan", dynamic=False)
        t0 = time.perf_counter()
        got = compiled(x)
        first = time.perf_counter() - t0
        err = (got - eager).abs().max().item()
        ok = torch.allclose(got, eager, rtol=1e-4, atol=1e-4)
        vk_ms = _median_ms(compiled, x, reps)
        cpu_ms = _median_ms(model, x, reps)
    out.write(f"\n{label} {list(x.shape)}:\n{dynamo_vulkan.reports()[-1].summary()}\n")
    out.write(f"  max |vulkan - eager| = {err:.3g} ({'match' if ok else 'MISMATCH'} at rtol/atol 1e-4); "
              f"first call (compile) {first:.2f} s\n")
    out.write(f"  vulkan {vk_ms:.2f} ms/call, eager cpu {cpu_ms:.2f} ms/call: "
              f"{cpu_ms / vk_ms:.2f}x\n")
    return ok


def _gguf(tokens: int, out) -> bool:
    """SmolLM2's greedy decoding through Vulkan and eager CPU: equal tokens, tokens/s."""
    from dynamo_vulkan.llm.generate import ModelNotInstalledError, find_model, generate, load

    try:
        path = find_model("smollm2")
    except ModelNotInstalledError as e:
        out.write(f"\nGGUF decoding skipped: {e}\n")
        return True
    model, tok = load(path, max_ctx=128)
    prompt = "The capital of France is"
    out.write(f"\nGGUF decoding, {path.name}, {tokens} greedy tokens after {prompt!r}:\n")
    runs = {}
    for backend in ("vulkan", None):
        runs[backend] = generate(model, prompt, tok, max_new_tokens=tokens, backend=backend,
                                 stop_at_eos=False)
    vk, cpu = runs["vulkan"], runs[None]
    same = vk.tokens == cpu.tokens
    out.write(f"  text: {vk.text!r}\n")
    out.write(f"  tokens {'equal to' if same else 'DIFFERENT from'} eager CPU's; compile + warm-up "
              f"{vk.warmup_s:.1f} s\n")
    out.write(f"  decode: vulkan {vk.decode_tok_s:.1f} tok/s, eager cpu {cpu.decode_tok_s:.1f} tok/s: "
              f"{vk.decode_tok_s / cpu.decode_tok_s:.2f}x\n")
    return same


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1, help="default: %(default)s")
    p.add_argument("--seq", type=int, default=64, help="prompt length (default: %(default)s)")
    p.add_argument("--dim", type=int, default=256, help="default: %(default)s")
    p.add_argument("--reps", type=int, default=20, help="timed calls (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=32, help="GGUF tokens, 0 to skip (default: %(default)s)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    info = dynamo_vulkan.device_info()
    out = sys.stdout
    out.write(f"device: {info.get('name', info.get('reason'))}\n")
    model = TransformerBlock(args.dim, heads=4, hidden=args.dim * 8 // 3).eval()
    ok = _block(model, torch.randn(args.batch, args.seq, args.dim), args.reps, "transformer block, a prompt", out)
    ok &= _block(model, torch.randn(args.batch, 1, args.dim), args.reps, "transformer block, one token", out)
    if args.tokens > 0:
        ok &= _gguf(args.tokens, out)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
