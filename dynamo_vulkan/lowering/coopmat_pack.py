"""The 16-bit copy of a tensor-core matmul's operand (shaders/coopmat_pack.comp), made
once ahead of the matmul where many of its tiles read that operand (coopmat.packed_operands):
they then read half the bytes and convert nothing in their inner loop."""
from __future__ import annotations

from dataclasses import dataclass

from . import core

WG = 256    # coopmat_pack.comp's workgroup
# octets of 8 an invocation of an elementwise operand's pack holds in registers at most
# (LZ_OCT, its expression computed once); past that it computes them again for the stores
LAZY_KEPT_OCTETS = 12
ALONG_ROWS_SROWS = 8     # rows a workgroup scales along its rows: one 32-byte sector a read


def scaled_rows(along_rows: bool, kp: int, plain: bool = True) -> int:
    """Rows a workgroup of the scaled pack takes (coopmat_pack.comp's SROWS; rows_p is a
    multiple of 32): along its rows ALONG_ROWS_SROWS; along k one row where a row's octets
    fill the workgroup, else as many rows as leave at least 32 invocations a row (a plain
    fp32 operand only: the norm, an elementwise expression and GGUF blocks take a row a
    workgroup)."""
    if along_rows:
        return ALONG_ROWS_SROWS
    if not plain:
        return 1
    lanes = 32
    while lanes < WG and lanes * 8 < kp:
        lanes *= 2
    return WG // lanes


