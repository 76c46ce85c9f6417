"""The lowered program: plain data (picklable for the disk cache).

A Plan lists buffers (in words of 32 bits), dispatches (which SPIR-V, which
buffers, specialisation constants, workgroup counts) and how the partition's
inputs and outputs map onto buffers. runtime/program.py turns it into kp
objects and one recorded sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# GPU storage kinds: every buffer is 32-bit words.
KIND_OF_DTYPE = {"torch.float32": "f32", "torch.int64": "i32", "torch.int32": "i32",
                 "torch.int16": "i32", "torch.int8": "i32", "torch.uint8": "i32", "torch.bool": "b",
                 # computed in float32, converted at the program's edges (partition.py keeps
                 # float64 to a graph's intermediates)
                 "torch.float16": "f32", "torch.bfloat16": "f32", "torch.float64": "f32"}
NUMPY_OF_KIND = {"f32": np.float32, "i32": np.int32, "b": np.uint32, "u8": np.uint8}
# "u8": raw bytes packed 4 to a word (zero-padded), for uint8 inputs that kernels decode
# themselves (GGUF blocks); the planner picks it per input (lowering.gguf.packed_input).
# "u8/<type>/<row bytes>": GGUF rows regrouped for the GPU (dynamo_vulkan/gguf/gpu_layout.py).


def base_kind(kind: str) -> str:
    """A kind without its byte layout ("u8/Q4_0/2304" -> "u8")."""
    return kind.split("/", 1)[0]


def words_of(kind: str, numel: int) -> int:
    """32-bit words a buffer of `numel` elements of `kind` needs."""
    return -(-numel // 4) if base_kind(kind) == "u8" else numel


@dataclass
class Buffer:
    words: int
    role: str            # "temp" | "input" | "output" | "const" | "param"
    kind: str = "f32"
    const: np.ndarray | None = None


@dataclass
class Dispatch:
    name: str            # kernel family + variant, for reports
    spirv_key: str       # key into Plan.sources
    bindings: list[int]  # buffer ids, binding 0..n-1
    writes: list[int]    # binding positions the kernel writes
    spec: list[int]      # uint32 specialisation constants by constant_id
    groups: tuple[int, int, int]
    note: str = ""       # shapes, for the debug dump and profile table
    # (buffer id, dispatch index): this kernel reads none of what that earlier dispatch
    # writes in that buffer (attention computing the KV-cache row that a scatter writes
    # beside it), so it need not wait for it; any other writer still orders it
    disjoint: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class InputSpec:
    buffer: int | None   # None: not a tensor (a Python scalar) or unused
    dtype: str           # torch dtype as a string
    shape: tuple
    resident: bool       # parameter/buffer: uploaded once, kept while its version holds
    # a packed-bytes input larger than maxStorageBufferRange, split into several buffers:
    # (buffer id, byte start, byte length) each; `buffer` is then the first of them
    chunks: list[tuple[int, int, int]] | None = None

    def buffers(self) -> list[int]:
        """Every buffer that holds this input."""
        if self.chunks:
            return [c[0] for c in self.chunks]
        return [] if self.buffer is None else [self.buffer]


@dataclass
class OutputSpec:
    buffer: int | None   # None: the output is input `alias` itself, or `const`
    dtype: str
    shape: tuple
    alias: int | None = None
    const: int | float | bool | None = None   # a size the program's input shapes fix


@dataclass
class Plan:
    buffers: list[Buffer] = field(default_factory=list)
    dispatches: list[Dispatch] = field(default_factory=list)
    inputs: list[InputSpec] = field(default_factory=list)
    outputs: list[OutputSpec] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)   # spirv_key -> GLSL
    mutations: list[tuple[int, int]] = field(default_factory=list)  # (input index, buffer) written back

    def describe(self) -> str:
        lines = [f"buffers: {len(self.buffers)} "
                 f"({sum(b.words for b in self.buffers if b.role == 'temp') * 4 / 1e6:.3f} MB temp)"]
        for i, b in enumerate(self.buffers):
            lines.append(f"  %{i}: {b.role} {b.kind} x{b.words}")
        lines.append(f"dispatches: {len(self.dispatches)}")
        for d in self.dispatches:
            lines.append(f"  {d.name} groups={d.groups} buffers={d.bindings} {d.note}")
        return "\n".join(lines)


def barriers(dispatches: list[Dispatch]) -> list[bool]:
    """Whether each dispatch waits behind a barrier: it reads or writes a buffer written
    since the last barrier (unless every such write is one it is disjoint from), or
    writes one read since then. The kernels between two barriers run concurrently."""
    out = []
    dirty: dict[int, set] = {}   # buffers written since the last barrier -> by which dispatches
    touched: set[int] = set()    # buffers read since the last barrier
    for index, d in enumerate(dispatches):
        writes = {d.bindings[w] for w in d.writes}
        waived: dict[int, set] = {}
        for b, i in d.disjoint:
            waived.setdefault(b, set()).add(i)
        hazard = any(b in writes or not dirty[b] <= waived.get(b, set())
                     for b in set(d.bindings) & dirty.keys()) or bool(writes & touched)
        if hazard:
            dirty.clear()
            touched.clear()
        out.append(hazard)
        for b in writes:
            dirty.setdefault(b, set()).add(index)
        touched |= set(d.bindings) - writes
    return out
