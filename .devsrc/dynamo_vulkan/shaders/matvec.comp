// Skinny matmul (few rows of A, e.g. one decode token): C[b] = ALPHA * A[b] @ B[b]
// (+ BETA * bias), M <= MROWS rows, in one of two mappings chosen by B's layout so
// that neighbouring threads read neighbouring words of B (the weight, read once for
// all rows of A):
// - default, B contiguous along k (x @ W^T, nn.Linear): one workgroup per output
//   column n and batch; threads stride over K; the partial sums meet through
//   subgroup adds, then shared memory when the workgroup has several subgroups.
// - COLS, B contiguous along n (x @ W with W [K, N] row-major): thread (q, ks) =
//   (tid % CQ, tid / CQ) of a workgroup owns 4 neighbouring columns n0 + 4q .. + 3
//   and every KT-th group of 4 k-rows of the workgroup's K range, loading each
//   group's 4 rows of B as vec4s (B_VEC4, else checked scalars) and A's 4 values per
//   row of A as a vec4 (A_VEC4) or scalars; the B rows of UNROLL groups are loaded
//   before their products so their latency overlaps (A, small, is re-read from
//   cache). The KT partial sums of a column meet in shared memory, MC rows of A per
//   round (KT == 1: none, and no barrier: the tiny case, one small workgroup).
//   Workgroup (x, y, z) = (column block, K split, batch).
//   SPLITS > 1 (too few column blocks to fill a GPU): each split writes its partial
//   sums to a coherent scratch buffer [SPLITS, batch, M, N] and counts itself in on
//   its column block's counter (an atomic); the last split to arrive adds them all
//   (PART_VEC4: as vec4s), writes C and resets the counter to 0 for the next call,
//   so the product is one kernel and one barrier level (attention.comp's merge).
#extension GL_EXT_control_flow_attributes : enable
#include "common.glsl"
#ifndef COLS
layout(local_size_x_id = 0) in;
#else
#ifndef CQ
#define CQ 64           // column quads per workgroup
#endif
#ifndef KT
#define KT 1            // k slices per workgroup
#endif
#define WG (CQ * KT)
layout(local_size_x = WG) in;
#endif
layout(constant_id = 1) const uint M = 1;
layout(constant_id = 2) const uint N = 1;
layout(constant_id = 3) const uint K = 1;
layout(constant_id = 4) const uint A_OFF = 0;
layout(constant_id = 5) const uint A_SB = 0;
layout(constant_id = 6) const uint A_SM = 0;
layout(constant_id = 7) const uint A_SK = 0;
layout(constant_id = 8) const uint B_OFF = 0;
layout(constant_id = 9) const uint B_SB = 0;
layout(constant_id = 10) const uint B_SK = 0;
layout(constant_id = 11) const uint B_SN = 0;
layout(constant_id = 12) const uint C_OFF = 0;
layout(constant_id = 13) const uint C_SB = 0;
layout(constant_id = 14) const uint C_SM = 0;
layout(constant_id = 15) const uint C_SN = 0;
layout(constant_id = 16) const uint ALPHA_BITS = 0x3f800000u;
layout(constant_id = 17) const uint BETA_BITS = 0x3f800000u;
layout(constant_id = 18) const uint KS = 0xffffffffu;   // COLS: K per split (a multiple of 4)
layout(constant_id = 19) const uint SPLITS = 1;
layout(constant_id = 20) const uint BATCHES = 1;
BUFFER(0, outb)
IN_BUFFER(1, ab)
IN_BUFFER(2, bbuf)
#ifdef HAS_BIAS
IN_BUFFER(3, cb)
#endif
#ifndef MROWS
#define MROWS 8
#endif

// alpha * s + beta * bias[batch, m, n]: an output value from its dot product
float finish(float s, uint batch, uint m, uint n) {
    float v = uintBitsToFloat(ALPHA_BITS) * s;
#ifdef HAS_BIAS
    v += uintBitsToFloat(BETA_BITS) * ld_f32(cb[C_OFF + batch * C_SB + m * C_SM + n * C_SN]);
#endif
    return v;
}

#ifndef COLS
// ---------------------------------------------------------------- B along k
shared float partial[64][MROWS];

