// Fused dequantize + mat-vec for few rows of x (decode, M <= 8):
// out[m, n] = sum_k x[m, k] * W[n, k], W kept as GGUF blocks (never
// dequantized to memory). TPR threads (a subgroup, or the whole workgroup for
// long rows) own NR consecutive rows of W; they stride over the rows' chunks of
// 8 elements (UNROLL chunks per step, so their loads are in flight together),
// decode each chunk once and use it for all MROWS rows of x; partial sums meet
// through subgroupAdd (and shared memory when TPR spans several subgroups).
// MROWS, NR, UNROLL and TPR are #defines so every array index is a compile-time
// constant (registers, never local memory). x is contiguous along k. FULL_STEPS: the
// row's chunks are a whole number of steps (no clamp, no zeroed slot).
// W may be one chunk of a weight split across buffers: its N rows are then
// columns OUT_OFF.. of an output whose rows hold OUT_N values.
// Fusions (lowering/gguf.py): NORM, x is RMS-normalised on the fly: the dots run
// on x * nw while the same lanes sum x^2 (a row group covers all of k), and the
// reduced dot is scaled by rsqrt(mean(x^2) + eps), so the norm costs no pass of
// its own over x and no barrier; RESIDUAL, a tensor is added to the output
// (out = res + x W^T, read before the loop so its latency overlaps the loop's);
// X_LAZY, x is an elementwise expression (an activation, gate * up) computed as
// it is loaded, by fusion.row_loader. CPL: neighbouring chunks per lane.
// POST_NORM (an RMSNorm of the output rows, then with POST_RES a residual added:
// Gemma-3's post-attention and post-FFN norms): out = raw * rsqrt(mean(raw^2) + eps)
// * pw (+ pres), per row of x, the rowwise kernel's RMS_NORM HAS_WEIGHT [HAS_RESIDUAL]
// formula. The norm needs all N raw outputs of a row, which many workgroups compute:
// each writes its raw outputs to a coherent scratch buffer and counts itself in on a
// counter (an atomic); the last to arrive reads the rows back, normalises them into
// out and resets the counter to 0 for the next call (attention.comp's split merge).
// The norm then costs no kernel and no barrier level of its own. Workgroups that
// exit at once (past N) never count; W is one buffer (OUT_OFF = 0, OUT_N = N).
// PN_GROUP: the norm is taken over each run of PN_GROUP outputs (a head's q or k: the
// norms of Gemma 3 and Qwen3 over head_dim), its weight PN_GROUP floats.
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
layout(constant_id = 11) const uint PN_EPS_BITS = 0;  // POST_NORM: eps
layout(constant_id = 12) const uint PRES_OFF = 0;     // POST_RES: offset and row stride
layout(constant_id = 13) const uint PRES_SM = 0;
BUFFER(0, outb)
IN_BUFFER(1, xb)
#define WQ_BINDING 2
IN_BUFFER(WQ_BINDING, wq)
#ifdef NORM
IN_BUFFER(3, nwb)      // the norm's weight, K floats from word 0
layout(set = 0, binding = 3) readonly buffer Buf3v { vec4 nwv[]; };
#endif
#ifdef RESIDUAL
IN_BUFFER(RES_BINDING, resb)
#endif
#ifdef POST_NORM
// raw x W^T, [MROWS, N]; coherent: the last workgroup reads every workgroup's rows
layout(set = 0, binding = PN_RAW) coherent buffer RawB { uint rawb[]; };
layout(set = 0, binding = PN_COUNT) coherent buffer CountB { uint counter[]; };
#include "last_arrival.glsl"
IN_BUFFER(PN_W, pwb)   // the norm's weight, PNG floats from word 0
#ifdef POST_RES
IN_BUFFER(PN_RES, presb)
#endif
#endif
#ifdef X_VEC4
// the same binding seen as vec4s: one 16-byte load (X_OFF, X_SM multiples of 4)
layout(set = 0, binding = 1) readonly buffer Buf1v { vec4 xv[]; };
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
#ifndef CPL
#define CPL 1
#endif
#if UNROLL % CPL != 0
#error "UNROLL must be a multiple of CPL"
#endif
#ifndef MAXWG
#define MAXWG 256     // the workgroup size at most (lowering/gguf.py sets it)
#endif
#ifdef NORM
#define NSUM (NR * MROWS + MROWS)   // partial sums: the dots, then sum(x^2) per row of x
#define NORM_SUM(v) (v)
#else
#define NSUM (NR * MROWS)
#define NORM_SUM(v) 0.0
#endif
#ifdef RESIDUAL
#define RES_OF(i) res[i]
#else
#define RES_OF(i) 0.0
#endif
shared float red[MAXWG][NSUM];       // partial sums, when not one subgroup per row
#ifdef POST_NORM
#include "wg_reduce.glsl"
#endif

// an output from its reduced dot product (and sum of x^2, and residual)
float finish(float s, float ss, float res) {
#ifdef NORM
    s *= inversesqrt(ss / float(K) + uintBitsToFloat(EPS_BITS));
#endif
#ifdef RESIDUAL
    s += res;
#endif
    return s;
}

void store(uint n0, uint i, float s) {
    uint r = i / MROWS, m = i % MROWS;
    if (n0 + r >= N) return;
#ifdef POST_NORM
    rawb[m * N + n0 + r] = st_f32(s);
#else
    outb[m * OUT_N + OUT_OFF + n0 + r] = st_f32(s);
#endif
}

