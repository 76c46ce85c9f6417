"""python -m benchmarks [--suites mlp,block] [--reps N] [--quick] [--out DIR]

For each workload: first compile time, cached compile time (fresh Dynamo,
memory caches dropped, disk cache warm), warm per-call latency of vulkan and
eager CPU (median and spread over repetitions after warm-up), their ratio,
and the max error against eager measured in the same run. Prints a table and
writes JSON with the machine, device, versions and command line.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

import dynamo_vulkan
from dynamo_vulkan.examples import MLP, TransformerBlock

WORKLOADS = {
    "mlp": lambda q: (MLP((256, 1024, 1024, 256)), torch.randn(8 if q else 64, 256)),
    "block": lambda q: (TransformerBlock(256, 4, 688), torch.randn(1, 16 if q else 128, 256)),
    "block_decode": lambda q: (TransformerBlock(256, 4, 688), torch.randn(1, 1, 256)),
}


def timed(fn, x, reps):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(x)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), min(times), max(times)


def compile_timed(model, x, drop_disk_cache: bool):
    """Compile from a fresh Dynamo and empty memory caches; time the first call."""
    torch._dynamo.reset()
    dynamo_vulkan.clear_cache(disk=drop_disk_cache)
    t0 = time.perf_counter()
    cm = torch.compile(model, backend="vulkan")
    y = cm(x)
    return cm, y, time.perf_counter() - t0


def bench(name, quick, reps):
    torch.manual_seed(0)
    model, x = WORKLOADS[name](quick)
    model.eval()
    with torch.no_grad():
        cm, y, first = compile_timed(model, x, drop_disk_cache=True)
        cm, y, cached = compile_timed(model, x, drop_disk_cache=False)
        ref = model(x)
        err = (y - ref).abs().max().item()
        for _ in range(3):
            cm(x)
            model(x)
        vk = timed(cm, x, reps)
        cpu = timed(model, x, reps)
    return {"workload": name, "shape": list(x.shape), "first_compile_s": first,
            "cached_compile_s": cached, "vulkan_ms": vk[0], "vulkan_ms_min": vk[1],
            "vulkan_ms_max": vk[2], "eager_cpu_ms": cpu[0], "eager_cpu_ms_min": cpu[1],
            "eager_cpu_ms_max": cpu[2], "speedup_vs_eager": cpu[0] / vk[0], "max_abs_err": err}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suites", default="mlp,block,block_decode")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="small shapes, few repetitions")
    p.add_argument("--out", default="bench-out")
    args = p.parse_args(argv)
    reps = 5 if args.quick else args.reps
    names = [s for s in args.suites.split(",") if s]
    unknown = set(names) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown suites {sorted(unknown)}; choose from {sorted(WORKLOADS)}")
    rows = [bench(n, args.quick, reps) for n in tqdm(names, desc="benchmarks", file=sys.stderr)]
    info = dynamo_vulkan.device_info()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    record = {"date": time.strftime("%Y-%m-%d"), "machine": platform.node(), "cpu_count": torch.get_num_threads(),
              "device": info.get("name"), "driver": info.get("driver_info"), "torch": torch.__version__,
              "commit": commit, "command": " ".join(sys.argv), "results": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=1))
    hdr = f"| workload | shape | first compile s | cached compile s | vulkan ms | eager cpu ms | speed-up | max err |"
    lines = [f"device: {record['device']} ({record['driver']}), torch {torch.__version__}, {record['date']}",
             hdr, "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['workload']} | {'x'.join(map(str, r['shape']))} | {r['first_compile_s']:.2f} | "
                     f"{r['cached_compile_s']:.2f} | {r['vulkan_ms']:.3f} | {r['eager_cpu_ms']:.3f} | "
                     f"{r['speedup_vs_eager']:.2f}x | {r['max_abs_err']:.1e} |")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
