// Matmul family on tensor cores (VK_KHR_cooperative_matrix): C[b] = ALPHA * A[b] @ B[b]
// (+ BETA * bias), fp32 in and out, the products in 16-bit floats, accumulated in fp32.
// The 16-bit type: bfloat16 (CM_BF16; fp32's exponent range, so no fp32 value overflows
// in the conversion) or float16 (CM_F16: fp16 tensors, whose values it holds exactly).
// SPLIT3 ("high" precision, bf16 only): each fp32 operand is split as hi = bf16(x) and
// lo = bf16(x - hi), and C accumulates lo*hi + hi*lo + hi*hi, near fp32's accuracy;
// without it ("medium", or 16-bit tensors) C accumulates 16-bit(a) * 16-bit(b).
//
// A workgroup of NSG = SG_M * SG_N subgroups computes a BM x BN tile of C; subgroup
// (sm, sn) owns RM x RN accumulators of CM_M x CM_N (the device's matrix shape) at rows
// sm * RM * CM_M, columns sn * RN * CM_N, held across the whole K loop.
// K steps of BK through shared memory, double buffered: while the tensor cores multiply
// step s out of one stage, the global loads of the next PREFETCH steps are in flight in
// registers; step s + 1's are converted and stored into the other stage afterwards, and
// one barrier a step separates the two (a stage is rewritten only after every subgroup
// passed the barrier that followed its last reads).
// A_PACKED / B_PACKED: the operand is a 16-bit copy made ahead of the kernel
// (coopmat_pack.comp: converted, split, zero padded to whole tiles and K steps, along k),
// whose octets are loaded as one uvec4 (a second for SPLIT3's lo plane) and stored as they
// are, without bounds or conversion.
// B_GGUF: B is a GGUF weight W [N, K] (x @ W^T; one QTYPE_<name> whose gb_bound exists,
// gguf_blocks.glsl), decoded from its blocks in the global loads: no 16-bit copy of W.
// Each workgroup first bounds its BN rows of W over the blocks of its K slice from their
// scales alone (gb_bound), which gives each row its power-of-two scale (SCALED, as
// coopmat_pack.comp chooses it); the global loads take each octet's words (gb_raw8), which
// are decoded, scaled and converted when stored (gb_dec8).
// Global loads: groups of 8 consecutive elements ("octets") along each operand's
// unit-stride dimension (A_ALONG_K / B_ALONG_K; two 16-byte loads where A_VEC4 / B_VEC4),
// converted to 16 bits and stored as one uvec4 (four packed pairs) so that shared runs
// follow the same dimension: A row-major (m, k) when read along k, else column-major;
// B column-major (k, n) when read along k, else row-major; the cooperative loads name the
// layout. Shared memory is an array of uvec4: cooperative loads take offsets and strides
// in its units (GLSL_KHR_cooperative_matrix lets the array's type differ from the
// matrix's); rows are padded by 8 elements (16 bytes), which keeps them 16-byte aligned
// and puts the 8 rows of each 16-byte-wide read in 8 different bank groups.
// Epilogue: a tile wholly inside C, without bias, with N a multiple of 4 (16-byte aligned
// rows), is stored by the cooperative stores straight to the output, scaled by ALPHA;
// other tiles go through a per-subgroup scratch (the stages' memory, after the loop) with
// ALPHA, the bias (split 0 only) and the bounds of M and N.
// Workgroups are visited in groups of GROUP_M tile rows (each group column by column), so
// that the workgroups resident at one time share their A rows and B columns in the cache.
// Strides, offsets, split K (SPLITS, KS: slice s of a [SPLITS, batch, M, N] output) and the
// spec constants are those of matmul.comp.
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#ifdef CM_BF16
#extension GL_EXT_bfloat16 : require
#define ET bfloat16_t
#else
#define ET float16_t
#endif
// BF16_IN_F16 (tests on devices without bf16 cooperative matrices): CM_BF16's rounding and
// split, each bf16 value held in fp16 (exactly, within fp16's range) and multiplied there
#if defined(SPLIT3) && !defined(CM_BF16) && !defined(BF16_IN_F16)
#error SPLIT3 splits fp32 into bfloat16 halves only
#endif
// ACC16 (float16 operands only): the products of FOLD K steps accumulate in float16
// matrices, which are then added into the fp32 accumulators (FOLD * BK products deep).
// The addition costs about as many instructions as the step's multiplies (a conversion
// and an add per element), so folding less often is faster; each fold keeps the fp16
// partial sums shorter, so folding more often is more accurate.
#if defined(ACC16) && (defined(CM_BF16) || defined(SPLIT3))
#error ACC16 multiplies float16 operands only
#endif
#ifndef FOLD
#define FOLD 1
#endif
// SCALED: both operands packed with a power-of-two scale per row of A and per column of B
// (coopmat_pack.comp), which keeps every fp16 value, and every fp16 partial sum (ACC16),
// finite; the epilogue multiplies each result by 2^-(e_m + e_n). Without ACC16 the
// products accumulate in fp32.
#if defined(SCALED) && !(defined(CM_F16) && defined(A_PACKED) && (defined(B_PACKED) || defined(B_GGUF)))
#error SCALED takes fp16 matrices, A packed and B packed or decoded from GGUF blocks
#endif
#if defined(B_GGUF) && !(defined(SCALED) && defined(B_ALONG_K))
#error B_GGUF decodes rows of W along k for the scaled fp16 kernel
#endif
#include "common.glsl"
#include "coopmat_convert.glsl"
#ifndef BM
#define BM 128
#define BN 128
#define BK 32
#define SG_M 2
#define SG_N 4
#define CM_M 16
#define CM_N 16
#define CM_K 16
#define SUBGROUP 32
#endif
#define NSG (SG_M * SG_N)
#define WG (NSG * SUBGROUP)
#if (CM_M * CM_N) % SUBGROUP != 0
#error the epilogue gives each lane CM_M * CM_N / SUBGROUP elements of a fragment
#endif
#define RM (BM / (SG_M * CM_M))
#define RN (BN / (SG_N * CM_N))
#define GROUP_M 8u
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
layout(set = 0, binding = 0) buffer Buf0f { float outf[]; };   // the cooperative stores' view
IN_BUFFER(1, ab)
#ifdef B_GGUF
#define WQ_BINDING 2
IN_BUFFER(2, wq)
#define ROW_BYTES B_SN                 // W's row stride, in bytes
#include "gguf_blocks.glsl"
#if !defined(GB_BOUND) || !defined(GB_RAW)
#error B_GGUF takes the types whose blocks bound their magnitudes (gb_bound) and load apart (gb_raw8)
#endif
#else
IN_BUFFER(2, bbuf)
#endif
#ifdef HAS_BIAS
IN_BUFFER(3, cb)
#endif
#ifdef A_VEC4
layout(set = 0, binding = 1) readonly buffer Buf1v { vec4 av[]; };
#endif
#ifdef B_VEC4
layout(set = 0, binding = 2) readonly buffer Buf2v { vec4 bv[]; };
#endif
#ifdef A_PACKED
layout(set = 0, binding = 1) readonly buffer Buf1p { uvec4 apk[]; };
#endif
#ifdef B_PACKED
layout(set = 0, binding = 2) readonly buffer Buf2p { uvec4 bpk[]; };
#endif
#ifdef SCALED
layout(set = 0, binding = 1) readonly buffer Buf1e { int aexp[]; };
#ifndef B_GGUF
layout(set = 0, binding = 2) readonly buffer Buf2e { int bexp[]; };
#endif
#endif
#ifdef B_GGUF
// the largest bound of each of the tile's rows of W (float bits: non-negative floats
// order as their bits), whose scale's exponent is b_exp (coopmat_pack.comp's rule)
shared uint wbound[BN];
int b_exp(uint r) { return scaled_exp(uintBitsToFloat(wbound[r])); }
#endif

