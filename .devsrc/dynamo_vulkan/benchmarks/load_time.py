"""Time the load of a GGUF model as a new process of ``python -m dynamo_vulkan.generate``
pays it (generate.load: header, decoder, tokenizer), hot page cache, with the tensor
reads on 1..N threads, and the host memory it holds.

    python -m dynamo_vulkan.benchmarks.load_time smollm2 gemma3 .device-kit/skel/qwen2-7b.json.gz \
        --threads 1,2,4,8 --reps 3

Each row is a fresh process. ``--mapped`` also times the reads the loader made before
positional reads (tensor bytes copied out of a mapping of the file, the copied pages
dropped), for a before/after on the same machine. Models: a GGUF path, a known model
name, or a skeleton (written once, see benchmarks/llm_models.py; ``--layers N`` keeps N).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def _status(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _mapped_raw_concat(self, names):
    """The loader's former read: copy out of a mapping in 16 MiB pieces, drop the pages."""
    import mmap

    import numpy as np
    import torch

    infos = [self.tensor_info(n) for n in names]
    if not hasattr(self, "_timing_mm"):
        self._timing_mm = mmap.mmap(self._fh.fileno(), 0, access=mmap.ACCESS_READ)
    mm, piece = self._timing_mm, 16 << 20
    out = np.empty(sum(i.nbytes for i in infos), np.uint8)
    at = 0
    for info in infos:
        src = np.frombuffer(mm, np.uint8, info.nbytes, info.offset)
        for i in range(0, info.nbytes, piece):
            n = min(piece, info.nbytes - i)
            out[at + i:at + i + n] = src[i:i + n]
            start = (info.offset + i) // mmap.PAGESIZE * mmap.PAGESIZE
            mm.madvise(mmap.MADV_DONTNEED, start, info.offset + i + n - start)
        at += info.nbytes
    return torch.from_numpy(out)


def child(path: str, threads: int, mapped: bool) -> dict:
    import dynamo_vulkan  # noqa: F401  (imports outside the timings)
    from dynamo_vulkan.llm import file_read
    from dynamo_vulkan.llm.models.loader import build_decoder
    from dynamo_vulkan.llm.reader import GGUFFile, open_gguf
    from dynamo_vulkan.llm.tokenizer import GGUFTokenizer

    file_read.MAX_THREADS = threads
    if mapped:
        GGUFFile.raw_concat = _mapped_raw_concat
    rss0 = _status("VmRSS")
    t0 = time.perf_counter()
    with open_gguf(path) as f:
        t1 = time.perf_counter()
        model = build_decoder(f)
        t2 = time.perf_counter()
        tok = GGUFTokenizer.from_gguf(f)
        t3 = time.perf_counter()
    size = f.file_size
    return {"open_s": t1 - t0, "build_s": t2 - t1, "tokenizer_s": t3 - t2, "load_s": t3 - t0,
            "rss_over_file": (_status("VmRSS") - rss0) / size, "peak_over_file": (_status("VmHWM") - rss0) / size,
            "file_gb": size / 1e9, "vocab": tok.vocab_size, "layers": model.config.n_layers}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m dynamo_vulkan.benchmarks.load_time", description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--threads", default="1,8", help="read threads to time, comma-separated")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--mapped", action="store_true", help="also time the former mapped reads")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], int(a.child[1]), a.child[2] == "1")))
        return
    if not a.models:
        ap.error("name at least one model")
    from dynamo_vulkan.benchmarks.llm_models import resolve

    for entry in a.models:
        path = str(resolve(entry, layers=a.layers).path)
        with open(path, "rb") as fh:            # hot page cache, as a second run finds it
            while fh.read(64 << 20):
                pass
        ways = [(int(t), False) for t in a.threads.split(",")] + ([(1, True)] if a.mapped else [])
        for rep in range(a.reps):
            for threads, mapped in ways:
                r = subprocess.run([sys.executable, "-m", "dynamo_vulkan.benchmarks.load_time", "--child", path, str(threads), str(int(mapped))],
                                   capture_output=True, text=True, check=True)
                row = json.loads(r.stdout.strip().splitlines()[-1])
                how = "mapped copy" if mapped else f"{threads} read threads"
                print(f"{entry} ({row['file_gb']:.2f} GB, {row['layers']} layers) {how}, run {rep}: "
                      f"load {row['load_s']:.3f} s = open {row['open_s']:.3f} + decoder {row['build_s']:.3f} "
                      f"+ tokenizer {row['tokenizer_s']:.3f}; host RSS {row['rss_over_file']:.3f}x file, "
                      f"peak {row['peak_over_file']:.3f}x", flush=True)


if __name__ == "__main__":
    main()
