"""Matmul family: mm, bmm, addmm, baddbmm (and addmv / addbmm through misc.py), with
transposed or broadcast operands read through their strides.

Three kernels, chosen by shape and layout:
- few rows of A (decode) and B contiguous along n (x @ W, W [K, N] row-major):
  matvec.comp COLS, neighbouring threads on neighbouring columns, K split across
  threads and, when the columns are too few to fill a GPU, across workgroups whose
  last one adds the partial sums (one kernel);
- few rows of A and B contiguous along k (x @ W^T, nn.Linear): matvec.comp, one
  workgroup per output column, threads along K;
- otherwise matmul.comp, tiled, its tile chosen per device and shape (GPU_TILES),
  K split over more workgroups when the tiles are too few to fill a GPU (partial
  products, then one elementwise sum);
- or, in that case, on tensor cores (matmul_coopmat.comp, coopmat.py chooses) where the
  device has cooperative matrices and torch's float32 matmul precision allows them
  ("high", "medium"), or always for fp16 and bf16 tensors.
The module-level knobs below are read at lowering time (scratch scripts that
measure variants set them); a cached plan keeps the choice it was made with.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from dynamo_vulkan import device

from . import coopmat, core
from .core import (Context, LoweringError, TRef, cpu_lanes, cpu_lanes_groups, f32_bits, host_matmul,
                   k_splits, lowering)
from .elementwise import add_slices

aten = torch.ops.aten


@dataclass(frozen=True)
class Tile:
    """A tiled kernel's shape: a bm x bn tile of C per workgroup, K steps of bk,
    tm x tn outputs per thread (multiples of 4: whole vec4s)."""
    bm: int
    bn: int
    bk: int
    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def shared_bytes(self) -> int:
        """Two copies (double buffering) of both K-major tiles, one vec4 of padding a row."""
        return 2 * self.bk * ((self.bm // 4 + 1) + (self.bn // 4 + 1)) * 16

    @property
    def name(self) -> str:
        return f"tiled{self.bm}x{self.bn}x{self.bk}"

    def defines(self) -> dict:
        return {"BM": self.bm, "BN": self.bn, "BK": self.bk, "TM": self.tm, "TN": self.tn}


# GPUs: the largest tile first (most arithmetic per shared-memory read); a smaller one
# when the large tiles would be too few to fill the GPU even with K split.
GPU_TILES = (Tile(128, 128, 8, 8, 8), Tile(128, 64, 8, 8, 4), Tile(64, 64, 16, 4, 4))
# CPU devices (lavapipe): the large tile is the faster there too (docs/journal.md, session 29)
CPU_TILE = Tile(128, 128, 8, 8, 8)
# Vulkan's minimum limits (16 KiB shared memory, 128 invocations) hold this one
SMALL_TILE = Tile(32, 32, 8, 4, 4)
FORCE_TILE: Tile | None = None     # a measurement's override of the choice

SKINNY_M = 8     # rows up to which B contiguous along k takes the mat-vec kernel
MV_WG = 64       # its workgroup size (a subgroup, for short K)
COLS_M = 16      # rows up to which B contiguous along n takes the COLS mat-vec kernel
COLS_MIN_WEIGHT = 1 << 16   # ... with B of at least this many elements (or more rows than
# SKINNY_M): below, B's reads are too few for coalescing to matter, and the one-workgroup-
# per-column kernel is shorter (docs/journal.md, session 29)
COLS_WG = 256    # COLS: threads per workgroup at most
COLS_MIN_ROWS = 16       # ... k-rows per thread at least (loads per thread in flight)
COLS_TARGET_WGS = 256    # ... workgroups wanted on a GPU (K split across them)
COLS_MAX_SPLITS = 32
COLS_RED_VEC4S = 1024    # ... shared memory of the partial-sum exchange (16 KiB)


def matmul(ctx: Context, a: TRef, b: TRef, bias=None, alpha=1.0, beta=1.0, out: TRef | None = None,
           weight=None, a_loader=None, a_norm=None) -> TRef:
    """alpha * a @ b (+ beta * bias, broadcast) for 2-D or batched 3-D a and b, into a
    new contiguous output (or `out`, contiguous from offset 0: a GGUF linear's); the
    kernel is chosen by the rows of a and b's layout. weight: b as a GGUF weight for the
    scaled tensor-core kernels (coopmat_pack.GGUFWeight); b then gives only the layout,
    and the product takes those kernels (an error where they do not take it). a_loader
    (fusion.row_loader): a is an elementwise expression that those kernels' 16-bit copy
    of it computes (a then gives only its shape), with weight only; a_norm (weight TRef,
    eps): that copy holds rms_norm(a) of a's rows, with weight only."""
    if (a_loader is not None or a_norm is not None) and weight is None:
        raise LoweringError("an elementwise or normalised A is taken with a GGUF weight only")
    if a.ndim == 2:
        a = a.with_layout((1,) + a.shape, (0,) + a.strides, a.offset)
        b = b.with_layout((1,) + b.shape, (0,) + b.strides, b.offset)
    nb, m, k = a.shape
    n = b.shape[2]
    if out is None:
        out = ctx.empty(ctx.out_shape(), "f32")
    if out.numel == 0:
        return out
    sb_a = a.strides[0] if a.shape[0] > 1 else 0
    sb_b = b.strides[0] if b.shape[0] > 1 else 0
    spec = [m, n, k, a.offset, sb_a, a.strides[1], a.strides[2],
            b.offset, sb_b, b.strides[1], b.strides[2], 0, 0, 0, 0, f32_bits(alpha), f32_bits(beta)]
    defines: dict = {}
    bindings = [out, a, b]
    if bias is not None and beta != 0:
        c = ctx.ref(bias)
        pad = 3 - c.ndim
        sizes = (1,) * pad + c.shape
        strides = (0,) * pad + c.strides
        spec[11:15] = [c.offset, *(0 if sz == 1 else st for sz, st in zip(sizes, strides))]
        defines["HAS_BIAS"] = 1
        bindings.append(c)
    note = f"[{nb}x{m}x{k}] @ [{k}x{n}]"
    if weight is None and m <= COLS_M and _along_n(b, n) and (m > SKINNY_M or k * n >= COLS_MIN_WEIGHT):
        _cols(ctx, defines, bindings, spec, nb, m, n, k, note)
    elif weight is None and m <= SKINNY_M:
        _rows(ctx, defines, bindings, spec, nb, m, n, k, note)
    else:
        choice = coopmat.choose(ctx, nb, m, n, k)
        if choice.plan is not None:
            coopmat.emit(ctx, choice.plan, defines, bindings, spec, out, nb, m, n, k,
                         f"{note}, {choice.note}", weight=weight, a_loader=a_loader, a_norm=a_norm)
        elif weight is not None:
            raise LoweringError(f"{note}: B is a GGUF weight for tensor cores that this product does not take")
        else:
            _tiled(ctx, defines, bindings, spec, out, nb, m, n, k,
                   f"{note}, {choice.note}" if choice.note else note)
    return out


def _along_n(b: TRef, n: int) -> bool:
    """Whether B's neighbouring words run along n (x @ W with W [K, N] row-major), so
    the mat-vec must put neighbouring threads on neighbouring columns to coalesce."""
    sk, sn = b.strides[1], b.strides[2]
    return n > 1 and sn != 0 and (sn == 1 or sn < sk) and sk != 1


def _aligned(*values: int) -> bool:
    return all(v % 4 == 0 for v in values)


def _rows(ctx, defines, bindings, spec, nb, m, n, k, note) -> None:
    """B along k: one workgroup per column, threads over K; a single subgroup when K
    is short (its sums then meet without shared memory or a barrier)."""
    sg = max(1, int(ctx.caps.get("subgroup_size", 32)))
    # at least one thread per row of A: thread m writes row m's sum (subgroups of 4,
    # lavapipe's 128-bit build, made 4 threads for k <= 4 and left a 5th row unwritten)
    wg = min(MV_WG, max(sg, 1 << max(0, k - 1).bit_length(), 1 << max(0, m - 1).bit_length()))
    defines |= {"VARIANT": "skinny", "MROWS": m}
    ctx.dispatch("matvec", defines, bindings, [0], [wg] + spec,
                 (min(n, 65535), -(-n // 65535), nb), note=note)


def cols_params(caps: dict, nb: int, m: int, n: int, k: int) -> dict:
    """The COLS mat-vec's mapping: column quads per workgroup (CQ: few idle, and fewer
    for more rows of A, so that the last split's merge has at most 4 outputs of 4
    columns per thread), k slices (KT, each thread keeping COLS_MIN_ROWS rows), and on
    a GPU the K splits that bring the workgroups to COLS_TARGET_WGS (none on CPU
    devices, whose few threads any grid keeps busy)."""
    quads = -(-n // 4)
    if quads < 8:
        cq = 1 << (quads - 1).bit_length()
    else:
        widest = 64 if m <= 4 else 32 if m <= 8 else 16
        cq = next((c for c in (64, 32, 16) if c <= widest and -(-quads // c) * c - quads <= quads // 8), 8)
    kt = 1
    while kt * 2 <= min(COLS_WG // cq, max(1, k // COLS_MIN_ROWS)):
        kt *= 2
    wg = cq * kt
    blocks = -(-quads // cq)
    splits = 1
    if not device.is_cpu(caps) and k > 0:
        fit = int(caps.get("max_storage_buffer_range", 128 << 20)) // (4 * nb * m * n)
        splits = max(1, min(-(-COLS_TARGET_WGS // (blocks * nb)), k // (kt * COLS_MIN_ROWS),
                            COLS_MAX_SPLITS, fit))
    ks = -(-k // (splits * 4)) * 4 if k else 4      # whole groups of 4 k-rows
    splits = -(-k // ks) if k else 1
    unroll = 4 if m <= 4 else 2
    return {"CQ": cq, "KT": kt, "blocks": blocks, "splits": splits, "ks": ks,
            "UNROLL": unroll, "MC": max(1, min(m, COLS_RED_VEC4S // wg))}


def _cols(ctx, defines, bindings, spec, nb, m, n, k, note) -> None:
    """B along n: the COLS mat-vec (matvec.comp), K split across workgroups on a GPU,
    their partial sums added by the last of each column block to finish."""
    a, b = bindings[1], bindings[2]
    p = cols_params(ctx.caps, nb, m, n, k)
    defines |= {"VARIANT": "cols", "COLS": 1, "MROWS": m, "CQ": p["CQ"], "KT": p["KT"],
                "UNROLL": p["UNROLL"], "MC": p["MC"]}
    if a.strides[2] == 1 and _aligned(a.offset, spec[4], a.strides[1] if m > 1 else 0):
        defines["A_VEC4"] = 1
    if b.strides[2] == 1 and _aligned(n, b.offset, spec[8], b.strides[1]):
        defines["B_VEC4"] = 1
    spec = [p["CQ"] * p["KT"]] + spec + [p["ks"], p["splits"], nb]
    writes = [0]
    if p["splits"] > 1:
        part = ctx.empty((p["splits"], nb, m, n), "f32")
        # zero at upload; each column block's last split resets its count for the next call
        counter = ctx.buffer(p["blocks"] * nb, "const", "i32", np.zeros(p["blocks"] * nb, np.uint32))
        base = len(bindings)
        defines |= {"SPLIT_K": 1, "PART_BINDING": base, "COUNT_BINDING": base + 1}
        if n % 4 == 0:
            defines["PART_VEC4"] = 1
        bindings = bindings + [part, counter]
        writes += [base, base + 1]
        note += f", K in {p['splits']} splits"
    ctx.dispatch("matvec", defines, bindings, writes, spec, (p["blocks"], p["splits"], nb), note=note)


def _fits(tile: Tile, caps: dict) -> bool:
    return tile.shared_bytes <= caps.get("max_compute_shared_memory_size", 16384) and \
        tile.threads <= caps.get("max_compute_work_group_invocations", 128)


def choose_tile(caps: dict, nb: int, m: int, n: int, k: int) -> tuple[Tile, int, int]:
    """(tile, K splits, K per split): on a GPU the largest tile whose workgroups, with
    K split (core.k_splits), fill the GPU; failing that the one giving most workgroups.
    Tiles the device cannot hold (shared memory, threads) are skipped; SMALL_TILE fits
    Vulkan's minimum limits, for devices that hold none of the others."""
    if FORCE_TILE is not None:
        tiles = (FORCE_TILE,)
    elif device.is_cpu(caps):
        tiles = (CPU_TILE,)
    else:
        tiles = GPU_TILES
    tiles = [t for t in tiles if _fits(t, caps)] or [t for t in (SMALL_TILE,) if _fits(t, caps)]
    if not tiles:
        raise LoweringError(f"no matmul tile fits this device's limits (shared memory "
                            f"{caps.get('max_compute_shared_memory_size')} bytes, "
                            f"{caps.get('max_compute_work_group_invocations')} invocations)")
    best = None
    for t in tiles:
        count = -(-n // t.bn) * -(-m // t.bm) * nb
        splits, ks = k_splits(caps, count, k, nb * m * n)
        if count * splits >= core.SPLIT_K_WGS:
            return t, splits, ks
        if best is None or count * splits > best[0]:
            best = (count * splits, t, splits, ks)
    return best[1:]


def load_groups(defines, name, sk, so, k, other, offset, sb) -> None:
    """How the tiled kernel reads operand `name` (strides sk along k, so along its other
    dimension of size `other`, batch stride sb): in groups of 4 along k (NAME_ALONG_K)
    when k has the unit (or the smaller) stride, else along the other dimension; as
    16-byte loads (NAME_VEC4) where the unit-stride groups are all aligned."""
    if sk == 1 or (so != 1 and sk < so):
        defines[f"{name}_ALONG_K"] = 1
        if sk == 1 and _aligned(k, offset, sb, so if other > 1 else 0):
            defines[f"{name}_VEC4"] = 1
    elif so == 1 and _aligned(other, offset, sb, sk if k > 1 else 0):
        defines[f"{name}_VEC4"] = 1


def _tiled(ctx, defines, bindings, spec, out, nb, m, n, k, note) -> None:
    """The tiled kernel; its global loads grouped along each operand's unit-stride
    dimension, 16-byte loads where every group is aligned."""
    a, b = bindings[1], bindings[2]
    lanes = cpu_lanes(ctx.caps, n) if FORCE_TILE is None else None
    grid = cpu_lanes_groups(lanes, m, n, nb) if lanes else None
    if grid and max(grid) <= 65535:    # else the tiles' grid
        load_groups(defines, "B", b.strides[1], b.strides[2], k, n, b.offset, spec[8])
        ctx.dispatch("matmul", defines | {"VARIANT": "lanes"} | lanes, bindings, [0], spec, grid, note=note)
        return
    tile, splits, ks = choose_tile(ctx.caps, nb, m, n, k)
    defines |= {"VARIANT": tile.name} | tile.defines()
    load_groups(defines, "A", a.strides[2], a.strides[1], k, m, a.offset, spec[4])
    load_groups(defines, "B", b.strides[1], b.strides[2], k, n, b.offset, spec[8])
    if n % 4 == 0:
        defines["OUT_VEC4"] = 1
    tiles = (-(-n // tile.bn), -(-m // tile.bm))
    dispatch_tiles(ctx, "matmul", defines, bindings, spec, out, tiles, nb, m, n, splits, ks, note)


def dispatch_tiles(ctx, family: str, defines, bindings, spec, out, tiles, nb, m, n, splits, ks,
                   note) -> None:
    """A tiled matmul kernel (matmul, matmul_coopmat) over its grid of tiles; with K in
    `splits` slices of `ks` (too few tiles to fill the GPU), each slice a partial product
    into a scratch buffer, then their sum into out."""
    if splits == 1:
        ctx.dispatch(family, defines, bindings, [0], spec, (*tiles, nb), note=note)
        return
    part = ctx.empty((splits, nb, m, n), "f32")
    ctx.dispatch(family, defines, [part] + bindings[1:], [0], spec + [ks, splits, nb],
                 (*tiles, nb * splits), note=f"{note}, K in {splits} splits")
    add_slices(ctx, part, out.with_layout((nb, m, n), (m * n, n, 1), out.offset))


def _check(node):
    """Prompt-sized products on a CPU device run on the host (core.host_matmul)."""
    val = node.meta.get("val")
    return host_matmul(val.shape[-2]) if isinstance(val, torch.Tensor) and val.ndim >= 2 else None


@lowering(aten.mm.default, aten.bmm.default, check=_check)
def mm(ctx, a, b):
    return matmul(ctx, ctx.ref(a), ctx.ref(b))


@lowering(aten.addmm.default, aten.baddbmm.default, check=_check)
def addmm(ctx, bias, a, b, beta=1.0, alpha=1.0):
    return matmul(ctx, ctx.ref(a), ctx.ref(b), bias, alpha, beta)