// ---- shared memory: element offsets of one stage's tiles; uvec4 index = element / 8
#ifdef A_ALONG_K
#define A_LD (BK + 8)                  // row-major: element (m, k) at m * A_LD + k
#define A_AT(m, k) ((m) * A_LD + (k))
#define A_LAYOUT gl_CooperativeMatrixLayoutRowMajor
#define A_ELEMS (BM * A_LD)
#else
#define A_LD (BM + 8)                  // column-major: element (m, k) at k * A_LD + m
#define A_AT(m, k) ((k) * A_LD + (m))
#define A_LAYOUT gl_CooperativeMatrixLayoutColumnMajor
#define A_ELEMS (BK * A_LD)
#endif
#ifdef B_ALONG_K
#define B_LD (BK + 8)                  // column-major: element (k, n) at n * B_LD + k
#define B_AT(k, n) ((n) * B_LD + (k))
#define B_LAYOUT gl_CooperativeMatrixLayoutColumnMajor
#define B_ELEMS (BN * B_LD)
#else
#define B_LD (BN + 8)                  // row-major: element (k, n) at k * B_LD + n
#define B_AT(k, n) ((k) * B_LD + (n))
#define B_LAYOUT gl_CooperativeMatrixLayoutRowMajor
#define B_ELEMS (BK * B_LD)
#endif
#ifdef SPLIT3
#define PLANES 2                       // hi and lo tiles
#else
#define PLANES 1
#endif
// uvec4 offsets within a stage: A hi, B hi, then (SPLIT3) A lo, B lo
#define A_HI 0
#define B_HI (A_ELEMS / 8)
#define A_LO ((A_ELEMS + B_ELEMS) / 8)
#define B_LO ((2 * A_ELEMS + B_ELEMS) / 8)
#define STAGE (PLANES * (A_ELEMS + B_ELEMS) / 8)
#define SCRATCH (NSG * CM_M * CM_N / 4)        // the epilogue's fp32 fragments, in uvec4
#define SMEM (2 * STAGE > SCRATCH ? 2 * STAGE : SCRATCH)
shared uvec4 sm[SMEM];

