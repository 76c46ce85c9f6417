// Fused dequantize + mat-vec for few rows of x (decode, M <= 8):
// out[m, n] = sum_k x[m, k] * W[n, k], W kept as GGUF blocks (never
// dequantized to memory). TPR threads (a subgroup, or the whole workgroup for
// long rows) own NR consecutive rows of W; they stride over the rows' groups of
// 4 elements (UNROLL groups per step, so their loads are in flight together),
// neighbouring lanes on neighbouring groups, so each load of x is one coalesced
// 16-byte read per lane; each group is decoded once (deq4: 4 raw values and
// their scale) and used for all MROWS rows of x; partial sums meet through
// subgroupAdd (and shared memory when TPR spans several subgroups).
// MROWS, NR, UNROLL and TPR are #defines so every array index is a compile-time
// constant (registers, never local memory). x is contiguous along k.
// W may be one chunk of a weight split across buffers: its N rows are then
// columns OUT_OFF.. of an output whose rows hold OUT_N values.
// Fusions (lowering/gguf.py): NORM, x is RMS-normalised on the fly: the dot
// product runs on x * nw while the same lanes sum x^2 (each row group covers all
// of k), and the reduced dot is scaled by rsqrt(mean(x^2) + eps), so the norm
// costs no extra pass over x and no barrier; RESIDUAL, a tensor is added to the
// output (out = res + x W^T, read before the loop so its latency overlaps);
// X_LAZY, x is an elementwise expression (an activation, gate * up) computed as it
// is loaded, by fusion.row_loader.
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 8;
layout(constant_id = 3) const uint X_OFF = 0;
layout(constant_id = 4) const uint X_SM = 0;      // x row stride, in words
layout(constant_id = 5) const uint ROW_BYTES = 0; // bytes of one row of W
layout(constant_id = 6) const uint OUT_OFF = 0;   // output column of W's first row
layout(constant_id = 7) const uint OUT_N = 1;     // output row length (N unless split)
layout(constant_id = 8) const uint EPS_BITS = 0;  // NORM: eps
layout(constant_id = 9) const uint RES_OFF = 0;   // RESIDUAL: offset and row stride
layout(constant_id = 10) const uint RES_SM = 0;
BUFFER(0, outb)
BUFFER(1, xb)
BUFFER(2, wq)
#ifdef NORM
BUFFER(3, nwb)      // the norm's weight, K floats from word 0
layout(set = 0, binding = 3) buffer Buf3v { vec4 nwv[]; };
#endif
#ifdef RESIDUAL
BUFFER(RES_BINDING, resb)
#endif
#ifdef X_VEC4
// the same binding seen as vec4s: one 16-byte load (X_OFF, X_SM multiples of 4)
layout(set = 0, binding = 1) buffer Buf1v { vec4 xv[]; };
#endif
#ifdef X_LAZY
X_LAZY
#endif
#include "gguf_blocks.glsl"
#ifndef MROWS
#define MROWS 1
#endif
#ifndef NR
#define NR 1
#endif
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef TPR
#define TPR 128
#endif
#define MAXWG 256
#ifdef NORM
#define NSUM (NR * MROWS + MROWS)   // partial sums: the dots, then x^2 per row of x
#else
#define NSUM (NR * MROWS)
#endif
shared float red[MAXWG][NSUM];       // partial sums, when not one subgroup per row

void store(uint n0, uint i, float s) {
    uint r = i / MROWS, m = i % MROWS;
    if (n0 + r >= N) return;
    outb[m * OUT_N + OUT_OFF + n0 + r] = st_f32(s);
}

// x[m, k .. k + 3]
vec4 x4(uint m, uint k) {
#if defined(X_LAZY)
    return vec4(xlazy(m, k), xlazy(m, k + 1u), xlazy(m, k + 2u), xlazy(m, k + 3u));
#else
    uint o = X_OFF + m * X_SM + k;
#if defined(X_VEC4)
    return xv[o >> 2];
#else
    return uintBitsToFloat(uvec4(xb[o], xb[o + 1u], xb[o + 2u], xb[o + 3u]));
#endif
#endif
}

