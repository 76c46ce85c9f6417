// Matmul family, tiled: C[b] = ALPHA * A[b] @ B[b] (+ BETA * bias).
// A workgroup of WG = (BM / TM) * (BN / TN) threads computes a BM x BN tile of C,
// stepping K by BK through shared memory; thread (tx, ty) = (tid % TX, tid / TX)
// owns TM rows and TN columns of the tile, in groups of four: rows 4 * (ty + i * TY)
// + 0..3 and columns 4 * (tx + j * TX) + 0..3, so its operands are whole vec4s of
// shared memory and neighbouring threads read neighbouring vec4s. Shared tiles are
// K-major (As[k][m], Bs[k][n]: A is stored transposed), and the TM x TN products
// of one k are an outer product accumulated in registers.
// Global loads: each thread fetches whole groups of 4 consecutive elements along
// the operand's unit-stride dimension (A_ALONG_K / B_ALONG_K: along k, else along m
// / n), as one 16-byte load when A_VEC4 / B_VEC4 (offset and other strides multiples
// of 4, so every group is aligned and wholly in or out of range), else as 4 checked
// scalar loads. Double buffering: two shared copies of each tile; the next K step's
// groups are loaded into registers before the current step's products, stored into
// the other copy after them, so one barrier per K step and global latency hidden
// behind the arithmetic.
// A, B and bias are read through their strides (spec constants): transposed and
// broadcast operands need no copy. Split K (SPLITS > 1, when the tiles are too few
// to fill a GPU): workgroup z takes batch z / SPLITS and K range [s * KS, (s + 1) * KS)
// for s = z % SPLITS, and writes its partial product to slice s of a [SPLITS, batch,
// M, N] output (split 0 adds the bias); lowering/matmul.py adds the slices in one
// elementwise kernel. lowering/matmul.py chooses BM, BN, BK, TM, TN per device.
#extension GL_EXT_control_flow_attributes : enable
#ifdef CPU_LANES
#extension GL_KHR_shader_subgroup_ballot : enable
#endif
#include "common.glsl"
#ifndef BM
#define BM 64
#define BN 64
#define BK 16
#define TM 4
#define TN 4
#endif
#define TX (BN / TN)           // threads along n
#define TY (BM / TM)           // threads along m
#define WG (TX * TY)
#define AQ (BM / 4)            // vec4s per k-row of the A tile
#define BQ (BN / 4)
#ifdef CPU_LANES
layout(local_size_x = CL_WG) in;
#else
layout(local_size_x = WG) in;
#endif
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 1;
layout(constant_id = 3) const uint A_OFF = 0;
layout(constant_id = 4) const uint A_SB = 0;
layout(constant_id = 5) const uint A_SM = 0;
layout(constant_id = 6) const uint A_SK = 0;
layout(constant_id = 7) const uint B_OFF = 0;
layout(constant_id = 8) const uint B_SB = 0;
layout(constant_id = 9) const uint B_SK = 0;
layout(constant_id = 10) const uint B_SN = 0;
layout(constant_id = 11) const uint C_OFF = 0;
layout(constant_id = 12) const uint C_SB = 0;
layout(constant_id = 13) const uint C_SM = 0;
layout(constant_id = 14) const uint C_SN = 0;
layout(constant_id = 15) const uint ALPHA_BITS = 0x3f800000u;
layout(constant_id = 16) const uint BETA_BITS = 0x3f800000u;
layout(constant_id = 17) const uint KS = 0xffffffffu;   // K per split (all of K: one)
layout(constant_id = 18) const uint SPLITS = 1;
layout(constant_id = 19) const uint BATCHES = 1;
BUFFER(0, outb)
IN_BUFFER(1, ab)
IN_BUFFER(2, bbuf)
#ifdef HAS_BIAS
IN_BUFFER(3, cb)
#endif
#ifdef A_VEC4
layout(set = 0, binding = 1) readonly buffer Buf1v { vec4 av[]; };
#endif
#ifdef B_VEC4
layout(set = 0, binding = 2) readonly buffer Buf2v { vec4 bv[]; };
#endif
#ifdef OUT_VEC4
layout(set = 0, binding = 0) buffer Buf0v { vec4 outv[]; };
#endif

