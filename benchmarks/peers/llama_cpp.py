"""llama.cpp on its Vulkan backend as the peer for the GGUF models.

It is found through ``--llama-cpp DIR`` or the ``LLAMA_CPP_DIR`` variable. DIR
holds either an unpacked ``llama_cpp`` package (llama-cpp-python built with
GGML_VULKAN) or the ready build's ``llama_cpp-*.tgz`` (unpacked into a
temporary directory here) and optionally a ``diskcache-*.whl`` (a pure-Python
dependency it imports, put on sys.path as is). ``llama_cpp`` already importable
works too. The same token ids are fed to it as to our backend: the prompt, then
one token per decode step, all layers on the GPU (n_gpu_layers=-1).
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from . import PeerUnavailable

log = logging.getLogger(__name__)
ENV = "LLAMA_CPP_DIR"


def locate(option: str | None) -> Path | None:
    d = option or os.environ.get(ENV)
    return Path(d).expanduser() if d else None


def import_llama_cpp(where: Path | None, tmp_root: Path):
    """The llama_cpp module, from ``where`` (see the module doc) or the environment."""
    if where is not None:
        if not where.is_dir():
            raise PeerUnavailable(f"--llama-cpp {where} is not a directory")
        pkg_root = where if (where / "llama_cpp").is_dir() else None
        if pkg_root is None:
            tgz = sorted(where.glob("llama_cpp-*.tgz")) + sorted(where.glob("llama_cpp*.tar.gz"))
            if not tgz:
                raise PeerUnavailable(f"{where} holds neither a llama_cpp package nor a llama_cpp-*.tgz")
            pkg_root = Path(tempfile.mkdtemp(prefix="llama-cpp-", dir=tmp_root))
            with tarfile.open(tgz[0]) as tf:
                tf.extractall(pkg_root, filter="data")
            if not (pkg_root / "llama_cpp").is_dir():
                raise PeerUnavailable(f"{tgz[0]} did not unpack to a llama_cpp package")
        sys.path.insert(0, str(pkg_root))
        for whl in sorted(where.glob("diskcache-*.whl")):
            sys.path.append(str(whl))
    # llama.cpp ignores software Vulkan devices unless named; device 0 is lavapipe on a CPU machine
    os.environ.setdefault("GGML_VK_VISIBLE_DEVICES", "0")
    try:
        return importlib.import_module("llama_cpp")
    except Exception as e:   # ImportError, or OSError from its shared libraries
        raise PeerUnavailable(f"llama_cpp does not import ({type(e).__name__}: {e})")


class LlamaCppPeer:
    def __init__(self, where: Path | None, tmp_root: Path):
        self.lc = import_llama_cpp(where, tmp_root)
        if not self.lc.llama_supports_gpu_offload():
            raise PeerUnavailable("this llama_cpp build cannot offload to a GPU (no Vulkan backend)")
        self.version = getattr(self.lc, "__version__", "?")
        self.note = f"llama.cpp (llama-cpp-python {self.version}) Vulkan, n_gpu_layers=-1"

    def open(self, path: Path, n_ctx: int):
        llm = self.lc.Llama(str(path), n_gpu_layers=-1, n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                            logits_all=False, verbose=False)
        return LlamaCppModel(self.lc, llm)


class LlamaCppModel:
    def __init__(self, lc, llm):
        self.lc, self.llm = lc, llm
        self.n_vocab = llm.n_vocab()

    def last_logits(self) -> np.ndarray:
        ptr = self.lc.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def run(self, prompt: list[int], steps: list[int]) -> tuple[float, list[float], np.ndarray]:
        """(prefill seconds, seconds per decode step, logits after the prompt) from a reset cache."""
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        prefill = time.perf_counter() - t0
        logits = self.last_logits()
        per_step = []
        for tok in steps:
            t0 = time.perf_counter()
            self.llm.eval([tok])
            per_step.append(time.perf_counter() - t0)
        return prefill, per_step, logits

    def close(self) -> None:
        self.llm.close()