#define A_OCTETS (BM * BK / 8)
#define B_OCTETS (BN * BK / 8)
#define A_PER ((A_OCTETS + WG - 1) / WG)
#define B_PER ((B_OCTETS + WG - 1) / WG)

// Octet g of a tile of `outer` rows (m or n) by BK: its first element's (outer, k).
uvec2 octet_pos(uint g, uint outer, bool along_k) {
    return along_k ? uvec2(g / (BK / 8u), (g % (BK / 8u)) * 8u)
                   : uvec2((g % (outer / 8u)) * 8u, g / (outer / 8u));
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

// 8 elements of A from (m, k) on along k (A_ALONG_K) or m, as v[0] (first 4) and v[1];
// zeros out of range. A_VEC4 guarantees M or K, offsets and strides multiples of 4.
void load_a(uint abase, uint m, uint k, uint kend, out vec4 v0, out vec4 v1) {
    uint o = abase + m * A_SM + k * A_SK;
    v0 = vec4(0.0);
    v1 = vec4(0.0);
#if defined(A_VEC4) && defined(A_ALONG_K)
    if (m < M) {
        if (k < kend) v0 = av[o >> 2];
        if (k + 4u < kend) v1 = av[(o >> 2) + 1u];
    }
#elif defined(A_VEC4)
    if (k < kend) {
        if (m < M) v0 = av[o >> 2];
        if (m + 4u < M) v1 = av[(o >> 2) + 1u];
    }
#elif defined(A_ALONG_K)
    if (m < M)
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            if (k + i < kend) v0[i] = ld_f32(ab[o + i * A_SK]);
            if (k + 4u + i < kend) v1[i] = ld_f32(ab[o + (4u + i) * A_SK]);
        }
#else
    if (k < kend)
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            if (m + i < M) v0[i] = ld_f32(ab[o + i * A_SM]);
            if (m + 4u + i < M) v1[i] = ld_f32(ab[o + (4u + i) * A_SM]);
        }
#endif
}