#ifdef CPU_LANES
// A CPU device (lavapipe), where a load whose address differs across the lanes of a
// SIMD register is a gather: as gguf_matmul.comp's CPU_LANES, each lane owns CL_NC
// columns of C (n, n + CL_WG, ...), the workgroup CL_MR rows; lane e of a subgroup
// loads A[m, k0 + e] and every lane takes the 8 values through subgroupBroadcast.
// 128 x 576 @ 576 x 1536 on lavapipe: 2.9 GFLOP/s tiled through shared memory.
#include "lanes8.glsl"
void main() {
    uint batch = gl_WorkGroupID.z;
    uint m0 = gl_WorkGroupID.y * CL_MR;
    uint nb = gl_WorkGroupID.x * (CL_WG * CL_NC) + gl_LocalInvocationID.x;
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB;
    uint e = gl_SubgroupInvocationID & 7u;
    float acc[CL_MR][CL_NC];
    [[unroll]] for (uint i = 0; i < CL_MR; ++i) [[unroll]] for (uint j = 0; j < CL_NC; ++j) acc[i][j] = 0.0;
    for (uint k0 = 0; k0 < K; k0 += 8u) {
        bool full = k0 + 8u <= K;          // the last step may hold fewer than 8 of k
        vec4 bl[CL_NC], bh[CL_NC];         // B[k0 .. k0 + 7, n] (0 past K; rows past N: row N-1)
        [[unroll]] for (uint j = 0; j < CL_NC; ++j) {
            uint bo = bbase + min(nb + j * CL_WG, N - 1u) * B_SN + k0 * B_SK;
#if defined(B_VEC4) && defined(B_ALONG_K)
            // two 16-byte loads (K a multiple of 4, so a group is wholly in or out of range)
            bl[j] = bv[bo >> 2];
            bh[j] = (full || k0 + 4u < K) ? bv[(bo >> 2) + 1u] : vec4(0.0);
#else
            [[unroll]] for (uint t = 0; t < 4u; ++t) {
                bl[j][t] = (full || k0 + t < K) ? ld_f32(bbuf[bo + t * B_SK]) : 0.0;
                bh[j][t] = (full || k0 + 4u + t < K) ? ld_f32(bbuf[bo + (4u + t) * B_SK]) : 0.0;
            }
#endif
        }
        [[unroll]] for (uint i = 0; i < CL_MR; ++i) {
            uint ka = min(k0 + e, K - 1u);
            vec4 al, ah;
            lanes8(k0 + e < K ? ld_f32(ab[abase + min(m0 + i, M - 1u) * A_SM + ka * A_SK]) : 0.0, al, ah);
            [[unroll]] for (uint j = 0; j < CL_NC; ++j) acc[i][j] += dot(bl[j], al) + dot(bh[j], ah);
        }
    }
    float alpha = uintBitsToFloat(ALPHA_BITS);
    [[unroll]] for (uint i = 0; i < CL_MR; ++i) {
        uint gm = m0 + i;
        [[unroll]] for (uint j = 0; j < CL_NC; ++j) {
            uint gn = nb + j * CL_WG;
            if (gm >= M || gn >= N) continue;
            float v = alpha * acc[i][j];
#ifdef HAS_BIAS
            v += uintBitsToFloat(BETA_BITS) * ld_f32(cb[C_OFF + batch * C_SB + gm * C_SM + gn * C_SN]);
#endif
            outb[(batch * M + gm) * N + gn] = st_f32(v);
        }
    }
}
#else
// One padding vec4 per k-row: the transposed stores of a group loaded along k
// (4 k-rows, one column) then fall in different banks for neighbouring threads.
shared vec4 As[2][BK][AQ + 1];
shared vec4 Bs[2][BK][BQ + 1];

