"""IREE on Vulkan as a peer for the MLP and transformer block.

iree-turbine's torch.compile backends reach only CPU/CUDA/HIP, so the model is
exported with torch.export, imported to MLIR with iree-base-compiler's
FxImporter, compiled for ``vulkan-spirv`` and run with iree-base-runtime's
``vulkan`` driver. The weights are function arguments, uploaded to the device
once, so a module (.vmfb) holds no weights and depends only on the shapes: one
compiled elsewhere for the same target (``--iree-vmfb-dir``) is as good, which
lets a machine that has only the runtime run the peer:

    python -m dynamo_vulkan.benchmarks.peers.iree --prepare DIR --target ampere [--quick]

Two things are decided for IREE, and noted with its rows: scaled_dot_product_attention
is decomposed to matmul + softmax before import (IREE's SPIR-V path cannot
compile its fused attention op), and int64 index math is demoted to int32
(the baseline Vulkan target has no Int64).
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import sys
from pathlib import Path

import numpy as np
import torch

from . import PeerUnavailable

log = logging.getLogger(__name__)

FLAGS = ("--iree-input-demote-i64-to-i32",)


def auto_target(device_name: str) -> str | None:
    """An --iree-vulkan-target for the device, or None for IREE's portable baseline."""
    n = (device_name or "").lower()
    if "nvidia" in n:
        return "ampere"           # the newest NVIDIA Vulkan target IREE names; runs on Hopper
    if "amd" in n or "radeon" in n:
        return "rdna3"
    return None


class IreePeer:
    def __init__(self, target: str | None, vmfb_dir: Path):
        try:
            import iree.runtime as rt
        except ImportError as e:
            raise PeerUnavailable(f"iree-base-runtime is not installed ({e}); pip install 'dynamo-vulkan[peers]'")
        self.rt = rt
        try:
            from iree.compiler.extras.fx_importer import FxImporter  # noqa: F401
            self.can_compile = True
        except ImportError:
            self.can_compile = False
        self.target = target
        self.vmfb_dir = Path(vmfb_dir)
        try:
            self.config = rt.Config("vulkan")
        except Exception as e:
            raise PeerUnavailable(f"IREE's vulkan driver found no device: {e}")
        self.device = self.config.device
        self._staging: dict[int, object] = {}     # read-back buffers by size, reused across calls
        self.note = (f"IREE {_version()} vulkan-spirv target {target or 'default'}; sdpa decomposed, i64->i32"
                     + ("" if self.can_compile else "; module compiled ahead (no iree-base-compiler here)"))

    # ------------------------------------------------------------------ compile
    def key(self, workload: str, model: torch.nn.Module, inputs: tuple) -> str:
        shapes = [tuple(x.shape) for x in inputs] + [(n, tuple(p.shape)) for n, p in _params(model)]
        h = hashlib.sha256(repr((workload, type(model).__name__, shapes, self.target, FLAGS, _version())).encode())
        return f"{_slug(workload)}-{h.hexdigest()[:16]}"

    def vmfb(self, workload: str, model, inputs: tuple) -> tuple[bytes, float]:
        """The compiled module and the seconds it took (0 when loaded from the directory)."""
        import time

        path = self.vmfb_dir / (self.key(workload, model, inputs) + ".vmfb")
        if path.is_file():
            return path.read_bytes(), 0.0
        if not self.can_compile:
            raise PeerUnavailable(f"no iree-base-compiler here and no precompiled {path.name} in {self.vmfb_dir}")
        t0 = time.perf_counter()
        blob = compile_module(model, inputs, self.target)
        self.vmfb_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(blob)
        tmp.replace(path)
        return blob, time.perf_counter() - t0

    # ------------------------------------------------------------------ run
    def run(self, workload: str, model, inputs: tuple, plan) -> dict:
        from ..timing import measure

        rt = self.rt
        blob, compile_s = self.vmfb(workload, model, inputs)
        ctx = rt.SystemContext(config=self.config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, blob))
        fn = ctx.modules.module["main"]
        params = [rt.asdevicearray(self.device, p.detach().contiguous().numpy()) for _, p in _params(model)]
        host = [x.contiguous().numpy() for x in inputs]

        def call():
            args = [rt.asdevicearray(self.device, h) for h in host]
            return self._to_host(fn(*args, *params))

        out = torch.from_numpy(call())
        return {"ms": measure(call, plan), "out": out, "compile_s": compile_s}

    def _to_host(self, arr) -> np.ndarray:
        """Copy a result to the host through a staging buffer kept for the next call.
        (DeviceArray.to_host imports the numpy array as host memory, which Mesa's lavapipe
        refuses: 4 KiB alignment.)"""
        rt = self.rt
        bv = arr._buffer_view
        src = bv.get_buffer()
        n = src.byte_length()
        buf = self._staging.get(n)
        if buf is None:
            buf = self._staging[n] = self.device.allocator.allocate_buffer(
                memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
                allocation_size=n)
        sem = self.device.create_semaphore(0)
        self.device.queue_copy(src, buf, wait_semaphores=rt.HalFence.create_at(sem, 0),
                               signal_semaphores=rt.HalFence.create_at(sem, 1))
        rt.HalFence.create_at(sem, 1).wait()
        dtype = rt.HalElementType.map_to_dtype(bv.element_type)
        return np.array(buf.map().asarray(bv.shape, dtype))


