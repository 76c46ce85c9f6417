"""GGUF models with the shapes and quant types of a real one, and random weights.

Speed does not depend on the weights' values, and a real model file (100-250 MB)
cannot always travel to where it should be measured. A *skeleton* is the real
file minus its tensor data: every metadata field (tokenizer included) and every
tensor's name, type and shape, as gzipped JSON of a few MB. From it we write a
same-shaped GGUF file whose blocks are random bytes with modest fp16 scales, so
the model runs with finite numbers (it only babbles). ``n_layers`` keeps the
first layers only, for quick runs. A file whose data is cut short (the first chunk
of a split model, which holds the whole header) gives a skeleton too.

    python -m dynamo_vulkan.benchmarks.synth_model MODEL.gguf SKELETON.json.gz   # make a skeleton
    python -m dynamo_vulkan.benchmarks.synth_model --llama qwen2-7b --tokenizer-from QWEN2.json.gz LLAMA.json.gz
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
    """The skeleton of a GGUF file (metadata and tensor infos, no data). A file whose data
    is cut short is read by our header-only reader (gguf.GGUFReader maps every tensor's
    data, so it fails there), which keeps values but not their GGUF types: those are
    inferred (value_type)."""
    import gguf

    from dynamo_vulkan.llm.reader import open_gguf

    with open_gguf(path, check_architecture=False, header_only=True) as h:
        full = max((t.offset + t.nbytes for t in h.tensors.values()), default=0)
        if full > h.file_size:
            fields = [[key, *value_type(val), val] for key, val in h.metadata.items()
                      if not key.startswith(SKIP_FIELDS)]
            name = h.get("general.name", None) or Path(path).name
            return {"source": f"{name} (header of {Path(path).name})", "bytes": full, "arch": h.architecture,
                    "fields": fields, "tensors": [[t.name, t.qtype_name, list(t.ne)] for t in h.tensors.values()]}
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


def value_type(val) -> tuple[str, str | None]:
    """(GGUF value type, array element type) of a metadata value whose type was not kept:
    the types llama.cpp's converter writes and its loader insists on (it refuses a key of
    another type): integers UINT32 (INT32 in arrays, as token types are; INT64/UINT64 past
    32 bits), floats FLOAT32, and booleans and strings as themselves."""
    if isinstance(val, list):
        kinds = {value_type(v)[0] for v in val}
        if len(kinds) > 1 and kinds <= {"UINT32", "INT32", "UINT64", "INT64"}:
            kinds = {"INT64" if kinds & {"UINT64", "INT64"} else "INT32"}
        if len(kinds) > 1:
            raise ValueError(f"a metadata array of mixed types {sorted(kinds)}")
        sub = kinds.pop() if kinds else "INT32"
        return "ARRAY", "INT32" if sub == "UINT32" else sub
    if isinstance(val, bool):
        return "BOOL", None
    if isinstance(val, int):
        if 0 <= val < 1 << 32:
            return "UINT32", None
        return ("INT32" if -(1 << 31) <= val < 0 else "INT64" if val < 0 else "UINT64"), None
    if isinstance(val, float):
        return "FLOAT32", None
    if isinstance(val, str):
        return "STRING", None
    raise ValueError(f"no GGUF type for a metadata value of type {type(val).__name__}")


def save_skeleton(model: Path, out: Path) -> Path:
    return save(describe(model), out)


def save(skel: dict, out: Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8") as f:
        json.dump(skel, f)
    return out


def load_skeleton(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


# Qwen2-7B's shapes (DeepSeek-R1-Distill-Qwen-7B too), as a llama-architecture decoder
# without its q/k/v biases: the 7B-class shapes that the 128 MiB buffer limit of lavapipe
# splits (token_embd ~306 MB, output ~447 MB)
QWEN2_7B = dict(hidden=3584, ffn=18944, n_layers=28, n_heads=28, n_kv_heads=4, head_dim=128,
                vocab=152064)


def q4_k_m_type(name: str, layer: int | None, n_layers: int) -> str:
    """The type llama.cpp's Q4_K_M recipe gives a llama tensor: Q6_K for the output head,
    and for attn_v and ffn_down in its "more bits" layers (the first and last eighth, and
    every third between); Q4_K for the other matrices."""
    if name == "output.weight":
        return "Q6_K"
    if layer is not None and name.endswith(("attn_v.weight", "ffn_down.weight")):
        eighth = n_layers // 8
        if layer < eighth or layer >= 7 * n_layers // 8 or (layer - eighth) % 3 == 2:
            return "Q6_K"
    return "Q4_K"


def llama_skeleton(hidden: int, ffn: int, n_layers: int, n_heads: int, n_kv_heads: int,
                   vocab: int, head_dim: int | None = None, context: int = 4096,
                   rope_base: float = 1e6, types=q4_k_m_type) -> dict:
    """The skeleton of a llama-architecture model built from its shapes (no file needed):
    the hyper-parameters as metadata, no tokenizer, an untied output head, and each
    matrix's type from types(name, layer, n_layers) (Q4_K_M's recipe by default)."""
    head_dim = head_dim or hidden // n_heads
    a = "llama"
    fields = [[f"{a}.block_count", "UINT32", None, n_layers],
              [f"{a}.context_length", "UINT32", None, context],
              [f"{a}.embedding_length", "UINT32", None, hidden],
              [f"{a}.feed_forward_length", "UINT32", None, ffn],
              [f"{a}.attention.head_count", "UINT32", None, n_heads],
              [f"{a}.attention.head_count_kv", "UINT32", None, n_kv_heads],
              [f"{a}.attention.layer_norm_rms_epsilon", "FLOAT32", None, 1e-6],
              [f"{a}.rope.freq_base", "FLOAT32", None, rope_base],
              [f"{a}.rope.dimension_count", "UINT32", None, head_dim]]
    mats = {"token_embd.weight": [hidden, vocab]}
    norms = {"output_norm.weight": [hidden]}
    for i in range(n_layers):
        p = f"blk.{i}."
        norms |= {p + "attn_norm.weight": [hidden], p + "ffn_norm.weight": [hidden]}
        mats |= {p + "attn_q.weight": [hidden, n_heads * head_dim],
                 p + "attn_k.weight": [hidden, n_kv_heads * head_dim],
                 p + "attn_v.weight": [hidden, n_kv_heads * head_dim],
                 p + "attn_output.weight": [n_heads * head_dim, hidden],
                 p + "ffn_gate.weight": [hidden, ffn], p + "ffn_up.weight": [hidden, ffn],
                 p + "ffn_down.weight": [ffn, hidden]}
    mats["output.weight"] = [hidden, vocab]
    tensors = [[n, "F32", ne] for n, ne in norms.items()] + \
        [[n, types(n, _layer(n), n_layers), ne] for n, ne in mats.items()]
    total = sum(_nbytes(t, ne) for _, t, ne in tensors)
    return {"source": f"llama {hidden}x{n_layers} (from shapes)", "bytes": total, "arch": a,
            "fields": fields, "tensors": tensors}


SHAPES = {"qwen2-7b": QWEN2_7B}


def with_tokenizer(skel: dict, donor: dict) -> dict:
    """``skel`` with the tokenizer fields (tokenizer.*) of ``donor``, whose vocabulary must
    have as many tokens as skel's embedding has rows (a skeleton made from shapes has no
    tokenizer; the harness feeds prompts as text and llama.cpp needs a vocabulary)."""
    tok = [f for f in donor["fields"] if f[0].startswith("tokenizer.")]
    tokens = next((f[3] for f in tok if f[0] == "tokenizer.ggml.tokens"), None)
    vocab = next((ne[1] for name, _, ne in skel["tensors"] if name == "token_embd.weight"), None)
    if tokens is None or vocab is None or len(tokens) != vocab:
        raise ValueError(f"{donor['source']}'s tokenizer has {len(tokens) if tokens else 'no'} tokens; "
                         f"{skel['source']}'s embedding has {vocab} rows")
    fields = [f for f in skel["fields"] if not f[0].startswith("tokenizer.")] + tok
    return dict(skel, fields=fields, source=f"{skel['source']} with the tokenizer of {donor['source']}")


def _layer(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() else None


def write_model(skel: dict, out: Path, n_layers: int | None = None, seed: int = 0) -> Path:
    """Write a random-weight GGUF with the skeleton's metadata, tensor names, types and shapes.
    Tensors are made and written one at a time (the header first, from their infos), so
    writing a 7B-sized file holds one tensor in memory, not the whole model."""
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
    kept = [(name, tname, ne) for name, tname, ne in skel["tensors"]
            if n_layers is None or _layer(name) is None or _layer(name) < n_layers]
    for name, tname, ne in kept:
        w.add_tensor_info(name, list(reversed(ne)), np.dtype(np.float32), _nbytes(tname, ne),
                          raw_dtype=gguf.GGMLQuantizationType[tname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, tname, ne in kept:
        w.write_tensor_data(_random_tensor(rng, tname, ne))
    w.close()
    return out


def _nbytes(tname: str, ne: list[int]) -> int:
    import gguf

    bs, ts = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[tname]]
    return int(np.prod(ne)) // bs * ts


def _random_tensor(rng, tname: str, ne: list[int]) -> np.ndarray:
    """A tensor's data: norms near 1, other float tensors small normals, quantized ones
    random blocks (_random_blocks)."""
    np_shape = tuple(reversed(ne))
    if tname == "F32":
        x = rng.standard_normal(np_shape, dtype=np.float32)
        return (1.0 + 0.1 * x) if len(ne) == 1 else 0.02 * x
    if tname == "F16":
        return (0.02 * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float16)
    return _random_blocks(rng, tname, ne)


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
    import argparse

    p = argparse.ArgumentParser(prog="python -m dynamo_vulkan.benchmarks.synth_model", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?", help="a GGUF file (or the header-only first chunk of one)")
    p.add_argument("out", help="the skeleton to write (.json.gz)")
    p.add_argument("--llama", choices=sorted(SHAPES), help="a llama-architecture skeleton with these shapes instead")
    p.add_argument("--tokenizer-from", metavar="SKELETON", help="take the tokenizer fields of this skeleton")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if (a.model is None) == (a.llama is None):
        p.error("give a GGUF file or --llama SHAPES")
    skel = describe(Path(a.model)) if a.model else llama_skeleton(**SHAPES[a.llama])
    if a.tokenizer_from:
        skel = with_tokenizer(skel, load_skeleton(Path(a.tokenizer_from)))
    print(save(skel, Path(a.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
