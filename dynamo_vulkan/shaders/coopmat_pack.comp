// One fp32 operand of the tensor-core matmul converted to 16 bits once, ahead of it
// (matmul_coopmat.comp's A_PACKED / B_PACKED), so that the matmul's inner loop reads half
// the bytes and converts nothing. Layout: per batch, ROWS_P rows (M or N rounded up to
// whole tiles) of KP elements along k (K rounded up to whole K steps), zeros in the
// padding; two elements a word (coopmat_convert.glsl), 16 bytes an octet of 8 along k;
// with SPLIT3 each batch's lo plane follows its hi plane.
// SCALED (fp16): each row is multiplied by a power of two 2^e, e chosen from the row's
// largest magnitude so that every scaled value lies below 16 (and e within [-124, 100]);
// the exponents follow the data, one int a row (per batch, ROWS_P of them), and the matmul
// multiplies its result by 2^-(e_row + e_col) (exactly, as powers of two). With both
// operands below 16, a product is below 256 and a K step's fp16 partial sum (ACC16) below
// 65504: no overflow whatever the inputs' range. A workgroup takes SROWS rows (the host's
// choice, a power of two up to 8; ROWS_P is a multiple of 32): SLANES invocations a row,
// each over every SLANES-th octet, for the maximum and then the stores. Along k a
// workgroup takes one row where rows are long (a prompt's few rows still fill the GPU),
// several where they are short (a short row leaves most of one workgroup idle); along its
// rows, 8 neighbouring rows (a 32-byte sector a read) by 32 lanes along k (many
// workgroups, and few octets an invocation walks).
// One invocation an octet (not SCALED). ALONG_ROWS: the source's unit stride runs along the rows (B of
// x @ W with W [K, N]), so neighbouring invocations take neighbouring rows of one octet
// column (their reads coalesce); else neighbouring octets of one row.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#include "coopmat_convert.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;      // M (or N)
layout(constant_id = 2) const uint K = 1;
layout(constant_id = 3) const uint OFF = 0;
layout(constant_id = 4) const uint SB = 0;        // batch stride (0: one batch)
layout(constant_id = 5) const uint SR = 0;        // row stride
layout(constant_id = 6) const uint SK = 0;        // k stride
layout(constant_id = 7) const uint BATCHES = 1;   // batches packed
layout(constant_id = 8) const uint ROWS_P = 1;
layout(constant_id = 9) const uint KP = 8;
layout(set = 0, binding = 0) writeonly buffer Buf0 { uvec4 dst[]; };
#ifdef GGUF
// the operand is a GGUF weight [ROWS, K] (one QTYPE_<name>), decoded here: a prompt's GGUF
// linear packs W straight from its blocks, without an fp32 copy
#ifndef SCALED
#error GGUF packs scaled fp16 only
#endif
layout(constant_id = 10) const uint ROW_BYTES = 0;
#define WQ_BINDING 1
BUFFER(WQ_BINDING, wq)
#include "gguf_blocks.glsl"
#elif defined(X_LAZY)
// the operand is an elementwise expression (a prompt's silu(gate) * up before the down
// projection) computed here as it is loaded, from binding 1 on: its own kernel and its
// fp32 result's round trip are saved. One batch; a row's "base" is its index. LZ_OCT:
// the octets an invocation takes at most, held in registers between the row's maximum
// and the stores, so that the expression is computed once.
#if !defined(SCALED) || defined(ALONG_ROWS)
#error X_LAZY packs scaled fp16 along k only
#endif
X_LAZY
#else
IN_BUFFER(1, src)
#endif
// x0, x1 = the 8 elements of octet o, element k given by LOADK (an expression of k),
// zeros beyond K
#define GATHER8(o, LOADK, x0, x1) { \
    vec4 g8_[2] = vec4[2](vec4(0.0), vec4(0.0)); \
    [[unroll]] for (uint i8_ = 0u; i8_ < 8u; ++i8_) { \
        uint k = (o) * 8u + i8_; \
        if (k < K) g8_[i8_ / 4u][i8_ % 4u] = LOADK; \
    } \
    x0 = g8_[0]; \
    x1 = g8_[1]; }
