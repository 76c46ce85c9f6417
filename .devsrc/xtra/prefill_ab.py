"""Scratch: compiled prefill ms (median of N generate() prefills) per model and length.
PATCH='mod:NAME=value;...' sets module constants first. Prints one line per length and,
with ERR=1, the largest logit difference from eager CPU at the last position."""
import os, sys, json, statistics, importlib, time
import torch
for item in filter(None, os.environ.get("PATCH", "").split(";")):
    mod, _, rest = item.partition(":"); name, _, val = rest.partition("=")
    setattr(importlib.import_module(mod), name, eval(val))
torch.set_float32_matmul_precision("high")
from dynamo_vulkan.benchmarks.llm_models import resolve
from dynamo_vulkan.llm.generate import generate, load
import dynamo_vulkan
entry, lengths = sys.argv[1], [int(x) for x in sys.argv[2].split(",")]
reps = int(os.environ.get("N", "12"))
bench = resolve(entry, layers=int(os.environ["LAYERS"]) if os.environ.get("LAYERS") else None)
model, tok = load(bench.path)
tag = os.environ.get("TAG", "")
res = {}
for n in lengths:
    ids = [100 + (7 * i) % 1000 for i in range(n)]
    generate(model, ids, tok, max_new_tokens=1, warmup=True, stop_at_eos=False)
    ts = []
    for _ in range(reps):
        r = generate(model, ids, tok, max_new_tokens=1, warmup=False, stop_at_eos=False)
        ts.append(r.prefill_s * 1e3)
    st = dynamo_vulkan.runtime_stats()
    res[n] = statistics.median(ts)
    print(f"RESULT {tag} {bench.label} {n}: {statistics.median(ts):.3f} ms (min {min(ts):.3f}) "
          f"device_bytes {st.get('device_bytes', 0)/2**20:.1f} MiB peak {st.get('device_bytes_peak', 0)/2**20:.1f}", flush=True)

dec = int(os.environ.get("DECODE", "0"))
if dec:
    ids = [100 + (7 * i) % 1000 for i in range(lengths[0])]
    generate(model, ids, tok, max_new_tokens=dec, warmup=True, stop_at_eos=False)
    for _ in range(2):
        r = generate(model, ids, tok, max_new_tokens=dec, warmup=False, stop_at_eos=False)
        print(f"RESULT {tag} {bench.label} decode {dec} after {lengths[0]}: {r.decode_tok_s:.1f} tok/s", flush=True)
