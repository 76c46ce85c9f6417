"""dynamo_vulkan.attention (dynamo_vulkan/fused.py) on shaders/attention.comp: one
workgroup per (query head, query row), online softmax over chunks of WG keys; for few
rows (decode) the keys are split across workgroups and the last of a row's splits to
finish merges them. A prompt on a GPU takes the register-tiled kernel instead
(attention_tiled.comp, tiled_config), with each row's live keys from mask_ranges.comp,
run once per mask and plan."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from dynamo_vulkan import fused as _fused  # noqa: F401  (defines the custom ops)

from dynamo_vulkan import device

from .core import LoweringError, TRef, f32_bits, groups_for, has_cpu_lanes, host_matmul, lowering
from . import gguf, gguf_int_dot
from .fusion import Lazy, LazyView, materialize, row_loader
from .index import RowWrite

ATTENTION = torch.ops.dynamo_vulkan.attention.default

WG = 256         # invocations per workgroup (and keys per chunk, one invocation each)
# ... on a CPU device (lavapipe), where a workgroup's idle invocations and barriers cost
# the CPU's time (docs/journal.md, session 29)
CPU_WG = 32
CPU_ROWS = 8     # query rows per subgroup in the CPU_LANES variant (prompts on a CPU device)
MAX_DIM = 1024   # head dims held in shared memory (q row) and registers (output)
SPLIT_ROWS = 64  # fewer query rows than this (decode) split the keys across workgroups
# a prompt's attention on a GPU from this many query rows, in TILED_MIN_BLOCKS workgroups
# or more (fewer leave a GPU idle: the row-per-workgroup kernel runs), register-tiled
# (attention_tiled.comp) by the first of TILED_CONFIGS that fits the device and the head
# dims: (query rows BQ, keys a chunk BK, rows an invocation RPT, invocations a row group
# TPRG), with at most TILED_ACC output floats and TILED_SCORES scores an invocation. The
# order is measured (benchmarks/attention_sweep.py; docs/journal.md, session 38): a
# prompt's attention is latency-bound, so 256 invocations a workgroup beat larger tiles
# per invocation in fewer (the 7B's 512-row prompt: 32x32x2x16 180 us, 32x32x4x8 728), and
# so do tiles whose registers spill (the next chunk's K and V loaded into registers ahead:
# 663 us)
TILED_MIN_ROWS = 16
TILED_MIN_BLOCKS = 64
TILED_CONFIGS = ((32, 32, 2, 16), (16, 32, 1, 16), (8, 32, 1, 32), (16, 16, 1, 16), (8, 16, 2, 16))
TILED_ACC = 64
TILED_SCORES = 32
SPLIT_TPK = 8    # ... with this many invocations per key's dot product
MAX_SPLITS = 64  # ... in at most this many splits,
# and at most SPLIT_WORKGROUPS workgroups in all: the kernel waits for its last split, and
# 64 splits of a 7B's 28 heads run past one wave of the GPU, slower than 32 at every cache
# fill the sweep measured (benchmarks/attention_sweep.py; docs/journal.md, session 39).
# SmolLM2's 9 heads and Gemma 3's 4 keep 64 splits.
SPLIT_WORKGROUPS = 1024
VPRE_MAX = 8          # V registers per invocation for loading a chunk's V rows early


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def cpu_lanes(caps: dict, rows: int) -> bool:
    """Whether a prompt's attention (rows > 1) takes the CPU_LANES variant: a CPU device
    with subgroups of 8 lanes or more (faster there than a workgroup per query row:
    docs/journal.md, session 29)."""
    return rows > 1 and has_cpu_lanes(caps)


@dataclass(frozen=True)
class TiledConfig:
    """attention_tiled.comp's tile: BQ query rows a workgroup, BK keys a chunk, RPT rows
    an invocation, TPRG invocations a row group; kv_apart: K and V have shared arrays of
    their own (V loaded with K)."""
    bq: int
    bk: int
    rpt: int
    tprg: int
    kv_apart: bool

    @property
    def wg(self) -> int:
        return self.bq // self.rpt * self.tprg


def _tiled_shared(bq: int, bk: int, tprg: int, d: int, dv: int, apart: bool) -> int:
    """attention_tiled.comp's shared bytes: q rows and K rows padded by a vec4, V rows,
    the chunk's weights, the row maxima, wg_reduce's partials."""
    qld, dv4 = -(-d // 4) + 1, -(-dv // 4)
    kv = bk * qld + bk * dv4 if apart else max(bk * qld, bk * dv4)
    return 16 * (bq * qld + kv) + 4 * (bk * bq + bq * tprg + 64)


def tiled_config(caps: dict, heads: int, rows: int, d: int, dv: int) -> TiledConfig | None:
    """The register-tiled kernel's tile for a prompt's attention (attention_tiled.comp), or
    None where it does not run: a CPU device, fewer than TILED_MIN_ROWS query rows, no
    tile of TILED_CONFIGS that fits the device's shared memory and invocations, keeps
    TILED_ACC output floats and TILED_SCORES scores an invocation, and makes
    TILED_MIN_BLOCKS workgroups."""
    if device.is_cpu(caps) or rows < TILED_MIN_ROWS:
        return None
    smem = caps.get("max_compute_shared_memory_size", 16384)
    for bq, bk, rpt, tprg in TILED_CONFIGS:
        cv = _ceil_div(_ceil_div(dv, 4), tprg)        # output vec4s an invocation and row
        if heads * _ceil_div(rows, bq) < TILED_MIN_BLOCKS or rpt * cv * 4 > TILED_ACC or \
                rpt * (bk // tprg) > TILED_SCORES or \
                bq // rpt * tprg > caps.get("max_compute_work_group_invocations", 128):
            continue
        for apart in (True, False):
            if _tiled_shared(bq, bk, tprg, d, dv, apart) <= smem:
                return TiledConfig(bq, bk, rpt, tprg, apart)
    return None


def _vec4_rows(t: TRef, dims: int) -> bool:
    """Whether an operand's rows (its last dim, `dims` long) load as whole vec4s: unit
    stride along them, dims, offset and the other strides multiples of 4."""
    return t.strides[-1] == 1 and dims % 4 == 0 and \
        all(x % 4 == 0 for x in (t.offset, *t.strides[:-1]))


def workgroup_size(caps: dict) -> int:
    """Invocations per workgroup (and keys per chunk) on the device with these caps."""
    return CPU_WG if device.is_cpu(caps) else WG


def split_invocations_per_key(dims: int) -> int:
    """Invocations sharing a key's dot product when the keys are split (decode): up to
    SPLIT_TPK, a power of two no larger than the head's `dims` (loads of VW values)."""
    return min(SPLIT_TPK, 1 << (dims.bit_length() - 1))


