"""GGUF custom ops on Vulkan: `dynamo_vulkan.gguf_linear` as a fused
dequantize + mat-vec (shaders/gguf_matvec.comp, few rows of x: decode; or integer dot
products with x's int8 planes, lowering/gguf_int_dot.py) or dequantize + tiled matmul
(gguf_matmul.comp, prompts), and
`dynamo_vulkan.gguf_embedding` as a row gather that decodes only the rows it
reads (gguf_embed.comp). One template per kernel; the GGUF type is a
`QTYPE_<name>` define decoded by shaders/gguf_blocks.glsl.

The weight's bytes stay quantized on the GPU: the planner stores a uint8
input read only by these ops as packed bytes (kind "u8", see `packed_input`;
the common types' rows regrouped for the GPU, dynamo_vulkan/gguf/gpu_layout.py),
uploaded once as a resident buffer, and no dequantized copy of W is ever
written to memory. A weight larger than the device's maxStorageBufferRange
(128 MiB on lavapipe and many mobile GPUs) is split into several buffers of
whole rows (`RowChunks`), and each op emits one dispatch per chunk: the mat-vec
and matmul write that chunk's columns of the output, the embedding gathers the
ids that fall in it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from dynamo_vulkan import device
from dynamo_vulkan.gguf import op as _op  # noqa: F401  (defines the custom ops)
from dynamo_vulkan.gguf.gpu_layout import U8, packed_kind, row_bytes_of
from dynamo_vulkan.gguf.quants import QUANT_TYPES, qtype_name, row_nbytes
from dynamo_vulkan.runtime.plan import base_kind

from .core import (NO_REQUEST, Context, Lowered, LoweringError, TRef, cpu_lanes,
                   cpu_lanes_groups, f32_bits, groups_for, host_matmul, k_splits, lowering,
                   meta_view, spec_of, vec4_rows)
from .checks import index_check
from . import gguf_int_dot as int_dot
from .elementwise import add_slices, contiguous, ew
from .fusion import Deferred, Lazy, RowLoader, materialize, row_loader, writes_in_place
from .rowwise import RMS_NORM, NormedRows
from .views import RESHAPES, VIEW_OPS

GGUF_LINEAR = torch.ops.dynamo_vulkan.gguf_linear.default
GGUF_EMBEDDING = torch.ops.dynamo_vulkan.gguf_embedding.default

# GGML type id -> the name its QTYPE_<name> define selects in gguf_blocks.glsl.
SHADER_TYPES = {t: info.name for t, info in QUANT_TYPES.items()}
MATVEC_M = 8     # rows of x up to which the mat-vec kernel is used
MV_WG = 128      # mat-vec threads per workgroup
MV_NR = 1        # rows of W per mat-vec thread group (x chunks are reused across them)
MV_WG_CHUNKS = 128   # chunks of 8 per row from which a whole workgroup takes each row group
MV_WG_NR = 2     # rows per workgroup for rows of at least MV_WG_NR_CHUNKS chunks
MV_WG_NR_CHUNKS = 512
MV_UNROLL = 4    # at most this many chunks per mat-vec thread and loop step (loads in
                 # flight together); fewer where that wastes less (mv_unroll)
MV_CPL = 1       # neighbouring chunks per mat-vec thread (MV_UNROLL a multiple of it)
MV_SUBGROUP_ROWS = 64   # rows of W from which each subgroup takes its own rows
# ... and from this many rows (an LM head of short rows: Gemma 3's 262144 x 640, SmolLM2's
# 49152 x 576), MV_MANY_NR rows a subgroup: its x chunks serve four rows and its grid is
# a quarter as many workgroups (docs/journal.md, sessions 56 and 57)
MV_MANY_ROWS = 32768
MV_MANY_NR = 4
MV_CPU_NR = 16  # rows per thread group on a CPU device (lavapipe), for up to 3 rows of x
                # (halved as those double), where every load costs alike and x's loads are
                # shared by the group's rows; in workgroups of MV_CPU_SUBGROUPS subgroups, so
                # a weight of few rows still spreads over the CPU's threads (measured against
                # the alternatives: docs/journal.md, session 29, "GGUF mat-vec")
MV_CPU_SUBGROUPS = 4
# The GPU settings above, and the mat-vec variants measured and dropped (x-stationary,
# persistent and software-pipelined kernels, 4 chunks a thread, prefetching into L2), are
# in docs/journal.md (session 29, "GGUF mat-vec"): each of a mat-vec's parts (W's loads,
# x's loads, decoding) costs alike and they do not overlap; more loads in flight helps.
NORM_MAX_ROWS = 16384   # rows of W up to which an RMSNorm before it is folded in
MAX_SUBGROUPS = 32   # subgroups per mat-vec workgroup at most (wg_reduce.glsl holds 64)
EMB_WG = 64
DEQUANT_WG = 256
# A prompt's GGUF linear on a GPU decodes W whole before the plain matmul from this many
# rows of x and elements of W: where it measured faster (7B shapes at 512 rows), not where
# it measured slower (SmolLM2's and Gemma 3's 128-row prompts: docs/journal.md, session 29)
DECODE_FIRST_M = 512
TC_DECODE_FIRST_M = 128
DECODE_FIRST_WEIGHTS = 4 << 20
# ... and on the tensor cores every weight from TC_DECODE_FIRST_M rows, except one below
# DECODE_FIRST_WEIGHTS whose rows are longer than TC_LONG_K, which waits for TC_DECODE_ALL_M
# rows: SmolLM2's and Gemma 3's prompts ran 22-38% faster with all their products there, the
# 7B's k and v (512 x 3584) 2.5% slower at 128 rows and 3% faster at 512 (docs/journal.md,
# sessions 33 and 46)
TC_DECODE_ALL_M = 512
TC_LONG_K = 2048
TILE = 64
# Split K for the tiled GGUF kernel (gguf_matmul.comp) on a GPU: each of its workgroups
# takes a round of load latency per K step of 16, so a small model's 128-row prompt
# (tens of 64x64 tiles, K of 576-2048) runs faster split finer than core.k_splits'
# defaults: SmolLM2 6.23 -> 4.55 ms, Gemma 3 5.40 -> 4.38 (H100, docs/journal.md,
# session 34). The partial products (a temporary of the output's size times the splits)
# hold at most 4 MiB, as a small weight's do in core.split_k_max_bytes: at 8 MiB
# SmolLM2's 512-row prompt stayed 0.3 MiB past its memory goal. The cap costs the small
# models' 512-row prompts 7-10% (fewer splits) and leaves their 128-row ones, where it
# does not bind, as they were (docs/journal.md, sessions 35 and 36).
GGUF_SPLIT_K = {"wgs": 1024, "min_k": 32, "most": 16, "max_bytes": 4 << 20}
# Bytes per buffer of a GGUF weight at most, where the device's maxStorageBufferRange is
# larger (4 GiB on NVIDIA): lavapipe's limit, so a weight splits alike on every device. A
# chunk of 128 MiB still holds 40,000+ rows of a 7B model's output head, thousands of
# workgroups a dispatch. (Uploads stage through runtime/upload.py's batches whatever the
# buffer's size.)
WEIGHT_BUFFER_MAX = 128 << 20


class RowChunks(NamedTuple):
    """A packed weight held in several buffers: parts are (TRef, first row, end row).
    A NamedTuple so FX's map_aggregate walks into it and finds the TRefs."""
    parts: tuple


