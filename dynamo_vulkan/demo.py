"""The README's main job: a transformer block compiled with backend="vulkan",
checked against eager CPU, with both timings printed.

    python -m dynamo_vulkan.demo [--batch 1] [--seq 64] [--dim 256] [--reps 20]
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    info = dynamo_vulkan.device_info()
    out = sys.stdout
    out.write(f"device: {info.get('name', info.get('reason'))}\n")
    model = TransformerBlock(args.dim, heads=4, hidden=args.dim * 8 // 3).eval()
    x = torch.randn(args.batch, args.seq, args.dim)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, backend="vulkan")
        t0 = time.perf_counter()
        got = compiled(x)
        first = time.perf_counter() - t0
        err = (got - eager).abs().max().item()
        ok = torch.allclose(got, eager, rtol=1e-4, atol=1e-4)
        vk_ms = _median_ms(compiled, x, args.reps)
        cpu_ms = _median_ms(model, x, args.reps)
    report = dynamo_vulkan.reports()[-1]
    out.write(f"transformer block [{args.batch}x{args.seq}x{args.dim}]: "
              f"{len(report.vulkan_nodes)} ops on Vulkan, {len(report.cpu_nodes)} on the CPU\n")
    out.write(f"max |vulkan - eager| = {err:.3g}  ({'match' if ok else 'MISMATCH'} at rtol/atol 1e-4)\n")
    out.write(f"first call (compile) {first:.2f} s\n")
    out.write(f"vulkan {vk_ms:.2f} ms/call   eager cpu {cpu_ms:.2f} ms/call   "
              f"speed-up {cpu_ms / vk_ms:.2f}x\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
