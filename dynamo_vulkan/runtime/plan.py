"""The lowered program: plain data, stored in the disk cache as JSON and raw arrays.

A Plan lists buffers (in words of 32 bits), dispatches (which SPIR-V, which
buffers, specialisation constants, workgroup counts) and how the partition's
inputs and outputs map onto buffers. runtime/program.py turns it into kp
objects and one recorded sequence.

plan_to_bytes / plan_from_bytes are the disk format: a JSON header and the
constant arrays' little-endian bytes, never pickles, so reading an entry runs no
code. Reading checks every field against its dataclass annotation (types), then
the plan as a whole (ranges, buffer and dispatch indices, roles, kinds, dtypes, and
that each dispatch's GLSL is one of the package's shaders under its own name, behind
#define lines).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import re
import struct
import types
import typing
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


MAX_GROUPS = 65535   # workgroups along x before a grid folds into y (Vulkan's guaranteed minimum)


def groups_for(n: int, per_group: int = 1) -> tuple[int, int, int]:
    """Workgroup counts for n items, folded into a 2-D grid past MAX_GROUPS."""
    total = max(1, -(-n // per_group))
    x = min(total, MAX_GROUPS)
    return (x, -(-total // x), 1)


@dataclass
class Dispatch:
    name: str            # kernel family + variant, for reports
    spirv_key: str       # key into Plan.sources
    bindings: list[int]  # buffer ids, binding 0..n-1
    writes: list[int]    # binding positions the kernel writes
    spec: list[int]      # uint32 specialisation constants by constant_id
    groups: tuple[int, int, int]
    note: str = ""       # shapes, for the debug dump and profile table
    # (buffer id, dispatch index): this kernel reads and writes none of what that earlier
    # dispatch writes in that buffer (attention computing the KV-cache row that a scatter
    # writes beside it; a split weight's chunks writing their own columns of one output),
    # so it need not wait for it; any other writer still orders it
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
    # kernels' checks (an index out of range, an int64 result outside int32): bit min(k, 31)
    # of buffer check_buffer's one word set means checks[k], "<exception name>: <message>",
    # failed (runtime/program.py raises it; checks from the 32nd on share the last bit)
    check_buffer: int | None = None
    checks: list[str] = field(default_factory=list)
    # two words that the program fills from torch's default generator before each submit
    # (the seed of random kernels: dropout's mask)
    seed_buffer: int | None = None

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
        hazard = any(not dirty[b] <= waived.get(b, set())
                     for b in set(d.bindings) & dirty.keys()) or bool(writes & touched)
        if hazard:
            dirty.clear()
            touched.clear()
        out.append(hazard)
        for b in writes:
            dirty.setdefault(b, set()).add(index)
        touched |= set(d.bindings) - writes
    return out


def levels(dispatches: list[Dispatch]) -> int:
    """How many barrier levels the dispatches run in (none for none): each level waits for
    the one before it, its kernels run side by side."""
    return int(bool(dispatches)) + sum(barriers(dispatches))


# --- the disk format -------------------------------------------------------------------

PLAN_MAGIC = b"DVKPLAN1\n"
ROLES = ("temp", "input", "output", "const", "param", "unused")
MAX_WORDS = 1 << 31          # words of one buffer (8 GiB; devices allow 4 GiB at most)
_U32 = 1 << 32
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DTYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
_FAMILY = re.compile(r"[a-z0-9_]+\Z")
_DEFINE = re.compile(r"#define [A-Za-z_][A-Za-z0-9_]*(\([A-Za-z0-9_, ]*\))?( |\Z)")
_ARRAY_KINDS = "uifb"        # numpy dtype kinds a constant may have (no objects, no records)


class PlanFormatError(ValueError):
    """A cached plan entry that is not a well-formed Plan: it is rebuilt, never used."""


def plan_to_bytes(plan: Plan) -> bytes:
    """A Plan as PLAN_MAGIC, the JSON header's length (u64 little-endian), the JSON
    header, then each constant array's bytes (little-endian) in the header's order."""
    arrays: list[np.ndarray] = []
    header = {"plan": _encode(plan, arrays), "arrays": []}
    chunks = []
    for a in arrays:
        a = np.ascontiguousarray(a)
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        header["arrays"].append({"dtype": a.dtype.str, "shape": list(a.shape)})
        chunks.append(a.tobytes())
    text = json.dumps(header, separators=(",", ":")).encode()
    return PLAN_MAGIC + struct.pack("<Q", len(text)) + text + b"".join(chunks)


def plan_from_bytes(blob: bytes) -> Plan:
    """The Plan plan_to_bytes wrote, every field checked; PlanFormatError otherwise."""
    head = len(PLAN_MAGIC) + 8
    if len(blob) < head or not blob.startswith(PLAN_MAGIC):
        raise PlanFormatError("not a plan entry (magic)")
    (size,) = struct.unpack_from("<Q", blob, len(PLAN_MAGIC))
    if size > len(blob) - head:
        raise PlanFormatError(f"header of {size} bytes runs past the entry's {len(blob)}")
    try:
        header = json.loads(blob[head:head + size].decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise PlanFormatError(f"header is not JSON: {e}") from None
    if not isinstance(header, dict) or set(header) != {"plan", "arrays"} or \
            not isinstance(header["arrays"], list):
        raise PlanFormatError("header must be an object of 'plan' and 'arrays'")
    arrays = _read_arrays(header["arrays"], blob, head + size)
    try:
        plan = _decode(header["plan"], Plan, arrays, "plan")
    except RecursionError:
        raise PlanFormatError("plan nests too deeply") from None
    check_plan(plan)
    return plan


def _encode(v, arrays: list):
    """JSON-ready data of a plan value; arrays go to `arrays`, referenced by index."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _encode(getattr(v, f.name), arrays) for f in dataclasses.fields(v)}
    if isinstance(v, np.ndarray):
        arrays.append(v)
        return {"array": len(arrays) - 1}
    if isinstance(v, (list, tuple)):
        return [_encode(x, arrays) for x in v]
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise TypeError(f"a plan's dicts have string keys, got {list(v)[:3]}")
        return {k: _encode(x, arrays) for k, x in v.items()}
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if v is None or isinstance(v, str):
        return v
    raise TypeError(f"a plan holds plain data only, got {type(v).__name__}")