#ifdef NORM
// the operand is rms_norm(x) of its rows (x * rsqrt(mean(x^2) + eps) * w, as rowwise.comp's
// RMS_NORM): a prompt's normalised x, computed here for every product that packs it, so
// that the norm costs no kernel and no fp32 copy. Scaled fp16 along k, one batch.
#if !defined(SCALED) || defined(ALONG_ROWS) || defined(GGUF) || defined(X_LAZY)
#error NORM packs a plain operand's rows, scaled fp16 along k
#endif
layout(constant_id = 10) const uint EPS_BITS = 0;
layout(constant_id = 11) const uint W_OFF = 0;
IN_BUFFER(2, nw)
// octet o of a row times r (its rsqrt(mean(x^2) + eps)) times the norm's weight
void normed8(uint o, float r, inout vec4 x0, inout vec4 x1) {
    vec4 w0, w1;
    GATHER8(o, ld_f32(nw[W_OFF + k]), w0, w1)
    x0 = x0 * r * w0;
    x1 = x1 * r * w1;
}
#endif

// 8 elements of a row from octet o on (zeros beyond K): at word base, or GGUF, the row
// at byte base, or X_LAZY, row base of the expression
void load8(uint base, uint o, out vec4 x0, out vec4 x1) {
#ifdef GGUF
    x0 = vec4(0.0);
    x1 = vec4(0.0);
    if (o * 8u < K) deq8r(base, o, x0, x1);      // GGUF rows are whole chunks of 8
#elif defined(X_LAZY)
    GATHER8(o, xlazy(base, k), x0, x1)
#else
    GATHER8(o, ld_f32(src[base + k * SK]), x0, x1)
#endif
}

#ifdef SCALED
// the largest finite magnitude of 8 elements: infinities stay infinite when scaled, NaN NaN
float finite_max8(vec4 x0, vec4 x1) {
    const vec4 inf = vec4(uintBitsToFloat(0x7f800000u));
    vec4 a0 = abs(x0), a1 = abs(x1);
    vec4 a = max(mix(vec4(0.0), a0, lessThan(a0, inf)), mix(vec4(0.0), a1, lessThan(a1, inf)));
    return max(max(a.x, a.y), max(a.z, a.w));
}
#ifndef SROWS
#define SROWS 1
#endif
#if SROWS > 1 && (defined(NORM) || defined(X_LAZY) || defined(GGUF))
#error NORM, X_LAZY and GGUF pack one row a workgroup
#endif
#define SLANES (gl_WorkGroupSize.x / uint(SROWS))
#if SROWS > 1
// each invocation's maximum, then each row's over its SLANES invocations
shared float row_max[gl_WorkGroupSize.x];
#else
#include "wg_reduce.glsl"
#endif
layout(set = 0, binding = 0) writeonly buffer Buf0e { int dst_exp[]; };


