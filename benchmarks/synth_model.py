"""GGUF models with the shapes and quant types of a real one, and random weights.

Speed does not depend on the weights' values, and a real model file (100-250 MB)
cannot always travel to where it should be measured. A *skeleton* is the real
file minus its tensor data: every metadata field (tokenizer included) and every
tensor's name, type and shape, as gzipped JSON of a few MB. From it we write a
same-shaped GGUF file whose blocks are random bytes with modest fp16 scales, so
the model runs with finite numbers (it only babbles). ``n_layers`` keeps the
first layers only, for quick runs.

    python -m benchmarks.synth_model MODEL.gguf SKELETON.json.gz   # make a skeleton
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

from dynamo_vulkan.gguf.random_blocks import random_blocks

# the size of each type's fp16 scale (and min) fields: activations stay finite
SCALES = {"Q4_0": 4e-3, "Q4_1": 4e-3, "Q5_0": 2e-3, "Q5_1": 2e-3, "Q8_0": 2.5e-4, "Q2_K": 4e-3,
          "Q3_K": 1e-3, "Q4_K": 3e-4, "Q5_K": 1.5e-4, "Q6_K": 1e-4}
SKIP_FIELDS = ("GGUF.", "general.architecture", "general.alignment")


def describe(path: Path) -> dict:
    """The skeleton of a GGUF file (metadata and tensor infos, no data)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    fields = []
    for key, f in r.fields.items():
        if key.startswith(SKIP_FIELDS):
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        val = f.contents()
        if isinstance(val, bytes):
            val = val.decode("utf-8", "replace")
        fields.append([key, vtype.name, sub.name if sub is not None else None, val])
    arch = r.fields["general.architecture"].contents()
    tensors = [[t.name, t.tensor_type.name, [int(v) for v in t.shape]] for t in r.tensors]
    return {"source": Path(path).name, "bytes": Path(path).stat().st_size, "arch": arch,
            "fields": fields, "tensors": tensors}


def save_skeleton(model: Path, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump(describe(model), f)
    return out


def load_skeleton(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() else None


def write_model(skel: dict, out: Path, n_layers: int | None = None, seed: int = 0) -> Path:
    """Write a random-weight GGUF with the skeleton's metadata, tensor names, types and shapes."""
    import gguf

    rng = np.random.default_rng(seed)
    arch = skel["arch"]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), arch)
    for key, vtype, sub, val in skel["fields"]:
        if n_layers is not None and key == f"{arch}.block_count":
            val = n_layers
        w.add_key_value(key, val, gguf.GGUFValueType[vtype], gguf.GGUFValueType[sub] if sub else None)
    for name, tname, ne in skel["tensors"]:
        layer = _layer(name)
        if n_layers is not None and layer is not None and layer >= n_layers:
            continue
        qt = gguf.GGMLQuantizationType[tname]
        np_shape = tuple(reversed(ne))
        if tname == "F32":
            x = rng.standard_normal(np_shape, dtype=np.float32)
            w.add_tensor(name, (1.0 + 0.1 * x) if len(ne) == 1 else 0.02 * x)
        elif tname == "F16":
            w.add_tensor(name, (0.02 * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float16))
        else:
            w.add_tensor(name, _random_blocks(rng, tname, ne), raw_shape=None, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _random_blocks(rng, tname: str, ne: list[int]) -> np.ndarray:
    """uint8 [rows, row_bytes]: random quants, and scales small enough to keep activations finite."""
    import gguf

    bs = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[tname]][0]
    cols, rows = ne[0], int(np.prod(ne[1:])) if len(ne) > 1 else 1
    nb = rows * (cols // bs)
    if tname == "BF16":
        x = (0.02 * rng.standard_normal(rows * cols, dtype=np.float32)).view(np.uint32) >> 16
        return x.astype(np.uint16).view(np.uint8).reshape(rows, -1)
    if tname not in SCALES:
        raise ValueError(f"no random-block recipe for {tname}")
    return random_blocks(tname, nb, rng, SCALES[tname], positive=True).reshape(rows, -1)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(save_skeleton(Path(argv[0]), Path(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