def chunk_rows(row_bytes: int, limit: int) -> int:
    """Rows per buffer of a split weight: as many whole rows as fit in `limit`
    bytes, rounded so each chunk starts on a 32-bit word (0: a row is too big)."""
    n = limit // row_bytes
    return n - n % (4 // math.gcd(row_bytes, 4))


def weight_limit(caps: dict) -> int:
    """Bytes a GGUF weight's buffer may hold: the device's maxStorageBufferRange, at most
    WEIGHT_BUFFER_MAX. A larger weight is split into buffers of whole rows (RowChunks)."""
    return min(int(caps.get("max_storage_buffer_range", 128 << 20)), WEIGHT_BUFFER_MAX)


def packed_input(node, value) -> bool:
    """Whether a graph input holds GGUF blocks: a uint8 tensor read only as the
    `blocks` argument of the gguf ops (their records' packed_arg). Such an input is
    stored as packed bytes."""
    def packed_there(u) -> bool:       # read as the one packed argument of its op's record
        spec = spec_of(u.target) if u.op == "call_function" else None
        at = spec.packed_arg if spec is not None else None
        return at is not None and len(u.args) > at and u.args[at] is node and \
            sum(a is node for a in u.args) == 1
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and bool(node.users) \
        and all(packed_there(u) for u in node.users)


def place_packed(ctx: Context, node, value: torch.Tensor, role: str):
    """Buffers for a packed-bytes graph input: (the value the lowering rules read,
    InputSpec chunks or None). Over the buffer limit, the rows are split across
    buffers by the row size its gguf users agree on."""
    limit = weight_limit(ctx.caps)
    total = value.numel()
    # regrouped when every reader agrees on the type and row length and the bytes are
    # whole rows (otherwise the rules reject the read with an error of their own)
    kinds = {_kind(u.args[2], u.args[4]) for u in node.users}
    kind = kinds.pop() if len(kinds) == 1 else U8
    if kind != U8 and total % row_bytes_of(kind):
        kind = U8
    if total <= limit:
        buf = ctx.buffer(-(-total // 4), role, kind)
        return TRef(buf, (total,), (1,), 0, kind), None
    sizes = {row_nbytes(u.args[2], u.args[4]) for u in node.users}
    if len(sizes) != 1:
        raise LoweringError(f"GGUF blocks of {total} bytes read with different row sizes "
                            f"{sorted(sizes)}: cannot split them across buffers")
    return _split(ctx, total, sizes.pop(), limit, role, None, kind)


def _kind(qtype, cols) -> str:
    """The kind GGUF rows of this type and length are stored as (U8: GGML's order)."""
    return packed_kind(qtype, cols) if isinstance(qtype, int) and qtype in SHADER_TYPES and \
        isinstance(cols, int) and cols > 0 and cols % 8 == 0 else U8


def _split(ctx: Context, total: int, row_bytes: int, limit: int, role: str, data, kind: str):
    """Buffers of whole rows covering `total` bytes; data: the bytes of a constant."""
    step = chunk_rows(row_bytes, limit)
    if step == 0:
        raise LoweringError(f"a GGUF row of {row_bytes} bytes exceeds a weight buffer's "
                            f"{limit} bytes (the device's maxStorageBufferRange, at most "
                            f"{WEIGHT_BUFFER_MAX})")
    from dynamo_vulkan.runtime.words import host_words
    rows, parts, chunks = total // row_bytes, [], []
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        start, length = r0 * row_bytes, (r1 - r0) * row_bytes
        const = None if data is None else host_words(data, kind, (start, length)).copy()
        buf = ctx.buffer(-(-length // 4), role, kind, const)
        parts.append((TRef(buf, (length,), (1,), 0, kind), r0, r1))
        chunks.append((buf, start, length))
    return RowChunks(tuple(parts)), chunks


def _limit() -> int:
    """weight_limit of the device that graphs are compiled for (the CPU-fallback checks)."""
    return weight_limit(device.device_info())


def _name(qtype) -> str:
    """The type's name from our own table (no gguf package needed), else gguf's."""
    info = QUANT_TYPES.get(qtype) if isinstance(qtype, int) else None
    return info.name if info else qtype_name(qtype)


def _check(node) -> str | None:
    """Why this gguf node must run on the CPU (None: it runs on Vulkan)."""
    qtype, cols = node.args[2], node.args[4]
    if not isinstance(qtype, int) or qtype not in SHADER_TYPES:
        return f"GGUF type {_name(qtype)} has no Vulkan kernel"
    if not isinstance(cols, int) or cols <= 0 or cols % 8:
        return f"GGUF rows of {cols} elements (Vulkan kernels need a positive multiple of 8)"
    limit = _limit()
    blocks = node.args[1].meta.get("val")
    rb = row_nbytes(qtype, cols)
    if blocks is not None and blocks.numel() > limit and chunk_rows(rb, limit) == 0:
        return (f"a row of its GGUF weight ({rb} bytes) exceeds a weight buffer's {limit} "
                f"bytes (the device's maxStorageBufferRange, at most {WEIGHT_BUFFER_MAX})")
    out = node.meta.get("val")
    if node.target is GGUF_LINEAR and out is not None and out.ndim:
        placed = host_matmul(out.numel() // max(1, out.shape[-1]))
        if placed:
            return placed
    buffer_max = int(device.device_info().get("max_storage_buffer_range", 128 << 20))
    if out is not None and out.numel() * 4 > buffer_max:
        return (f"its output ({out.numel() * 4 / 2**20:.1f} MiB) exceeds the device's "
                f"maxStorageBufferRange ({buffer_max / 2**20:.0f} MiB)")
    return None


def _type_defines(qtype) -> dict:
    name = SHADER_TYPES.get(qtype) if isinstance(qtype, int) else None
    if name is None:
        raise LoweringError(f"GGUF type {_name(qtype)} has no Vulkan kernel")
    return {"VARIANT": name, f"QTYPE_{name}": 1}


def _blocks(ctx: Context, blocks, rows: int, cols: int, qtype: int) -> list:
    """The weight's packed-bytes buffers as (TRef, first row, end row): one, or
    several for a weight split over the buffer limit (a graph input, or a
    constant uploaded once)."""
    rb = row_nbytes(qtype, cols)
    nbytes = rows * rb
    if isinstance(blocks, torch.Tensor):
        def upload(blocks=blocks):
            from dynamo_vulkan.runtime.words import host_words
            limit = weight_limit(ctx.caps)
            kind = _kind(qtype, cols) if blocks.numel() == nbytes else U8
            if blocks.numel() > limit and blocks.numel() == nbytes:
                return _split(ctx, nbytes, rb, limit, "const", blocks, kind)[0]
            words = host_words(blocks, kind).copy()
            return TRef(ctx.buffer(words.size, "const", kind, words),
                        (blocks.numel(),), (1,), 0, kind)
        blocks = ctx.const_once(blocks, upload, tag="gguf")
    parts = list(blocks.parts) if isinstance(blocks, RowChunks) else [(blocks, 0, rows)]
    for ref, r0, r1 in parts:
        if not isinstance(ref, TRef) or base_kind(ref.kind) != U8:
            raise LoweringError("GGUF blocks are not stored as packed bytes (a uint8 input "
                                "that other ops read too)")
        if ref.offset != 0 or ref.numel != (r1 - r0) * rb:
            raise LoweringError(f"GGUF blocks: expected {(r1 - r0) * rb} bytes at offset 0 "
                                f"for rows {r0}..{r1}, got {ref.numel} at offset {ref.offset}")
        if ref.kind != _kind(qtype, cols):
            raise LoweringError(f"GGUF blocks stored as {ref.kind} are read as {_kind(qtype, cols)}"
                                " (one uint8 tensor read with two types or row lengths)")
    if parts[-1][2] != rows:
        raise LoweringError(f"GGUF blocks: {parts[-1][2]} rows stored, {rows} expected")
    return parts


def _rows_of(ctx: Context, x: TRef, m: int, k: int, unit_k: bool) -> TRef:
    """x as an [m, k] view, copied when its layout cannot say so (or, with
    unit_k, when its elements along k are not adjacent)."""
    def view(t):
        return t.view(m, k)
    try:
        v = meta_view(x, view)
    except RuntimeError:
        v = None
    if v is None or (unit_k and v.strides[1] != 1):
        v = meta_view(ew(ctx, "$0", [x], "f32"), view)
    return v


def mv_unroll(chunks: int, tpr: int) -> int:
    """Chunks of 8 per mat-vec thread and loop step: up to MV_UNROLL (a multiple of
    MV_CPL), the one that leaves the fewest slots past the row's end, the largest on a
    tie. Those slots still load and decode (the row's last chunk, weighted 0): with 4
    per step, a row of 576 (72 chunks) over 32 threads filled 128 slots; with 3, 96."""
    slots = {u: -(-chunks // (tpr * u)) * tpr * u for u in range(MV_UNROLL, 0, -1) if u % MV_CPL == 0}
    return min(slots, key=slots.get) if slots else MV_UNROLL


def emit_linear(ctx: Context, out: TRef, x2: TRef, w: TRef, qtype: int, rows: int,
                cols: int, row0: int = 0, out_rows: int | None = None, norm=None,
                residual: TRef | None = None, loader: RowLoader | None = None,
                post_norm=None, post_res: TRef | None = None, beside: tuple = ()) -> None:
    """Dispatch out[m, row0 + n] = sum_k x2[m, k] * W[n, k] for the `rows` rows of
    W into a contiguous [m, out_rows] `out` (out_rows: rows by default; more when
    W is one chunk of a split weight): the mat-vec kernel for m <= MATVEC_M (x2's
    k-stride must be 1), the tiled one above. Split from the rule so benchmarks
    can emit it directly. Mat-vec only: norm (weight TRef, eps) RMS-normalises the
    rows of x2 first; residual, an [m, out_rows] view with unit column stride, is
    added to the output; loader (fusion.row_loader, its bindings after the residual's)
    computes x as it is loaded (x2 is then only its shape); post_norm (weight TRef, eps,
    group) RMS-normalises each run of `group` outputs (a row, or a head's) into `out`
    (the raw product goes to a scratch buffer),
    then adds post_res, an [m, rows] view with unit column stride (POST_NORM: W in one
    buffer, no residual of the product's own). beside: the dispatches of a split weight's
    other chunks, which write other columns of `out`: a mat-vec runs beside them, no
    barrier between (plan.Dispatch.disjoint)."""
    defines = _type_defines(qtype)
    m, k, n = x2.shape[0], cols, rows
    out_rows = rows if out_rows is None else out_rows
    disjoint = [(out.buf, i) for i in beside]
    rb = row_nbytes(qtype, cols)
    note = f"[{m}x{k}] @ {defines['VARIANT']}[{n}x{k}]^T"
    if out_rows != rows:
        note += f" -> columns {row0}..{row0 + n} of {out_rows}"
    if m <= MATVEC_M and int_dot.use_int_dot(ctx, qtype, m, n, k, x2, fused=post_norm is not None,
                                             prologue=norm is not None or loader is not None or
                                             int_dot.planes_ready(ctx, x2, k, qtype)):
        int_dot.emit_int_dot(ctx, out, x2, w, defines, n, k, rb, row0, residual, norm, loader,
                             note, disjoint)
    elif m <= MATVEC_M:
        if loader is None and x2.strides[1] != 1:
            raise LoweringError("gguf mat-vec needs x with unit stride along k")
        sg = max(1, int(ctx.caps.get("subgroup_size", 32)))
        cpu = device.is_cpu(ctx.caps)
        wg = min(MV_WG, (MV_CPU_SUBGROUPS if cpu else MAX_SUBGROUPS) * sg)
        # a subgroup per row (partial sums meet in one subgroupAdd, several rows per
        # workgroup) unless there are too few rows to fill the GPU that way
        # long rows on a GPU: the workgroup's threads share each row group, and the longest
        # share their x loads across two rows. Not on lavapipe, a CPU device, where a
        # subgroup per row stays faster (docs/journal.md, session 29)
        chunks = k // 8
        long_rows = chunks >= MV_WG_CHUNKS and not cpu
        tpr = sg if n >= MV_SUBGROUP_ROWS and sg < wg and wg % sg == 0 and not long_rows else wg
        if cpu:
            nr = max(1, MV_CPU_NR // max(1, m // 2))
        else:
            nr = MV_WG_NR if tpr == wg and chunks >= MV_WG_NR_CHUNKS else \
                MV_MANY_NR if tpr < wg and n >= MV_MANY_ROWS else MV_NR
        # the partial sums' shared array, 4 * wg * (nr + 1) * m bytes at most, fits
        shared = int(ctx.caps.get("max_compute_shared_memory_size", 16384)) - 1024
        nr = max(1, min(nr, shared // (4 * wg * m) - 1))
        spec = [wg, n, k, x2.offset, x2.strides[0], rb, row0, out_rows]
        unroll = mv_unroll(chunks, tpr)
        # MAXWG sizes the partial sums' shared array (NR * MROWS floats an invocation: a
        # CPU device's 16 rows of 3 rows of x in 256 would pass lavapipe's 32 KB)
        defines |= {"MROWS": m, "NR": nr, "UNROLL": unroll, "TPR": tpr, "CPL": MV_CPL, "MAXWG": wg}
        if chunks % (tpr * unroll) == 0:
            defines["FULL_STEPS"] = 1
        if loader is None and vec4_rows(x2):
            defines["X_VEC4"] = 1
        bindings = [out, loader.buffers[0] if loader else x2, w]
        spec += [f32_bits(norm[1]) if norm else 0, residual.offset if residual else 0,
                 residual.strides[0] if residual else 0]
        if norm is not None:
            defines["NORM"] = 1
            bindings.append(norm[0])
            note = "rms_norm + " + note
        if residual is not None:
            defines |= {"RESIDUAL": 1, "RES_BINDING": len(bindings)}
            bindings.append(residual)
            note += " + residual"
        if loader is not None:
            if loader.base != len(bindings):
                raise LoweringError(f"row loader declared from binding {loader.base}, "
                                    f"bound at {len(bindings)}")
            defines["X_LAZY"] = loader.decls
            bindings += loader.buffers
            note = "elementwise + " + note
        writes = [0]
        if post_norm is not None:
            if residual is not None or row0 != 0 or out_rows != rows:
                raise LoweringError("the mat-vec's post-norm needs W in one buffer and no "
                                    "residual added to the product")
            writes += _bind_post_norm(ctx, defines, bindings, spec, m, n, post_norm, post_res)
            group = post_norm[2]
            note += " + rms_norm" + (f" of each {group}" if group != n else "") + \
                (" + residual" if post_res is not None else "") + " (post-norm by the last workgroup)"
        ctx.dispatch("gguf_matvec", defines, bindings, writes, spec,
                     groups_for(n, nr * (wg // tpr)), note=note, disjoint=disjoint)
    else:
        first = _decode_first(ctx, m, n, k, row0, out_rows, defines["VARIANT"])
        if post_norm is not None or residual is not None and not first:
            raise LoweringError("the tiled GGUF matmul has no residual or post-norm fusion")
        if (loader is not None or norm is not None) and not _packs_prologue(first):
            raise LoweringError("a prompt's elementwise or normalised x is computed by the "
                                "tensor-core kernels' 16-bit copy of it only")
        if first:
            _emit_decoded_matmul(ctx, out, x2, w, defines, n, k, rb, note, first, loader, norm,
                                 residual)
            return
        groups = (-(-n // TILE), -(-m // TILE), 1)
        lanes = cpu_lanes(ctx.caps, n)
        if lanes:
            defines |= lanes
            groups = cpu_lanes_groups(lanes, m, n)
        if max(groups) > 65535:
            raise LoweringError(f"gguf_linear of {m}x{n} outputs needs more than 65535 "
                                "workgroups along one axis")
        spec = [m, n, k, x2.offset, x2.strides[0], x2.strides[1], rb, row0, out_rows]
        splits, ks = k_splits(ctx.caps, groups[0] * groups[1], k, m * n, **GGUF_SPLIT_K)
        if splits == 1:
            ctx.dispatch("gguf_matmul", defines, [out, x2, w], [0], spec, groups, note=note)
            return
        part = ctx.empty((splits, m, n), "f32")
        spec[7:9] = [0, n]
        ctx.dispatch("gguf_matmul", defines, [part, x2, w], [0], spec + [ks],
                     (groups[0], groups[1], splits), note=f"{note}, K in {splits} splits")
        add_slices(ctx, part, out.with_layout((m, n), (out_rows, 1), out.offset + row0))


def _decode_first(ctx: Context, m: int, n: int, k: int, row0: int, out_rows: int, qtype: str):
    """Whether a prompt's GGUF linear runs on the plain matmul kernels (larger tiles, tensor
    cores where the matmul precision allows) instead of the tiled GGUF kernel, whose tiles
    are fp32 and smaller: on a GPU, for weights of DECODE_FIRST_WEIGHTS elements or more,
    W in one buffer writing all of out, and prompts of DECODE_FIRST_M rows or more (W
    decoded whole first to a temporary fp32 matrix within one buffer), or of
    TC_DECODE_FIRST_M rows or more where the scaled fp16 tensor cores take the product
    (which decode W in their tile loads where coopmat_pack.decodes_inline says so, else
    first into their fp16 copy within one buffer); on the tensor cores also smaller
    weights, those of rows longer than TC_LONG_K from TC_DECODE_ALL_M rows.
    Returns False, True (the fp32 matrix) or the tensor cores' plan."""
    from .coopmat_pack import decodes_inline
    small = n * k < DECODE_FIRST_WEIGHTS
    if device.is_cpu(ctx.caps) or row0 != 0 or out_rows != n or \
            (small and (m < TC_DECODE_FIRST_M or m < TC_DECODE_ALL_M and k > TC_LONG_K)):
        return False
    limit = int(ctx.caps.get("max_storage_buffer_range", 128 << 20))
    plan = _scaled_plan(ctx, m, n, k) if m >= TC_DECODE_FIRST_M else None
    if small and plan is None:
        return False
    if plan is not None and decodes_inline(qtype, plan, m, n, k):
        return plan
    if plan is not None:        # the fp16 copy: whole tiles of rows, whole K steps, exponents
        rows_p, kp = -(-n // plan.bn) * plan.bn, -(-k // plan.bk) * plan.bk
        return plan if 2 * rows_p * kp + 4 * rows_p <= limit else False
    return m >= DECODE_FIRST_M and 4 * n * k <= limit


def _packs_prologue(first) -> bool:
    """Whether a prompt's product, by _decode_first's answer, runs on the scaled fp16
    tensor-core kernel, whose 16-bit copy of x can compute an elementwise x or x's rms_norm
    as it loads x (coopmat_pack.comp X_LAZY, NORM)."""
    return first is not False and first is not True and first.scaled


def _prompt_decode_first(ctx: Context, out: TRef, w: list, m: int, qtype: int, rows: int,
                         cols: int):
    """_decode_first's answer for gguf_linear's product where it is a prompt's (m >
    MATVEC_M), W in one buffer, out not empty; else False. Its matmul kernels add a
    residual as their bias (any strides), and on the scaled tensor cores (_packs_prologue)
    x's prologue (an elementwise x, its rms_norm) goes into their 16-bit copy of x."""
    if m <= MATVEC_M or out.numel == 0 or len(w) != 1:
        return False
    return _decode_first(ctx, m, rows, cols, 0, rows, SHADER_TYPES[qtype])


def _scaled_plan(ctx: Context, m: int, n: int, k: int):
    """The scaled fp16 tensor-core plan of x @ W^T, where the matmul would take one."""
    from . import coopmat
    plan = coopmat.choose(ctx, 1, m, n, k).plan
    return plan if plan is not None and plan.scaled else None


def _emit_decoded_matmul(ctx: Context, out: TRef, x2: TRef, w: TRef, defines: dict, n: int,
                         k: int, rb: int, note: str, how, loader: RowLoader | None = None,
                         norm=None, residual: TRef | None = None) -> None:
    """out = x2 @ W^T (+ residual, [m, n], added by the matmul's epilogue as its bias) by
    the matmul lowering (lowering/matmul.py), written into out (how: _decode_first's
    answer): by the scaled fp16 tensor-core kernel, which decodes W
    (coopmat_pack.GGUFWeight), where it takes the product (loader: x is an elementwise
    expression its 16-bit copy of x computes; norm (weight TRef, eps): that copy holds
    rms_norm(x2)), else after gguf_dequant decodes W into a temporary fp32 [n, k]."""
    from .coopmat_pack import GGUFWeight
    from .matmul import matmul

    if how is not True:
        matmul(ctx, x2, w.with_layout((k, n), (1, k), 0), bias=residual, out=out,  # W's layout only
               weight=GGUFWeight(w, defines, n, k, rb), a_loader=loader, a_norm=norm)
        return
    wf = ctx.empty((n, k), "f32")
    ctx.dispatch("gguf_dequant", defines, [wf, w], [0], [DEQUANT_WG, n, k, rb],
                 groups_for(n * (k // 8), DEQUANT_WG), note=f"{defines['VARIANT']}[{n}x{k}] decoded for {note}",
                 weight_copy=True)
    matmul(ctx, x2, wf.with_layout((k, n), (1, k), 0), bias=residual, out=out)


def planes_for_reader(ctx: Context, node, k: int) -> tuple[int, int] | None:
    """(NIBBLES, PLANES) for int8 planes of `node`'s output (one row of k values) where its
    one reader, through views, is a one-row GGUF mat-vec that would take the integer-dot
    path with them (decode attention's output before the output projection); else None.
    provide_planes then records them for that mat-vec (emit_linear finds them by key, so a
    reader that sees another row, as a copy of it, makes planes of its own)."""
    u = node
    while len(u.users) == 1:
        nxt = next(iter(u.users))
        if nxt.target is GGUF_LINEAR:
            break
        if nxt.target not in VIEW_OPS:
            return None
        u = nxt
    else:
        return None
    qtype, rows, cols = nxt.args[2:5]
    name = SHADER_TYPES.get(qtype)
    val = nxt.meta.get("val")
    if nxt.args[0] is not u or cols != k or name not in int_dot.INT_DOT_TYPES or val is None or \
            val.numel() != rows or _matvec_feeds_norm(nxt, ctx) or \
            not int_dot.int_dot_weight(ctx, qtype, rows, cols, True):
        return None
    return int_dot.INT_DOT_TYPES[name], int_dot.x_planes(ctx)


def _bind_post_norm(ctx: Context, defines: dict, bindings: list, spec: list, m: int, n: int,
                    post_norm, post_res: TRef | None) -> list[int]:
    """Declare and bind the POST_NORM epilogue's buffers after the mat-vec's own: the raw
    product [m, n] (scratch), the count of finished workgroups, the norm's weight and the
    residual; their constants go on `spec`. Returns the binding positions it writes.
    post_norm: (weight, eps, group), the norm over each run of `group` outputs (PN_GROUP
    where that is less than a row)."""
    weight, eps, group = post_norm
    if group <= 0 or n % group:
        raise LoweringError(f"the mat-vec's post-norm groups of {group} do not divide its {n} outputs")
    if weight.kind != "f32" or weight.offset != 0 or weight.strides != (1,) or weight.shape != (group,):
        raise LoweringError(f"the mat-vec's post-norm needs a contiguous float32 weight of {group} "
                            f"values at offset 0, got {weight.kind} {weight.shape} "
                            f"strides {weight.strides} at {weight.offset}")
    if group != n:
        defines["PN_GROUP"] = group
    if post_res is not None and (post_res.shape != (m, n) or post_res.strides[1] != 1):
        raise LoweringError(f"the mat-vec's post-norm residual must be an [{m}, {n}] view with "
                            f"unit column stride, got {post_res.shape} strides {post_res.strides}")
    raw = ctx.empty((m, n), "f32")
    # zero at upload; the last workgroup to count itself in resets it for the next call
    counter = ctx.buffer(1, "const", "i32", np.zeros(1, np.uint32))
    base = len(bindings)
    defines |= {"POST_NORM": 1, "PN_RAW": base, "PN_COUNT": base + 1, "PN_W": base + 2}
    bindings += [raw, counter, weight]
    spec += [f32_bits(eps), post_res.offset if post_res is not None else 0,
             post_res.strides[0] if post_res is not None else 0]
    if post_res is not None:
        defines |= {"POST_RES": 1, "PN_RES": base + 3}
        bindings.append(post_res)
    return [base, base + 1]


def _recompute_costs() -> bool:
    """Whether a mat-vec prologue's recomputation (every row group normalising x or
    computing silu(gate) * up again) costs more than the kernel it saves: on a CPU
    Vulkan device (lavapipe) compute is the bottleneck, not the barrier between kernels
    (docs/journal.md, session 29)."""
    return device.is_cpu()


def norm_feeds_matvecs(node, ctx: Context) -> bool:
    """An rms_norm whose every user is a gguf_linear of it, on a GPU: each mat-vec
    normalises x itself (NORM: in its one planes kernel on the integer-dot path, else in
    every row group), and the norm costs no kernel of its own; not for weights of more
    than NORM_MAX_ROWS rows (an LM head) on the fp32 path, whose thousands of workgroups
    would each read x once more than the weight is worth. A prompt's products normalise x
    in the tensor cores' 16-bit copy of it (one copy for all of them)."""
    val, w = node.meta.get("val"), node.args[1]
    if _recompute_costs() or val is None:
        return False
    if val.numel() // max(1, val.shape[-1]) > MATVEC_M:
        # a prompt: the scaled tensor cores' 16-bit copy of x normalises it where they take
        # the product (gguf_linear); any other kernel reads the norm computed once
        return val.shape[-1] % 8 == 0 and isinstance(w, torch.fx.Node) and w.op == "placeholder" and \
            bool(node.users) and all(u.target is GGUF_LINEAR and u.args[0] is node for u in node.users)
    one_row = val.numel() == val.shape[-1]

    def takes_norm(u) -> bool:
        if u.target is not GGUF_LINEAR or u.args[0] is not node:
            return False
        rows, cols = u.args[3], u.args[4]
        return rows <= NORM_MAX_ROWS or one_row and int_dot.int_dot_weight(ctx, u.args[2], rows, cols, True)
    return val.shape[-1] % 8 == 0 and isinstance(w, torch.fx.Node) and w.op == "placeholder" and \
        bool(node.users) and all(takes_norm(u) for u in node.users)


def _lazy_feeds_matvec(user, node) -> bool:
    """An elementwise result (silu(gate) * up) read only as x by a GGUF linear, on a GPU:
    a mat-vec computes it as it loads x (not for LM-head-sized weights: see
    norm_feeds_matvecs); a prompt's product on the scaled tensor-core kernel computes it in
    its 16-bit copy of x (gguf_linear; any other prompt kernel gets it computed first)."""
    val = node.meta.get("val")
    if _recompute_costs() or user.args[0] is not node or val is None or val.dim() < 1:
        return False
    return val.numel() // max(1, val.shape[-1]) > MATVEC_M or user.args[3] <= NORM_MAX_ROWS


def _matvec_feeds_norm(node, ctx: Context) -> bool:
    """A mat-vec gguf_linear read only by an rms_norm of its output rows with a graph
    input as weight (Gemma-3's norms after the attention output and FFN down projections),
    or only by a reshape of it read only by an rms_norm over runs of the outputs that
    divide a row (the norms of Gemma 3's and Qwen3's q and k over each head's dims):
    the mat-vec's last workgroup to finish normalises the output (POST_NORM), and the norm
    costs no kernel and no barrier level. Only on GPUs, where that barrier is what decode
    time is made of: a CPU device (lavapipe) keeps its kernels apart, as for the
    prologues (_recompute_costs). Not when the norm itself folds into mat-vecs that read
    it (it is their prologue then), for weights over NORM_MAX_ROWS rows (the last
    workgroup reads every output back) or split across buffers (a dispatch per part),
    nor when a node between the two writes a buffer in place (the mat-vec reads x when
    the norm is lowered)."""
    val, rows = node.meta.get("val"), node.args[3]
    if _recompute_costs() or val is None or not isinstance(rows, int) or \
            not 0 < rows <= NORM_MAX_ROWS or val.numel() // rows > MATVEC_M or len(node.users) != 1:
        return False
    blocks = node.args[1].meta.get("val") if isinstance(node.args[1], torch.fx.Node) else None
    if blocks is not None and blocks.numel() > _limit():
        return False
    norm = next(iter(node.users))
    src = node
    if norm.target in RESHAPES and len(norm.users) == 1:
        src, norm = norm, next(iter(norm.users))
    w = norm.args[1] if norm.target is RMS_NORM else None
    wv = w.meta.get("val") if isinstance(w, torch.fx.Node) else None
    group = wv.shape[0] if wv is not None and wv.dim() == 1 else 0
    return wv is not None and norm.args[0] is src and w.op == "placeholder" and \
        (group == rows or src is not node and 0 < group and rows % group == 0) and \
        wv.dtype == torch.float32 and not norm_feeds_matvecs(norm, ctx) and \
        _nothing_written_between(node, norm)


def _nothing_written_between(a, b) -> bool:
    """No node after a and before b (graph order) may write a buffer in place: a copy_
    into an input, an index_put (the planner may update it in place) or a mutating op."""
    n = a.next
    while n is not b and n.op != "output":
        if writes_in_place(n):
            return False
        n = n.next
    return n is b


def _residual_rows(res, m: int, n: int, rows: bool = False) -> TRef | None:
    """The residual as an [m, n] view with unit column stride (rows: or one row of n
    values broadcast over m, a bias), or None."""
    try:
        v = meta_view(res, lambda t: t.view(m, n) if not rows or t.numel() != n else
                      t.view(n).expand(m, n))
    except RuntimeError:
        return None
    return v if v.strides[1] == 1 and v.kind == "f32" else None


@dataclass(eq=False)
class PendingLinear(Deferred):
    """A mat-vec gguf_linear left to its one user, an rms_norm (its record's prologue,
    _matvec_feeds_norm), with all its kernel reads as its lowering found them (x or its
    row loader, a norm prologue), so that either emission is the linear it would have
    been: with the norm as the kernel's epilogue (fold_rms_norm), or plain (compute)."""
    out: TRef
    x2: TRef
    w: TRef
    qtype: int
    rows: int
    cols: int
    norm: tuple | None
    loader: RowLoader | None

    def compute(self, ctx):
        if self.__dict__.get("_folded"):
            raise LoweringError("a gguf_linear whose kernel normalised its output in place "
                                "was read raw as well")
        self._emit(ctx)
        return self.out

    def fold_rms_norm(self, ctx, weight, eps: float, residual, group: int | None = None):
        """The mat-vec with rms_norm(product, weight, eps) (+ residual) as its epilogue,
        over each row or each run of `group` outputs, writing the norm into the product's
        buffer; None for a weight that is not one contiguous float32 row of `rows` (or
        `group`) values or a residual not viewable as [m, rows]."""
        group = self.rows if group is None else group
        if "_done" in self.__dict__ or weight.kind != "f32" or weight.offset != 0 or \
                weight.strides != (1,) or weight.shape != (group,) or self.rows % group:
            return None
        m = self.x2.shape[0]
        res = None if residual is None else _residual_rows(residual, m, self.rows)
        if residual is not None and res is None:
            return None
        self._emit(ctx, post_norm=(weight, eps, group), post_res=res)
        self.__dict__["_folded"] = True
        return self.out

    def reshape(self, shape: tuple) -> "PendingReshape":
        return PendingReshape(self, tuple(shape))

    def _emit(self, ctx, **post):
        emit_linear(ctx, self.out, self.x2, self.w, self.qtype, self.rows, self.cols,
                    norm=self.norm, loader=self.loader, **post)


class PendingReshape(Deferred):
    """A reshape of a PendingLinear read only by an rms_norm over its last dim (runs of the
    product's outputs within a row: a head's q or k), which folds into the mat-vec as its
    grouped post-norm; any other consumer gets the product computed and viewed."""

    def __init__(self, linear: PendingLinear, shape: tuple):
        self.linear, self.shape = linear, shape

    def compute(self, ctx):
        return meta_view(ctx.ref(materialize(ctx, self.linear)), lambda t: t.reshape(self.shape))

    def fold_rms_norm(self, ctx, weight, eps: float, residual):
        if residual is not None or not self.shape:
            return None
        out = self.linear.fold_rms_norm(ctx, weight, eps, None, group=self.shape[-1])
        return None if out is None else meta_view(out, lambda t: t.reshape(self.shape))


# prologue (_matvec_feeds_norm): its rms_norm may fold into the kernel, which is then
# emitted when the norm is lowered; loads_lazy: computes an elementwise x as it loads it;
# epilogue: adds a residual; the blocks (argument 1) are a packed-bytes input
@lowering(GGUF_LINEAR, check=_check, prologue=_matvec_feeds_norm, loads_lazy=_lazy_feeds_matvec,
          takes_deferred=True, epilogue=True, packed_arg=1)
def gguf_linear(ctx: Context, x, blocks, qtype, rows, cols, request=NO_REQUEST) -> Lowered:
    _type_defines(qtype)
    w = _blocks(ctx, blocks, rows, cols, qtype)
    out = ctx.empty(ctx.out_shape(), "f32")
    m = out.numel // rows if rows else 0
    # deferred, it takes no residual of its own
    defer = request.defer and m <= MATVEC_M and len(w) == 1 and out.numel > 0
    prompt = _prompt_decode_first(ctx, out, w, m, qtype, rows, cols)
    norm = None
    if isinstance(x, NormedRows):
        nw = x.weight
        if m <= MATVEC_M and nw.offset == 0 and nw.strides == (1,) and x.x.strides[-1] == 1:
            norm, x = (nw, x.eps), x.x
        elif nw.strides == (1,) and x.x.strides[-1] == 1 and x.x.kind == "f32" and \
                _packs_prologue(prompt):
            # a prompt on the scaled tensor cores: their 16-bit copy of x normalises it
            norm, x = (nw, x.eps), x.x
    residual = None
    if request.residual is not None and out.numel and not defer and \
            (m <= MATVEC_M or prompt is not False):
        residual = _residual_rows(request.residual, m, rows, rows=m > MATVEC_M)
    added = residual is not None
    if isinstance(x, Lazy) and m <= MATVEC_M and out.numel and norm is None:
        # the mat-vec's bindings: out, x (unread), W, the residual, then the loader's
        loader = row_loader(ctx, x, m, cols, 4 if residual is not None else 3)
        if loader is not None:
            shape_only = TRef(-1, (m, cols), (0, 1), 0, "f32")
            return Lowered(_linear(ctx, defer, out, shape_only, w, qtype, rows, cols,
                                   residual=residual, loader=loader), added)
    if isinstance(x, Lazy) and _packs_prologue(prompt):
        # a prompt on the scaled tensor cores: x computed in their 16-bit copy of it, whose
        # bindings are dst, then the loader's
        loader = row_loader(ctx, x, m, cols, 1)
        if loader is not None:
            shape_only = TRef(-1, (m, cols), (cols, 1), 0, "f32")
            emit_linear(ctx, out, shape_only, w[0][0], qtype, rows, cols, residual=residual,
                        loader=loader)
            return Lowered(out, added)
    x = ctx.ref(materialize(ctx, x))
    if x.kind != "f32":
        x = ew(ctx, "$0", [x], "f32", compute="f32")
    if out.numel == 0:
        return Lowered(out, added)
    x2 = _rows_of(ctx, x, m, cols, unit_k=m <= MATVEC_M)
    return Lowered(_linear(ctx, defer, out, x2, w, qtype, rows, cols, norm, residual), added)


def _linear(ctx: Context, defer: bool, out: TRef, x2: TRef, w: list, qtype: int, rows: int,
            cols: int, norm=None, residual: TRef | None = None, loader: RowLoader | None = None):
    """out = x W^T over every part of w; with defer, a PendingLinear of it (W in one part)."""
    if defer:
        return PendingLinear(out, x2, w[0][0], qtype, rows, cols, norm, loader)
    chunks: list[int] = []       # the dispatches of the parts so far, for `disjoint`
    for part, r0, r1 in w:
        emit_linear(ctx, out, x2, part, qtype, r1 - r0, cols, r0, rows, norm, residual, loader,
                    beside=tuple(chunks))
        chunks.append(len(ctx.plan.dispatches) - 1)
    return out


@lowering(GGUF_EMBEDDING, check=_check, packed_arg=1)
def gguf_embedding(ctx: Context, ids, blocks, qtype, rows, cols):
    defines = _type_defines(qtype)
    w = _blocks(ctx, blocks, rows, cols, qtype)
    ids = ctx.ref(ids)
    if ids.kind != "i32":
        raise LoweringError(f"gguf_embedding ids of kind {ids.kind} (integers expected)")
    out = ctx.empty(ctx.out_shape(), "f32")
    if out.numel == 0:
        return out
    if ids.ndim == 1:
        stride = ids.strides[0]
    else:
        ids = contiguous(ctx, ids)
        stride = 1
    n = ids.numel
    check, bit = index_check(ctx)    # an id out of range: IndexError after the submit
    chunks: list[int] = []
    for part, r0, r1 in w:     # each chunk fills the rows whose ids it holds: side by side
        spec = [EMB_WG, n, cols, r1 - r0, row_nbytes(qtype, cols), ids.offset, stride, r0, rows,
                1 << bit]
        ctx.dispatch("gguf_embed", defines, [out, part, ids, check], [0], spec,
                     groups_for(n * (cols // 8), EMB_WG),
                     note=f"{n} rows of {defines['VARIANT']}[{rows}x{cols}]"
                          + (f" (rows {r0}..{r1})" if len(w) > 1 else ""),
                     disjoint=[(out.buf, i) for i in chunks])
        chunks.append(len(ctx.plan.dispatches) - 1)
    return out
