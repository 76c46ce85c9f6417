// x as PLANES (2 or 3) int8 planes per block of 32, for the integer-dot GGUF mat-vec
// (gguf_matvec_idot.comp): with s = max|x| / 127 over the block, x = s * (a0 + a1 / 254 +
// a2 / 254^2) to within s / 254^2 / 2, about 2^-24 of the block's largest value, so the
// mat-vec keeps fp32 accuracy (no activation quantization error of the 8-bit kind); two
// planes, x = s * (a0 + a1 / 254), hold it to s / 254 / 2, about 2^-16 of the block's
// largest value (the matmul precisions that allow TF32-class error).
// Eight invocations per block of one row of x, invocation l making word l of each plane
// (4 elements); the block's max and plane sums meet in shared memory. Out, per block:
// PLANES + 1/2 uvec4 = the planes (8 words each, the bytes in the order the weight's quants
// sit: NIBBLES, the even elements of each 8 in one word and the odd in the next, else
// element order), then s0 = s, s1 (as float bits) and the plane sums A0 = sum a0, A1:
// three planes s1 = s / 254^2, A1 = sum(254 a1 + a2); two, s1 = s / 254, A1 = sum a1.
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
#if PLANES != 2 && PLANES != 3
#error "gguf_xplanes.comp: PLANES is 2 or 3"
#endif
#define WPB (8u * PLANES + 4u)     // words a block
#ifndef MAXWG
#define MAXWG 256
#endif
shared float smax[MAXWG];
shared int sa0[MAXWG], sa1[MAXWG];

uint packed_bytes(ivec4 a) {
    uvec4 u = uvec4(a) & 0xFFu;
    return u.x | (u.y << 8) | (u.z << 16) | (u.w << 24);
}

void main() {
    uint lid = gl_LocalInvocationID.x, g = flat_invocation(), l = g & 7u, blk = g >> 3;
    bool live = blk < NB * M;          // no early return: the barriers need every invocation
    uint m = min(blk, NB * M - 1u) / NB, b = min(blk, NB * M - 1u) % NB;
    // word l's 4 elements: NIBBLES, elements 8 (l / 2) + 2 e + l % 2; else 4 l + e
    uint e0 = NIBBLES != 0 ? 8u * (l >> 1) + (l & 1u) : 4u * l, de = NIBBLES != 0 ? 2u : 1u;
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
    vec4 av = abs(v);
    // a NaN (which max() may drop) is marked -1 and makes the block's scales NaN, so the
    // mat-vec's sums come out NaN as the fp32 kernel's do (an infinity gives an infinite
    // scale, and the sums infinities or NaN)
    smax[lid] = any(isnan(v)) ? -1.0 : max(max(av.x, av.y), max(av.z, av.w));
    barrier();
    uint first = lid & ~7u;
    float amax = 0.0;
    bool nan_in = false;
    [[unroll]] for (uint i = 0; i < 8u; ++i) {
        amax = max(amax, smax[first + i]);
        nan_in = nan_in || smax[first + i] < 0.0;
    }
    float s = nan_in ? uintBitsToFloat(0x7fc00000u) : amax / 127.0;
    float inv = amax > 0.0 && !nan_in ? 127.0 / amax : 0.0;
    vec4 t = v * inv;
    vec4 a0 = clamp(roundEven(t), -127.0, 127.0);
    vec4 r = (t - a0) * 254.0;
    vec4 a1 = clamp(roundEven(r), -127.0, 127.0);
    vec4 a2 = clamp(roundEven((r - a1) * 254.0), -127.0, 127.0);
    ivec4 i0 = ivec4(a0), i1 = ivec4(a1), i2 = ivec4(a2);
    uint o = WPB * blk;
    if (live) {
        outb[o + l] = packed_bytes(i0);
        outb[o + 8u + l] = packed_bytes(i1);
#if PLANES == 3
        outb[o + 16u + l] = packed_bytes(i2);
#endif
    }
    sa0[lid] = i0.x + i0.y + i0.z + i0.w;
#if PLANES == 3
    sa1[lid] = 254 * (i1.x + i1.y + i1.z + i1.w) + (i2.x + i2.y + i2.z + i2.w);
    const float S1_DIV = 64516.0;
#else
    sa1[lid] = i1.x + i1.y + i1.z + i1.w;
    const float S1_DIV = 254.0;
#endif
    barrier();
    if (live && l == 0u) {
        int s0 = 0, s1 = 0;
        [[unroll]] for (uint i = 0; i < 8u; ++i) { s0 += sa0[first + i]; s1 += sa1[first + i]; }
        outb[o + 8u * PLANES] = floatBitsToUint(s * rn);
        outb[o + 8u * PLANES + 1u] = floatBitsToUint(s / S1_DIV * rn);
        outb[o + 8u * PLANES + 2u] = uint(s0);
        outb[o + 8u * PLANES + 3u] = uint(s1);
    }
}
