"""llama.cpp on its Vulkan backend as the peer for the GGUF models.

It is found through ``--llama-cpp [DIR]`` or the ``LLAMA_CPP_DIR`` variable. DIR
holds either an unpacked ``llama_cpp`` package (llama-cpp-python built with
GGML_VULKAN) or the ready build's ``llama_cpp-*.tgz`` (unpacked into a
temporary directory here) and optionally a ``diskcache-*.whl`` (a pure-Python
dependency it imports, put on sys.path as is), or it holds builds as
subdirectories: ``llama-cpp-full`` (the full-strength build: cooperative
matrices, integer dot, bf16) is taken where present, else ``llama-cpp`` (the
plain shader paths), as in ``../shared/peers`` and the device kit's ``peers``.
``--llama-cpp`` without DIR looks for those two places. ``llama_cpp`` already
importable works too. The same token ids are fed to it as to our backend: the
prompt, then one token per decode step, all layers on the GPU (n_gpu_layers=-1).
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
from typing import NamedTuple

import numpy as np

from . import PeerUnavailable

log = logging.getLogger(__name__)
ENV = "LLAMA_CPP_DIR"
AUTO = "auto"                                # --llama-cpp given without DIR
BUILDS = ("llama-cpp-full", "llama-cpp")     # subdirectories of DIR, the preferred first
REPO = Path(__file__).resolve().parents[2]
# where --llama-cpp without DIR looks: the shared peers beside the checkout, the device kit
SEARCHED = (REPO.parent / "shared" / "peers", REPO / ".device-kit" / "peers")


def locate(option: str | None) -> Path | None:
    """The directory of the llama.cpp build to use: DIR itself, or its preferred build
    subdirectory (BUILDS); for AUTO, the first of SEARCHED that holds one."""
    if option == AUTO:
        for root in SEARCHED:
            found = _build_in(root)
            if found is not None:
                return found
        raise PeerUnavailable(f"--llama-cpp without DIR: no {' or '.join(BUILDS)} in "
                              + ", ".join(str(r) for r in SEARCHED))
    d = option or os.environ.get(ENV)
    if not d:
        return None
    where = Path(d).expanduser()
    return _build_in(where) or where


def _build_in(root: Path) -> Path | None:
    for name in BUILDS:
        if (root / name).is_dir():
            return root / name
    return None


def build_name(where: Path | None) -> str:
    """'full' or 'plain' (which shader paths the build has), from the package's name."""
    if where is None:
        return "installed"
    names = [where.name] + [p.name for p in where.glob("llama_cpp*.t*gz")]
    return "full" if any("full" in n for n in names) else "plain"


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
        self.build = build_name(where)
        self.note = f"llama.cpp (llama-cpp-python {self.version}, {self.build} build) Vulkan, n_gpu_layers=-1"

    def open(self, path: Path, n_ctx: int):
        llm = self.lc.Llama(str(path), n_gpu_layers=-1, n_ctx=n_ctx, n_batch=512, n_ubatch=512,
                            logits_all=False, verbose=False)
        return LlamaCppModel(self.lc, llm)


class PeerRun(NamedTuple):
    prefill_s: float             # llama_eval of the prompt
    first_token_s: float         # ... and the greedy first token from its logits
    step_s: list[float]          # each decode step
    logits: np.ndarray           # after the prompt


class LlamaCppModel:
    def __init__(self, lc, llm):
        self.lc, self.llm = lc, llm
        self.n_vocab = llm.n_vocab()

    def last_logits(self) -> np.ndarray:
        ptr = self.lc.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def run(self, prompt: list[int], steps: list[int]) -> "PeerRun":
        """The prompt then one decode step per token of ``steps``, from a reset cache. Each
        eval is followed by llama_synchronize, as llama-bench does: llama_decode returns
        once the work is queued (on lavapipe a 64-token prompt's eval took 1 ms and its
        synchronize 1.4 s), and unsynchronized, a step's time is that of the one before."""
        sync = self.lc.llama_synchronize
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(prompt)
        sync(self.llm.ctx)
        prefill = time.perf_counter() - t0
        logits = self.last_logits()
        int(np.argmax(logits))                    # the first token, as a greedy caller takes it
        first = time.perf_counter() - t0
        per_step = []
        for tok in steps:
            t0 = time.perf_counter()
            self.llm.eval([tok])
            sync(self.llm.ctx)
            per_step.append(time.perf_counter() - t0)
        return PeerRun(prefill, first, per_step, logits)

    def close(self) -> None:
        self.llm.close()
