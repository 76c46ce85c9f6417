// The GGUF mat-vec for one row of x with integer dot products (Q4_0, Q4_1, Q8_0, Q4_K,
// Q6_K):
// out[n] = sum_k x[k] * W[n, k], x given as PLANES (2 or 3) int8 planes per block of 32
// (gguf_xplanes.comp), so a block's 32 products are 8 packed dot products per plane
// and a few scalar ops, where the fp32 kernel (gguf_matvec.comp) decodes and multiplies
// every element. Exact integer sums P (gguf_blocks.glsl gb_dot_qx), then
//   block = d * (s0 P0 + s1 P1) + m * (s0 A0 + s1 A1),
// so the result is x's planes times W to fp32 rounding. A workgroup's threads share NR
// rows of W (x's planes loaded once for them), each thread UNROLL blocks at a time, partial
// sums meeting through subgroupAdd and shared memory. RESIDUAL adds a tensor.
#extension GL_EXT_spirv_intrinsics : require
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#include "int_dot.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 32;
layout(constant_id = 3) const uint ROW_BYTES = 0;
layout(constant_id = 4) const uint OUT_OFF = 0;   // output column of W's first row
layout(constant_id = 5) const uint RES_OFF = 0;   // RESIDUAL: offset
BUFFER(0, outb)
layout(set = 0, binding = 1) readonly buffer XPlanes { uvec4 xp4[]; };
#define WQ_BINDING 2
IN_BUFFER(WQ_BINDING, wq)
#ifdef RESIDUAL
IN_BUFFER(3, resb)
#endif
#define GB_INT_DOT 1
#include "gguf_blocks.glsl"
#ifndef NR
#define NR 2
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef MAXSG
#define MAXSG 64
#endif
shared float red[MAXSG][NR];

void main() {
    uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    uint n0 = flat_workgroup() * NR;
    float acc[NR];
    uint ro[NR];
    [[unroll]] for (uint r = 0; r < NR; ++r) { acc[r] = 0.0; ro[r] = min(n0 + r, N - 1u) * ROW_BYTES; }
    const uint NBLK = K / 32u;
    // UNROLL blocks a step, wg apart: their loads at clamped addresses before any of
    // their sums, so more of W is in flight; a block past the row adds nothing (a select,
    // so no NaN of a clamped block reaches the sum)
    for (uint b0 = lid; b0 < NBLK; b0 += wg * UNROLL) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            uint b = min(b0 + u * wg, NBLK - 1u);
            bool live = b0 + u * wg < NBLK;
            uvec4 xp[2 * PLANES];
            [[unroll]] for (uint i = 0; i < 2u * PLANES; ++i) xp[i] = xp4[(2u * PLANES + 1u) * b + i];
            uvec4 meta = xp4[(2u * PLANES + 1u) * b + 2u * PLANES];
            vec2 s = uintBitsToFloat(meta.xy);
            ivec2 sums = ivec2(meta.zw);
            float xs = s.x * float(sums.x) + s.y * float(sums.y);   // the block's sum of x
            [[unroll]] for (uint r = 0; r < NR; ++r) {
                vec2 p = gb_dot_qx(ro[r], b, xp, sums), dm = gb_dot_dm(ro[r], b);
                float t = dm.x * (s.x * p.x + s.y * p.y) + dm.y * xs;
                acc[r] += live ? t : 0.0;
            }
        }
    }
    [[unroll]] for (uint r = 0; r < NR; ++r) {
        float t = subgroupAdd(acc[r]);
        if (subgroupElect()) red[gl_SubgroupID][r] = t;
    }
    barrier();
    if (lid < NR && n0 + lid < N) {
        float t = 0.0;
        for (uint j = 0; j < gl_NumSubgroups; ++j) t += red[j][lid];
#ifdef RESIDUAL
        t += ld_f32(resb[RES_OFF + OUT_OFF + n0 + lid]);
#endif
        outb[OUT_OFF + n0 + lid] = st_f32(t);
    }
}