#ifdef POST_NORM
// After this workgroup's raw outputs are stored: count it in, and if it is the last of
// the ceil(N / rows per workgroup) workgroups to finish, normalise every row of x's
// output. Every invocation of the workgroup must call it (it holds barriers).
void post_norm() {
    uint lid = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    uint per_wg = (wg / TPR) * NR, groups = (N + per_wg - 1u) / per_wg;
    if (!last_to_arrive(0u, groups)) return;     // uniform across the workgroup
#ifdef PN_GROUP
    const uint PNG = PN_GROUP;
#else
    const uint PNG = N;
#endif
    [[unroll]] for (uint m = 0; m < MROWS; ++m) {
        for (uint g0 = 0u; g0 < N; g0 += PNG) {        // uniform: every invocation, each group
            float s = 0.0;
            for (uint j = g0 + lid; j < g0 + PNG; j += wg) { float v = ld_f32(rawb[m * N + j]); s += v * v; }
            float r = inversesqrt(wg_sum(s) / float(PNG) + uintBitsToFloat(PN_EPS_BITS));
            for (uint j = g0 + lid; j < g0 + PNG; j += wg) {
                float y = ld_f32(rawb[m * N + j]) * r * ld_f32(pwb[j - g0]);
#ifdef POST_RES
                y = ld_f32(presb[PRES_OFF + m * PRES_SM + j]) + y;
#endif
                outb[m * N + j] = st_f32(y);
            }
        }
    }
}
#endif

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
    // read now, so its latency overlaps the loop's
    float res[NR * MROWS];
    [[unroll]] for (uint i = 0; i < NR * MROWS; ++i) {
        uint r = min(n0 + i / MROWS, N - 1u), m = i % MROWS;
        res[i] = ld_f32(resb[RES_OFF + m * RES_SM + OUT_OFF + r]);
    }
#endif
    float acc[NSUM];
    [[unroll]] for (uint i = 0; i < NSUM; ++i) acc[i] = 0.0;
    const uint chunks = K / 8u;
    uint rbase[NR];
    [[unroll]] for (uint r = 0; r < NR; ++r) rbase[r] = min(n0 + r, N - 1u) * ROW_BYTES;
    // a lane takes CPL neighbouring chunks, then jumps TPR * CPL chunks. Chunks past the
    // row are read as its last chunk and weighted 0, so no load sits behind a branch:
    // the UNROLL chunks' loads are all issued before their math (bytes in flight)
    for (uint ch0 = lane * CPL; ch0 < chunks; ch0 += TPR * UNROLL) {
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            uint chu = ch0 + (u % CPL) + (u / CPL) * TPR * CPL;
#ifdef FULL_STEPS
            uint ch = chu;                  // the steps tile the row: every chunk is in it
            bvec4 keep = bvec4(true);
#else
            uint ch = min(chu, chunks - 1u);
            bvec4 keep = bvec4(UNROLL == 1 || chu < chunks);
#endif
            vec4 xl[MROWS], xh[MROWS];
            [[unroll]] for (uint m = 0; m < MROWS; ++m) {
                xl[m] = mix(vec4(0.0), x4(m, 8u * ch), keep);   // a select: x may hold infs
                xh[m] = mix(vec4(0.0), x4(m, 8u * ch + 4u), keep);
#ifdef NORM
                acc[NR * MROWS + m] += dot(xl[m], xl[m]) + dot(xh[m], xh[m]);
                xl[m] *= nwv[2u * ch];
                xh[m] *= nwv[2u * ch + 1u];
#endif
            }
#if GB_AFFINE
            float sx[MROWS];      // the chunk's sum of x, for the weights' offsets
            [[unroll]] for (uint m = 0; m < MROWS; ++m) sx[m] = dot(xl[m] + xh[m], vec4(1.0));
#endif
            [[unroll]] for (uint r = 0; r < NR; ++r) {
                // element = a * q + b: the dot of x with q, scaled once per chunk
                vec4 lo, hi;
                vec2 ab = deq8a(rbase[r], ch, lo, hi);   // rows past N: row N-1 again, unused
                [[unroll]] for (uint m = 0; m < MROWS; ++m) {
#if GB_AFFINE
                    acc[r * MROWS + m] += ab.x * (dot(lo, xl[m]) + dot(hi, xh[m])) + ab.y * sx[m];
#else
                    acc[r * MROWS + m] += ab.x * (dot(lo, xl[m]) + dot(hi, xh[m]));
#endif
                }
            }
        }
    }
    // no early return from here on: POST_NORM's barriers need the whole workgroup
    if (TPR < gl_WorkGroupSize.x && gl_SubgroupSize == TPR) {   // one subgroup per row group
        [[unroll]] for (uint i = 0; i < NSUM; ++i) acc[i] = subgroupAdd(acc[i]);
        if (lane == 0u) {
            [[unroll]] for (uint i = 0; i < NR * MROWS; ++i)
                store(n0, i, finish(acc[i], NORM_SUM(acc[NR * MROWS + i % MROWS]), RES_OF(i)));
        }
    } else {
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
            if (lane == i % TPR) {      // TPR may be fewer than the outputs
                float s = 0.0, ss = 0.0;
                for (uint j = 0; j < per; ++j) s += red[slot * per + j][i];
#ifdef NORM
                for (uint j = 0; j < per; ++j) ss += red[slot * per + j][NR * MROWS + i % MROWS];
#endif
                store(n0, i, finish(s, ss, RES_OF(i)));
            }
        }
    }
#ifdef POST_NORM
    post_norm();
#endif
}