def _read_arrays(specs: list, blob: bytes, start: int) -> list[np.ndarray]:
    out, pos = [], start
    for i, spec in enumerate(specs):
        where = f"arrays[{i}]"
        if not isinstance(spec, dict) or set(spec) != {"dtype", "shape"} or \
                not isinstance(spec["dtype"], str) or not isinstance(spec["shape"], list) or \
                not all(type(d) is int and 0 <= d < MAX_WORDS * 4 for d in spec["shape"]):
            raise PlanFormatError(f"{where}: expected {{dtype: str, shape: [ints]}}, got {spec!r:.200}")
        try:
            dtype = np.dtype(spec["dtype"])
        except TypeError:
            raise PlanFormatError(f"{where}: unknown dtype {spec['dtype']!r:.50}") from None
        if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or dtype.byteorder == ">":
            raise PlanFormatError(f"{where}: dtype {dtype.str!r} is not a little-endian number")
        n = int(np.prod(spec["shape"], dtype=object)) * dtype.itemsize
        if n > len(blob) - pos:
            raise PlanFormatError(f"{where}: {n} bytes run past the entry's end")
        out.append(np.frombuffer(blob, dtype, count=n // dtype.itemsize, offset=pos)
                   .reshape(spec["shape"]).copy())
        pos += n
    if pos != len(blob):
        raise PlanFormatError(f"{len(blob) - pos} bytes after the last array")
    return out


def _name(hint) -> str:
    return getattr(hint, "__name__", None) or str(hint)


@functools.lru_cache(maxsize=None)
def _fields_of(cls) -> tuple[list[str], frozenset, dict]:
    """A plan dataclass's field names (as a list and a set) and their resolved annotations
    (typing.get_type_hints evaluates every string annotation again on each call)."""
    names = [f.name for f in dataclasses.fields(cls)]
    return names, frozenset(names), typing.get_type_hints(cls)


def _decode(v, hint, arrays: list, where: str):
    """`v` (parsed JSON) as a value of type `hint` (a field's annotation), or
    PlanFormatError naming the field. Plain data only: bool, int, float, str, None,
    numpy arrays, the plan's dataclasses, and lists, tuples and dicts of them."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:            # X | None: X's own error says what was wrong
            return _decode(v, options[0], arrays, where)
        for option in options:
            try:
                return _decode(v, option, arrays, where)
            except PlanFormatError:
                pass
        raise PlanFormatError(f"{where}: expected {_name(hint)}, got {type(v).__name__} {v!r:.80}")
    if dataclasses.is_dataclass(hint):
        names, fields, hints = _fields_of(hint)
        if not isinstance(v, dict) or v.keys() != fields:
            raise PlanFormatError(f"{where}: expected the fields {names} of {hint.__name__}, "
                                  f"got {sorted(v) if isinstance(v, dict) else type(v).__name__}")
        return hint(**{k: _decode(v[k], hints[k], arrays, f"{where}.{k}") for k in names})
    if hint is np.ndarray:
        if not (isinstance(v, dict) and set(v) == {"array"} and type(v["array"]) is int
                and 0 <= v["array"] < len(arrays)):
            raise PlanFormatError(f"{where}: expected an array reference, got {v!r:.80}")
        return arrays[v["array"]]
    if hint in (list, tuple) or origin in (list, tuple):
        if not isinstance(v, list):
            raise PlanFormatError(f"{where}: expected a list, got {type(v).__name__}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(v) != len(args):
                raise PlanFormatError(f"{where}: expected {len(args)} items, got {len(v)}")
            return tuple(_decode(x, a, arrays, f"{where}[{i}]") for i, (x, a) in enumerate(zip(v, args)))
        item = args[0] if args else int | float | bool | str
        out = [_decode(x, item, arrays, f"{where}[{i}]") for i, x in enumerate(v)]
        return out if (origin or hint) is list else tuple(out)
    if origin is dict:
        if not isinstance(v, dict):
            raise PlanFormatError(f"{where}: expected an object, got {type(v).__name__}")
        return {_decode(k, args[0], arrays, f"{where} key"): _decode(x, args[1], arrays, f"{where}[{k!r:.40}]")
                for k, x in v.items()}
    if hint is type(None):
        if v is not None:
            raise PlanFormatError(f"{where}: expected null, got {type(v).__name__}")
        return None
    if hint in (bool, int, str):
        if type(v) is not hint:
            raise PlanFormatError(f"{where}: expected {hint.__name__}, got {type(v).__name__} {v!r:.80}")
        return v
    if hint is float:
        if type(v) not in (float, int):
            raise PlanFormatError(f"{where}: expected float, got {type(v).__name__} {v!r:.80}")
        return float(v)
    raise TypeError(f"{where}: a plan field of type {_name(hint)} has no disk format")


def _fail(where: str, what: str):
    raise PlanFormatError(f"{where}: {what}")


def _kind_ok(kind: str) -> bool:
    base, _, layout = kind.partition("/")
    if base not in NUMPY_OF_KIND:
        return False
    if not layout:
        return True
    parts = layout.split("/")
    return base == "u8" and len(parts) == 2 and _IDENT.match(parts[0]) is not None and \
        parts[1].isdigit()


def _torch_dtype_ok(name: str) -> bool:
    import torch
    return name.startswith("torch.") and isinstance(getattr(torch, name[6:], None), torch.dtype)


def check_plan(plan: Plan) -> None:
    """Ranges and references of a decoded Plan; PlanFormatError at the first wrong one."""
    nb, ni, nd = len(plan.buffers), len(plan.inputs), len(plan.dispatches)

    def index(v, n, where):
        if v is None or not 0 <= v < n:
            _fail(where, f"{v} is not an index below {n}")

    for i, b in enumerate(plan.buffers):
        where = f"buffers[{i}]"
        if not 0 <= b.words <= MAX_WORDS:     # 0: a buffer no dispatch binds (role unused)
            _fail(where, f"words {b.words} outside [0, {MAX_WORDS}]")
        if b.role not in ROLES:
            _fail(where, f"role {b.role!r} is not one of {ROLES}")
        if not _kind_ok(b.kind):
            _fail(where, f"kind {b.kind!r} is not one of {tuple(NUMPY_OF_KIND)} (u8 with a layout)")
        if (b.const is not None) != (b.role == "const"):
            _fail(where, "constant data on a buffer whose role is not const, or none on a const")
        if b.const is not None and (b.const.dtype != np.uint32 or b.const.ndim != 1
                                    or b.const.size > b.words):
            _fail(where, f"constant of {b.const.dtype} {b.const.shape} is not <= {b.words} uint32 words")
    for n, d in enumerate(plan.dispatches):
        where = f"dispatches[{n}]"
        if d.spirv_key not in plan.sources:
            _fail(where, f"spirv_key {d.spirv_key!r:.40} names no source")
        for k, b in enumerate(d.bindings):
            index(b, nb, f"{where}.bindings[{k}]")
        for k, w in enumerate(d.writes):
            index(w, len(d.bindings), f"{where}.writes[{k}]")
        if not all(0 <= s < _U32 for s in d.spec) or not all(0 <= g < _U32 for g in d.groups):
            _fail(where, "a specialisation constant or workgroup count outside uint32")
        for b, i in d.disjoint:
            index(b, nb, f"{where}.disjoint buffer")
            index(i, n, f"{where}.disjoint dispatch")
    for i, s in enumerate(plan.inputs):
        where = f"inputs[{i}]"
        if s.buffer is not None:
            index(s.buffer, nb, f"{where}.buffer")
        if not _DTYPE_NAME.match(s.dtype):
            _fail(where, f"dtype {s.dtype!r:.40} is not a name")
        if not all(type(d) is int and d >= 0 for d in s.shape):
            _fail(where, f"shape {s.shape!r:.80} is not of sizes")
        for b, start, length in s.chunks or ():
            index(b, nb, f"{where}.chunks")
            if start < 0 or length < 0:
                _fail(where, f"chunk ({b}, {start}, {length}) has a negative span")
    for i, o in enumerate(plan.outputs):
        where = f"outputs[{i}]"
        if o.buffer is not None:
            index(o.buffer, nb, f"{where}.buffer")
            if not _torch_dtype_ok(o.dtype):
                _fail(where, f"dtype {o.dtype!r:.40} is not a torch dtype")
        elif not _DTYPE_NAME.match(o.dtype):
            _fail(where, f"dtype {o.dtype!r:.40} is not a name")
        if o.alias is not None:
            index(o.alias, ni, f"{where}.alias")
        if not all(type(d) is int and d >= 0 for d in o.shape):
            _fail(where, f"shape {o.shape!r:.80} is not of sizes")
    for k, (i, b) in enumerate(plan.mutations):
        index(i, ni, f"mutations[{k}] input")
        index(b, nb, f"mutations[{k}] buffer")
    if plan.check_buffer is not None:
        index(plan.check_buffer, nb, "check_buffer")
    if plan.checks and plan.check_buffer is None:
        _fail("checks", "checks without a check_buffer")
    if plan.seed_buffer is not None:
        index(plan.seed_buffer, nb, "seed_buffer")
        if plan.buffers[plan.seed_buffer].role != "input" or plan.buffers[plan.seed_buffer].words < 2:
            _fail("seed_buffer", "the seed buffer is not an input of two words")
    _check_sources(plan)


def _check_sources(plan: Plan) -> None:
    """Each source is keyed by its digest and is shaders/<family>.comp, its family the
    dispatch's name, behind a head of '#version 450' and '#define NAME VALUE' lines:
    a cached plan names only the package's own kernels."""
    from .. import cache
    from . import shaders

    family_of: dict[str, str] = {}
    known = {p.stem for p in shaders.shader_dir().iterdir() if p.suffix == ".comp"}
    for n, d in enumerate(plan.dispatches):
        family = d.name.split(":", 1)[0]
        if not _FAMILY.match(family) or family not in known:
            _fail(f"dispatches[{n}]", f"kernel {d.name!r:.60} is not one of the package's shaders")
        if family_of.setdefault(d.spirv_key, family) != family:
            _fail(f"dispatches[{n}]", f"source {d.spirv_key!r:.40} is named by two kernel families")
    for key, source in plan.sources.items():
        where = f"sources[{key!r:.40}]"
        family = family_of.get(key)
        if family is None:
            _fail(where, "no dispatch uses it")
        if cache.digest(source) != key:
            _fail(where, "its key is not its digest")
        body = "\n" + shaders.read(f"{family}.comp")
        if not source.endswith(body):
            _fail(where, f"it is not shaders/{family}.comp")
        lines = source[:-len(body)].split("\n")
        if lines[0] != "#version 450":
            _fail(where, "it does not start with #version 450")
        for line in lines[1:]:
            if not _DEFINE.match(line):
                _fail(where, f"head line {line!r:.60} is not '#define NAME[(ARGS)] VALUE'")