void main() {
    uint n = flat_workgroup();
    uint batch = gl_WorkGroupID.z;
    if (n >= N) return;
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB + n * B_SN;
    float acc[MROWS];
    [[unroll]] for (uint m = 0; m < MROWS; ++m) acc[m] = 0.0;
    for (uint k = gl_LocalInvocationID.x; k < K; k += gl_WorkGroupSize.x) {
        float b = ld_f32(bbuf[bbase + k * B_SK]);
        [[unroll]] for (uint m = 0; m < MROWS; ++m)
            if (m < M) acc[m] += ld_f32(ab[abase + m * A_SM + k * A_SK]) * b;
    }
    uint lid = gl_LocalInvocationID.x;
    if (gl_NumSubgroups == 1u) {          // one subgroup holds the whole reduction
        float mine = 0.0;
        [[unroll]] for (uint m = 0; m < MROWS; ++m) {
            float s = subgroupAdd(acc[m]);
            if (lid == m) mine = s;
        }
        if (lid < M) outb[(batch * M + lid) * N + n] = st_f32(finish(mine, batch, lid, n));
        return;
    }
    [[unroll]] for (uint m = 0; m < MROWS; ++m) {
        float s = subgroupAdd(acc[m]);
        if (subgroupElect()) partial[gl_SubgroupID][m] = s;
    }
    barrier();
    if (lid < M) {
        float s = 0.0;
        for (uint g = 0; g < gl_NumSubgroups; ++g) s += partial[g][lid];
        outb[(batch * M + lid) * N + n] = st_f32(finish(s, batch, lid, n));
    }
}

#else
// ---------------------------------------------------------------- B along n
#ifndef UNROLL
#define UNROLL 1
#endif
#ifndef MC
#define MC 1
#endif
#ifdef A_VEC4
layout(set = 0, binding = 1) readonly buffer Buf1v { vec4 av[]; };
#endif
#ifdef B_VEC4
layout(set = 0, binding = 2) readonly buffer Buf2v { vec4 bv[]; };
#endif
#ifdef SPLIT_K
// coherent: the last split of a column block reads every split's partial sums
layout(set = 0, binding = PART_BINDING) coherent buffer PartB { uint partb[]; };
layout(set = 0, binding = COUNT_BINDING) coherent buffer CountB { uint counter[]; };
#include "last_arrival.glsl"
#ifdef PART_VEC4
layout(set = 0, binding = PART_BINDING) coherent buffer PartBv { vec4 partv[]; };   // N % 4 == 0
#endif
#endif
#if KT > 1
shared vec4 red[MC * WG];
#endif

// B[k, n .. n + 3], zeros past N
vec4 b_row(uint bbase, uint k, uint n) {
    uint o = bbase + k * B_SK + n * B_SN;
#ifdef B_VEC4
    vec4 v = vec4(0.0);
    if (n < N) v = bv[o >> 2];
    return v;
#else
    vec4 v = vec4(0.0);
    [[unroll]] for (uint e = 0; e < 4u; ++e)
        if (n + e < N) v[e] = ld_f32(bbuf[o + e * B_SN]);
    return v;
#endif
}

// A[m, k .. k + 3]
vec4 a_group(uint abase, uint m, uint k) {
    uint o = abase + m * A_SM + k * A_SK;
#ifdef A_VEC4
    return av[o >> 2];
#else
    return vec4(ld_f32(ab[o]), ld_f32(ab[o + A_SK]), ld_f32(ab[o + 2u * A_SK]), ld_f32(ab[o + 3u * A_SK]));
#endif
}

// The reduced sums of row m, columns n .. n + 3: to C, or to this split's slice.
void emit(vec4 s, uint batch, uint split, uint m, uint n) {
#if defined(SPLIT_K) && defined(PART_VEC4)
    if (n < N) partv[(((split * BATCHES + batch) * M + m) * N + n) >> 2] = s;
#else
    [[unroll]] for (uint e = 0; e < 4u; ++e) {
        if (n + e >= N) break;
#ifdef SPLIT_K
        partb[((split * BATCHES + batch) * M + m) * N + n + e] = st_f32(s[e]);
#else
        outb[(batch * M + m) * N + n + e] = st_f32(finish(s[e], batch, m, n + e));
#endif
    }
#endif
}

