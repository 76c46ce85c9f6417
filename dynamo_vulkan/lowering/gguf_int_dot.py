"""The integer-dot GGUF mat-vec of one row of x: x quantised to int8 planes
(gguf_xplanes.comp, or a producer that writes them: decode attention's merge), then packed
dot products with W's quants (gguf_matvec_idot.comp). Which mat-vecs take it
(use_int_dot), its shapes by weight type and kind, and the planes shared between the
mat-vecs of one x (Context.derived); lowering/gguf.py's emit_linear calls it."""
from __future__ import annotations

from dynamo_vulkan import device
from dynamo_vulkan.gguf.quants import QUANT_TYPES

from .coopmat import precision
from .core import Context, LoweringError, TRef, f32_bits, groups_for, vec4_rows
from .fusion import RowLoader

# The integer-dot mat-vec (gguf_matvec_idot.comp; devices created with
# shaderIntegerDotProduct, kp patch 7; the config's int_dot): x quantized into three int8
# planes per block of 32 (gguf_xplanes.comp, fp32-accurate), then 8 packed dot products
# per plane and block instead of decoding and multiplying every element. Under matmul
# precision "high" or "medium" two planes (x to 2^-16 of its block's largest value, well
# inside TF32's 2^-11 of each element; one plane's 2^-8 of the block's largest would pass
# bf16's error wherever activations have outliers): a third less of the dot products and
# of x's loads. "auto" takes it
# where it measured faster (docs/journal.md, session 29): the INT_DOT_AUTO types from
# INT_DOT_AUTO_WEIGHTS (not Q8_0, whose fp32 kernel streams its bytes well), and every
# type from INT_DOT_PROLOGUE_WEIGHTS where a prologue (an RMSNorm, or silu(gate) * up) is
# folded into the planes, which then compute it once for every mat-vec that reads them;
# both for rows of INT_DOT_MIN_COLS or more (a thread takes a block of 32 at a time).
# the types it decodes, and whether x's planes hold their bytes in nibble order (the
# 4-bit types: gguf_xplanes.comp NIBBLES) or element order
INT_DOT_TYPES = {"Q4_0": 1, "Q4_1": 1, "Q4_K": 1, "Q8_0": 0, "Q6_K": 0}
INT_DOT_AUTO = ("Q4_0", "Q4_1", "Q4_K", "Q6_K")   # the types "auto" takes it for, x read as it is
INT_DOT_AUTO_WEIGHTS = 32 << 20    # ... from this many rows x cols
# with a prologue (an RMSNorm or elementwise producer, which the planes compute once):
# every INT_DOT_TYPES weight of this many rows x cols. A 7B's q|k (4096 x 3584) is past it
# and decodes faster so (its planes beside v's fp32 mat-vec, then integer dots); its v
# (512 x 3584) is not, and decodes slower from planes (docs/journal.md, session 52)
INT_DOT_PROLOGUE_WEIGHTS = 8 << 20
INT_DOT_MIN_COLS = 2048     # rows of W at least this long, for "auto" either way
# The integer-dot mat-vec's shape: (rows of W a workgroup, threads) by weight type (None:
# any other) and the weight's kind: "many" rows (INT_DOT_MANY_ROWS or more), else "long"
# rows (INT_DOT_LONG_ROWS columns or more) or "few"; and INT_DOT_UNROLL blocks a thread
# loads before summing any. Swept on the H100 with x in two planes at 7B and 8B shapes
# (docs/journal.md, sessions 41 and 42): few long rows (a 7B's down, 3584 x 18944) run best
# a row to 32 threads, which keeps more of each thread's blocks in flight; few short rows
# (3584 or 4096 square) two rows to 64; many rows two rows to 32 threads, except Q6_K's,
# whose larger blocks favour 64.
INT_DOT_SHAPES = {(None, "few"): (2, 64), (None, "long"): (1, 32), (None, "many"): (2, 32),
                  ("Q6_K", "many"): (2, 64)}