#ifndef B_GGUF
// 8 elements of B from (k, n) on along k (B_ALONG_K) or n; zeros out of range.
void load_b(uint bbase, uint n, uint k, uint kend, out vec4 v0, out vec4 v1) {
    uint o = bbase + k * B_SK + n * B_SN;
    v0 = vec4(0.0);
    v1 = vec4(0.0);
#if defined(B_VEC4) && defined(B_ALONG_K)
    if (n < N) {
        if (k < kend) v0 = bv[o >> 2];
        if (k + 4u < kend) v1 = bv[(o >> 2) + 1u];
    }
#elif defined(B_VEC4)
    if (k < kend) {
        if (n < N) v0 = bv[o >> 2];
        if (n + 4u < N) v1 = bv[(o >> 2) + 1u];
    }
#elif defined(B_ALONG_K)
    if (n < N)
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            if (k + i < kend) v0[i] = ld_f32(bbuf[o + i * B_SK]);
            if (k + 4u + i < kend) v1[i] = ld_f32(bbuf[o + (4u + i) * B_SK]);
        }
#else
    if (k < kend)
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            if (n + i < N) v0[i] = ld_f32(bbuf[o + i * B_SN]);
            if (n + 4u + i < N) v1[i] = ld_f32(bbuf[o + (4u + i) * B_SN]);
        }
#endif
}
#endif

// The next K step's octets, in flight in registers: fp32 values (two vec4 an octet), or a
// packed operand's 16-bit words (one uvec4 an octet and plane: hi, then lo for SPLIT3), or
// a GGUF chunk's words (B_GGUF: gb_raw8's uvec4, zeros out of range).
// PREFETCH sets of them: the loads of step s + PREFETCH are issued while step s multiplies,
// so that PREFETCH steps of multiplies hide their latency (set: the step modulo PREFETCH).
#ifndef PREFETCH
#define PREFETCH 1
#endif
#ifdef A_PACKED
uvec4 qa[PREFETCH][PLANES * A_PER];
#else
vec4 pa[PREFETCH][2 * A_PER];
#endif
#if defined(B_PACKED) || defined(B_GGUF)
uvec4 qb[PREFETCH][PLANES * B_PER];
#else
vec4 pb[PREFETCH][2 * B_PER];
#endif

// A packed operand (coopmat_pack.comp): per batch (one where the batch stride is 0) and
// plane (hi, then lo for SPLIT3), rows of KP elements along k (K rounded up to whole K
// steps) for M (N) rounded up to whole tiles, zero padded, so that its loads need no
// bounds. Offsets in uvec4 units.
#define KP (((K + BK - 1u) / BK) * BK)
#define A_ROWS_P (((M + BM - 1u) / BM) * BM)
#define B_ROWS_P (((N + BN - 1u) / BN) * BN)
#define A_PLANE (A_ROWS_P * (KP / 8u))
#define B_PLANE (B_ROWS_P * (KP / 8u))

void fetch(uint set, uint tid, uint batch, uint abase, uint bbase, uint m0, uint n0, uint k0, uint kend) {
    [[unroll]] for (uint c = 0; c < A_PER; ++c) {
        uint g = tid + c * WG;
        if (A_OCTETS % WG == 0u || g < A_OCTETS) {
            uvec2 p = octet_pos(g, BM, A_IS_K);
#ifdef A_PACKED
            uint at = (A_SB == 0u ? 0u : batch) * PLANES * A_PLANE + (m0 + p.x) * (KP / 8u) + (k0 + p.y) / 8u;
            qa[set][c] = apk[at];
#ifdef SPLIT3
            qa[set][A_PER + c] = apk[A_PLANE + at];
#endif
#else
            load_a(abase, m0 + p.x, k0 + p.y, kend, pa[set][2 * c], pa[set][2 * c + 1]);
#endif
        }
    }
    [[unroll]] for (uint c = 0; c < B_PER; ++c) {
        uint g = tid + c * WG;
        if (B_OCTETS % WG == 0u || g < B_OCTETS) {
            uvec2 p = octet_pos(g, BN, B_IS_K);
#if defined(B_GGUF)
            uint n = n0 + p.x, k = k0 + p.y;
            qb[set][c] = n < N && k < kend ? gb_raw8(n * ROW_BYTES, k / 8u) : uvec4(0u);
#elif defined(B_PACKED)
            uint at = (B_SB == 0u ? 0u : batch) * PLANES * B_PLANE + (n0 + p.x) * (KP / 8u) + (k0 + p.y) / 8u;
            qb[set][c] = bpk[at];
#ifdef SPLIT3
            qb[set][B_PER + c] = bpk[B_PLANE + at];
#endif
#else
            load_b(bbase, n0 + p.x, k0 + p.y, kend, pb[set][2 * c], pb[set][2 * c + 1]);
#endif
        }
    }
}

