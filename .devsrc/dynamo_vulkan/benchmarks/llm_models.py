"""What ``--models`` names, made a GGUF file that loads: a GGUF file as it is; a known
model name (``smollm2``, ``gemma3``: dynamo_vulkan.llm.generate.find_model), else its
skeleton in ``--gguf-skeletons``; a skeleton (``NAME.json.gz``, synth_model.py); or a
GGUF file whose data is cut short (the first chunk of a split model: its header
becomes a skeleton). Skeletons, and ``layers`` (keep the first N layers), give
random-weight files with the same shapes and types; they are written once into
CACHE (a 7B file takes a minute to write) and reused while their source is unchanged.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

CACHE = Path(os.environ.get("DYNAMO_VULKAN_BENCH_MODELS") or Path.home() / ".cache" / "dynamo_vulkan" / "bench-models")
SKELETON_SUFFIX = ".json.gz"


@dataclass(frozen=True)
class BenchModel:
    label: str       # the rows' name for it
    path: Path       # the GGUF file to load
    what: str        # where it came from (a note)


class NoTokenizer(ValueError):
    """A skeleton without tokenizer fields: the suite feeds prompts as text, and llama.cpp needs a vocabulary."""


def resolve(entry: str, skeleton_dir: str | None = None, layers: int | None = None) -> BenchModel:
    from dynamo_vulkan.llm.generate import ModelNotInstalledError, find_model

    p = Path(entry).expanduser()
    if entry.endswith(SKELETON_SUFFIX):
        if not p.is_file():
            raise FileNotFoundError(f"skeleton {entry} not found")
        return _from_skeleton(p, p.name[:-len(SKELETON_SUFFIX)], layers)
    if not p.is_file():
        try:
            p = find_model(entry)
        except ModelNotInstalledError as e:
            skel = Path(skeleton_dir) / f"{entry}{SKELETON_SUFFIX}" if skeleton_dir else None
            if skel is None or not skel.is_file():
                raise FileNotFoundError(f"{e}; and no {entry}{SKELETON_SUFFIX} in --gguf-skeletons") from e
            return _from_skeleton(skel, entry, layers)
    label = p.name[:-len(".gguf")] if p.name.endswith(".gguf") else p.name
    if cut_short(p):
        return _from_file_header(p, label, layers, "its data cut short")
    if layers is not None:
        return _from_file_header(p, label, layers, "cut to its first layers")
    return BenchModel(label, p, p.name)


def cut_short(path: Path) -> bool:
    """True when the file's tensor table points past its end (a header-only chunk)."""
    from dynamo_vulkan.llm.reader import open_gguf

    with open_gguf(path, check_architecture=False, header_only=True) as f:
        return max((t.offset + t.nbytes for t in f.tensors.values()), default=0) > f.file_size


def _label(name: str, layers: int | None) -> str:
    return name if layers is None else f"{name} {layers}-layer"


def _from_skeleton(path: Path, name: str, layers: int | None) -> BenchModel:
    from . import synth_model

    key = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    skel = None

    def load():
        nonlocal skel
        skel = skel or synth_model.load_skeleton(path)
        return skel
    out = _written(f"{name}-{key}", layers, load)
    return BenchModel(_label(name, layers), out,
                      f"random weights, same shapes and types as {load()['source']}"
                      + (f", first {layers} layers" if layers is not None else "") + f" (skeleton {path.name})")


def _from_file_header(path: Path, name: str, layers: int | None, why: str) -> BenchModel:
    from . import synth_model

    st = path.stat()
    out = _written(f"{name}-{st.st_size}-{int(st.st_mtime)}", layers, lambda: synth_model.describe(path))
    return BenchModel(_label(name, layers), out,
                      f"random weights, same shapes and types as {path.name} ({why})"
                      + (f", first {layers} layers" if layers is not None else ""))


def _written(stem: str, layers: int | None, skeleton) -> Path:
    """CACHE/stem[-Nl].gguf, written from skeleton() unless already there (written under a
    temporary name and renamed, so an interrupted write is never reused)."""
    from . import synth_model

    out = CACHE / (stem + (f"-{layers}l" if layers is not None else "") + ".gguf")
    if out.is_file():
        return out
    skel = skeleton()
    fields = {k for k, *_ in skel["fields"]}
    if "tokenizer.ggml.model" not in fields:
        raise NoTokenizer(f"{skel['source']}: the skeleton has no tokenizer fields (tokenizer.ggml.*); "
                          "give it a tokenizer of the same vocabulary size (synth_model.with_tokenizer)")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    try:
        synth_model.write_model(skel, tmp, n_layers=layers)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out