// Groups of 4 elements in one operand tile, and per thread (rounded up).
#define A_GROUPS (BM * BK / 4)
#define B_GROUPS (BN * BK / 4)
#define A_PER ((A_GROUPS + WG - 1) / WG)
#define B_PER ((B_GROUPS + WG - 1) / WG)

// Group g of a tile of `outer` rows (m or n) by BK: its first element's (outer, k)
// position in the tile; along k a row holds BK / 4 groups, along outer a k-row
// holds outer / 4.
uvec2 group_pos(uint g, uint outer, bool along_k) {
    return along_k ? uvec2(g / (BK / 4u), (g % (BK / 4u)) * 4u)
                   : uvec2((g % (outer / 4u)) * 4u, g / (outer / 4u));
}

// 4 elements of A from (m, k) on along its grouped dimension (k for A_ALONG_K, else
// m); zeros out of range (rows past M, k past kend). Vector loads: the group is
// aligned and wholly in or out of range.
vec4 load_a(uint abase, uint m, uint k, uint kend) {
    uint o = abase + m * A_SM + k * A_SK;
#ifdef A_VEC4
    vec4 v = vec4(0.0);
    if (m < M && k < kend) v = av[o >> 2];
    return v;
#else
    vec4 v = vec4(0.0);
#ifdef A_ALONG_K
    if (m < M)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (k + i < kend) v[i] = ld_f32(ab[o + i * A_SK]);
#else
    if (k < kend)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (m + i < M) v[i] = ld_f32(ab[o + i * A_SM]);
#endif
    return v;
#endif
}

// 4 elements of B from (k, n) on along its grouped dimension (k for B_ALONG_K, else n).
vec4 load_b(uint bbase, uint n, uint k, uint kend) {
    uint o = bbase + k * B_SK + n * B_SN;
#ifdef B_VEC4
    vec4 v = vec4(0.0);
    if (n < N && k < kend) v = bv[o >> 2];
    return v;
#else
    vec4 v = vec4(0.0);
#ifdef B_ALONG_K
    if (n < N)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (k + i < kend) v[i] = ld_f32(bbuf[o + i * B_SK]);
#else
    if (k < kend)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (n + i < N) v[i] = ld_f32(bbuf[o + i * B_SN]);
#endif
    return v;
#endif
}

#ifdef A_ALONG_K
#define A_IS_K true
#else
#define A_IS_K false
#endif
#ifdef B_ALONG_K
#define B_IS_K true
#else
#define B_IS_K false
#endif

vec4 pa[A_PER], pb[B_PER];     // the next K step's groups, in flight in registers

void fetch(uint tid, uint abase, uint bbase, uint m0, uint n0, uint k0, uint kend) {
    [[unroll]] for (uint c = 0; c < A_PER; ++c) {
        uint g = tid + c * WG;
        if (A_GROUPS % WG == 0u || g < A_GROUPS) {
            uvec2 p = group_pos(g, BM, A_IS_K);
            pa[c] = load_a(abase, m0 + p.x, k0 + p.y, kend);
        }
    }
    [[unroll]] for (uint c = 0; c < B_PER; ++c) {
        uint g = tid + c * WG;
        if (B_GROUPS % WG == 0u || g < B_GROUPS) {
            uvec2 p = group_pos(g, BN, B_IS_K);
            pb[c] = load_b(bbase, n0 + p.x, k0 + p.y, kend);
        }
    }
}

