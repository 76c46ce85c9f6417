"""Limits measured in the same process, so every figure can be set against them.

- the Vulkan device's copy bandwidth: the better of a grid-stride uvec4 copy
  kernel and a buffer-to-buffer transfer, through kp, timed with kp's GPU
  timestamps (bytes read + written per second);
- one empty kp submit + wait (the floor under any compiled call);
- with torch CUDA on the machine: its device-to-device copy bandwidth and its
  fp32 matmul rate with TF32 off (the peak FLOP/s we hold matmuls against).
- a chained streaming read of N bytes: distinct buffers read one after another, a
  barrier between (as a decoder's mat-vecs run): what any kernel that reads a weight
  of N bytes once can reach, launch and barrier included (GGUF mat-vec rows);
- a barrier level: a chain of one-workgroup kernels, each behind a barrier after the
  last: the least a program's level of kernels costs, so a decode step of L levels
  takes at least L of it whatever its kernels do.
"""
from __future__ import annotations

import logging
import time

import numpy as np

from .timing import Plan, Stat, measure, measure_cuda

log = logging.getLogger(__name__)

# A grid-stride pass over N4 uvec4s: copied to dst, or (READ_ONLY) only read
STREAM_SHADER = """#version 450
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint N4 = 1u;
layout(binding = 0) readonly buffer Src { uvec4 src[]; };
layout(binding = 1) writeonly buffer Dst { uvec4 dst[]; };
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
#ifdef READ_ONLY
    uvec4 a = uvec4(0u);
    for (uint i = gl_GlobalInvocationID.x; i < N4; i += stride) a ^= src[i];
    if (a == uvec4(0x9E3779B9u)) dst[0] = a;    // keeps the loads; never true for zeros
#else
    for (uint i = gl_GlobalInvocationID.x; i < N4; i += stride) dst[i] = src[i];
#endif
}
"""
COPY_SHADER = STREAM_SHADER
READ_SHADER = STREAM_SHADER.replace("#version 450\n", "#version 450\n#define READ_ONLY 1\n", 1)
READ_GROUPS = 4096      # workgroups of the read floor at most (more read no faster)


def _seconds_per_op(seq, ops: int, period_ns: float) -> float:
    """GPU seconds per op of a kp sequence just evaluated: its first to last timestamp
    over `ops` (after a warm-up evaluation)."""
    ts = np.array(seq.get_timestamps(), dtype=np.float64)
    return float(ts[-1] - ts[0]) * period_ns * 1e-9 / ops


def wall_difference(short, long, calls: int) -> float:
    """Seconds that long() takes beyond short(): the difference of their median wall
    times over `calls` alternated calls each, so what both pay (a submit, uploads,
    read-back) cancels."""
    walls: tuple[list[float], list[float]] = ([], [])
    for _ in range(calls):
        for w, fn in zip(walls, (short, long)):
            t0 = time.perf_counter()
            fn()
            w.append(time.perf_counter() - t0)
    return float(np.median(walls[1])) - float(np.median(walls[0]))


