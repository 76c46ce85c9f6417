"""Tensor-core matmuls (shaders/matmul_coopmat.comp): when a product may use them, in
which 16-bit format, and with which tile.

Precision is the user's, as torch defines it for CUDA: torch.get_float32_matmul_precision()
at compile time (the config's matmul_precision, in the cache key) decides for fp32 tensors:
- "highest": never; today's exact fp32 kernels;
- "high" and "medium": scaled fp16 (SCALED): each row of A and each column of B is
  multiplied by a power of two that brings its largest finite magnitude into [8, 16),
  rounded to fp16 (10 mantissa bits, as TF32 keeps), multiplied on fp16 tensor cores,
  and the result multiplied back by the powers of two. "high" sums the products in fp32:
  the operands' rounding is then the only error, TF32's on the same inputs (2.94e-4 on
  random 4096^3 matrices on an H100 against TF32's 2.94e-4). "medium", which lets torch
  multiply in bf16, sums FOLD_PRODUCTS["medium"] products at a time in fp16 partial sums
  (each product below 256: no overflow for any input) before adding them into fp32, where
  the device has fp16-accumulator matrices of the fp32 ones' shape: the driver may run
  them faster (on consumer GPUs that halve the fp32-accumulator rate; not on an H100,
  where fp32 sums ran 3% faster, docs/journal.md, session 44), and a partial sum rounds
  at the scale of its largest product (5.3e-4 on the same matrices).
  Where the device has no fp16 x fp16 + fp32 matrices: bf16x3 for "high" (each operand
  split as bf16 hi + bf16 lo, hi*hi + hi*lo + lo*hi in fp32; about fp32's accuracy) and
  bf16 for "medium".
fp16 tensors take scaled fp16 with fp32 sums too (their values scale exactly unless tiny
beside their row's largest); bf16 tensors bf16 with fp32 sums. Where the device lacks a
needed shape or type, or no glslc compiles the kernel, the fp32 kernels run and the note
says why; so they do everywhere with DYNAMO_VULKAN_TENSOR_CORES=off (the config's
tensor_cores).
TILE, SUBGROUPS, BK_CHOICES, FORCE_SPLITS, FORCE_PACK, EXTRA_DEFINES, SCALED_FOR and
BF16_IN_F16 below are read at lowering time (tests and benchmarks/coopmat_sweep.py set
them); a cached plan keeps the choice it was made with. Operands that many tiles read (and
a scaled product's both operands) are converted to 16 bits first (packed_operands,
lowering/coopmat_pack.py).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from dynamo_vulkan import shaders

from . import core

log = logging.getLogger(__name__)

PRECISIONS = ("highest", "high", "medium")
TILE = (128, 128)          # rows and columns of C per workgroup
# Subgroups per workgroup along m and n, the first whose invocations the device allows:
# 16 of 32 x 32 of C each beat 8 of 64 x 32 on every product measured on an H100 (3-8% on
# the 7B's prompt products, 31% on one of 16 tiles; docs/journal.md, session 45), since
# twice the subgroups hide more of each K step's load latency
SUBGROUPS = ((4, 4), (2, 4))
BK_CHOICES = (32, 16, 8)   # K per shared-memory step: the largest whose stages fit
FORCE_SPLITS: int | None = None    # a test's override of the K split (core.k_splits)
EXTRA_DEFINES: dict = {}           # a measurement's extra kernel defines (None: dropped)
# fp32 precisions multiplied as scaled fp16 where the device has its matrices (docstring)
SCALED_FOR = {"high": "f16", "medium": "f16"}
# products summed in fp16 before each addition into fp32 (a whole number of K steps), per
# precision ("fp16": fp16 tensors); 0: every product summed in fp32. At most 128, the most
# whose sum stays finite (below 256 each: below 32,768)
FOLD_PRODUCTS = {"high": 0, "medium": 128, "fp16": 0}
PACK_MIN_READS = 8         # tiles reading an operand from which it is converted first
# K steps whose loads are in flight while one multiplies (the kernel's PREFETCH) where
# both operands are 16-bit copies, whose loads are plain words; a GGUF weight decoded in
# the tile loads keeps one, with which it ran faster (docs/journal.md, session 48)
PREFETCH_PACKED = 2
FORCE_PACK: str | None = None      # a test's or measurement's override: "", "A", "B" or "AB"
# Tests on a device with fp16 but no bf16 cooperative matrices (a newer lavapipe) set this:
# "high" and "medium" then round and split as in bf16 and hold each bf16 value in fp16
# (exact within fp16's range, which real inputs may leave: never for use), so that the
# bf16 kernels' logic runs there.
BF16_IN_F16 = False


@dataclass(frozen=True)
class Plan:
    """One tensor-core kernel: its 16-bit type, whether fp32 operands are split in two
    (SPLIT3), the device's matrix shape and the workgroup tile."""
    dtype: str             # "bf16", "f16", or "bf16-in-f16" (BF16_IN_F16)
    split3: bool
    cm: tuple              # (M, N, K) of one cooperative matrix
    bm: int
    bn: int
    bk: int
    subgroup: int
    scaled: bool = False   # fp16 operands scaled by powers of two (SCALED)
    products: int = 0      # SCALED: products in each fp16 partial sum, 0: fp32 sums (FOLD_PRODUCTS)
    sg: tuple = SUBGROUPS[0]    # subgroups along m and n

    def defines(self) -> dict:
        d = {"CM_BF16" if self.dtype == "bf16" else "CM_F16": 1,
             **({"BF16_IN_F16": 1} if self.dtype == "bf16-in-f16" else {}),
             "BM": self.bm, "BN": self.bn, "BK": self.bk, "SG_M": self.sg[0], "SG_N": self.sg[1],
             "CM_M": self.cm[0], "CM_N": self.cm[1], "CM_K": self.cm[2], "SUBGROUP": self.subgroup}
        if self.split3:
            d["SPLIT3"] = 1
        if self.scaled:
            d["SCALED"] = 1
        if self.scaled and self.products:
            if self.bk * self.fold > 128:   # an fp16 sum of products below 256 stays finite
                raise core.LoweringError(f"scaled fp16 partial sums hold at most 128 products, "
                                         f"not {self.bk} x {self.fold}")
            d |= {"ACC16": 1, "FOLD": self.fold}
        return d

    @property
    def fold(self) -> int:
        """K steps whose fp16 partial sums are added into fp32 at once (SCALED)."""
        return max(1, self.products // self.bk)

    @property
    def label(self) -> str:
        base = "bf16" if self.dtype == "bf16-in-f16" else self.dtype
        kind = f"{base}x3" if self.split3 else \
            f"{base} scaled, fp16 sums of {self.products}" if self.scaled and self.products else \
            f"{base} scaled" if self.scaled else base
        held = " held in fp16" if self.dtype == "bf16-in-f16" else ""
        return (f"tensor cores {kind}{held} {'x'.join(map(str, self.cm))}, tile {self.bm}x{self.bn}x{self.bk} "
                f"in {self.sg[0]}x{self.sg[1]} subgroups")


@dataclass(frozen=True)
class Choice:
    plan: Plan | None
    note: str              # what the debug dump says of this matmul's precision


def shared_bytes(bm: int, bn: int, bk: int, cm: tuple, split3: bool, sg: tuple) -> int:
    """The kernel's shared memory: two stages of A and B tiles of 16-bit elements in the
    larger of their two layouts (rows padded by 8), hi and lo planes with SPLIT3; at least
    the epilogue's fp32 fragment per subgroup, which reuses the stages."""
    a = max(bm * (bk + 8), bk * (bm + 8))
    b = max(bn * (bk + 8), bk * (bn + 8))
    stages = 2 * 2 * (a + b) * (2 if split3 else 1)
    return max(stages, 4 * sg[0] * sg[1] * cm[0] * cm[1])


def _shape(caps: dict, dtype: str, sg: tuple, acc: str = "f32") -> tuple | None:
    """The device's subgroup-scope matrix shape for dtype x dtype + acc -> acc that a
    subgroup's part of the tile holds whole, K dividing the K step, each side a multiple of
    8 (the shared tiles' 16-byte units): 16x16x16 first, else the largest."""
    found = []
    for entry in caps.get("cooperative_matrix_shapes", ()):
        s = dict(entry)
        if (s.get("a"), s.get("b"), s.get("c"), s.get("result"), s.get("scope")) != \
                (dtype, dtype, acc, acc, "subgroup"):
            continue
        cm = (int(s["m"]), int(s["n"]), int(s["k"]))
        if (TILE[0] // sg[0]) % cm[0] == 0 and (TILE[1] // sg[1]) % cm[1] == 0 \
                and any(bk % cm[2] == 0 for bk in BK_CHOICES) and all(c % 8 == 0 for c in cm):
            found.append(cm)
    if not found:
        return None
    return (16, 16, 16) if (16, 16, 16) in found else max(found, key=lambda c: (c[0] * c[1] * c[2], c))


def precision(ctx) -> str:
    """The compile's float32 matmul precision (config), else torch's current setting."""
    value = getattr(getattr(ctx, "cfg", None), "matmul_precision", None)
    return value or torch.get_float32_matmul_precision()


def tensor_cores(ctx) -> str:
    """The compile's tensor-core setting (config): "auto" (where the rules above allow
    them: the default) or "off" (never)."""
    return getattr(getattr(ctx, "cfg", None), "tensor_cores", None) or "auto"


def _tensor_dtype(ctx):
    val = ctx.node.meta.get("val") if ctx.node is not None else None
    return val.dtype if isinstance(val, torch.Tensor) else torch.float32


def choose(ctx, nb: int, m: int, n: int, k: int) -> Choice:
    """Whether this product runs on tensor cores, and how (module docstring)."""
    dtype = _tensor_dtype(ctx)
    caps = ctx.caps
    split3 = False
    if dtype == torch.float16:
        want, scaled, why = "f16", True, "fp16 tensors"
    elif dtype == torch.bfloat16:
        want, scaled, why = "bf16", False, "bf16 tensors"
    else:
        prec = precision(ctx)
        if prec not in PRECISIONS:
            raise core.LoweringError(f"torch float32 matmul precision {prec!r} is not one of {PRECISIONS}")
        if prec == "highest":
            return Choice(None, "")
        scaled, why = prec in SCALED_FOR, f"precision {prec!r}"
        want, split3 = ("f16", False) if scaled else ("bf16", prec == "high")
    if tensor_cores(ctx) == "off":
        return Choice(None, f"fp32 ({why}; tensor cores off: DYNAMO_VULKAN_TENSOR_CORES=off)")
    if not caps.get("cooperative_matrix"):
        return Choice(None, f"fp32 ({why}; the device has no cooperative matrices)")
    subgroup = int(caps.get("subgroup_size", 32))
    sg = next((g for g in SUBGROUPS
               if g[0] * g[1] * subgroup <= caps.get("max_compute_work_group_invocations", 128)), None)
    if sg is None:
        return Choice(None, f"fp32 ({why}; a tensor-core workgroup exceeds the device's invocations)")
    products = 0
    if scaled:
        cm = _shape(caps, "f16", sg)
        if cm is None:
            # no fp16 x fp16 + fp32 matrices: bf16(x3) for fp32 tensors
            scaled = False
            if dtype != torch.float16:
                want, split3 = "bf16", prec == "high"
        elif _shape(caps, "f16", sg, acc="f16") == cm:     # fp16 partial sums where asked for
            products = FOLD_PRODUCTS["fp16" if dtype == torch.float16 else prec]
    if want == "bf16" and not caps.get("bfloat16_cooperative_matrix"):
        if not BF16_IN_F16:
            return Choice(None, f"fp32 ({why}; the device has no bf16 cooperative matrices)")
        want = "bf16-in-f16"
    cm = _shape(caps, "f16" if want == "bf16-in-f16" else want, sg)
    if cm is None:
        return Choice(None, f"fp32 ({why}; no {want} x {want} + f32 matrix shape the tiles hold)")
    if shaders.coopmat_glslc() is None:
        return Choice(None, f"fp32 ({why}; no glslc for cooperative-matrix kernels: "
                            "scripts/glslc_coopmat.sh)")
    bm, bn = TILE
    limit = caps.get("max_compute_shared_memory_size", 16384)
    for bk in BK_CHOICES:
        if bk % cm[2] == 0 and shared_bytes(bm, bn, bk, cm, split3, sg) <= limit:
            plan = Plan(want, split3, cm, bm, bn, bk, subgroup, scaled, products, sg)
            return Choice(plan, f"{plan.label} ({why})")
    return Choice(None, f"fp32 ({why}; the tensor-core tiles exceed the device's shared memory)")


def packed_operands(tiles_m: int, tiles_n: int) -> str:
    """Which operands ("A", "B", both or none) are converted to 16 bits ahead of the matmul
    (coopmat_pack.comp): those that PACK_MIN_READS or more tiles read, each reading its
    16-bit copy at half the bytes of fp32 and converting nothing in its inner loop; an
    operand read by fewer is converted where it is read (its copy would cost more than it
    saves)."""
    if FORCE_PACK is not None:
        return FORCE_PACK
    return ("A" if tiles_n >= PACK_MIN_READS else "") + ("B" if tiles_m >= PACK_MIN_READS else "")


def _packed(ctx, plan: Plan, ref, rows: int, k: int, rows_p: int, kp: int, sb: int, sr: int, sk: int,
            nb: int, norm=None):
    """The 16-bit copy of an operand (coopmat_pack.pack_operand; norm: of its rows'
    rms_norm), made once for every product that reads the same elements in the same layout
    until a dispatch writes a buffer it reads: a prompt's q, k and v projections pack their
    one normalised x once."""
    from .coopmat_pack import pack_operand
    key = ("coopmat_pack", ref.buf, ref.offset, ref.shape, ref.strides, plan.dtype, plan.split3,
           plan.scaled, rows, k, rows_p, kp, sb, sr, sk, nb,
           None if norm is None else (norm[0].buf, norm[0].offset, norm[1]))
    reads = {ref.buf} | ({norm[0].buf} if norm is not None else set())
    return ctx.derived(key, reads, lambda: pack_operand(ctx, plan, ref, rows, k, rows_p, kp, sb, sr,
                                                        sk, nb, norm=norm))


def emit(ctx, plan: Plan, defines: dict, bindings: list, spec: list, out, nb, m, n, k, note,
         weight=None, a_loader=None, a_norm=None) -> None:
    """Dispatch the kernel (K split into slices, then their sum, when its tiles are too few
    to fill the GPU), after the 16-bit copies of the operands that many tiles read.
    weight (coopmat_pack.GGUFWeight), where given, is B: decoded in the kernel's tile
    loads (B_GGUF) or first into its fp16 copy. a_loader (fusion.row_loader), where given,
    computes A (an elementwise expression) in its 16-bit copy; a_norm (weight TRef, eps),
    A's rows' rms_norm."""
    from .coopmat_pack import decodes_inline, pack_operand
    from .matmul import dispatch_tiles, load_groups
    a, b = bindings[1], bindings[2]
    defines = {n: v for n, v in (defines | {"VARIANT": "coopmat"} | plan.defines() | EXTRA_DEFINES).items()
               if v is not None}
    tiles = (-(-n // plan.bn), -(-m // plan.bm))
    packed = "AB" if plan.scaled else packed_operands(tiles[1], tiles[0]) if k else ""
    kp = -(-max(k, 1) // plan.bk) * plan.bk
    bindings = list(bindings)
    if (a_loader is not None or a_norm is not None) and "A" not in packed:
        raise core.LoweringError("an elementwise or normalised A is computed by its 16-bit "
                                 "copy, which this product does not make")
    if "A" in packed and a_loader is not None:
        bindings[1] = pack_operand(ctx, plan, a, m, k, tiles[1] * plan.bm, kp, spec[4], a.strides[1],
                                   a.strides[2], nb, loader=a_loader)
        defines |= {"A_PACKED": 1, "A_ALONG_K": 1}
    elif "A" in packed:
        bindings[1] = _packed(ctx, plan, a, m, k, tiles[1] * plan.bm, kp, spec[4], a.strides[1],
                              a.strides[2], nb, norm=a_norm)
        defines |= {"A_PACKED": 1, "A_ALONG_K": 1}
    else:
        load_groups(defines, "A", a.strides[2], a.strides[1], k, m, a.offset, spec[4])
    inline = weight is not None and decodes_inline(weight.qtype, plan, m, weight.n, weight.k)
    if weight is not None:
        if not plan.scaled or nb != 1:
            raise core.LoweringError("a GGUF weight as B needs a scaled, unbatched product")
        if inline:
            bindings[2] = weight.ref
            defines |= {f"QTYPE_{weight.qtype}": 1, "B_GGUF": 1, "B_ALONG_K": 1}
            spec = spec[:7] + [0, 0, 1, weight.row_bytes] + spec[11:]     # B_SN: W's row bytes
            note = f"{note}, W decoded from its {weight.qtype} blocks in the tile loads"
        else:
            bindings[2] = weight.pack(ctx, plan, tiles[0] * plan.bn, kp)
            defines |= {"B_PACKED": 1, "B_ALONG_K": 1}
    elif "B" in packed:
        bindings[2] = _packed(ctx, plan, b, n, k, tiles[0] * plan.bn, kp, spec[8], b.strides[2], b.strides[1], nb)
        defines |= {"B_PACKED": 1, "B_ALONG_K": 1}
    else:
        load_groups(defines, "B", b.strides[1], b.strides[2], k, n, b.offset, spec[8])
    if "A_PACKED" in defines and "B_PACKED" in defines:
        defines.setdefault("PREFETCH", PREFETCH_PACKED)
    if packed:
        first = packed.replace("B", "") if inline else packed
        note = f"{note}, {first} in 16 bits first"
    count = tiles[0] * tiles[1] * nb
    splits, _ = core.k_splits(ctx.caps, count, k, nb * m * n, max_bytes=core.split_k_max_bytes(k, n))
    if FORCE_SPLITS is not None:
        splits = FORCE_SPLITS
    ks = -(-k // (splits * plan.bk)) * plan.bk if k else plan.bk
    splits = -(-k // ks) if k else 1
    dispatch_tiles(ctx, "matmul_coopmat", defines, bindings, spec, out, tiles, nb, m, n, splits, ks, note)