// The fetched groups into shared copy `buf`: a group along outer is one vec4 of a
// k-row; a group along k is one element of 4 k-rows.
void stash(uint tid, uint buf) {
    [[unroll]] for (uint c = 0; c < A_PER; ++c) {
        uint g = tid + c * WG;
        if (A_GROUPS % WG == 0u || g < A_GROUPS) {
            uvec2 p = group_pos(g, BM, A_IS_K);
#ifdef A_ALONG_K
            [[unroll]] for (uint i = 0; i < 4u; ++i) As[buf][p.y + i][p.x >> 2][p.x & 3u] = pa[c][i];
#else
            As[buf][p.y][p.x >> 2] = pa[c];
#endif
        }
    }
    [[unroll]] for (uint c = 0; c < B_PER; ++c) {
        uint g = tid + c * WG;
        if (B_GROUPS % WG == 0u || g < B_GROUPS) {
            uvec2 p = group_pos(g, BN, B_IS_K);
#ifdef B_ALONG_K
            [[unroll]] for (uint i = 0; i < 4u; ++i) Bs[buf][p.y + i][p.x >> 2][p.x & 3u] = pb[c][i];
#else
            Bs[buf][p.y][p.x >> 2] = pb[c];
#endif
        }
    }
}

void main() {
    uint batch = gl_WorkGroupID.z / SPLITS, split = gl_WorkGroupID.z % SPLITS;
    uint kbeg = split * KS, kend = min(K, kbeg + KS);
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint tid = gl_LocalInvocationID.x, tx = tid % TX, ty = tid / TX;
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB;
    vec4 acc[TM][TN / 4];
    [[unroll]] for (uint r = 0; r < TM; ++r)
        [[unroll]] for (uint j = 0; j < TN / 4; ++j) acc[r][j] = vec4(0.0);
    uint steps = kend > kbeg ? (kend - kbeg + BK - 1u) / BK : 0u;
    if (steps > 0u) {
        fetch(tid, abase, bbase, m0, n0, kbeg, kend);
        stash(tid, 0u);
        barrier();
    }
    for (uint s = 0; s < steps; ++s) {
        uint cur = s & 1u;
        bool more = s + 1u < steps;
        if (more) fetch(tid, abase, bbase, m0, n0, kbeg + (s + 1u) * BK, kend);
        [[unroll]] for (uint kk = 0; kk < BK; ++kk) {
            vec4 a[TM / 4], b[TN / 4];
            [[unroll]] for (uint i = 0; i < TM / 4; ++i) a[i] = As[cur][kk][ty + i * TY];
            [[unroll]] for (uint j = 0; j < TN / 4; ++j) b[j] = Bs[cur][kk][tx + j * TX];
            [[unroll]] for (uint i = 0; i < TM / 4; ++i)
                [[unroll]] for (uint ii = 0; ii < 4u; ++ii)
                    [[unroll]] for (uint j = 0; j < TN / 4; ++j) acc[i * 4u + ii][j] += a[i][ii] * b[j];
        }
        if (more) stash(tid, cur ^ 1u);
        barrier();
    }
    float alpha = uintBitsToFloat(ALPHA_BITS);
    uint obase = (split * BATCHES + batch) * M;
    [[unroll]] for (uint i = 0; i < TM / 4; ++i) {
        [[unroll]] for (uint ii = 0; ii < 4u; ++ii) {
            uint gm = m0 + (ty + i * TY) * 4u + ii;
            if (gm >= M) continue;
            [[unroll]] for (uint j = 0; j < TN / 4; ++j) {
                uint gn = n0 + (tx + j * TX) * 4u;
                vec4 v = alpha * acc[i * 4u + ii][j];
#ifdef HAS_BIAS
                if (split == 0u) {
                    uint cbase = C_OFF + batch * C_SB + gm * C_SM;
                    float beta = uintBitsToFloat(BETA_BITS);
                    [[unroll]] for (uint e = 0; e < 4u; ++e)
                        if (gn + e < N) v[e] += beta * ld_f32(cb[cbase + (gn + e) * C_SN]);
                }
#endif
                uint o = (obase + gm) * N + gn;
#ifdef OUT_VEC4
                if (gn < N) outv[o >> 2] = v;
#else
                [[unroll]] for (uint e = 0; e < 4u; ++e)
                    if (gn + e < N) outb[o + e] = st_f32(v[e]);
#endif
            }
        }
    }
}
#endif