INT_DOT_MANY_ROWS = 16384
INT_DOT_LONG_ROWS = 8192
INT_DOT_UNROLL = 2
# ... except where more blocks in flight measured faster: Q6_K's few long rows (a 7B's down
# projection; Q4_K's keep 2: docs/journal.md, session 52)
INT_DOT_UNROLLS = {("Q6_K", "long"): 4}
# invocations of a planes workgroup: with an RMSNorm each workgroup sums x^2 over the whole
# row, so fewer, wider workgroups take fewer loads a thread (64 and 256 measured slower:
# docs/journal.md, session 52)
XPLANES_WG = 128


def _name_of(qtype) -> str | None:
    """The GGUF type's name (Q4_K, ...), None for a number that is not one."""
    info = QUANT_TYPES.get(qtype)
    return info.name if info is not None else None


def use_int_dot(ctx: Context, qtype: int, m: int, n: int, k: int, x2: TRef,
                fused: bool, prologue: bool) -> bool:
    """Whether a mat-vec takes the integer-dot path (the config's int_dot): one row of x with
    unit stride, no post-norm fused in (an RMSNorm or elementwise prologue goes into x's
    planes), a type it decodes, a device created with shaderIntegerDotProduct; for
    "auto", a GPU and a weight of a type and size where it measured faster (larger ones,
    and not Q8_0 where no prologue's recomputation is saved)."""
    if m != 1 or fused or x2.strides[1] != 1:
        return False
    return int_dot_weight(ctx, qtype, n, k, prologue)


def int_dot_weight(ctx: Context, qtype: int, n: int, k: int, prologue: bool) -> bool:
    """use_int_dot's rule for the weight and the device: what the graph-level fusion
    choices (norm_feeds_matvecs) can know before x is lowered."""
    mode, name = ctx.cfg.int_dot, _name_of(qtype)
    if mode == "off" or name not in INT_DOT_TYPES:
        return False
    if mode == "auto":
        if not ctx.caps.get("integer_dot_product") or device.is_cpu(ctx.caps):
            return False
        if k < INT_DOT_MIN_COLS:
            return False
        if prologue:
            return n * k >= INT_DOT_PROLOGUE_WEIGHTS
        return name in INT_DOT_AUTO and n * k >= INT_DOT_AUTO_WEIGHTS
    if not ctx.caps.get("integer_dot_product"):
        raise LoweringError("DYNAMO_VULKAN_INT_DOT=on, but the Vulkan device was created "
                            "without shaderIntegerDotProduct (it lacks "
                            "VK_KHR_shader_integer_dot_product, or kp was built without "
                            "kp patch 07-integer-dot-product: run scripts/setup.sh)")
    return True


def emit_int_dot(ctx: Context, out: TRef, x2: TRef, w: TRef, defines: dict, n: int, k: int,
                 rb: int, row0: int, residual: TRef | None, norm, loader: RowLoader | None,
                 note: str, disjoint=()) -> None:
    """x's int8 planes (gguf_xplanes; with norm, of x RMS-normalised; with loader, of the
    elementwise expression it computes), then the integer-dot mat-vec into out[0, row0..].
    Mat-vecs of the same x (and norm, or loader) share one planes dispatch (q, k and v;
    gate and up; a split weight's chunks), unless a dispatch since has written a buffer
    the planes read."""
    nb = k // 32
    nibbles = INT_DOT_TYPES[defines["VARIANT"]]
    if loader is not None:     # the same expression of the same operands
        read = {b.buf for b in loader.buffers}
        key = ("xplanes", "loader", loader.decls, loader.base, nibbles,
               tuple((b.buf, b.offset, b.strides, b.shape) for b in loader.buffers))
    else:
        read = {x2.buf} | ({norm[0].buf} if norm is not None else set())
        key = planes_key(x2, k, nibbles, None if norm is None else (norm[0].buf, norm[0].offset, norm[1]))
    count = x_planes(ctx)
    planes = ctx.derived(key + (count,), read,
                         lambda: emit_planes(ctx, x2, nb, nibbles, k, norm, loader, count))
    bindings = [out, planes, w]
    kind = "many" if n >= INT_DOT_MANY_ROWS else "long" if k >= INT_DOT_LONG_ROWS else "few"
    nr, wg = INT_DOT_SHAPES.get((defines["VARIANT"], kind), INT_DOT_SHAPES[None, kind])
    unroll = INT_DOT_UNROLLS.get((defines["VARIANT"], kind), INT_DOT_UNROLL)
    defines = defines | {"NR": nr, "UNROLL": unroll, "PLANES": count}
    if residual is not None:
        defines["RESIDUAL"] = 1
        bindings.append(residual)
        note += " + residual"
    ctx.dispatch("gguf_matvec_idot", defines, bindings, [0],
                 [wg, n, k, rb, row0,
                  residual.offset if residual is not None else 0],
                 groups_for(n, nr), note=note + " (integer dot products)", disjoint=disjoint)