def splits_keys(caps: dict, rows: int, keys: int, wg: int, split_tpk: int) -> bool:
    """Whether the keys are split across workgroups: few query rows (decode) over more
    than one chunk of keys, on a GPU. Not on lavapipe, whose two or so threads are kept
    busy by a workgroup per row (split, it is 4x slower there: docs/journal.md)."""
    return rows < SPLIT_ROWS and keys > wg // split_tpk and not device.is_cpu(caps)


def _check(node) -> str | None:
    q, v = node.args[0].meta.get("val"), node.args[2].meta.get("val")
    if q is not None and v is not None and max(q.shape[-1], v.shape[-1]) > MAX_DIM:
        return f"attention head dims {q.shape[-1]}/{v.shape[-1]} exceed {MAX_DIM}"
    # a prompt's attention on a CPU device: its two products run faster in torch
    return host_matmul(q.shape[1]) if q is not None and q.ndim == 3 else None


def _q_computed_on_load(user, node) -> bool:
    """q's RoPE (an elementwise result read only as attention's q) is computed as the
    attention loads q: decode (one query row), on GPUs, where it saves a kernel and,
    with the KV-cache rows computed here too (_new_row), the barrier before attention."""
    val = node.meta.get("val")
    return user.args[0] is node and val is not None and val.dim() == 3 and \
        val.shape[1] == 1 and not device.is_cpu()