// The fetched octets into stage `base` (uvec4 offset), along the dimension they were read
// along (converted to 16 bits unless packed): one uvec4 store per octet and plane. n0, k0:
// the tile's first column and the step's first k (B_GGUF decodes by them).
void stash(uint set, uint tid, uint base, uint n0, uint k0) {
    [[unroll]] for (uint c = 0; c < A_PER; ++c) {
        uint g = tid + c * WG;
        if (A_OCTETS % WG == 0u || g < A_OCTETS) {
            uvec2 p = octet_pos(g, BM, A_IS_K);
            uvec4 hi, lo;
#ifdef A_PACKED
            hi = qa[set][c];
#ifdef SPLIT3
            lo = qa[set][A_PER + c];
#endif
#else
            convert(pa[set][2 * c], pa[set][2 * c + 1], hi, lo);
#endif
            uint at = base + A_AT(p.x, p.y) / 8u;
            sm[A_HI + at] = hi;
#ifdef SPLIT3
            sm[A_LO + at] = lo;
#endif
        }
    }
    [[unroll]] for (uint c = 0; c < B_PER; ++c) {
        uint g = tid + c * WG;
        if (B_OCTETS % WG == 0u || g < B_OCTETS) {
            uvec2 p = octet_pos(g, BN, B_IS_K);
            uvec4 hi, lo;
#if defined(B_GGUF)
            {
                // times the row's scale, a power of two: as scaling the decoded values
                vec4 v0, v1;
                uint n = n0 + p.x, ch = (k0 + p.y) / 8u;
                vec2 ab = gb_dec8(qb[set][c], n * ROW_BYTES, ch, v0, v1) * pow2(b_exp(p.x));
#if GB_AFFINE
                convert(v0 * ab.x + ab.y, v1 * ab.x + ab.y, hi, lo);
#else
                convert(v0 * ab.x, v1 * ab.x, hi, lo);
#endif
            }
#elif defined(B_PACKED)
            hi = qb[set][c];
#ifdef SPLIT3
            lo = qb[set][B_PER + c];
#endif
#else
            convert(pb[set][2 * c], pb[set][2 * c + 1], hi, lo);
#endif
            uint at = base + B_AT(p.y, p.x) / 8u;
            sm[B_HI + at] = hi;
#ifdef SPLIT3
            sm[B_LO + at] = lo;
#endif
        }
    }
}

#define FRAG_A coopmat<ET, gl_ScopeSubgroup, CM_M, CM_K, gl_MatrixUseA>
#define FRAG_B coopmat<ET, gl_ScopeSubgroup, CM_K, CM_N, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>
#define FRAG_H coopmat<float16_t, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>