class ChainedRead:
    """Reads of `copies` distinct buffers of ``nbytes`` one after another, a global
    barrier between, recorded in one kp sequence: made once (uploads, compiling), then
    timed as often as wanted (`gbps`), so a caller can time it while the GPU is warm."""

    def __init__(self, nbytes: int, copies: int):
        import kp

        from dynamo_vulkan.device import manager
        from dynamo_vulkan.runtime.program import SHADER_READ, SHADER_WRITE, STAGE_COMPUTE
        from dynamo_vulkan.runtime.shaders import compile_source

        self.nbytes, self.copies = max(16, nbytes // 16 * 16), copies
        mgr = manager()
        storage = kp.TensorTypes.storage
        self.tensors = [mgr.tensor_t(np.zeros(self.nbytes // 4, np.uint32), tensor_type=storage)
                        for _ in range(copies)]
        dst = mgr.tensor_t(np.zeros(4, np.uint32), tensor_type=storage)
        n4 = self.nbytes // 16
        self.groups = max(1, min(-(-n4 // 256), READ_GROUPS))
        spv, empty = compile_source(READ_SHADER, "bench_read"), np.zeros(0, np.uint32)
        algos = [mgr.algorithm([src, dst], spv, [self.groups, 1, 1], np.array([n4], np.uint32), empty)
                 for src in self.tensors]
        self.tensors.append(dst)

        def sequence(rounds, timestamps):
            seq = mgr.sequence(total_timestamps=timestamps)
            for i in range(rounds * copies):
                if i:
                    seq.record(kp.OpGlobalBarrier(SHADER_WRITE, SHADER_READ | SHADER_WRITE,
                                                  STAGE_COMPUTE, STAGE_COMPUTE))
                seq.record(kp.OpDispatchBare(algos[i % copies]))
            seq.eval()                   # first-use costs
            return seq
        self._sequence = sequence
        self.walled: dict = {}           # rounds -> the sequences gbps times
        self.busy = None

    def heat(self, seconds: float) -> None:
        """Keep the GPU reading for `seconds` (back to back submits of up to 4 GB each),
        so its clocks are up for what is timed next: sparse submits (a timed call, then
        the host's work) leave a GPU at its idle clock (docs/journal.md has an H100's)."""
        if self.busy is None:            # the same reads many times over, no timestamps
            rounds = min((4 << 30) // (self.nbytes * self.copies), 2048 // self.copies)
            self.busy = self._sequence(max(1, rounds), 0)
        t_end = time.perf_counter() + seconds
        while time.perf_counter() < t_end:
            self.busy.eval()

    def gbps(self, calls: int = 10, rounds: int = 4) -> dict:
        """GB/s of the bytes read: the difference of the median wall times of the reads
        recorded 2 * rounds and `rounds` times (`calls` submits each, alternated), over
        rounds * copies reads (no GPU timestamp between them, as benchmarks/gguf_matvec.py
        times its mat-vecs)."""
        seqs = self.walled.get(rounds)
        if seqs is None:
            seqs = self.walled[rounds] = [self._sequence(r, 0) for r in (rounds, 2 * rounds)]
        s = wall_difference(seqs[0].eval, seqs[1].eval, calls) / (rounds * self.copies)
        return {"bytes": self.nbytes, "copies": self.copies, "us": s * 1e6, "gbps": self.nbytes / s / 1e9,
                "how": f"{self.copies} buffers read in turn (uvec4, {self.groups} workgroups), a "
                       f"barrier between, recorded {rounds} and {2 * rounds} times: the difference "
                       f"of the median wall times of {calls} submits each"}

    def close(self):
        for t in self.tensors:
            t.destroy()
        self.tensors = []


# Each link of a dependent chain: one workgroup reads the word the last one wrote and
# writes the next (two buffers in turn), so the chain's order is a true dependency.
LINK_SHADER = """#version 450
layout(local_size_x = 64) in;
layout(binding = 0) readonly buffer Src { uint src[]; };
layout(binding = 1) writeonly buffer Dst { uint dst[]; };
void main() {
    if (gl_LocalInvocationID.x == 0u) dst[0] = src[0] + 1u;
}
"""


def barrier_level_us(links: int = 64, rounds: int = 4, calls: int = 10) -> dict:
    """Microseconds a barrier level costs at least: a chain of `links` one-workgroup
    kernels, a global barrier before each (as a program records its levels), recorded
    `rounds` and 2 * rounds times; the difference of their median wall times over
    rounds * links, so the submit and wait cancel (no timestamps between the kernels)."""
    import kp

    from dynamo_vulkan.device import manager
    from dynamo_vulkan.runtime.program import SHADER_READ, SHADER_WRITE, STAGE_COMPUTE
    from dynamo_vulkan.runtime.shaders import compile_source

    mgr = manager()
    storage = kp.TensorTypes.storage
    bufs = [mgr.tensor_t(np.zeros(4, np.uint32), tensor_type=storage) for _ in range(2)]
    spv, empty = compile_source(LINK_SHADER, "bench_link"), np.zeros(0, np.uint32)
    algos = [mgr.algorithm([bufs[i], bufs[1 - i]], spv, [1, 1, 1], empty, empty) for i in range(2)]
    try:
        def chain(n):
            seq = mgr.sequence()
            for i in range(n):
                seq.record(kp.OpGlobalBarrier(SHADER_WRITE, SHADER_READ | SHADER_WRITE,
                                              STAGE_COMPUTE, STAGE_COMPUTE))
                seq.record(kp.OpDispatchBare(algos[i % 2]))
            seq.eval()                   # first-use costs
            return seq
        short, long = chain(rounds * links), chain(2 * rounds * links)
        s = wall_difference(short.eval, long.eval, calls) / (rounds * links)
    finally:
        for b in bufs:
            b.destroy()
    return {"us": s * 1e6, "links": links,
            "how": f"a chain of one-workgroup kernels, a global barrier before each, recorded "
                   f"{rounds * links} and {2 * rounds * links} times: the difference of the median "
                   f"wall times of {calls} submits each, per kernel"}


def vulkan_copy_gbps(nbytes: int, iters: int = 10) -> dict:
    """GB/s (read + write) of a copy kernel over ``nbytes`` on the Vulkan device."""
    import kp

    from dynamo_vulkan import device_info
    from dynamo_vulkan.device import manager
    from dynamo_vulkan.runtime.shaders import compile_source

    info = device_info()
    nbytes = int(min(nbytes, info.get("max_storage_buffer_range", 128 << 20)) // 16 * 16)
    mgr = manager()
    words = nbytes // 4
    storage = kp.TensorTypes.storage
    src = mgr.tensor_t(np.zeros(words, np.uint32), tensor_type=storage)
    dst = mgr.tensor_t(np.zeros(words, np.uint32), tensor_type=storage)
    n4 = nbytes // 16
    groups = max(1, min(-(-n4 // 256), 65535))
    spec = np.array([n4], np.uint32)
    empty = np.zeros(0, np.uint32)
    algo = mgr.algorithm([src, dst], compile_source(COPY_SHADER, "bench_copy"), [groups, 1, 1], spec, empty)
    seq = mgr.sequence(total_timestamps=iters + 2)
    for _ in range(iters):
        seq.record(kp.OpAlgoDispatch(algo, empty))
    seq.eval()                       # warm-up
    seq.eval()
    period = float(info.get("timestamp_period_ns", 1.0))
    kernel_gbps = 2 * nbytes / _seconds_per_op(seq, iters, period) / 1e9
    seq = mgr.sequence(total_timestamps=iters + 2)
    for _ in range(iters):
        seq.record(kp.OpTensorCopy([src, dst]))
    seq.eval()
    seq.eval()
    transfer_gbps = 2 * nbytes / _seconds_per_op(seq, iters, period) / 1e9
    for t in (src, dst):
        t.destroy()
    return {"bytes": nbytes, "gbps": max(kernel_gbps, transfer_gbps), "kernel_gbps": kernel_gbps,
            "transfer_gbps": transfer_gbps,
            "how": f"the better of a uvec4 copy kernel and vkCmdCopyBuffer (kp OpTensorCopy), "
                   f"{iters} in one submit, kp timestamps"}


def empty_submit(plan: Plan) -> dict:
    """ms of one submit + wait of an empty kp sequence: reused, and made afresh each time;
    as our runtime submits (kp patch 6: one fence per sequence, polled before blocking)
    and as kp 0.9 does as released (a fence created and destroyed per submit, blocking)."""
    import kp
    from dynamo_vulkan.device import manager

    mgr = manager()
    seq = mgr.sequence()
    reused = measure(seq.eval, plan)
    fresh = measure(lambda: mgr.sequence().eval(), plan)
    spin, reuse = kp.fence_spin_us(), kp.fence_reuse()
    kp.set_fence_reuse(False)
    kp.set_fence_spin_us(0)
    try:
        stock = measure(seq.eval, plan)
    finally:
        kp.set_fence_reuse(reuse)
        kp.set_fence_spin_us(spin)
    return {"reused_ms": reused.as_dict(), "fresh_ms": fresh.as_dict(), "kp_as_released_ms": stock.as_dict(),
            "fence_spin_us": spin}


def cuda_copy_gbps(nbytes: int, plan: Plan) -> dict:
    import torch

    x = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    st = measure_cuda(lambda: y.copy_(x), plan)
    return {"bytes": nbytes, "gbps": 2 * nbytes / (st.median * 1e-3) / 1e9, "device": torch.cuda.get_device_name(),
            "how": "torch CUDA device-to-device copy_, CUDA events"}


def cuda_fp32_matmul_gflops(n: int, plan: Plan) -> dict:
    """Peak-ish fp32 FLOP/s of torch CUDA matmul with TF32 off (n x n x n)."""
    import torch

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        a = torch.randn(n, n, device="cuda")
        b = torch.randn(n, n, device="cuda")
        st = measure_cuda(lambda: a @ b, plan)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return {"n": n, "gflops": 2 * n ** 3 / (st.median * 1e-3) / 1e9, "device": torch.cuda.get_device_name(),
            "how": "torch CUDA fp32 matmul, TF32 off, CUDA events"}


def cuda_available() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:            # a broken CUDA install is the same as none here
        return False


def run_all(quick: bool, plan: Plan) -> dict:
    """Every probe that this machine can run; a failed probe is recorded, not fatal."""
    out: dict = {}
    size = (16 << 20) if quick else (256 << 20)
    try:
        out["vulkan_copy"] = vulkan_copy_gbps(size, iters=3 if quick else 10)
    except Exception as e:
        out["vulkan_copy"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        out["empty_submit"] = empty_submit(Plan(reps=200 if not quick else 50, warmup=10, max_s=2.0))
    except Exception as e:
        out["empty_submit"] = {"error": f"{type(e).__name__}: {e}"}
    try:
        out["barrier_level"] = barrier_level_us(links=16 if quick else 64, calls=5 if quick else 10)
    except Exception as e:
        out["barrier_level"] = {"error": f"{type(e).__name__}: {e}"}
    if cuda_available():
        try:
            out["cuda_copy"] = cuda_copy_gbps(size, plan)
            out["cuda_fp32_matmul"] = cuda_fp32_matmul_gflops(1024 if quick else 8192, plan)
        except Exception as e:
            out["cuda_error"] = f"{type(e).__name__}: {e}"
    else:
        out["cuda"] = "torch.cuda is not available: no CUDA copy or FLOP/s limits"
    return out


def copy_limit(probes: dict) -> tuple[float | None, str]:
    """The best copy bandwidth measured on the device (GB/s) and which probe gave it."""
    best, name = None, ""
    for key in ("vulkan_copy", "cuda_copy"):
        g = probes.get(key, {}).get("gbps")
        if g and (best is None or g > best):
            best, name = g, key
    return best, name


def empty_submit_ms(probes: dict, as_released: bool = False) -> float | None:
    """The median empty submit+wait: as our runtime submits, or as kp 0.9 does as released."""
    es = probes.get("empty_submit", {})
    key = "kp_as_released_ms" if as_released else "reused_ms"
    return es[key]["median"] if key in es else None


def peak_gflops(probes: dict) -> float | None:
    return probes.get("cuda_fp32_matmul", {}).get("gflops")


def barrier_level(probes: dict) -> float | None:
    """The least microseconds a barrier level of kernels costs (barrier_level_us), if measured."""
    return probes.get("barrier_level", {}).get("us")


__all__ = ["run_all", "copy_limit", "ChainedRead", "barrier_level", "empty_submit_ms", "peak_gflops", "Stat"]