def _params(model) -> list:
    return list(model.named_parameters()) if isinstance(model, torch.nn.Module) else []


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s)[:48]


def _version() -> str:
    import importlib.metadata
    try:
        return importlib.metadata.version("iree-base-runtime")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def compile_module(model: torch.nn.Module, inputs: tuple, target: str | None) -> bytes:
    """A .vmfb whose function ``main(*inputs, *parameters)`` runs ``model`` on Vulkan."""
    import iree.compiler as ic
    from iree.compiler.extras.fx_importer import FxImporter

    names = [n for n, _ in _params(model)]
    params = tuple(p.detach() for _, p in _params(model))

    class WeightsAsArgs(torch.nn.Module):
        def forward(self, *args):
            xs, ps = args[:len(inputs)], args[len(inputs):]
            return torch.func.functional_call(model, dict(zip(names, ps)), xs)

    with torch.no_grad():
        ep = torch.export.export(WeightsAsArgs(), (*inputs, *params)).run_decompositions()
    imp = FxImporter()
    imp.import_frozen_program(ep)
    flags = list(FLAGS) + ([f"--iree-vulkan-target={target}"] if target else [])
    return ic.compile_str(str(imp.module), target_backends=["vulkan-spirv"], input_type="torch", extra_args=flags)


def main(argv=None) -> int:
    """Compile the MLP/block modules ahead, for a machine that has only iree-base-runtime."""
    p = argparse.ArgumentParser(prog="python -m dynamo_vulkan.benchmarks.peers.iree", description=main.__doc__)
    p.add_argument("--prepare", required=True, metavar="DIR", help="write .vmfb files here")
    p.add_argument("--target", default=None, help="--iree-vulkan-target (e.g. ampere); default: IREE's baseline")
    p.add_argument("--quick", action="store_true", help="the --quick shapes")
    args = p.parse_args(argv)
    from ..suites import block, mlp

    out = Path(args.prepare)
    out.mkdir(parents=True, exist_ok=True)
    for suite in (mlp, block):
        for name, make in suite.workloads(args.quick):
            model, inputs = make()
            path = out / (_key_only(name, model, inputs, args.target) + ".vmfb")
            path.write_bytes(compile_module(model.eval(), inputs, args.target))
            print(path)
    return 0


def _key_only(workload, model, inputs, target) -> str:
    peer = IreePeer.__new__(IreePeer)
    peer.target = target
    return IreePeer.key(peer, workload, model, inputs)


if __name__ == "__main__":
    sys.exit(main())
