// Matmul family: C[b] = ALPHA * A[b] @ B[b] (+ BETA * bias), tiled through
// shared memory: a workgroup of 16x16 threads computes a 64x64 tile of C, each
// thread a 4x4 block, stepping K by 16. A, B and bias are read through their
// strides (spec constants), so transposed and broadcast operands need no copy.
// Split K (SPLITS > 1, when the tiles are too few to fill a GPU): workgroup z takes
// batch z / SPLITS and K range [s * KS, (s + 1) * KS) for s = z % SPLITS, and writes
// its partial product to slice s of a [SPLITS, batch, M, N] output (split 0 adds
// the bias); lowering/matmul.py adds the slices in one elementwise kernel.
#include "common.glsl"
layout(local_size_x = 16, local_size_y = 16) in;
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
BUFFER(1, ab)
BUFFER(2, bbuf)
#ifdef HAS_BIAS
BUFFER(3, cb)
#endif

const uint TM = 64, TN = 64, TK = 16;
shared float As[TK][TM + 1];
shared float Bs[TK][TN + 1];

void main() {
    uint batch = gl_WorkGroupID.z / SPLITS, split = gl_WorkGroupID.z % SPLITS;
    uint kbeg = split * KS, kend = min(K, kbeg + KS);
    uint m0 = gl_WorkGroupID.y * TM, n0 = gl_WorkGroupID.x * TN;
    uint tx = gl_LocalInvocationID.x, ty = gl_LocalInvocationID.y;
    uint tid = ty * 16u + tx;
    uint abase = A_OFF + batch * A_SB, bbase = B_OFF + batch * B_SB;
    float acc[4][4];
    for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = 0.0;
    for (uint k0 = kbeg; k0 < kend; k0 += TK) {
        for (uint e = tid; e < TM * TK; e += 256u) {
            uint mm = e / TK, kk = e % TK;
            uint gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < kend) ? ld_f32(ab[abase + gm * A_SM + gk * A_SK]) : 0.0;
        }
        for (uint e = tid; e < TN * TK; e += 256u) {
            uint kk = e / TN, nn = e % TN;
            uint gn = n0 + nn, gk = k0 + kk;
            Bs[kk][nn] = (gn < N && gk < kend) ? ld_f32(bbuf[bbase + gk * B_SK + gn * B_SN]) : 0.0;
        }
        barrier();
        for (uint kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16u * i];
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + 16u * j];
            for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    float alpha = uintBitsToFloat(ALPHA_BITS);
    for (int i = 0; i < 4; ++i) {
        uint gm = m0 + ty + 16u * i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; ++j) {
            uint gn = n0 + tx + 16u * j;
            if (gn >= N) continue;
            float v = alpha * acc[i][j];
#ifdef HAS_BIAS
            if (split == 0u)
                v += uintBitsToFloat(BETA_BITS) * ld_f32(cb[C_OFF + batch * C_SB + gm * C_SM + gn * C_SN]);
#endif
            outb[((split * BATCHES + batch) * M + gm) * N + gn] = st_f32(v);
        }
    }
}
