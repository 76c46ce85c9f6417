// Matmul family on tensor cores (VK_KHR_cooperative_matrix): C[b] = ALPHA * A[b] @ B[b]
// (+ BETA * bias), fp32 in and out, the products in 16-bit floats, accumulated in fp32.
// ET is the 16-bit type: bfloat16_t (CM_BF16; fp32's exponent range, so no fp32 value
// overflows in the conversion) or float16_t (CM_F16: fp16 tensors, whose values it holds
// exactly). SPLIT3 ("high" precision): each fp32 operand is split as hi = ET(x) and
// lo = ET(x - hi), and C accumulates hi*hi + hi*lo + lo*hi, near fp32's accuracy; without
// it ("medium", or 16-bit tensors) C accumulates ET(a) * ET(b).
// A workgroup of NSG = SG_M * SG_N subgroups computes a BM x BN tile of C, stepping K by
// BK through shared memory; subgroup (sm, sn) owns RM x RN fragments of CM_M x CM_N (the
// device's matrix shape, lowering/matmul.py) at rows sm * RM * CM_M, columns sn * RN * CM_N.
// Global loads: whole groups of 4 consecutive elements along each operand's unit-stride
// dimension (A_ALONG_K / B_ALONG_K, 16-byte loads where A_VEC4 / B_VEC4), converted and
// stored so that shared runs follow the same dimension: A row-major (m, k) when read along
// k, else column-major; B row-major (k, n) when read along n, else column-major; the
// cooperative loads name the layout. The next K step's groups are loaded into registers
// while the tensor cores multiply the current one.
// Epilogue: each fragment goes through a per-subgroup shared scratch to the output with
// ALPHA, the bias (split 0 only) and the bounds of M and N. Strides, offsets, split K
// (SPLITS, KS: slice s of a [SPLITS, batch, M, N] output) and the spec constants are
// those of matmul.comp.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifdef CM_BF16
#extension GL_EXT_bfloat16 : require
#define ET bfloat16_t
// the largest finite bfloat16, for fp32 values that would round up to infinity
#define ET_MAX uintBitsToFloat(0x7f7f0000u)
#else
#define ET float16_t
#endif
#include "common.glsl"
#ifndef BM
#define BM 128
#define BN 128
#define BK 32
#define SG_M 2
#define SG_N 2
#define CM_M 16
#define CM_N 16
#define CM_K 16
#define SUBGROUP 32
#endif
#define NSG (SG_M * SG_N)
#define WG (NSG * SUBGROUP)
#define RM (BM / (SG_M * CM_M))
#define RN (BN / (SG_N * CM_N))
layout(local_size_x = WG) in;
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
layout(constant_id = 17) const uint KS = 0xffffffffu;   // K per split, whole BK steps
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

// Shared tiles; a row of 16-bit elements padded by 8 (16 bytes: rows stay 16-byte aligned
// for the cooperative loads, and neighbouring rows start in other banks).
#ifdef A_ALONG_K
#define A_LD (BK + 8)                  // row-major: element (m, k) at m * A_LD + k
#define A_AT(m, k) ((m) * A_LD + (k))
#define A_LAYOUT gl_CooperativeMatrixLayoutRowMajor
#define A_SIZE (BM * A_LD)
#else
#define A_LD (BM + 8)                  // column-major: element (m, k) at k * A_LD + m
#define A_AT(m, k) ((k) * A_LD + (m))
#define A_LAYOUT gl_CooperativeMatrixLayoutColumnMajor
#define A_SIZE (BK * A_LD)
#endif
#ifdef B_ALONG_K
#define B_LD (BK + 8)                  // column-major: element (k, n) at n * B_LD + k
#define B_AT(k, n) ((n) * B_LD + (k))
#define B_LAYOUT gl_CooperativeMatrixLayoutColumnMajor
#define B_SIZE (BN * B_LD)
#else
#define B_LD (BN + 8)                  // row-major: element (k, n) at k * B_LD + n
#define B_AT(k, n) ((k) * B_LD + (n))
#define B_LAYOUT gl_CooperativeMatrixLayoutRowMajor
#define B_SIZE (BK * B_LD)
#endif
shared ET Ahi[A_SIZE];
shared ET Bhi[B_SIZE];
#ifdef SPLIT3
shared ET Alo[A_SIZE];
shared ET Blo[B_SIZE];
#endif
shared float Cs[NSG * CM_M * CM_N];