def planes_key(x2: TRef, k: int, nibbles: int, norm=None) -> tuple:
    """What identifies the int8 planes of x2's one row of k words at unit stride (of its
    RMSNorm by `norm`, a key of its weight and eps), less their count (ctx.derived)."""
    return ("xplanes", x2.buf, x2.offset, k, nibbles, norm)


def planes_ready(ctx: Context, x2: TRef, k: int, qtype: int) -> bool:
    """Whether planes of x2's row for this weight's type were made and still hold (decode
    attention's merge writes them for the output projection): its mat-vec then takes the
    integer-dot path as one with a prologue does, its planes costing no kernel."""
    name = _name_of(qtype)
    if name not in INT_DOT_TYPES or x2.shape[0] != 1 or x2.strides[1] != 1:
        return False
    return ctx.has_derived(planes_key(x2, k, INT_DOT_TYPES[name]) + (x_planes(ctx),), {x2.buf})


def provide_planes(ctx: Context, out: TRef, k: int, planes_of: tuple[int, int], planes: TRef) -> None:
    """Record `planes`, written by the last dispatch, as the planes (planes_for_reader's
    NIBBLES and PLANES) of out's first k words."""
    nibbles, count = planes_of
    row = TRef(out.buf, (1, k), (k, 1), out.offset, "f32")
    ctx.provide_derived(planes_key(row, k, nibbles) + (count,), planes)


def x_planes(ctx: Context) -> int:
    """How many int8 planes hold x for the integer-dot mat-vec: three under matmul
    precision "highest" (fp32 accuracy), else two."""
    return 3 if precision(ctx) == "highest" else 2


def emit_planes(ctx: Context, x2: TRef, nb: int, nibbles: int, k: int, norm,
                loader: RowLoader | None, count: int) -> TRef:
    """gguf_xplanes: x's one row as `count` int8 planes, 8 * count + 4 words per block of
    32; with norm (weight TRef, eps), of x RMS-normalised; with loader, of its expression
    (x2 is then only the shape; the loader's bindings from loader.base, the places before
    them filled with its first buffer, unread)."""
    planes = ctx.empty((1, nb * (8 * count + 4)), "i32")
    defines = {"NIBBLES": nibbles, "MAXWG": XPLANES_WG, "PLANES": count}
    bindings = [planes, loader.buffers[0] if loader is not None else x2]
    prefix = ""
    if norm is not None:
        defines["NORM"] = 1
        bindings.append(norm[0])
        prefix = "rms_norm + "
        if loader is None and vec4_rows(x2):
            defines["X_VEC4"] = 1
    if loader is not None:
        bindings += [loader.buffers[0]] * (loader.base - len(bindings)) + loader.buffers
        defines["X_LAZY"] = loader.decls
        prefix = "elementwise + "
    ctx.dispatch("gguf_xplanes", defines, bindings, [0],
                 [XPLANES_WG, nb, 1, x2.offset, x2.strides[0], f32_bits(norm[1]) if norm else 0],
                 groups_for(8 * nb, XPLANES_WG), note=f"{prefix}[1x{k}] as {count} int8 planes")
    return planes