#ifdef SPLIT_K
// The last split of a column block: every split's partial sums of row m, columns
// n .. n + 3, added, to C. Their loads are independent, so they are in flight together.
void merge(uint batch, uint m, uint n) {
    uint o = (batch * M + m) * N + n;
#ifdef PART_VEC4
    vec4 s = vec4(0.0);
    for (uint z = 0; z < SPLITS; ++z) s += partv[(z * BATCHES * M * N + o) >> 2];
    [[unroll]] for (uint e = 0; e < 4u; ++e) outb[o + e] = st_f32(finish(s[e], batch, m, n + e));
#else
    [[unroll]] for (uint e = 0; e < 4u; ++e) {
        if (n + e >= N) break;
        float s = 0.0;
        for (uint z = 0; z < SPLITS; ++z) s += ld_f32(partb[z * BATCHES * M * N + o + e]);
        outb[o + e] = st_f32(finish(s, batch, m, n + e));
    }
#endif
}
#endif

void main() {
    uint tid = gl_LocalInvocationID.x, q = tid % CQ, ks = tid / CQ;
    uint batch = gl_WorkGroupID.z, split = gl_WorkGroupID.y;
    uint n = (gl_WorkGroupID.x * CQ + q) * 4u;
    uint kbeg = split * KS, kend = min(K, kbeg + KS);
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB;
    vec4 acc[MROWS];
    [[unroll]] for (uint m = 0; m < MROWS; ++m) acc[m] = vec4(0.0);
    // whole groups of 4 k-rows: UNROLL of this thread's groups per step
    uint kfull = kbeg + ((kend - kbeg) & ~3u);
    for (uint k = kbeg + 4u * ks; k < kfull; k += 4u * KT * UNROLL) {
        vec4 w[UNROLL][4];
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            uint kg = k + u * 4u * KT;
            [[unroll]] for (uint r = 0; r < 4u; ++r) {
                w[u][r] = vec4(0.0);
                if (kg < kfull) w[u][r] = b_row(bbase, kg + r, n);
            }
        }
        [[unroll]] for (uint u = 0; u < UNROLL; ++u) {
            uint kg = k + u * 4u * KT;
            if (kg >= kfull) break;
            [[unroll]] for (uint m = 0; m < MROWS; ++m) {
                vec4 x = a_group(abase, m, kg);
                acc[m] += x.x * w[u][0] + x.y * w[u][1] + x.z * w[u][2] + x.w * w[u][3];
            }
        }
    }
    // the last (kend - kbeg) % 4 rows, one per thread
    for (uint k = kfull + ks; k < kend; k += KT) {
        vec4 w = b_row(bbase, k, n);
        [[unroll]] for (uint m = 0; m < MROWS; ++m) acc[m] += ld_f32(ab[abase + m * A_SM + k * A_SK]) * w;
    }
#if KT > 1
    // the KT slices' sums of each column meet in shared memory, MC rows of A at a time
    [[unroll]] for (uint r0 = 0; r0 < MROWS; r0 += MC) {
        if (r0 > 0u) barrier();
        [[unroll]] for (uint i = 0; i < MC; ++i)
            if (r0 + i < MROWS) red[i * WG + tid] = acc[r0 + i];
        barrier();
        for (uint idx = tid; idx < MC * CQ; idx += WG) {
            uint i = idx / CQ, qq = idx % CQ;
            if (r0 + i >= MROWS) continue;
            vec4 s = vec4(0.0);
            [[unroll]] for (uint j = 0; j < KT; ++j) s += red[i * WG + j * CQ + qq];
            emit(s, batch, split, r0 + i, (gl_WorkGroupID.x * CQ + qq) * 4u);
        }
    }
#else
    [[unroll]] for (uint m = 0; m < MROWS; ++m) emit(acc[m], batch, split, m, n);
#endif
#ifdef SPLIT_K
    if (!last_to_arrive(batch * gl_NumWorkGroups.x + gl_WorkGroupID.x, SPLITS)) return;
    for (uint idx = tid; idx < MROWS * CQ; idx += WG) {
        uint n4 = (gl_WorkGroupID.x * CQ + idx % CQ) * 4u;
        if (n4 < N) merge(batch, idx / CQ, n4);
    }
#endif
}
#endif