void main() {
    uint ko = KP / 8u, groups = ROWS_P / uint(SROWS);
    uint wg = flat_workgroup(), lid = gl_LocalInvocationID.x;
    uint b = wg / groups;
    if (b >= BATCHES) return;
#ifdef ALONG_ROWS
    // neighbouring invocations on neighbouring rows (their reads coalesce)
    uint rl = lid % uint(SROWS), lane = lid / uint(SROWS);
#else
    uint rl = lid / SLANES, lane = lid % SLANES;
#endif
#ifdef GGUF
    uint r = (wg % groups) * uint(SROWS) + rl, base = r * ROW_BYTES;
#elif defined(X_LAZY)
    uint r = (wg % groups) * uint(SROWS) + rl, base = r;
#else
    uint r = (wg % groups) * uint(SROWS) + rl, base = OFF + b * SB + r * SR;
#endif
    float m = 0.0;
#ifdef NORM
    float ss = 0.0;
    if (r < ROWS)
        for (uint o = lane; o < ko; o += SLANES) {
            vec4 x0, x1;
            load8(base, o, x0, x1);
            ss += dot(x0, x0) + dot(x1, x1);
        }
    float rn = inversesqrt(wg_sum(ss) / float(K) + uintBitsToFloat(EPS_BITS));
#endif
#if defined(GGUF) && defined(GB_BOUND)
    // a GGUF row's bound from its blocks' scales (gguf_blocks.glsl), its quants unread. Where
    // it lies a binade or more above the largest magnitude, the scaled values stay below 8
    // instead of 16, which changes no result: a power of two scales the fp16 products and
    // partial sums without changing their rounding (short of fp16's subnormals, 2^18 below)
    if (r < ROWS)
        for (uint blk = lane; blk < NB; blk += SLANES) m = max(m, gb_bound(base, blk));
#elif defined(LZ_OCT)
    // X_LAZY: each invocation's octets computed once, kept in registers for the stores
    vec4 kept[2u * LZ_OCT];
    [[unroll]] for (uint i = 0u; i < LZ_OCT; ++i) {
        uint o = lane + i * SLANES;
        kept[2u * i] = vec4(0.0);
        kept[2u * i + 1u] = vec4(0.0);
        if (r < ROWS && o < ko) load8(base, o, kept[2u * i], kept[2u * i + 1u]);
        m = max(m, finite_max8(kept[2u * i], kept[2u * i + 1u]));
    }
#else
    if (r < ROWS)
        for (uint o = lane; o < ko; o += SLANES) {
            vec4 x0, x1;
            load8(base, o, x0, x1);
#ifdef NORM
            normed8(o, rn, x0, x1);
#endif
            m = max(m, finite_max8(x0, x1));
        }
#endif
#if SROWS > 1
    row_max[lid] = m;
    barrier();
    m = 0.0;
#ifdef ALONG_ROWS
    for (uint i = 0u; i < SLANES; ++i) m = max(m, row_max[rl + i * uint(SROWS)]);
#else
    for (uint i = 0u; i < SLANES; ++i) m = max(m, row_max[rl * SLANES + i]);
#endif
#else
    m = wg_max(m);
#endif
    int e = scaled_exp(m);
    float scale = pow2(e);
    uint at = (b * ROWS_P + r) * ko;
#ifdef LZ_OCT
    [[unroll]] for (uint i = 0u; i < LZ_OCT; ++i) {
        uint o = lane + i * SLANES;
        if (o >= ko) break;
        uvec4 hi, lo;
        convert(kept[2u * i] * scale, kept[2u * i + 1u] * scale, hi, lo);
        dst[at + o] = hi;
    }
#else
    for (uint o = lane; o < ko; o += SLANES) {
        vec4 x0 = vec4(0.0), x1 = vec4(0.0);
        if (r < ROWS) load8(base, o, x0, x1);
#ifdef NORM
        normed8(o, rn, x0, x1);
#endif
        uvec4 hi, lo;
        convert(x0 * scale, x1 * scale, hi, lo);
        dst[at + o] = hi;
    }
#endif
    if (lane == 0u) dst_exp[4u * BATCHES * ROWS_P * ko + b * ROWS_P + r] = e;
}
#else
void main() {
    uint ko = KP / 8u, count = BATCHES * ROWS_P * ko;
    uint e = flat_invocation();
    if (e >= count) return;
#ifdef ALONG_ROWS
    uint r = e % ROWS_P, o = (e / ROWS_P) % ko, b = e / (ROWS_P * ko);
#else
    uint o = e % ko, r = (e / ko) % ROWS_P, b = e / (ko * ROWS_P);
#endif
    vec4 x0 = vec4(0.0), x1 = vec4(0.0);
    if (r < ROWS) load8(OFF + b * SB + r * SR, o, x0, x1);
    uvec4 hi, lo;
    convert(x0, x1, hi, lo);
#ifdef SPLIT3
    uint at = (b * 2u * ROWS_P + r) * ko + o;
    dst[at + ROWS_P * ko] = lo;
#else
    uint at = (b * ROWS_P + r) * ko + o;
#endif
    dst[at] = hi;
}
#endif
