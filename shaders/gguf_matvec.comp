// Fused dequantize + mat-vec for few rows of x (decode, M <= 8):
// out[m, n] = sum_k x[m, k] * W[n, k], W kept as GGUF blocks (never
// dequantized to memory). A workgroup owns NR consecutive rows of W; its
// threads stride over the rows' chunks of 8 elements, decode each chunk once
// and use it for all M rows of x; partial sums meet through subgroupAdd and
// shared memory. x is contiguous along k (the lowering copies it otherwise).
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint M = 1;
layout(constant_id = 2) const uint N = 1;
layout(constant_id = 3) const uint K = 8;
layout(constant_id = 4) const uint X_OFF = 0;
layout(constant_id = 5) const uint X_SM = 0;      // x row stride, in words
layout(constant_id = 6) const uint ROW_BYTES = 0; // bytes of one row of W
BUFFER(0, outb)
BUFFER(1, xb)
BUFFER(2, wq)
#ifdef X_VEC4
// the same binding seen as vec4s: one 16-byte load (X_OFF, X_SM multiples of 4)
layout(set = 0, binding = 1) buffer Buf1v { vec4 xv[]; };
#endif
#include "gguf_blocks.glsl"
#ifndef NR
#define NR 1
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#define MAXM 8
#define MAXSG 32
shared float partial[MAXSG][NR * MAXM];

vec4 x4(uint o) {
#ifdef X_VEC4
    return xv[o >> 2];
#else
    return uintBitsToFloat(uvec4(xb[o], xb[o + 1u], xb[o + 2u], xb[o + 3u]));
#endif
}

void main() {
    uint n0 = flat_workgroup() * NR;
    if (n0 >= N) return;
    float acc[NR][MAXM];
    for (uint r = 0; r < NR; ++r) for (uint m = 0; m < MAXM; ++m) acc[r][m] = 0.0;
    const uint chunks = K / 8u;
    // UNROLL chunks per thread and step, gl_WorkGroupSize.x apart: their loads are
    // independent, so more of them are in flight at once
    for (uint ch0 = gl_LocalInvocationID.x; ch0 < chunks; ch0 += gl_WorkGroupSize.x * UNROLL) {
        for (uint u = 0; u < UNROLL; ++u) {
            uint ch = ch0 + u * gl_WorkGroupSize.x;
            if (UNROLL > 1 && ch >= chunks) break;
            uint boff = (ch / CPB) * QB, c = ch % CPB;
            vec4 xl[MAXM], xh[MAXM];
            for (uint m = 0; m < M; ++m) {
                uint o = X_OFF + m * X_SM + 8u * ch;
                xl[m] = x4(o);
                xh[m] = x4(o + 4u);
            }
            for (uint r = 0; r < NR; ++r) {
                if (NR > 1 && n0 + r >= N) break;
                vec4 lo, hi;
                deq8((n0 + r) * ROW_BYTES + boff, c, lo, hi);
                for (uint m = 0; m < M; ++m) acc[r][m] += dot(lo, xl[m]) + dot(hi, xh[m]);
            }
        }
    }
    for (uint r = 0; r < NR; ++r) for (uint m = 0; m < M; ++m) {
        float s = subgroupAdd(acc[r][m]);
        if (subgroupElect()) partial[gl_SubgroupID][r * MAXM + m] = s;
    }
    barrier();
    uint t = gl_LocalInvocationID.x;
    if (t < NR * M) {
        uint r = t / M, m = t % M;
        if (n0 + r < N) {
            float s = 0.0;
            for (uint g = 0; g < gl_NumSubgroups; ++g) s += partial[g][r * MAXM + m];
            outb[m * N + n0 + r] = st_f32(s);
        }
    }
}