def _scaled_copy(ctx, rows_p: int, kp: int):
    """The buffer of one batch's scaled fp16 copy: rows_p rows of kp fp16 values, then each
    row's exponent."""
    return ctx.empty((rows_p * kp // 2 + rows_p,), "f32")


def pack_operand(ctx, plan, ref, rows: int, k: int, rows_p: int, kp: int, sb: int, sr: int, sk: int,
                 nb: int, loader=None, norm=None):
    """The 16-bit copy of one operand (rows x k per batch, strides sb, sr, sk) that
    matmul_coopmat.comp reads as A_PACKED / B_PACKED: rows_p x kp per batch, zero padded.
    loader (fusion.row_loader from binding 1, scaled plans, one batch): the operand is an
    elementwise expression computed as the pack loads it (ref then gives its shape only).
    norm (weight TRef, eps; scaled plans, one batch, rows along k): the operand is
    rms_norm(ref) of its rows, computed here."""
    if loader is not None:
        if not plan.scaled or (nb != 1 and sb) or loader.base != 1:
            raise core.LoweringError("an elementwise operand is packed by the scaled fp16 "
                                     "kernels only, one batch, its loader bound from 1")
        dst = _scaled_copy(ctx, rows_p, kp)
        defines = {"VARIANT": "f16 lazy", "CM_F16": 1, "SCALED": 1, "X_LAZY": loader.decls}
        octets = -(-kp // (8 * WG))       # an invocation's octets, kept in registers where few
        if octets <= LAZY_KEPT_OCTETS:
            defines["LZ_OCT"] = octets
        ctx.dispatch("coopmat_pack", defines,
                     [dst, *loader.buffers], [0], [WG, rows, k, 0, 0, 0, 0, 1, rows_p, kp],
                     core.groups_for(rows_p * WG, WG),
                     note=f"elementwise [{rows}x{k}] computed to 16 bits for {plan.label}")
        return dst
    if norm is not None and (not plan.scaled or (nb != 1 and sb) or sk != 1):
        raise core.LoweringError("rms_norm rows are packed by the scaled fp16 kernels only, "
                                 "one batch, the rows along k")
    batches = nb if sb else 1
    planes = 2 if plan.split3 else 1
    octets = batches * rows_p * kp // 8
    # 16 bytes an octet; SCALED: then each row's exponent (one word a row)
    dst = ctx.empty((planes * octets * 4 + (batches * rows_p if plan.scaled else 0),), "f32")
    defines = {"VARIANT": plan.dtype, **{n: v for n, v in plan.defines().items()
                                         if n in ("CM_BF16", "CM_F16", "BF16_IN_F16", "SPLIT3", "SCALED")}}
    if sr == 1 and sk != 1:
        defines["ALONG_ROWS"] = 1
    # SCALED: a workgroup a group of scaled_rows rows; else an invocation an octet
    count = octets
    if plan.scaled:
        srows = scaled_rows("ALONG_ROWS" in defines, kp, norm is None)
        defines["SROWS"] = srows
        count = batches * rows_p // srows * WG
    bindings, spec = [dst, ref], [WG, rows, k, ref.offset, sb, sr, sk, batches, rows_p, kp]
    note = f"[{batches}x{rows}x{k}] to 16 bits for {plan.label}"
    if norm is not None:
        defines["NORM"] = 1
        bindings.append(norm[0])
        spec += [core.f32_bits(norm[1]), norm[0].offset]
        note = f"rms_norm of {note}"
    ctx.dispatch("coopmat_pack", defines, bindings, [0], spec, core.groups_for(count, WG), note=note)
    return dst


# GGUF types whose blocks bound their magnitudes from their scales alone and load apart from
# their decoding (gguf_blocks.glsl's gb_bound, gb_raw8): the tensor-core kernel can decode
# them in its tile loads (B_GGUF)
BOUNDED_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"})
# ... where the product has at most this many rows of tiles: each row of tiles decodes W
# again, and the decoding's instructions compete with the multiplies. One row of tiles
# runs faster decoding in the tile loads than from W's fp16 copy, two as fast; from three
# on the copy wins (at the cost of its buffer), since the kernel keeps two K steps of
# loads in flight where both operands are 16-bit copies (coopmat.PREFETCH_PACKED) and one
# where it decodes. A weight of fewer than INLINE_MANY_MIN_WEIGHTS elements, whose copy
# is small and cheap, is decoded in the tile loads for one row of tiles only
# (docs/journal.md, sessions 37, 46 and 49)
INLINE_MAX_TILES_M = 2
INLINE_MANY_MIN_WEIGHTS = 4 << 20


def decodes_inline(qtype: str, plan, m: int, n: int, k: int) -> bool:
    """Whether the tensor-core kernel decodes a GGUF weight W [n, k] of qtype in its tile
    loads for a product of m rows (else W is first decoded into its fp16 copy)."""
    most = INLINE_MAX_TILES_M if n * k >= INLINE_MANY_MIN_WEIGHTS else 1
    return qtype in BOUNDED_TYPES and -(-m // plan.bm) <= most


@dataclass(frozen=True)
class GGUFWeight:
    """B of x @ W^T given as a GGUF weight W [n, k]: its blocks, their type's defines
    (VARIANT, QTYPE_) and its row bytes. The scaled tensor-core kernel decodes the blocks
    in its tile loads where decodes_inline says so (no copy of W); else W is first decoded
    whole into the kernel's fp16 copy (pack_gguf)."""
    ref: object
    defines: dict
    n: int
    k: int
    row_bytes: int

    @property
    def qtype(self) -> str:
        return self.defines["VARIANT"]

    def pack(self, ctx, plan, rows_p: int, kp: int):
        return pack_gguf(ctx, plan, self.ref, self.defines, self.n, self.k, self.row_bytes, rows_p, kp)


def pack_gguf(ctx, plan, w, qdefines: dict, n: int, k: int, row_bytes: int, rows_p: int, kp: int):
    """The scaled fp16 copy of a GGUF weight W [n, k] (qdefines: its VARIANT and QTYPE_),
    decoded from its blocks by coopmat_pack.comp (GGUF), laid out as pack_operand's B of
    x @ W^T: rows_p rows of kp elements, then each row's exponent."""
    if not plan.scaled:
        raise ValueError("GGUF weights are packed for the scaled fp16 kernels only")
    dst = _scaled_copy(ctx, rows_p, kp)
    defines = {**qdefines, "CM_F16": 1, "SCALED": 1, "GGUF": 1}
    ctx.dispatch("coopmat_pack", defines, [dst, w], [0],
                 [WG, n, k, 0, 0, 0, 1, 1, rows_p, kp, row_bytes],
                 core.groups_for(rows_p * WG, WG),
                 note=f"{qdefines['VARIANT']}[{n}x{k}] decoded to 16 bits for {plan.label}",
                 weight_copy=True)
    return dst
