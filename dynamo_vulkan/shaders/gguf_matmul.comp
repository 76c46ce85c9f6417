// Fused dequantize + matmul for prompts (M > 8): out[M, N] = x[M, K] @ W[N, K]^T
// with W as GGUF blocks. A workgroup of 16x16 threads computes a 64x64 tile of
// out, each thread 4x4, stepping K by 16: per step, 128 threads decode the W
// tile (64 rows x 2 chunks of 8) into shared memory and all load the x tile
// through its strides, each into registers a step ahead (load_step); no
// dequantized copy of W is ever stored in a buffer.
// CPU devices take CPU_LANES instead (below: no shared memory, x shared by broadcasts).
// W may be one chunk of a split weight: its N rows are then columns
// OUT_OFF.. of an output whose rows hold OUT_N values.
// Split K: workgroup z sums only K range [z * KS, (z + 1) * KS) and writes its
// partial tile to slice z of the output (M * OUT_N values each); a second kernel
// adds the slices. Few tiles (a prompt of a small model) then still fill the GPU:
// each workgroup's time is its K loop, a round of load latency per step.
#extension GL_EXT_control_flow_attributes : enable
#ifdef CPU_LANES
#extension GL_KHR_shader_subgroup_ballot : enable
#endif
#include "common.glsl"
layout(constant_id = 0) const uint M = 1;
layout(constant_id = 1) const uint N = 1;
layout(constant_id = 2) const uint K = 8;
layout(constant_id = 3) const uint X_OFF = 0;
layout(constant_id = 4) const uint X_SM = 0;
layout(constant_id = 5) const uint X_SK = 1;
layout(constant_id = 6) const uint ROW_BYTES = 0;
layout(constant_id = 7) const uint OUT_OFF = 0;
layout(constant_id = 8) const uint OUT_N = 1;
layout(constant_id = 9) const uint KS = 0xffffffffu;   // K per split (all of K: one)
BUFFER(0, outb)
BUFFER(1, xb)
#define WQ_BINDING 2
BUFFER(WQ_BINDING, wq)
#include "gguf_blocks.glsl"

const uint TM = 64, TN = 64, TK = 16;
#ifdef CPU_LANES
// A CPU device (lavapipe): invocations are the lanes of a SIMD register, and a load whose
// address differs across lanes is a gather, one element at a time. So each lane owns
// CL_NC rows of W (columns n, n + CL_WG, ...: decoded once per chunk of 8, held in
// registers), the workgroup CL_MR rows of x; lane e of each subgroup loads x[m, k0 + e]
// and every lane takes the 8 values through subgroupBroadcast (a register shuffle), so
// per chunk a lane makes 8 * CL_MR * CL_NC products for CL_MR loads of x and CL_NC
// decodes. Needs subgroups of at least 8 lanes. No shared memory, no barrier: on
// lavapipe several times faster than blocks through shared memory (docs/journal.md).
layout(local_size_x = CL_WG) in;
#include "lanes8.glsl"
void main() {
    uint m0 = gl_WorkGroupID.y * CL_MR;
    uint kbeg = gl_WorkGroupID.z * KS, kend = min(K, kbeg + KS);
    uint nb = gl_WorkGroupID.x * (CL_WG * CL_NC) + gl_LocalInvocationID.x;
    float acc[CL_MR][CL_NC];
    uint rb[CL_NC];
    [[unroll]] for (uint j = 0; j < CL_NC; ++j) rb[j] = min(nb + j * CL_WG, N - 1u) * ROW_BYTES;
    [[unroll]] for (uint i = 0; i < CL_MR; ++i) [[unroll]] for (uint j = 0; j < CL_NC; ++j) acc[i][j] = 0.0;
    uint e = gl_SubgroupInvocationID & 7u;
    for (uint k0 = kbeg; k0 < kend; k0 += 8u) {
        vec4 lo[CL_NC], hi[CL_NC];      // rows past N: row N-1 again, not stored
        [[unroll]] for (uint j = 0; j < CL_NC; ++j) deq8r(rb[j], k0 / 8u, lo[j], hi[j]);
        [[unroll]] for (uint i = 0; i < CL_MR; ++i) {
            vec4 xl, xh;
            lanes8(ld_f32(xb[X_OFF + min(m0 + i, M - 1u) * X_SM + (k0 + e) * X_SK]), xl, xh);
            [[unroll]] for (uint j = 0; j < CL_NC; ++j) acc[i][j] += dot(lo[j], xl) + dot(hi[j], xh);
        }
    }
    [[unroll]] for (uint i = 0; i < CL_MR; ++i) {
        uint gm = m0 + i;
        [[unroll]] for (uint j = 0; j < CL_NC; ++j) {
            uint gn = nb + j * CL_WG;
            if (gm < M && gn < N) outb[gl_WorkGroupID.z * M * OUT_N + gm * OUT_N + OUT_OFF + gn] = st_f32(acc[i][j]);
        }
    }
}
#else
layout(local_size_x = 16, local_size_y = 16) in;
shared float As[TK][TM + 1];
shared float Ws[TK][TN + 1];

// One K step's operands into registers: x's 4 elements of this invocation (e = tid +
// 256 i of the 64x16 tile) and, for the first 128 invocations, 8 decoded values of W
// (row nn, chunk half_). Loaded a step ahead, so that their memory latency passes while
// the workgroup multiplies the step before.
void load_step(uint m0, uint n0, uint k0, uint kend, uint tid, out float xr[4], out vec4 lo, out vec4 hi) {
    [[unroll]] for (uint i = 0; i < 4u; ++i) {
        uint e = tid + 256u * i, gm = m0 + e / TK, gk = k0 + e % TK;
        xr[i] = (gm < M && gk < kend) ? ld_f32(xb[X_OFF + gm * X_SM + gk * X_SK]) : 0.0;
    }
    lo = vec4(0.0);
    hi = vec4(0.0);
    if (tid < TN * 2u) {
        uint gn = n0 + (tid >> 1), gk = k0 + 8u * (tid & 1u);
        if (gn < N && gk < kend) deq8r(gn * ROW_BYTES, gk / 8u, lo, hi);
    }
}

void main() {
    uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
    uint kbeg = gl_WorkGroupID.z * KS, kend = min(K, kbeg + KS);
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint tid = ty * 16u + tx;
    float acc[4][4];
    for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    float xr[4];
    vec4 lo, hi;
    load_step(m0, n0, kbeg, kend, tid, xr, lo, hi);
    for (uint k0 = kbeg; k0 < kend; k0 += TK) {
        [[unroll]] for (uint i = 0; i < 4u; ++i) {
            uint e = tid + 256u * i;
            As[e % TK][e / TK] = xr[i];
        }
        if (tid < TN * 2u) {
            uint nn = tid >> 1, kk = 8u * (tid & 1u);
            for (uint i = 0; i < 4u; ++i) {
                Ws[kk + i][nn] = lo[i];
                Ws[kk + 4u + i][nn] = hi[i];
            }
        }
        barrier();
        if (k0 + TK < kend) load_step(m0, n0, k0 + TK, kend, tid, xr, lo, hi);
        for (uint kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16u * i];
            for (int j = 0; j < 4; ++j) b[j] = Ws[kk][tx + 16u * j];
            for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    for (int i = 0; i < 4; ++i) {
        uint gm = m0 + ty + 16u * i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; ++j) {
            uint gn = n0 + tx + 16u * j;
            if (gn < N) outb[gl_WorkGroupID.z * M * OUT_N + gm * OUT_N + OUT_OFF + gn] = st_f32(acc[i][j]);
        }
    }
}
#endif
