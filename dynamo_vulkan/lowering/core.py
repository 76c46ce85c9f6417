"""What every lowering rule works with: tensor references into GPU buffers and
the context that allocates buffers and emits dispatches (the registry of rules is
registry.py; `lowering` is re-exported here for the family modules).

A value on the GPU is a `TRef`: a buffer plus shape, strides and offset in
elements, so view ops only make a new TRef. Kernels read operands through their
strides (specialisation constants), and the planner later assigns physical
buffers by liveness.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from dynamo_vulkan import config, device
from dynamo_vulkan.runtime import shaders
from dynamo_vulkan.runtime.plan import KIND_OF_DTYPE, Buffer, Dispatch, Plan, groups_for  # noqa: F401  (rules import it from here)
from dynamo_vulkan.runtime.words import plain

from .registry import NO_REQUEST, Lowered, OpSpec, Request, lowering, spec_of  # noqa: F401

GLSL_TYPE = {"f32": "float", "i32": "int", "b": "bool"}


class LoweringError(RuntimeError):
    """A node that the Vulkan lowering cannot handle with these inputs: a rule's declared
    refusal, with its reason; the node runs on the CPU. Any other exception from a rule
    is a bug in it (lowering/planner.py)."""


class RuleBugError(LoweringError):
    """A lowering rule raised something other than a declared refusal (LoweringError): a
    bug in the rule, not a limit of Vulkan. Outside strict mode (Config.strict) the planner
    logs it as a bug and the node runs on the CPU."""


class HostPlacement(str):
    """A rule check's reason for running a node on the host that is a choice (it is faster
    there), not a missing kernel: no fallback warning, and DYNAMO_VULKAN_FALLBACK=error
    allows it."""


@dataclass(frozen=True)
class TRef:
    buf: int
    shape: tuple
    strides: tuple
    offset: int
    kind: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def is_contiguous(self) -> bool:
        return self.strides == contiguous_strides(self.shape)

    def with_layout(self, shape, strides, offset) -> "TRef":
        return TRef(self.buf, tuple(shape), tuple(strides), int(offset), self.kind)


def contiguous_strides(shape) -> tuple:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


def broadcast_shapes(*shapes) -> tuple:
    """torch.broadcast_shapes of plain int shapes, without its first call's import of
    torch's symbolic shapes and sympy (~0.45 s on a process's first new plan)."""
    out: list[int] = []
    for shape in shapes:
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        out = [1] * (len(shape) - len(out)) + out
        for i, s in enumerate(shape, len(out) - len(shape)):
            if type(s) is not int or s < 0:
                return tuple(torch.broadcast_shapes(*shapes))      # symbolic or invalid: torch's
            if s != out[i] and s != 1:
                if out[i] != 1:
                    raise RuntimeError(f"shapes {shapes} cannot be broadcast together (dim {i}: {out[i]} vs {s})")
                out[i] = s
    return tuple(out)


def kind_of(dtype: torch.dtype) -> str:
    kind = KIND_OF_DTYPE.get(str(dtype))
    if kind is None:
        raise LoweringError(f"dtype {dtype} is not supported on Vulkan")
    return kind


def f32_bits(x: float) -> int:
    import struct
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def i32_bits(x: int) -> int:
    x = int(x)
    if not -2**31 <= x < 2**31:
        raise LoweringError(f"integer constant {x} does not fit in int32")
    return x & 0xFFFFFFFF


def vec4_rows(x2: TRef) -> bool:
    """Whether every row of x2 starts on 16 bytes, so a kernel may read it as vec4s
    (X_VEC4: its binding seen as vec4s)."""
    return x2.offset % 4 == 0 and (x2.shape[0] == 1 or x2.strides[0] % 4 == 0)


class Context:
    """Builds one Plan: buffers, constants, dispatches, and the GLSL they use."""

    def __init__(self, caps: dict, cfg: config.Config | None = None):
        self.plan = Plan()
        self.caps = caps
        self.cfg = cfg or config.load()    # the compile's settings (config.py)
        self.node = None           # the FX node being lowered (for meta and errors)
        self._consts: dict[tuple, object] = {}         # (tag, id of a host constant) -> its upload
        self._const_tensors: list[torch.Tensor] = []   # keeps id() of folded constants stable
        self.outputs: list[TRef] = []                  # graph outputs placed so far
        self.in_place: set = set()      # nodes that may write their first input's buffer
        self.row_writes: dict = {}      # buffer id -> its last one-row scatter (index.RowWrite)
        self._derived: dict = {}        # key -> (a value derived from buffers, dispatch count then)
        self.weight_copies: set[int] = set()   # dispatches copying weights (schedule.py)
        # called (once) before the next dispatch: the planner's copies or the elementwise
        # siblings (elementwise._Siblings) not emitted yet
        self.before_dispatch = None
        self.siblings = None

    def run_before_dispatch(self) -> None:
        if self.before_dispatch is not None:
            hook, self.before_dispatch = self.before_dispatch, None
            hook()

    def derived(self, key, reads: set, make):
        """A value that dispatches derive from buffers `reads` (x's int8 planes, a mask's
        live ranges): make() emits it the first time; later callers with the same key get
        it back until a dispatch since has written one of those buffers."""
        if not self.has_derived(key, reads):
            self._derived[key] = (make(), len(self.plan.dispatches))
        return self._derived[key][0]

    def has_derived(self, key, reads: set) -> bool:
        """Whether derived(key, reads, ...) would give a value back without making it."""
        self.run_before_dispatch()     # a pending copy may write one of `reads`
        got, since = self._derived.get(key, (None, 0))
        return got is not None and not any(d.bindings[i] in reads for d in self.plan.dispatches[since:]
                                           for i in d.writes)

    def provide_derived(self, key, value) -> None:
        """Record a derived value that the last dispatch made beside its own output (the
        int8 planes of decode attention's output, written by its merge)."""
        self._derived[key] = (value, len(self.plan.dispatches))

    def forget_derived(self) -> None:
        """Make every derived value again at its next use (benchmarks that repeat work)."""
        self._derived.clear()

    # --- buffers -----------------------------------------------------------
    def buffer(self, words: int, role: str = "temp", kind: str = "f32", const=None) -> int:
        limit = self.caps.get("max_storage_buffer_range", 128 << 20)
        if words * 4 > limit:
            raise LoweringError(f"a buffer of {words * 4} bytes exceeds the device's "
                                f"maxStorageBufferRange ({limit} bytes)")
        self.plan.buffers.append(Buffer(max(1, int(words)), role, kind, const))
        return len(self.plan.buffers) - 1

    def empty(self, shape, kind: str) -> TRef:
        shape = tuple(int(s) for s in shape)
        return TRef(self.buffer(math.prod(shape), "temp", kind), shape,
                    contiguous_strides(shape), 0, kind)

    def ref(self, x) -> TRef:
        """A TRef for a lowered value or a host constant (uploaded once)."""
        if isinstance(x, TRef):
            return x
        if isinstance(x, torch.Tensor):
            return self.const_once(x, lambda: self._upload(x))
        raise LoweringError(f"expected a tensor, got {type(x).__name__}")

    def const_once(self, x: torch.Tensor, make: Callable[[], object], tag: str = ""):
        """The value `make()` builds for host tensor x (its constant buffers), built once
        per (tag, x) in this plan; x is kept alive with the plan's context, so its id()
        names no other tensor meanwhile. Families that upload a constant in a layout of
        their own (GGUF blocks) use a tag of their own."""
        key = (tag, id(x))
        ref = self._consts.get(key)
        if ref is None:
            ref = self._consts[key] = make()
            self._const_tensors.append(x)
        return ref

    def _upload(self, x: torch.Tensor) -> TRef:
        kind = kind_of(x.dtype)
        data = plain(x).contiguous().reshape(-1)
        data = data.to(torch.float32 if kind == "f32" else torch.int32).numpy()
        if kind == "i32" and x.dtype == torch.int64 and x.numel() and \
                (x.max() >= 2**31 or x.min() < -2**31):
            raise LoweringError("an int64 constant does not fit in int32")
        buf = self.buffer(data.size, "const", kind, data.view("uint32").copy())
        return TRef(buf, tuple(x.shape), contiguous_strides(tuple(x.shape)), 0, kind)

    # --- node metadata -----------------------------------------------------
    def meta(self, i: int | None = None):
        val = self.node.meta["val"]
        return val[i] if i is not None else val

    def out_kind(self, i: int | None = None) -> str:
        return kind_of(self.meta(i).dtype)

    def out_shape(self, i: int | None = None) -> tuple:
        return tuple(int(s) for s in self.meta(i).shape)

    # --- kernels -----------------------------------------------------------
    def dispatch(self, family: str, defines: dict, bindings: list, writes: list[int],
                 spec: list[int], groups, note: str = "", disjoint=(),
                 weight_copy: bool = False) -> None:
        """Emit one dispatch of shaders/<family>.comp specialised by `defines`.

        bindings: TRefs or buffer ids, bound in order; writes: their positions
        that the kernel writes; spec: uint32 values by constant_id; disjoint: (buffer
        id, dispatch index) pairs it need not wait for (plan.Dispatch.disjoint);
        weight_copy: it writes a copy of weights, which may run beside an earlier product
        (schedule.move_copies_ahead)."""
        self.run_before_dispatch()
        if weight_copy:
            self.weight_copies.add(len(self.plan.dispatches))
        key, source = shaders.kernel_source(family, defines)
        self.plan.sources[key] = source
        bufs = [b.buf if isinstance(b, TRef) else int(b) for b in bindings]
        self.plan.dispatches.append(Dispatch(
            name=f"{family}:{defines.get('VARIANT', '')}".rstrip(":"), spirv_key=key,
            bindings=bufs, writes=list(writes), spec=[int(s) & 0xFFFFFFFF for s in spec],
            groups=tuple(int(g) for g in groups), note=note,
            disjoint=[(int(b), int(i)) for b, i in disjoint]))


# Split K (the tiled matmul kernels): a grid of fewer tiles than this leaves a GPU idle
SPLIT_K_WGS = 256   # tiled workgroups below which K is split across more of them
SPLIT_K_MIN = 128   # ... keeping at least this much K per split
MAX_K_SPLITS = 8
# Bytes of split partial products at most for the tensor-core products, by the size of
# their weight (B): a product's temporaries grow with what it multiplies. SmolLM2's
# 512-row prompt held 18 MiB of them in each, then 7.9 MiB in its down projection's, past
# its memory goal (1.25 x the file + KV cache); its weights (all under 4M elements) keep
# 4 MiB, as the tiled GGUF kernel does (lowering/gguf.GGUF_SPLIT_K). A 7B's 128-row
# prompt (28 tiles a product) wants its q, o and down products in four splits, which
# 4 MiB would halve (docs/journal.md, sessions 35, 36 and 47). Plain fp32 products keep
# theirs.
SPLIT_K_MAX_BYTES = 4 << 20
SPLIT_K_LARGE_WEIGHT = 4 << 20          # elements of B from which ...
SPLIT_K_LARGE_MAX_BYTES = 8 << 20       # ... the partials may take this many bytes


def split_k_max_bytes(k: int, n: int) -> int:
    """The partials' cap (SPLIT_K_MAX_BYTES) of a tensor-core product of a [k, n] B."""
    return SPLIT_K_LARGE_MAX_BYTES if k * n >= SPLIT_K_LARGE_WEIGHT else SPLIT_K_MAX_BYTES


def k_splits(caps: dict, tiles: int, k: int, outputs: int = 1, wgs: int = SPLIT_K_WGS,
             min_k: int = SPLIT_K_MIN, most: int = MAX_K_SPLITS,
             max_bytes: int | None = None) -> tuple[int, int]:
    """(splits, K per split) for a tiled matmul kernel of `tiles` workgroups: enough
    workgroups to fill a GPU (`wgs`), each keeping at least `min_k` of K (whole K steps of
    16), at most `most` splits, and partial outputs (splits x `outputs` floats) that fit
    one buffer (and `max_bytes`); one split on CPU devices (lavapipe), whose few threads
    are busy with any grid. The kernel writes each split's partial product; one
    elementwise kernel adds them."""
    if device.is_cpu(caps) or tiles >= wgs or k == 0:
        return 1, k
    room = int(caps.get("max_storage_buffer_range", 128 << 20))
    fit = min(room, max_bytes or room) // (4 * max(1, outputs))
    splits = max(1, min(-(-wgs // tiles), k // min_k, most, fit))
    ks = -(-k // (splits * 16)) * 16            # whole K steps of the kernel
    return -(-k // ks), ks


# rows of a product from which a CPU device runs it (and its graph) on the host: from
# there torch on the host is faster than lavapipe (docs/journal.md, session 29)
HOST_MATMUL_MIN_ROWS = 3


def host_matmul(rows: int):
    """Why a matrix product of `rows` rows runs on the host (a HostPlacement), or None: on
    a CPU Vulkan device (lavapipe) unless the compile's config says cpu_matmul="vulkan",
    products of HOST_MATMUL_MIN_ROWS rows or more (prompts) go to torch on the same CPU,
    and partition.py sends the rest of their graph with them; fewer rows (a decode step's
    mat-vecs, which our fused GGUF kernels run faster than torch does there) stay on
    Vulkan. Rule checks call it while the backend partitions a graph, with that compile's
    config current (config.using)."""
    if rows >= HOST_MATMUL_MIN_ROWS and device.is_cpu() and config.current().cpu_matmul == "host":
        return HostPlacement(f"a product of {rows} rows on a CPU Vulkan device runs faster in "
                             "torch on the host (DYNAMO_VULKAN_CPU_MATMUL=vulkan keeps it on Vulkan)")
    return None


CPU_ROW_WG_MAX_ROW = 4096   # row length up to which a CPU device reduces a row in one subgroup


def row_wg(caps: dict, wg: int, row: int) -> int:
    """Invocations of a kernel that reduces each row in one workgroup (rowwise, reduce,
    argreduce): `wg` on a GPU. On a CPU device (lavapipe) one subgroup for rows up to
    CPU_ROW_WG_MAX_ROW: there a barrier switches every invocation's coroutine, and with one
    subgroup the reduction is subgroup operations, 2-9x faster (docs/journal.md, session
    29). Longer rows keep `wg` lanes: the same time there, and more partial sums, so a
    lane's running sum rounds less."""
    if device.is_cpu(caps) and row <= CPU_ROW_WG_MAX_ROW:
        return max(1, min(wg, int(caps.get("subgroup_size", wg))))
    return wg


CPU_LANES_MR = 8    # CPU_LANES matmuls (lavapipe): rows of A per workgroup, columns of C
CPU_LANES_NC = 12   # per lane (the fastest of the shapes measured: docs/journal.md, session 29)


def has_cpu_lanes(caps: dict) -> bool:
    """Whether the CPU_LANES kernels (matmuls, prompt attention) serve this device: a CPU
    device whose subgroups hold the 8 lanes they share values across."""
    return device.is_cpu(caps) and int(caps.get("subgroup_size", 32)) >= 8


def cpu_lanes(caps: dict, n: int) -> dict | None:
    """The CPU_LANES defines (gguf_matmul.comp, matmul.comp) for n columns of output on a
    CPU device with subgroups of 8 lanes or more (None elsewhere): CPU_LANES_NC columns a
    lane and the workgroup (a multiple of the subgroup, at most 64) that computes the
    fewest columns past n (576: 48 lanes, none)."""
    if not has_cpu_lanes(caps):
        return None
    sg = int(caps.get("subgroup_size", 32))
    wg = min(range(sg, max(sg, 64) + 1, sg), key=lambda w: (-(-n // (w * CPU_LANES_NC)) * w, -w))
    return {"CPU_LANES": 1, "CL_WG": wg, "CL_MR": CPU_LANES_MR, "CL_NC": CPU_LANES_NC}


def cpu_lanes_groups(lanes: dict, m: int, n: int, batches: int = 1) -> tuple[int, int, int]:
    """The CPU_LANES grid: columns of C, rows of A, batches."""
    return (-(-n // (lanes["CL_WG"] * lanes["CL_NC"])), -(-m // lanes["CL_MR"]), batches)


def meta_view(ref: TRef, fn) -> TRef:
    """Apply a view op to a meta tensor of ref's layout and read the new layout."""
    span = 1 + sum((s - 1) * st for s, st in zip(ref.shape, ref.strides) if s > 0)
    base = torch.empty(ref.offset + span, device="meta")
    t = fn(base.as_strided(ref.shape, ref.strides, ref.offset))
    return ref.with_layout(tuple(t.shape), tuple(t.stride()), t.storage_offset())