#define A_GROUPS (BM * BK / 4)
#define B_GROUPS (BN * BK / 4)
#define A_PER ((A_GROUPS + WG - 1) / WG)
#define B_PER ((B_GROUPS + WG - 1) / WG)

// Group g of a tile of `outer` rows (m or n) by BK: its first element's (outer, k).
uvec2 group_pos(uint g, uint outer, bool along_k) {
    return along_k ? uvec2(g / (BK / 4u), (g % (BK / 4u)) * 4u)
                   : uvec2((g % (outer / 4u)) * 4u, g / (outer / 4u));
}

// 4 elements of A from (m, k) on along k (A_ALONG_K) or m; zeros out of range.
vec4 load_a(uint abase, uint m, uint k, uint kend) {
    uint o = abase + m * A_SM + k * A_SK;
    vec4 v = vec4(0.0);
#ifdef A_VEC4
    if (m < M && k < kend) v = av[o >> 2];
#elif defined(A_ALONG_K)
    if (m < M)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (k + i < kend) v[i] = ld_f32(ab[o + i * A_SK]);
#else
    if (k < kend)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (m + i < M) v[i] = ld_f32(ab[o + i * A_SM]);
#endif
    return v;
}

// 4 elements of B from (k, n) on along k (B_ALONG_K) or n; zeros out of range.
vec4 load_b(uint bbase, uint n, uint k, uint kend) {
    uint o = bbase + k * B_SK + n * B_SN;
    vec4 v = vec4(0.0);
#ifdef B_VEC4
    if (n < N && k < kend) v = bv[o >> 2];
#elif defined(B_ALONG_K)
    if (n < N)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (k + i < kend) v[i] = ld_f32(bbuf[o + i * B_SK]);
#else
    if (k < kend)
        [[unroll]] for (uint i = 0; i < 4u; ++i)
            if (n + i < N) v[i] = ld_f32(bbuf[o + i * B_SN]);
#endif
    return v;
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

// x as ET (hi) and, for SPLIT3, the rest x - hi as ET (lo). In bfloat16 a finite x that
// rounds to infinity (beyond its largest finite value, within fp32's) is kept finite, so
// that hi is within one bf16 step of x and lo holds the rest; infinities and NaN stay in
// hi with lo 0. fp16 (16-bit tensors) converts as torch does: beyond 65504, infinity.
void split(float x, out ET hi, out ET lo) {
#ifdef CM_BF16
    // rounded to nearest even here, in fp32 bits: the driver's conversion may truncate
    // (NVIDIA's does: medium's bf16 products lost 4x the accuracy, all biased one way)
    uint bits = floatBitsToUint(x);
    float h = isnan(x) ? x : uintBitsToFloat((bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u);
    if (isinf(h) && !isinf(x)) h = x > 0.0 ? ET_MAX : -ET_MAX;
#else
    float h = float(ET(x));
#endif
    hi = ET(h);
#ifdef SPLIT3
    float r = x - h;           // exact in fp32; its bf16, rounded to nearest as above
    uint rb = floatBitsToUint(r);
    r = uintBitsToFloat((rb + 0x7fffu + ((rb >> 16) & 1u)) & 0xffff0000u);
    lo = (isinf(x) || isnan(x)) ? ET(0.0) : ET(r);
#else
    lo = ET(0.0);
#endif
}

// The fetched groups into the shared tiles, along the dimension they were read along.
void stash(uint tid) {
    [[unroll]] for (uint c = 0; c < A_PER; ++c) {
        uint g = tid + c * WG;
        if (A_GROUPS % WG == 0u || g < A_GROUPS) {
            uvec2 p = group_pos(g, BM, A_IS_K);
            [[unroll]] for (uint i = 0; i < 4u; ++i) {
                ET hi, lo;
                split(pa[c][i], hi, lo);
#ifdef A_ALONG_K
                uint at = A_AT(p.x, p.y + i);
#else
                uint at = A_AT(p.x + i, p.y);
#endif
                Ahi[at] = hi;
#ifdef SPLIT3
                Alo[at] = lo;
#endif
            }
        }
    }
    [[unroll]] for (uint c = 0; c < B_PER; ++c) {
        uint g = tid + c * WG;
        if (B_GROUPS % WG == 0u || g < B_GROUPS) {
            uvec2 p = group_pos(g, BN, B_IS_K);
            [[unroll]] for (uint i = 0; i < 4u; ++i) {
                ET hi, lo;
                split(pb[c][i], hi, lo);
#ifdef B_ALONG_K
                uint at = B_AT(p.y + i, p.x);
#else
                uint at = B_AT(p.y, p.x + i);
#endif
                Bhi[at] = hi;
#ifdef SPLIT3
                Blo[at] = lo;
#endif
            }
        }
    }
}

#define FRAG_A coopmat<ET, gl_ScopeSubgroup, CM_M, CM_K, gl_MatrixUseA>
#define FRAG_B coopmat<ET, gl_ScopeSubgroup, CM_K, CM_N, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>

void main() {
    uint batch = gl_WorkGroupID.z / SPLITS, split_index = gl_WorkGroupID.z % SPLITS;
    uint kbeg = split_index * KS, kend = min(K, kbeg + KS);
    uint m0 = gl_WorkGroupID.y * BM, n0 = gl_WorkGroupID.x * BN;
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint wm = (sg / SG_N) * (RM * CM_M), wn = (sg % SG_N) * (RN * CM_N);
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB;
    FRAG_C acc[RM][RN];
    [[unroll]] for (uint i = 0; i < RM; ++i)
        [[unroll]] for (uint j = 0; j < RN; ++j) acc[i][j] = FRAG_C(0.0);
    uint steps = kend > kbeg ? (kend - kbeg + BK - 1u) / BK : 0u;
    if (steps > 0u) fetch(tid, abase, bbase, m0, n0, kbeg, kend);
    for (uint s = 0; s < steps; ++s) {
        stash(tid);
        barrier();
        if (s + 1u < steps) fetch(tid, abase, bbase, m0, n0, kbeg + (s + 1u) * BK, kend);
        [[unroll]] for (uint kk = 0; kk < BK; kk += CM_K) {
            FRAG_A a[RM];
            [[unroll]] for (uint i = 0; i < RM; ++i)
                coopMatLoad(a[i], Ahi, A_AT(wm + i * CM_M, kk), A_LD, A_LAYOUT);
            FRAG_B b[RN];
            [[unroll]] for (uint j = 0; j < RN; ++j)
                coopMatLoad(b[j], Bhi, B_AT(kk, wn + j * CM_N), B_LD, B_LAYOUT);
#ifdef SPLIT3
            // the small terms first: hi*lo and lo*hi, then hi*hi
            {
                FRAG_B bl[RN];
                [[unroll]] for (uint j = 0; j < RN; ++j)
                    coopMatLoad(bl[j], Blo, B_AT(kk, wn + j * CM_N), B_LD, B_LAYOUT);
                [[unroll]] for (uint i = 0; i < RM; ++i)
                    [[unroll]] for (uint j = 0; j < RN; ++j) acc[i][j] = coopMatMulAdd(a[i], bl[j], acc[i][j]);
            }
            {
                FRAG_A al[RM];
                [[unroll]] for (uint i = 0; i < RM; ++i)
                    coopMatLoad(al[i], Alo, A_AT(wm + i * CM_M, kk), A_LD, A_LAYOUT);
                [[unroll]] for (uint i = 0; i < RM; ++i)
                    [[unroll]] for (uint j = 0; j < RN; ++j) acc[i][j] = coopMatMulAdd(al[i], b[j], acc[i][j]);
            }
#endif
            [[unroll]] for (uint i = 0; i < RM; ++i)
                [[unroll]] for (uint j = 0; j < RN; ++j) acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
        }
        barrier();
    }
    float alpha = uintBitsToFloat(ALPHA_BITS);
    uint obase = (split_index * BATCHES + batch) * M;
    uint scratch = sg * (CM_M * CM_N);
    [[unroll]] for (uint i = 0; i < RM; ++i) {
        [[unroll]] for (uint j = 0; j < RN; ++j) {
            coopMatStore(acc[i][j], Cs, scratch, CM_N, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (uint e = lane; e < CM_M * CM_N; e += SUBGROUP) {
                uint gm = m0 + wm + i * CM_M + e / CM_N, gn = n0 + wn + j * CM_N + e % CM_N;
                if (gm >= M || gn >= N) continue;
                float v = alpha * Cs[scratch + e];
#ifdef HAS_BIAS
                if (split_index == 0u)
                    v += uintBitsToFloat(BETA_BITS) * ld_f32(cb[C_OFF + batch * C_SB + gm * C_SM + gn * C_SN]);
#endif
                outb[(obase + gm) * N + gn] = st_f32(v);
            }
            subgroupBarrier();
        }
    }
}