void main() {
    // TPR threads per group of NR rows: a subgroup when TPR is the subgroup size (their
    // partial sums meet in one subgroupAdd), the whole workgroup when TPR = WG.
    uint lid = gl_LocalInvocationID.x, lane = lid % TPR, slot = lid / TPR;
    uint n0 = (flat_workgroup() * (gl_WorkGroupSize.x / TPR) + slot) * NR;
    if (flat_workgroup() * (gl_WorkGroupSize.x / TPR) * NR >= N) return;    // uniform
#ifdef RESIDUAL
    float res[NR * MROWS];
    [[unroll]] for (uint i = 0; i < NR * MROWS; ++i) {
        uint r = min(n0 + i / MROWS, N - 1u), m = i % MROWS;
        res[i] = ld_f32(resb[RES_OFF + m * RES_SM + OUT_OFF + r]);
    }
#endif
    float acc[NSUM];
    [[unroll]] for (uint i = 0; i < NSUM; ++i) acc[i] = 0.0;
    const uint groups = K / 4u;
    uint rbase[NR];
    [[unroll]] for (uint r = 0; r < NR; ++r) rbase[r] = min(n0 + r, N - 1u) * ROW_BYTES;
    for (uint g0 = lane; g0 < groups; g0 += TPR * UNROLL) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            uint g = g0 + u * TPR;
            if (UNROLL == 1 || g < groups) {
                uint boff = (g / GPB) * QB, q = g % GPB;
                vec4 xg[MROWS];
#ifdef DEQ4_MIN
                float xs[MROWS];
#endif
                [[unroll]] for (uint m = 0; m < MROWS; ++m) {
                    xg[m] = x4(m, 4u * g);
#ifdef NORM
                    acc[NR * MROWS + m] += dot(xg[m], xg[m]);
                    xg[m] *= nwv[g];
#endif
#ifdef DEQ4_MIN
                    xs[m] = (xg[m].x + xg[m].y) + (xg[m].z + xg[m].w);
#endif
                }
                [[unroll]] for (uint r = 0; r < NR; ++r) {
                    vec2 dm;
                    vec4 w = deq4(rbase[r] + boff, q, dm);   // rows past N: row N-1 again, unused
                    [[unroll]] for (uint m = 0; m < MROWS; ++m) {
#ifdef DEQ4_MIN
                        acc[r * MROWS + m] += dm.x * dot(w, xg[m]) + dm.y * xs[m];
#else
                        acc[r * MROWS + m] += dm.x * dot(w, xg[m]);
#endif
                    }
                }
            }
        }
    }
    if (TPR < gl_WorkGroupSize.x && gl_SubgroupSize == TPR) {   // one subgroup per row group
        [[unroll]] for (uint i = 0; i < NSUM; ++i) acc[i] = subgroupAdd(acc[i]);
        if (lane == 0u) {
            [[unroll]] for (uint i = 0; i < NR * MROWS; ++i) {
                float s = acc[i];
#ifdef NORM
                s *= inversesqrt(acc[NR * MROWS + i % MROWS] / float(K) + uintBitsToFloat(EPS_BITS));
#endif
#ifdef RESIDUAL
                s += res[i];
#endif
                store(n0, i, s);
            }
        }
        return;
    }
    // the whole workgroup per row group, or a device whose subgroups are not TPR wide
    // for this pipeline: partial sums through shared memory
    uint per = TPR % gl_SubgroupSize == 0u ? TPR / gl_SubgroupSize : TPR;   // values per group
    [[unroll]] for (uint i = 0; i < NSUM; ++i) {
        if (per < TPR) {         // subgroups lie inside row groups: one value each
            float t = subgroupAdd(acc[i]);
            if (subgroupElect()) red[gl_SubgroupID][i] = t;
        } else {
            red[lid][i] = acc[i];
        }
    }
    barrier();
    [[unroll]] for (uint i = 0; i < NR * MROWS; ++i) {
        if (lane == i) {
            float s = 0.0;
            for (uint j = 0; j < per; ++j) s += red[slot * per + j][i];
#ifdef NORM
            float ss = 0.0;
            for (uint j = 0; j < per; ++j) ss += red[slot * per + j][NR * MROWS + i % MROWS];
            s *= inversesqrt(ss / float(K) + uintBitsToFloat(EPS_BITS));
#endif
#ifdef RESIDUAL
            s += res[i];
#endif
            store(n0, i, s);
        }
    }
}