def _new_row(ctx, cache: TRef, heads: int, width: int, name: str, base: int):
    """For a decode step whose K or V cache row was just written by a one-row scatter
    (index.RowWrite) still the buffer's last writer: (the write, its row as a
    RowLoader of `heads` rows of `width`, GLSL defines), so the attention computes that
    row itself and need not wait for the scatter. None when the layouts do not say so."""
    ctx.run_before_dispatch()      # a pending copy may write the cache
    w: RowWrite | None = ctx.row_writes.get(cache.buf)
    if w is None or any(cache.buf in (d.bindings[i] for i in d.writes)
                        for d in ctx.plan.dispatches[w.dispatch + 1:]):
        return None
    tgt = w.target
    if tgt.buf != cache.buf or tgt.offset != cache.offset or w.dim != 1 or tgt.ndim < 3 or \
            tgt.shape[0] != heads or cache.shape[:2] != tgt.shape[:2] or \
            cache.strides[:2] != tgt.strides[:2] or math.prod(tgt.shape[2:]) != width or \
            not (tgt.is_contiguous() and cache.is_contiguous()):
        return None
    vals = w.values
    if not isinstance(vals, (TRef, Lazy)):
        return None
    vshape = tuple(vals.shape)
    if len(vshape) != tgt.ndim or vshape[0] != heads or vshape[1] != 1 or \
            tuple(vshape[2:]) != tuple(tgt.shape[2:]):
        return None
    lazy = vals if isinstance(vals, Lazy) else Lazy("$0", (vals,), vals.kind, None, None, vshape)
    rw = vshape[-1]
    loader = row_loader(ctx, lazy, math.prod(vshape[:-1]), rw, base, name=name)
    if loader is None:
        return None
    up = name.upper()
    return w, loader, {f"{up}_NEW": loader.decls, f"{up}_W": rw, f"{up}_RPH": width // rw}


@lowering(ATTENTION, check=_check, loads_lazy=_q_computed_on_load, takes_deferred=True)
def attention(ctx, q, k, v, mask, scale, softcap=0.0):
    k, v, mask = (ctx.ref(materialize(ctx, t)) for t in (k, v, mask))
    q_lazy, q_defines = None, {}
    if isinstance(q, (Lazy, LazyView)):
        # q (its RoPE) computed as it is loaded, read in the Lazy's own shape as rows of
        # its last dim (a reshape of it keeps the elements' order)
        lazy = q.lazy if isinstance(q, LazyView) else q
        hq_, t_, d_ = q.shape
        w_ = lazy.shape[-1] if lazy.shape else 0
        if t_ == 1 and w_ and d_ % w_ == 0:
            q_lazy = row_loader(ctx, lazy, math.prod(lazy.shape[:-1]), w_, 5, name="q")
            q_defines = {"Q_W": w_, "Q_RPH": d_ // w_}
    if q_lazy is None:
        q = ctx.ref(materialize(ctx, q))
    q_kind = lazy.kind if q_lazy is not None else q.kind
    if not (q_kind == k.kind == v.kind == "f32") or mask.kind != "b":
        raise LoweringError("attention needs float32 q/k/v and a bool mask")
    softcap = float(softcap)
    if not (0.0 <= softcap < math.inf):
        raise LoweringError(f"attention: softcap must be finite and >= 0, got {softcap}")
    hq, t, d = q.shape
    hkv, c, dv = v.shape
    out = ctx.empty((hq, t, dv), "f32")
    if out.numel == 0:
        return out
    aligned = _vec4_rows(k, d) and _vec4_rows(v, dv)
    vw = 4 if aligned else 1
    spec = [hq, t, c, hq // hkv, f32_bits(scale),
            q.offset if q_lazy is None else 0, *(q.strides if q_lazy is None else (0, 0, 0)),
            k.offset, *k.strides, v.offset, *v.strides,
            mask.offset, *mask.strides, c, f32_bits(softcap)]
    note = f"q[{hq}x{t}x{d}] over kv[{hkv}x{c}x{dv}]" + (" vec4" if vw == 4 else "") + \
        (f", softcap {softcap:g}" if softcap else "")
    if cpu_lanes(ctx.caps, t) and aligned and q_lazy is None:
        blocks = hkv * _ceil_div(hq // hkv * t, CPU_ROWS)
        ctx.dispatch("attention", {"CPU_LANES": 1, "VARIANT": "lanes", "WG": 8, "AR": CPU_ROWS,
                                   "D": d, "DV": dv, "SPLITS": 1},
                     [out, q, k, v, mask], [0], spec, groups_for(blocks), note=note + ", lanes")
        return out
    tile = tiled_config(ctx.caps, hq, t, d, dv)
    if tile is not None and q_lazy is None:
        _emit_tiled(ctx, tile, out, q, k, v, mask, spec, note)
        return out
    wg = workgroup_size(ctx.caps)
    dvlp = min(dv // vw, wg)
    rows = hq * t
    tpk, splits, split_keys = 1, 1, c
    split_tpk = split_invocations_per_key(d // vw)
    if splits_keys(ctx.caps, rows, c, wg, split_tpk):
        # decode: few rows, so spread the keys (more than one chunk of them) over more
        # workgroups, split_tpk invocations per key, and merge the splits
        tpk = split_tpk
        kpp = wg // tpk
        splits = max(1, min(MAX_SPLITS, SPLIT_WORKGROUPS // rows, _ceil_div(c, kpp)))
        split_keys = _ceil_div(_ceil_div(c, splits), kpp) * kpp     # whole chunks per split
        splits = _ceil_div(c, split_keys)
    parts, dpt = wg // dvlp, _ceil_div(dv // vw, dvlp)
    vpk = _ceil_div(wg // tpk, parts)       # V rows per invocation and chunk
    defines = {"WG": wg, "VW": vw, "D": d, "DV": dv, "DVL": dv // vw, "DVLP": dvlp,
               "PARTS": parts, "DPT": dpt, "TPK": tpk, "KPP": wg // tpk, "SPLITS": splits,
               # decode's splits load their V rows with the keys (registers permitting)
               "VPK": vpk if splits > 1 and dpt * vpk <= VPRE_MAX else 0}
    spec[-2] = split_keys
    # bindings: out, q, k, v, mask, then what the variant adds
    bindings = [out, q_lazy.buffers[0] if q_lazy else q, k, v, mask]
    writes = [0]
    extra: dict = {}
    if q_lazy is not None:
        bindings += q_lazy.buffers
        extra |= {"Q_LAZY": q_lazy.decls, **q_defines}
        note = "rope + " + note
    if splits > 1:
        # the row's live keys, cut evenly into the splits (attention.comp RANGES_BINDING)
        extra["RANGES_BINDING"] = len(bindings)
        bindings.append(_ranges_of(ctx, mask))
        extra["SCRATCH_BINDING"] = len(bindings)
        writes.append(len(bindings))
        bindings.append(ctx.empty((rows * splits * (dv + 2),), "f32"))
        # a counter per row, zero at upload and reset by the row's last split
        extra["COUNTER_BINDING"] = len(bindings)
        writes.append(len(bindings))
        bindings.append(ctx.buffer(rows, "const", "i32", np.zeros(rows, np.uint32)))
    disjoint = []
    # the step's K/V rows computed here: a GPU saves the barrier after the scatters. Not
    # on lavapipe, a CPU device, where it is many times slower (docs/journal.md, session 29)
    if t == 1 and not device.is_cpu(ctx.caps):
        kn = _new_row(ctx, k, hkv, d, "k", len(bindings) + 1)
        vn = _new_row(ctx, v, hkv, dv, "v", len(bindings) + 1 + len(kn[1].buffers)) if kn else None
        if kn and vn and kn[0].index.buf == vn[0].index.buf and kn[0].index.offset == vn[0].index.offset:
            idx = kn[0].index
            extra |= {"PENDING": 1, "IDX_BINDING": len(bindings), "IDX_OFF": idx.offset,
                      **kn[2], **vn[2]}
            bindings += [idx, *kn[1].buffers, *vn[1].buffers]
            disjoint = [(k.buf, kn[0].dispatch), (v.buf, vn[0].dispatch)]
            note += ", the step's k/v rows computed here"
    planes_of = gguf.planes_for_reader(ctx, ctx.node, rows * dv) \
        if splits > 1 and t == 1 and dv % 32 == 0 and dv // 4 <= wg and ctx.node is not None else None
    planes = None
    if planes_of is not None:
        # the output projection's int8 planes, written by each row's merge
        planes = ctx.empty((rows * dv // 32 * (8 * planes_of[1] + 4),), "i32")
        extra |= {"PLANES_BINDING": len(bindings), "NIBBLES": planes_of[0], "PLANES": planes_of[1]}
        writes.append(len(bindings))
        bindings.append(planes)
    if splits > 1:
        note += f", {splits} splits merged by the last"
        if planes is not None:
            note += f" (with its output's {planes_of[1]} int8 planes)"
    ctx.dispatch("attention", defines | extra, bindings, writes, spec, groups_for(rows * splits),
                 note=note, disjoint=disjoint)
    if planes is not None:
        gguf_int_dot.provide_planes(ctx, out, rows * dv, planes_of, planes)
    return out


def _emit_tiled(ctx, tile: TiledConfig, out: TRef, q: TRef, k: TRef, v: TRef, mask: TRef,
                spec: list, note: str) -> None:
    """attention_tiled.comp for a prompt: a workgroup per (query head, tile.bq rows)."""
    hq, t, d = q.shape
    c, dv = v.shape[1], v.shape[2]
    defines = {"BQ": tile.bq, "BK": tile.bk, "RPT": tile.rpt, "TPRG": tile.tprg, "D": d, "DV": dv}
    for name, operand, dims in (("Q_VEC4", q, d), ("K_VEC4", k, d), ("V_VEC4", v, dv)):
        if _vec4_rows(operand, dims):
            defines[name] = 1
    if tile.kv_apart:
        defines["KV_APART"] = 1
    ctx.dispatch("attention_tiled", defines, [out, q, k, v, mask, _ranges_of(ctx, mask)], [0], spec,
                 groups_for(hq * _ceil_div(t, tile.bq)),
                 note=note + f", tiled {tile.bq} rows x {tile.bk} keys, {tile.rpt}x{tile.tprg}")


def _ranges_of(ctx, mask: TRef) -> TRef:
    """The mask's live ranges (_mask_ranges), made once for every attention that reads the
    same mask while it holds (a step's layers)."""
    return ctx.derived(("mask_ranges", mask.buf, mask.offset, mask.strides, mask.shape), {mask.buf},
                       lambda: _mask_ranges(ctx, mask))


def _mask_ranges(ctx, mask: TRef) -> TRef:
    """mask_ranges.comp: each row's first and one-past-last unmasked key and whether all
    keys between are unmasked, [T, 3] int32, for the tiled prompt attention and decode's
    splits."""
    t, c = mask.shape
    ranges = ctx.empty((t, 3), "i32")
    defines = {}
    if _vec4_rows(mask, c):
        defines["M_VEC4"] = 1
    ctx.dispatch("mask_ranges", defines, [ranges, mask], [0], [t, c, mask.offset, *mask.strides],
                 groups_for(t), note=f"live keys of mask[{t}x{c}]")
    return ranges
