// Fused dequantize + matmul for prompts (M > 8): out[M, N] = x[M, K] @ W[N, K]^T
// with W as GGUF blocks. A workgroup of 16x16 threads computes a 64x64 tile of
// out, each thread 4x4, stepping K by 16: per step, 128 threads decode the W
// tile (64 rows x 2 chunks of 8) into shared memory and all load the x tile
// through its strides; no dequantized copy of W is ever stored in a buffer.
// W may be one chunk of a split weight: its N rows are then columns
// OUT_OFF.. of an output whose rows hold OUT_N values.
// Split K: workgroup z sums only K range [z * KS, (z + 1) * KS) and writes its
// partial tile to slice z of the output (M * OUT_N values each); a second kernel
// adds the slices. Few tiles (a prompt of a small model) then still fill the GPU:
// each workgroup's time is its K loop, a round of load latency per step.
#extension GL_EXT_control_flow_attributes : enable
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
#ifdef CPU_TILE
// A CPU device (lavapipe), where a shared load costs about what a global one does and
// a 16-byte load about two 4-byte ones: 64 threads, each an 8x8 block of the tile, whose
// 8 rows of x and 8 rows of W sit side by side in shared memory, so a k step costs the
// thread four 16-byte loads for 64 products (the 4x4 layout below: eight 4-byte loads
// for 16).
layout(local_size_x = 64) in;
shared vec4 As4[TK][TM / 4];    // [k][m / 4]: x rows m .. m + 3 at that k
shared vec4 Ws4[TK][TN / 4];

void main() {
    uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
    uint kbeg = gl_WorkGroupID.z * KS, kend = min(K, kbeg + KS);
    uint tid = gl_LocalInvocationID.x, tx = tid % 8u, ty = tid / 8u;
    vec4 acc[8][2];
    [[unroll]] for (uint i = 0; i < 8u; ++i) { acc[i][0] = vec4(0.0); acc[i][1] = vec4(0.0); }
    for (uint k0 = kbeg; k0 < kend; k0 += TK) {
        // thread tid loads row tid of the x tile and decodes row tid of the W tile
        uint gm = m0 + tid, gn = n0 + tid;
        [[unroll]] for (uint kk = 0; kk < TK; ++kk) {
            uint gk = k0 + kk;
            As4[kk][tid >> 2][tid & 3u] = (gm < M && gk < kend) ? ld_f32(xb[X_OFF + gm * X_SM + gk * X_SK]) : 0.0;
        }
        [[unroll]] for (uint h = 0; h < 2u; ++h) {
            uint gk = k0 + 8u * h;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (gn < N && gk < kend) deq8r(gn * ROW_BYTES, gk / 8u, lo, hi);
            [[unroll]] for (uint i = 0; i < 4u; ++i) {
                Ws4[8u * h + i][tid >> 2][tid & 3u] = lo[i];
                Ws4[8u * h + 4u + i][tid >> 2][tid & 3u] = hi[i];
            }
        }
        barrier();
        [[unroll]] for (uint kk = 0; kk < TK; ++kk) {
            vec4 a0 = As4[kk][2u * ty], a1 = As4[kk][2u * ty + 1u];
            vec4 b0 = Ws4[kk][2u * tx], b1 = Ws4[kk][2u * tx + 1u];
            [[unroll]] for (uint i = 0; i < 4u; ++i) {
                acc[i][0] += a0[i] * b0; acc[i][1] += a0[i] * b1;
                acc[4u + i][0] += a1[i] * b0; acc[4u + i][1] += a1[i] * b1;
            }
        }
        barrier();
    }
    [[unroll]] for (uint i = 0; i < 8u; ++i) {
        uint gm = m0 + 8u * ty + i;
        if (gm >= M) continue;
        [[unroll]] for (uint j = 0; j < 8u; ++j) {
            uint gn = n0 + 8u * tx + j;
            if (gn < N) outb[gl_WorkGroupID.z * M * OUT_N + gm * OUT_N + OUT_OFF + gn] = st_f32(acc[i][j >> 2][j & 3u]);
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
