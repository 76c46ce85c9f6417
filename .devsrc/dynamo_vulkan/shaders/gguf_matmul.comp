// Fused dequantize + matmul for prompts (M > 8): out[M, N] = x[M, K] @ W[N, K]^T
// with W as GGUF blocks. A workgroup of 16x16 threads computes a 64x64 tile of
// out, each thread 4x4, stepping K by 16: per step, 128 threads decode the W
// tile (64 rows x 2 chunks of 8) into shared memory and all load the x tile
// through its strides; no dequantized copy of W is ever stored in a buffer.
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

void main() {
    uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
    uint kbeg = gl_WorkGroupID.z * KS, kend = min(K, kbeg + KS);
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint tid = ty * 16u + tx;
    float acc[4][4];
    for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    for (uint k0 = kbeg; k0 < kend; k0 += TK) {
        for (uint e = tid; e < TM * TK; e += 256u) {
            uint mm = e / TK, kk = e % TK;
            uint gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < kend) ? ld_f32(xb[X_OFF + gm * X_SM + gk * X_SK]) : 0.0;
        }
        if (tid < TN * 2u) {
            uint nn = tid >> 1, half_ = tid & 1u;
            uint gn = n0 + nn, gk = k0 + 8u * half_;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (gn < N && gk < kend) {
                uint ch = gk / 8u;
                deq8r(gn * ROW_BYTES, ch, lo, hi);
            }
            uint kk = 8u * half_;
            for (uint i = 0; i < 4u; ++i) {
                Ws[kk + i][nn] = lo[i];
                Ws[kk + 4u + i][nn] = hi[i];
            }
        }
        barrier();
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