void main() {
    uint batch = gl_WorkGroupID.z / SPLITS, split_index = gl_WorkGroupID.z % SPLITS;
    uint kbeg = split_index * KS, kend = min(K, kbeg + KS);
    // tile (tm, tn) of the flat workgroup index, GROUP_M tile rows at a time
    uint tiles_n = gl_NumWorkGroups.x, tiles_m = gl_NumWorkGroups.y;
    uint index = gl_WorkGroupID.y * tiles_n + gl_WorkGroupID.x;
    uint first = (index / (GROUP_M * tiles_n)) * GROUP_M, rows = min(tiles_m - first, GROUP_M);
    uint within = index % (GROUP_M * tiles_n);
    uint m0 = (first + within % rows) * BM, n0 = (within / rows) * BN;
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint wm = (sg / SG_N) * (RM * CM_M), wn = (sg % SG_N) * (RN * CM_N);
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB;
    FRAG_C acc[RM][RN];
    [[unroll]] for (uint i = 0; i < RM; ++i)
        [[unroll]] for (uint j = 0; j < RN; ++j) acc[i][j] = FRAG_C(0.0);
    uint steps = kend > kbeg ? (kend - kbeg + BK - 1u) / BK : 0u;
#ifdef B_GGUF
    // the bound of each row over the blocks that meet [kbeg, kend): every invocation a
    // (row, block) pair, neighbours on neighbouring blocks of a row
    for (uint r = tid; r < BN; r += WG) wbound[r] = 0u;
    barrier();
    {
        uint blk0 = kbeg / QK, nblk = steps > 0u ? (kend - 1u) / QK + 1u - blk0 : 0u;
        for (uint i = tid; i < BN * nblk; i += WG) {
            uint r = i / nblk, n = n0 + r;
            if (n < N) atomicMax(wbound[r], floatBitsToUint(gb_bound(n * ROW_BYTES, blk0 + i % nblk)));
        }
    }
    barrier();
#endif
    if (steps > 0u) {
        fetch(0u, tid, batch, abase, bbase, m0, n0, kbeg, kend);
        stash(0u, tid, 0u, n0, kbeg);
    }
    [[unroll]] for (uint j = 1u; j < PREFETCH; ++j)
        if (j < steps) fetch(j, tid, batch, abase, bbase, m0, n0, kbeg + j * BK, kend);
    barrier();
#ifdef ACC16
    FRAG_H part[RM][RN];
    [[unroll]] for (uint i = 0; i < RM; ++i)
        [[unroll]] for (uint j = 0; j < RN; ++j) part[i][j] = FRAG_H(0.0);
#endif
    // step s multiplies out of stage s % 2, issues the loads of step s + PREFETCH into
    // register set s % PREFETCH (free: its step was stored by step s - 1) and stores step
    // s + 1's set into the other stage; the loop is unrolled PREFETCH times so that each
    // set is named by a constant
    for (uint s0 = 0; s0 < steps; s0 += PREFETCH)
    [[unroll]] for (uint p = 0; p < PREFETCH; ++p) {
        uint s = s0 + p;
        if (PREFETCH > 1u && s >= steps) continue;
        uint cur = (s & 1u) * STAGE;
        bool more = s + 1u < steps;
        if (s + PREFETCH < steps) fetch(p, tid, batch, abase, bbase, m0, n0, kbeg + (s + PREFETCH) * BK, kend);
        [[unroll]] for (uint kk = 0; kk < BK; kk += CM_K) {
            FRAG_A a[RM];
            FRAG_B b[RN];
            [[unroll]] for (uint i = 0; i < RM; ++i)
                coopMatLoad(a[i], sm, cur + A_HI + A_AT(wm + i * CM_M, kk) / 8u, A_LD / 8u, A_LAYOUT);
            [[unroll]] for (uint j = 0; j < RN; ++j)
                coopMatLoad(b[j], sm, cur + B_HI + B_AT(kk, wn + j * CM_N) / 8u, B_LD / 8u, B_LAYOUT);
#ifdef SPLIT3
            // the small terms first: lo*hi and hi*lo, then hi*hi
            {
                FRAG_A al[RM];
                FRAG_B bl[RN];
                [[unroll]] for (uint i = 0; i < RM; ++i)
                    coopMatLoad(al[i], sm, cur + A_LO + A_AT(wm + i * CM_M, kk) / 8u, A_LD / 8u, A_LAYOUT);
                [[unroll]] for (uint j = 0; j < RN; ++j)
                    coopMatLoad(bl[j], sm, cur + B_LO + B_AT(kk, wn + j * CM_N) / 8u, B_LD / 8u, B_LAYOUT);
                [[unroll]] for (uint i = 0; i < RM; ++i)
                    [[unroll]] for (uint j = 0; j < RN; ++j) {
                        acc[i][j] = coopMatMulAdd(al[i], b[j], acc[i][j]);
                        acc[i][j] = coopMatMulAdd(a[i], bl[j], acc[i][j]);
                    }
            }
#endif
#ifdef ACC16
            [[unroll]] for (uint i = 0; i < RM; ++i)
                [[unroll]] for (uint j = 0; j < RN; ++j) part[i][j] = coopMatMulAdd(a[i], b[j], part[i][j]);
#else
            [[unroll]] for (uint i = 0; i < RM; ++i)
                [[unroll]] for (uint j = 0; j < RN; ++j) acc[i][j] = coopMatMulAdd(a[i], b[j], acc[i][j]);
#endif
        }
#ifdef ACC16
        if (FOLD == 1u || (s + 1u) % FOLD == 0u || !more)
            [[unroll]] for (uint i = 0; i < RM; ++i)
                [[unroll]] for (uint j = 0; j < RN; ++j) {
                    acc[i][j] += FRAG_C(part[i][j]);
                    part[i][j] = FRAG_H(0.0);
                }
#endif
        if (more) stash((p + 1u) % PREFETCH, tid, STAGE - cur, n0, kbeg + (s + 1u) * BK);
        barrier();
    }

    float alpha = uintBitsToFloat(ALPHA_BITS);
    uint obase = (split_index * BATCHES + batch) * M;
#if !defined(HAS_BIAS) && !defined(SCALED)
    if (m0 + BM <= M && n0 + BN <= N && (N & 3u) == 0u) {
        [[unroll]] for (uint i = 0; i < RM; ++i)
            [[unroll]] for (uint j = 0; j < RN; ++j) {
                uint gm = m0 + wm + i * CM_M, gn = n0 + wn + j * CM_N;
                if (ALPHA_BITS != 0x3f800000u) acc[i][j] = acc[i][j] * alpha;
                coopMatStore(acc[i][j], outf, (obase + gm) * N + gn, N, gl_CooperativeMatrixLayoutRowMajor);
            }
        return;
    }
#endif
    // the stages are free (the loop's last barrier): one fp32 fragment per subgroup
    uint scratch = sg * (CM_M * CM_N / 4u);
    [[unroll]] for (uint i = 0; i < RM; ++i) {
        [[unroll]] for (uint j = 0; j < RN; ++j) {
            coopMatStore(acc[i][j], sm, scratch, CM_N / 4u, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            // a fixed trip count, unrolled: a loop of the driver's own count here keeps the
            // i, j loops rolled and so every accumulator in local memory (NVIDIA reserves
            // it for the whole GPU: ~9 MiB per fragment a subgroup on an H100)
            [[unroll]] for (uint t = 0u; t < CM_M * CM_N / SUBGROUP; ++t) {
                uint e = lane + t * SUBGROUP;
                uint gm = m0 + wm + i * CM_M + e / CM_N, gn = n0 + wn + j * CM_N + e % CM_N;
                if (gm >= M || gn >= N) continue;
                float v = alpha * uintBitsToFloat(sm[scratch + e / 4u][e % 4u]);
#ifdef SCALED
                // times 2^s, s = -(e_m + e_n) in [-200, 248], as two halves that are floats;
                // the partial product lies between v and the result, so it stays in range
                // (the batch count: BATCHES is given with K splits only)
                uint nbat = gl_NumWorkGroups.z / SPLITS;
                int em = aexp[4u * (A_SB == 0u ? 1u : nbat) * A_PLANE + (A_SB == 0u ? 0u : batch) * A_ROWS_P + gm];
#ifdef B_GGUF
                int en = b_exp(gn - n0);
#else
                int en = bexp[4u * (B_SB == 0u ? 1u : nbat) * B_PLANE + (B_SB == 0u ? 0u : batch) * B_ROWS_P + gn];
#endif
                int s = -(em + en), s1 = s / 2;
                v = v * pow2(s1) * pow2(s - s1);
#endif
#ifdef HAS_BIAS
                if (split_index == 0u)
                    v += uintBitsToFloat(BETA_BITS) * ld_f32(cb[C_OFF + batch * C_SB + gm * C_SM + gn * C_SN]);
#endif
                outb[(obase + gm) * N + gn] = st_f32(v);
            }
            subgroupMemoryBarrierShared();
            subgroupBarrier();
        }
    }
}
