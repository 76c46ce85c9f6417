// x as PLANES (2 or 3) int8 planes per block of 32, for the integer-dot GGUF mat-vec
// (gguf_matvec_idot.comp), in xplanes.glsl's layout. Eight invocations per block of one
// row of x, invocation l making word l of each plane (4 elements); the block's max and
// plane sums meet in shared memory.
// NORM: the planes are of x RMS-normalised (x * nw * rsqrt(mean(x^2) + eps), the rowwise
// kernel's RMS_NORM HAS_WEIGHT formula): each workgroup sums x^2 over the whole row
// (one row of x), the planes hold x * nw and the scales carry the rsqrt, so the mat-vecs
// that read them need no norm of their own. X_LAZY: x is an elementwise expression
// (silu(gate) * up), computed as it is loaded (fusion.row_loader), once for all readers.
// X_VEC4: x is read by the norm's sum of squares four elements a load.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NB = 1;       // blocks per row
layout(constant_id = 2) const uint M = 1;        // rows of x
layout(constant_id = 3) const uint X_OFF = 0;
layout(constant_id = 4) const uint X_SM = 0;     // x row stride, in words
layout(constant_id = 5) const uint EPS_BITS = 0; // NORM: eps
BUFFER(0, outb)
IN_BUFFER(1, xb)
#ifdef NORM
IN_BUFFER(2, nwb)      // the norm's weight, 32 NB floats from word 0
#include "wg_reduce.glsl"
#endif
#ifdef X_VEC4
// x's binding seen as vec4s, for the norm's sum of squares: one 16-byte load for four
// elements (X_OFF and X_SM multiples of 4)
layout(set = 0, binding = 1) readonly buffer Buf1v { vec4 xv[]; };
#endif
#ifdef X_LAZY
X_LAZY
#define XLOAD(m, k) xlazy(m, k)
#else
#define XLOAD(m, k) ld_f32(xb[X_OFF + (m) * X_SM + (k)])
#endif
#ifndef NIBBLES
#define NIBBLES 0
#endif
#ifndef PLANES
#define PLANES 3
#endif
#include "xplanes.glsl"
#ifndef MAXWG
#define MAXWG 256
#endif
shared float smax[MAXWG];
shared int sa0[MAXWG], sa1[MAXWG];

void main() {
    uint lid = gl_LocalInvocationID.x, g = flat_invocation(), l = g & 7u, blk = g >> 3;
    bool live = blk < NB * M;          // no early return: the barriers need every invocation
    uint m = min(blk, NB * M - 1u) / NB, b = min(blk, NB * M - 1u) % NB;
    uint e0 = xp_element(l, 0u), de = xp_element(l, 1u) - e0;    // word l's 4 elements
    uint k0 = 32u * b + e0;
    vec4 v = vec4(XLOAD(m, k0), XLOAD(m, k0 + de), XLOAD(m, k0 + 2u * de), XLOAD(m, k0 + 3u * de));
    float rn = 1.0;      // NORM: rsqrt(mean(x^2) + eps)
#ifdef NORM
    float ss = 0.0;
#ifdef X_VEC4
    for (uint k = lid; k < 8u * NB; k += gl_WorkGroupSize.x) {
        vec4 x4 = xv[(X_OFF + m * X_SM) / 4u + k];
        ss += dot(x4, x4);
    }
#else
    for (uint k = lid; k < 32u * NB; k += gl_WorkGroupSize.x) {
        float xk = XLOAD(m, k);
        ss += xk * xk;
    }
#endif
    rn = inversesqrt(wg_sum(ss) / float(32u * NB) + uintBitsToFloat(EPS_BITS));
    v *= vec4(ld_f32(nwb[k0]), ld_f32(nwb[k0 + de]), ld_f32(nwb[k0 + 2u * de]), ld_f32(nwb[k0 + 3u * de]));
#endif
    smax[lid] = xp_word_max(v);
    barrier();
    uint first = lid & ~7u;
    float amax;
    bool nan_in;
    XP_BLOCK_MAX(smax, first, amax, nan_in)
    vec2 sc = xp_scale(amax, nan_in);
    ivec4 i0, i1, i2;
    xp_quantize(v, sc.y, i0, i1, i2);
    uint o = XP_WPB * blk;
    if (live) {
        outb[o + l] = xp_packed(i0);
        outb[o + 8u + l] = xp_packed(i1);
#if PLANES == 3
        outb[o + 16u + l] = xp_packed(i2);
#endif
    }
    ivec2 part = xp_sums(i0, i1, i2);
    sa0[lid] = part.x;
    sa1[lid] = part.y;
    barrier();
    if (live && l == 0u) {
        int s0 = 0, s1 = 0;
        [[unroll]] for (uint i = 0; i < 8u; ++i) { s0 += sa0[first + i]; s1 += sa1[first + i]; }
        outb[o + 8u * PLANES] = floatBitsToUint(sc.x * rn);
        outb[o + 8u * PLANES + 1u] = floatBitsToUint(sc.x / XP_S1_DIV * rn);
        outb[o + 8u * PLANES + 2u] = uint(s0);
        outb[o + 8u * PLANES + 3u] = uint(s1);
    }
}
